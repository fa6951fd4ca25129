"""Transaction administration over the Kafka protocol, for ``appliance transactions ...``
(what Kafka's kafka-transactions.sh does): list, describe, abort a hanging transaction by its
partition, and force-terminate a transactional id (KIP-939).

Runs in the operator's shell; owns nothing but one connection to the broker
(``appliance.client.connection.BrokerConnection``, version-negotiated), so it works the same
against a Kafka cluster's coordinator.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
from appliance.client.security import Security

LIST_TRANSACTIONS, DESCRIBE_TRANSACTIONS, DESCRIBE_PRODUCERS = 66, 65, 61
INIT_PRODUCER_ID, WRITE_TXN_MARKERS = 22, 27
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
    """DescribeTransactions v0, decoded here: the start time of a transaction that has not
    begun is -1, which kio's timestamp type does not accept.

    Response v0 (flexible)::

        throttle_time_ms int32 | [transaction_states: error_code int16, transactional_id string,
        state string, timeout_ms int32, start_time_ms int64, producer_id int64,
        producer_epoch int16, [topics: topic string, [partitions int32], tags], tags] | tags
    """
    body = conn.request(DESCRIBE_TRANSACTIONS, {"transactional_ids": [transactional_id]}, version=0, raw=True)
    rd = _Reader(body)
    rd.take(">i")
    assert rd.uvarint() - 1 == 1, "one transactional id asked, one answered"
    err = rd.take(">h")
    tid, state = rd.string(), rd.string()
    timeout, start, pid, epoch = rd.take(">iqqh")
    parts = []
    for _ in range(rd.uvarint() - 1):
        topic = rd.string()
        parts += [(topic, rd.take(">i")) for _ in range(rd.uvarint() - 1)]
        rd.skip_tags()
    _check(err)
    return {"transactional_id": tid, "state": state, "timeout_ms": timeout, "start_time_ms": start,
            "producer_id": pid, "producer_epoch": epoch, "partitions": sorted(parts)}


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
