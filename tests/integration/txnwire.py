"""Raw-wire transaction helpers shared by the transaction tests: Kafka error codes, a hand-driven
transaction (``Txn``: InitProducerId, AddPartitionsToTxn, transactional Produce, EndTxn over a
``RawClient``), DescribeTransactions / Fetch / ListOffsets / DescribeProducers / WriteTxnMarkers
wrappers that return plain values, and the signal helpers that stop a worker for a while.

No client library sits in between, so every error code the tests check is the broker's own.
"""

from __future__ import annotations

import os
import signal
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass

from appliance.protocol.records import (Record, build_batch, decode_records, iter_batch_headers,
                                        parse_control_record)

# Error codes (Kafka's Errors)
NONE = 0
COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
INVALID_REQUEST = 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTION_COORDINATOR_FENCED = 52
INVALID_RECORD = 87
TRANSACTION_ABORTABLE = 120

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST, LATEST = -2, -1


# -- helpers --------------------------------------------------------------------------------------

def create_topic(raw, name, partitions=1, configs=()):
    r = raw.request(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                        "assignments": [],
                                        "configs": [{"name": k, "value": v} for k, v in configs]}],
                            "timeout_ms": 30000, "validate_only": False})
    assert r.topics[0].error_code == NONE, r


def init_pid(raw, txn_id, timeout_ms=60000, version=4):
    r = raw.request(22, version, {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                                  "producer_id": -1, "producer_epoch": -1})
    return r


def records_of(values):
    return [Record(key=None, value=v) for v in values]


def produce(raw, topic, partition, batch, *, txn_id=None, version=9, timeout_ms=10000):
    """One Produce request with one batch; the partition's response."""
    r = raw.request(0, version, {"transactional_id": txn_id, "acks": -1, "timeout_ms": timeout_ms,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": partition, "records": batch}]}]})
    return r.responses[0].partition_responses[0]


class Txn:
    """One transactional producer, by hand: (transactional id, producer id, epoch) and a
    sequence counter per partition."""

    def __init__(self, raw, txn_id, timeout_ms=60000, *, pid=None, epoch=0):
        """InitProducerId for ``txn_id``; or, with ``pid``, a producer that claims (pid, epoch)
        for it without asking."""
        self.raw = raw
        self.txn_id = txn_id
        if pid is None:
            r = init_pid(raw, txn_id, timeout_ms)
            assert r.error_code == NONE, r
            pid, epoch = r.producer_id, r.producer_epoch
        self.pid, self.epoch = pid, epoch
        self.seq: dict[tuple[str, int], int] = {}

    def add(self, topic, partitions, *, pid=None, epoch=None, version=3):
        """AddPartitionsToTxn (client form); {(topic, partition): error code}."""
        r = self.raw.request(24, version, {
            "v3_and_below_transactional_id": self.txn_id,
            "v3_and_below_producer_id": self.pid if pid is None else pid,
            "v3_and_below_producer_epoch": self.epoch if epoch is None else epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}]})
        return {(t.name, p.partition_index): p.partition_error_code
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    def must_add(self, topic, partitions):
        codes = self.add(topic, partitions)
        assert set(codes.values()) == {NONE}, codes

    def batch(self, topic, partition, values, *, seq=None, epoch=None):
        s = self.seq.get((topic, partition), 0) if seq is None else seq
        return build_batch(records_of(values), producer_id=self.pid,
                           producer_epoch=self.epoch if epoch is None else epoch,
                           base_sequence=s, transactional=True)

    def send(self, topic, partition, values, *, version=9, seq=None, timeout_ms=10000):
        """Produce one transactional batch; the partition response. The sequence advances
        only when the batch was appended."""
        p = produce(self.raw, topic, partition, self.batch(topic, partition, values, seq=seq),
                    txn_id=self.txn_id, version=version, timeout_ms=timeout_ms)
        if p.error_code == NONE:
            self.seq[(topic, partition)] = self.seq.get((topic, partition), 0) + len(values)
        return p

    def must_send(self, topic, partition, values, **kw):
        p = self.send(topic, partition, values, **kw)
        assert p.error_code == NONE, p
        return p.base_offset

    def end(self, commit, *, version=3, pid=None, epoch=None):
        r = self.raw.request(26, version, {"transactional_id": self.txn_id,
                                           "producer_id": self.pid if pid is None else pid,
                                           "producer_epoch": self.epoch if epoch is None else epoch,
                                           "committed": commit})
        return r

    def add_offsets(self, group):
        return self.raw.request(25, 3, {"transactional_id": self.txn_id, "producer_id": self.pid,
                                        "producer_epoch": self.epoch, "group_id": group}).error_code

    def describe(self):
        return describe(self.raw, self.txn_id)

    def wait_state(self, state, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            d = self.describe()
            if d.transaction_state == state:
                return d
            assert time.monotonic() < deadline, f"{self.txn_id} stuck in {d.transaction_state}, not {state}"
            time.sleep(0.02)

    def commit(self):
        r = self.end(True)
        assert r.error_code == NONE, r
        return self.wait_state("CompleteCommit")

    def abort(self):
        r = self.end(False)
        assert r.error_code == NONE, r
        return self.wait_state("CompleteAbort")


@dataclass
class TxnState:
    error_code: int
    transactional_id: str
    transaction_state: str
    transaction_timeout_ms: int
    transaction_start_time: int          # ms; -1 before the first partition is added
    producer_id: int
    producer_epoch: int
    partitions: list


def describe(raw, txn_id) -> TxnState:
    """DescribeTransactions v0 for one id, decoded here: kio refuses the start time -1 that
    Kafka (and the appliance) send for a transaction that has not started."""
    raw.correlation += 1
    corr = raw.correlation
    raw.send_frame(raw.header(65, 0, corr) + raw.encode(65, 0, {"transactional_ids": [txn_id]}))
    buf = raw.recv_frame()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return vals[0] if len(vals) == 1 else vals

    def uvarint():
        nonlocal pos
        shift = n = 0
        while True:
            b = buf[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def string():
        nonlocal pos
        n = uvarint() - 1
        out = buf[pos:pos + n].decode()
        pos += n
        return out

    def skip_tags():
        for _ in range(uvarint()):
            uvarint()
            nonlocal pos
            pos += uvarint()

    assert take(">i") == corr
    skip_tags()                                   # response header v1
    take(">i")                                    # throttle time
    assert uvarint() - 1 == 1
    err = take(">h")
    tid, state = string(), string()
    timeout, start, pid, epoch = take(">iqqh")
    parts = []
    for _ in range(uvarint() - 1):
        topic = string()
        parts += [(topic, take(">i")) for _ in range(uvarint() - 1)]
        skip_tags()
    return TxnState(err, tid, state, timeout, start, pid, epoch, sorted(parts))


def txn_partitions(d):
    return d.partitions


@dataclass
class Batch:
    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    values: list            # data: record values; control: [(type, coordinator epoch)]


@dataclass
class Fetched:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list | None    # [(producer id, first offset)] or None (not sent)
    batches: list[Batch]

    def data_offsets(self):
        return [b.base_offset for b in self.batches if not b.control]

    def values(self):
        return [v for b in self.batches if not b.control for v in b.values]

    def markers(self):
        return [(b.base_offset, b.producer_id, b.values[0][0]) for b in self.batches if b.control]


def parse_batches(data) -> list[Batch]:
    out = []
    buf = bytes(data or b"")
    for pos, h in iter_batch_headers(buf):
        raw = buf[pos:pos + h.size]
        values = [parse_control_record(raw)] if h.is_control else [r.value for r in decode_records(raw)]
        out.append(Batch(h.base_offset, h.last_offset, h.producer_id, h.producer_epoch,
                         h.is_transactional, h.is_control, values))
    return out


def fetch(raw, topic, partition=0, offset=0, isolation=READ_UNCOMMITTED, *, max_bytes=1 << 20,
          version=11) -> Fetched:
    r = raw.request(1, version, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
                                 "isolation_level": isolation, "session_id": 0, "session_epoch": -1,
                                 "topics": [{"topic": topic, "partitions": [
                                     {"partition": partition, "fetch_offset": offset,
                                      "partition_max_bytes": max_bytes}]}],
                                 "forgotten_topics_data": [], "rack_id": ""})
    p = r.responses[0].partitions[0]
    aborted = None if p.aborted_transactions is None else sorted(
        (a.producer_id, a.first_offset) for a in p.aborted_transactions)
    return Fetched(p.error_code, p.high_watermark, p.last_stable_offset,
                   getattr(p, "log_start_offset", -1), aborted, parse_batches(p.records))


def list_offset(raw, topic, partition=0, ts=LATEST, isolation=READ_UNCOMMITTED, version=7):
    r = raw.request(2, version, {"replica_id": -1, "isolation_level": isolation,
                                 "topics": [{"name": topic, "partitions": [
                                     {"partition_index": partition, "timestamp": ts}]}]})
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p
    return p.offset


def end_offsets(raw, topic, partition=0):
    """(high watermark, last stable offset) as ListOffsets reports them."""
    return (list_offset(raw, topic, partition, isolation=READ_UNCOMMITTED),
            list_offset(raw, topic, partition, isolation=READ_COMMITTED))


def plain(raw, topic, partition, values):
    p = produce(raw, topic, partition, build_batch(records_of(values)))
    assert p.error_code == NONE, p
    return p.base_offset


def producers(raw, topic, partition=0):
    r = raw.request(61, 0, {"topics": [{"name": topic, "partition_indexes": [partition]}]})
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p
    return {ap.producer_id: ap for ap in p.active_producers}


def write_markers(raw, pid, epoch, commit, coordinator_epoch, topic, partitions, version=1):
    r = raw.request(27, version, {"markers": [{
        "producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
        "coordinator_epoch": coordinator_epoch, "transaction_version": 0,
        "topics": [{"name": topic, "partition_indexes": list(partitions)}]}]})
    (m,) = r.markers
    return {(t.name, p.partition_index): p.error_code for t in m.topics for p in t.partitions}


@contextmanager
def stopped(pid):
    """The process ``pid`` stopped with SIGSTOP for the duration of the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def coordinator_pid(app):
    (w,) = app.workers("coordinator")
    return w["pid"]


def eventually(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- idempotence rules for transactional producers ------------------------------------------------
