"""Transaction administration over the Kafka protocol, for ``appliance transactions ...``
(what Kafka's kafka-transactions.sh does): list, describe, abort a hanging transaction by its
partition, and force-terminate a transactional id (KIP-939); and the admin calls the Spark sink's
job log needs besides (create a topic, read one broker config, delete the records before an
offset).

Runs in the operator's shell (``appliance.cli.transactions``), and in the Spark sink's driver and
tasks (``appliance.spark``: hence here, beside the client, and not under ``appliance.cli``); owns
nothing but one connection to the broker (``appliance.client.connection.BrokerConnection``,
version-negotiated), so it works the same against a Kafka cluster's coordinator.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
from appliance.client.security import Security

LIST_TRANSACTIONS, DESCRIBE_TRANSACTIONS, DESCRIBE_PRODUCERS = 66, 65, 61
INIT_PRODUCER_ID, WRITE_TXN_MARKERS, CREATE_TOPICS, DESCRIBE_CONFIGS = 22, 27, 19, 32
METADATA, DELETE_RECORDS = 3, 21
BROKER_RESOURCE = 4
RETRY = {ErrorCode.concurrent_transactions, ErrorCode.coordinator_load_in_progress,
         ErrorCode.coordinator_not_available, ErrorCode.not_coordinator}


def connect(bootstrap: str, timeout_ms: int = 30000, security: Security | None = None,
            client_id: str = "appliance-transactions") -> BrokerConnection:
    host, port = bootstrap.rsplit(":", 1)
    return BrokerConnection(host.strip("[]"), int(port), client_id=client_id,
                            request_timeout_ms=timeout_ms, security=security)


def _check(code) -> None:
    if int(code) != 0:
        raise KafkaError(code)


def list_transactions(conn: BrokerConnection, states: list[str] = (), producer_ids: list[int] = (),
                      duration_ms: int = -1, pattern: str | None = None) -> list[dict]:
    r = conn.request(LIST_TRANSACTIONS, {"state_filters": list(states), "producer_id_filters": list(producer_ids),
                                         "duration_filter": duration_ms,
                                         "transactional_id_pattern": pattern})
    _check(r.error_code)
    return [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
             "state": t.transaction_state} for t in r.transaction_states]


def describe_transaction(conn: BrokerConnection, transactional_id: str) -> dict:
    """One transactional id (``describe_transactions``); raises its error code."""
    (d,) = describe_transactions(conn, [transactional_id])
    _check(d["error_code"])
    return d


def describe_transactions(conn: BrokerConnection, transactional_ids: list[str]) -> list[dict]:
    """DescribeTransactions v0 of several ids in one request, each with its ``error_code``,
    decoded here: the start time of a transaction that has not begun is -1, which kio's
    timestamp type does not accept.

    Response v0 (flexible)::

        throttle_time_ms int32 | [transaction_states: error_code int16, transactional_id string,
        state string, timeout_ms int32, start_time_ms int64, producer_id int64,
        producer_epoch int16, [topics: topic string, [partitions int32], tags], tags] | tags
    """
    if not transactional_ids:
        return []
    body = conn.request(DESCRIBE_TRANSACTIONS, {"transactional_ids": list(transactional_ids)},
                        version=0, raw=True)
    rd = _Reader(body)
    rd.take(">i")
    out = []
    for _ in range(rd.uvarint() - 1):
        err = rd.take(">h")
        tid, state = rd.string(), rd.string()
        timeout, start, pid, epoch = rd.take(">iqqh")
        parts = []
        for _ in range(rd.uvarint() - 1):
            topic = rd.string()
            parts += [(topic, rd.take(">i")) for _ in range(rd.uvarint() - 1)]
            rd.skip_tags()
        rd.skip_tags()
        out.append({"transactional_id": tid, "error_code": err, "state": state, "timeout_ms": timeout,
                    "start_time_ms": start, "producer_id": pid, "producer_epoch": epoch,
                    "partitions": sorted(parts)})
    return out


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return vals[0] if len(vals) == 1 else vals

    def uvarint(self) -> int:
        shift = n = 0
        while True:
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            return ""
        out = self.buf[self.pos:self.pos + n].decode()
        self.pos += n
        return out

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


def find_hanging(conn: BrokerConnection, topic: str, partition: int, start_offset: int) -> dict:
    """The producer whose open transaction on the partition began at ``start_offset``
    (DescribeProducers), as kafka-transactions.sh abort --start-offset finds it."""
    r = conn.request(DESCRIBE_PRODUCERS, {"topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = r.topics[0].partitions[0]
    _check(p.error_code)
    for ap in p.active_producers:
        if ap.current_txn_start_offset == start_offset:
            return {"producer_id": ap.producer_id, "producer_epoch": ap.producer_epoch,
                    "coordinator_epoch": ap.coordinator_epoch}
    raise KafkaError(ErrorCode.invalid_request,
                     f"no open transaction starts at offset {start_offset} of {topic}-{partition}")


def abort_transaction(conn: BrokerConnection, topic: str, partition: int, producer_id: int,
                      producer_epoch: int, coordinator_epoch: int) -> None:
    """WriteTxnMarkers with an ABORT marker for the producer on one partition (the admin path
    for a hanging transaction, one the coordinator does not know)."""
    r = conn.request(WRITE_TXN_MARKERS, {"markers": [{
        "producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": False,
        "coordinator_epoch": coordinator_epoch, "transaction_version": 0,
        "topics": [{"name": topic, "partition_indexes": [partition]}]}]})
    (m,) = r.markers
    _check(m.topics[0].partitions[0].error_code)


def force_terminate(conn: BrokerConnection, transactional_id: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """KIP-939 forceTerminateTransaction: InitProducerId with KeepPreparedTxn=false aborts the
    id's open transaction (prepared or not) and fences every producer using it. Retried while
    the coordinator is busy completing; returns the (producer id, epoch) that now owns the id."""
    deadline = time.monotonic() + timeout_s
    txn_timeout = 60000
    while True:
        r = conn.request(INIT_PRODUCER_ID, {"transactional_id": transactional_id,
                                            "transaction_timeout_ms": txn_timeout, "producer_id": -1,
                                            "producer_epoch": -1, "enable2_pc": False,
                                            "keep_prepared_txn": False})
        code = ErrorCode(int(r.error_code))
        if code == ErrorCode.none:
            return r.producer_id, r.producer_epoch
        if code == ErrorCode.invalid_transaction_timeout and txn_timeout > 1000:
            txn_timeout = 1000                   # the broker's maximum is lower than a minute
            continue
        if code not in RETRY or time.monotonic() >= deadline:
            raise KafkaError(code)
        time.sleep(0.1)


def create_topic(conn: BrokerConnection, name: str, partitions: int,
                 configs: dict[str, str] | None = None, timeout_ms: int = 30000) -> bool:
    """CreateTopics of one topic; True if it was created, False if it existed already."""
    r = conn.request(CREATE_TOPICS, {
        "topics": [{"name": name, "num_partitions": partitions, "replication_factor": -1,
                    "assignments": [],
                    "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
        "timeout_ms": timeout_ms, "validate_only": False})
    (t,) = r.topics
    if int(t.error_code) == ErrorCode.topic_already_exists:
        return False
    if int(t.error_code) != 0:
        raise KafkaError(t.error_code, f"CreateTopics {name}: {t.error_message or ''}".rstrip(": "))
    return True


def delete_records(conn: BrokerConnection, topic: str, partition: int, offset: int,
                   timeout_ms: int = 30000) -> int:
    """DeleteRecords of one partition before ``offset`` (sent to ``conn``'s broker, which must
    lead the partition); returns the partition's new log start offset."""
    r = conn.request(DELETE_RECORDS, {"topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "offset": offset}]}], "timeout_ms": timeout_ms})
    p = r.topics[0].partitions[0]
    _check(p.error_code)
    return p.low_watermark


def node_id(conn: BrokerConnection) -> int:
    """The node id of the broker ``conn`` is connected to (Metadata without topics: the broker
    whose address is the connection's, else the first one listed)."""
    r = conn.request(METADATA, {"topics": [], "allow_auto_topic_creation": False,
                                "include_cluster_authorized_operations": False,
                                "include_topic_authorized_operations": False})
    brokers = list(r.brokers)
    if not brokers:
        raise KafkaError(ErrorCode.broker_not_available, "Metadata listed no broker")
    for b in brokers:
        if (b.host, b.port) == (conn.host, conn.port):
            return b.node_id
    return brokers[0].node_id


def broker_config(conn: BrokerConnection, name: str) -> str | None:
    """The value of one config of the broker ``conn`` is connected to (DescribeConfigs of that
    broker's resource, named by its node id: the cluster-wide default resource, named "", lists
    only dynamic configs, as Kafka's does), or None when the broker does not report that name."""
    r = conn.request(DESCRIBE_CONFIGS, {
        "resources": [{"resource_type": BROKER_RESOURCE, "resource_name": str(node_id(conn)),
                       "configuration_keys": [name]}],
        "include_synonyms": False, "include_documentation": False})
    (res,) = r.results
    _check(res.error_code)
    for c in res.configs:
        if c.name == name:
            return c.value
    return None
