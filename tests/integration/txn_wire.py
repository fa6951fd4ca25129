"""Transactions over the wire, for the raw-protocol transaction tests: a hand-driven transaction
(``Txn``: InitProducerId, AddPartitionsToTxn, transactional Produce, EndTxn over a
``RawClient``), the same requests one at a time (``init_pid``, ``init_producer``, ``add_offsets``,
``end_txn``), DescribeTransactions decoded by hand (``describe``), DescribeProducers and
WriteTxnMarkers, each returning plain values and never hiding an error code.

Error codes, topics, Produce, Fetch and ListOffsets are raw_wire.py's; TxnOffsetCommit (the
group's side of a transaction, KIP-447) is group_wire.py's. Runs in the pytest process.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from appliance.protocol.records import build_batch
from raw_wire import NONE, RawClient, produce, records_of, retry


def init_pid(raw, txn_id, timeout_ms=60000, version=4):
    """InitProducerId: the response, whatever its error code."""
    r = raw.request(22, version, {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                                  "producer_id": -1, "producer_epoch": -1})
    return r


def init_producer(raw: RawClient, txn_id: str, timeout_ms: int = 60000) -> tuple[int, int]:
    """InitProducerId for ``txn_id``: (producer id, epoch). Retried while the coordinator
    completes the previous instance's transaction (CONCURRENT_TRANSACTIONS), as clients do."""
    r = retry(lambda: raw.request(22, 4, {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                                          "producer_id": -1, "producer_epoch": -1}))
    assert r.error_code == NONE, r
    return r.producer_id, r.producer_epoch


def add_offsets(raw: RawClient, txn_id: str, pid: int, epoch: int, group: str, version: int = 3) -> int:
    """AddOffsetsToTxn: the error code."""
    r = raw.request(25, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                  "group_id": group})
    return r.error_code


def end_txn(raw: RawClient, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3):
    """EndTxn: the response (error_code; producer id/epoch from v5)."""
    return raw.request(26, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                     "committed": commit})


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
        return end_txn(self.raw, self.txn_id, self.pid if pid is None else pid,
                       self.epoch if epoch is None else epoch, commit, version)

    def add_offsets(self, group):
        return add_offsets(self.raw, self.txn_id, self.pid, self.epoch, group)

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
