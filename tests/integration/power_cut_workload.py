"""The power-cut tests' workload and checker: an idempotent producer, a transactional producer
(commits and 10 % aborts) and a group committing offsets, all with real confluent-kafka clients,
kept running across power cuts (tests/integration/lazyfs.py), then everything they were told
checked against what the appliance serves. Used by tests/integration/test_power_cut.py and
loadtests/power_cut.py.

What counts (Jepsen's classes where they apply): an acknowledged record missing (lost write) or
found at another offset, a value read twice (duplicate), an aborted or unfinished transaction's
record visible to read_committed, a transaction seen in part, a committed offset lower than the
last commit that succeeded, and a partition whose last stable offset stays below its high
watermark (a hanging transaction).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

EVENTS, TXNS, GROUP = "events", "txns", "cut-group"
PARTITIONS = 3


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (EVENTS, TXNS)])
    for f in futures.values():
        f.result(30)


@dataclass
class Seen:
    """What the clients were told, by the workload threads (each owns its fields)."""
    acked: dict = field(default_factory=dict)          # value -> (partition, offset)
    failed: set = field(default_factory=set)           # delivery failed: may or may not be there
    ack_times: dict = field(default_factory=dict)      # value -> monotonic time of its ack
    committed_txns: dict = field(default_factory=dict)  # txn -> its values
    aborted_txns: dict = field(default_factory=dict)
    unknown_txns: dict = field(default_factory=dict)   # the commit's answer was lost: all or none
    offsets: dict = field(default_factory=dict)        # partition -> last offset committed OK
    out_of_order: int = 0                              # OUT_OF_ORDER_SEQUENCE answers seen
    errors: list = field(default_factory=list)


class Workload:
    def __init__(self, bootstrap: str, seed: int = 0):
        self.bootstrap = bootstrap
        self.seen = Seen()
        self.stop = threading.Event()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=t, daemon=True, name=t.__name__)
                        for t in (self._idempotent, self._transactional, self._offsets)]

    def start(self) -> "Workload":
        for t in self.threads:
            t.start()
        return self

    def finish(self, timeout: float = 180.0) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), f"{t.name} did not finish"

    def acked_count(self) -> int:
        return len(self.seen.acked)

    def txn_count(self) -> int:
        return len(self.seen.committed_txns) + len(self.seen.aborted_txns)

    # ---- the clients -------------------------------------------------------------------------

    def _idempotent(self) -> None:
        s = self.seen
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                      "acks": "all", "linger.ms": 2, "message.timeout.ms": 300000,
                      "retry.backoff.ms": 50, "reconnect.backoff.max.ms": 500})

        def cb(err, msg):
            v = msg.value().decode()
            if err is None:
                s.acked[v] = (msg.partition(), msg.offset())
                s.ack_times[v] = time.monotonic()
            else:
                s.failed.add(v)
                if "OUT_OF_ORDER" in str(err):
                    s.out_of_order += 1

        n = 0
        while not self.stop.is_set():
            try:
                p.produce(EVENTS, value=f"i-{n}".encode(), partition=n % PARTITIONS, on_delivery=cb)
                n += 1
            except BufferError:
                pass
            p.poll(0.002)
        left = p.flush(240)
        if left:
            s.errors.append(f"idempotent producer: {left} records unresolved")

    def _transactional(self) -> None:
        s = self.seen
        conf = {"bootstrap.servers": self.bootstrap, "transactional.id": "cut-txn",
                "acks": "all", "transaction.timeout.ms": 10000, "message.timeout.ms": 10000,
                "reconnect.backoff.max.ms": 500}
        p = None
        txn = 0
        while not self.stop.is_set():
            try:
                if p is None:
                    p = Producer(conf)
                    p.init_transactions(30)
            except KafkaException:
                p = None
                time.sleep(0.2)
                continue
            txn += 1
            values = [f"t-{txn}-{k}" for k in range(self.rng.randint(1, 4))]
            abort = self.rng.random() < 0.1
            stage = "produce"
            try:
                p.begin_transaction()
                for k, v in enumerate(values):
                    p.produce(TXNS, value=v.encode(), partition=(txn + k) % PARTITIONS)
                stage = "commit"
                if abort:
                    p.abort_transaction(30)
                    s.aborted_txns[txn] = values
                else:
                    p.commit_transaction(30)
                    s.committed_txns[txn] = values
            except KafkaException:
                # A commit whose answer was lost may have committed: all or none. Aborts and
                # failed produces end aborted (the next init_transactions fences and aborts).
                if stage == "commit" and not abort:
                    s.unknown_txns[txn] = values
                else:
                    s.aborted_txns[txn] = values
                p = None              # a new producer: its InitProducerId aborts what is open

    def _offsets(self) -> None:
        s = self.seen
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP,
                      "enable.auto.commit": False})
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                part = n % PARTITIONS
                try:
                    c.commit(offsets=[TopicPartition(EVENTS, part, n)], asynchronous=False)
                    s.offsets[part] = n
                except KafkaException:
                    time.sleep(0.1)
                time.sleep(0.01)
        finally:
            c.close()


# ---- the checker --------------------------------------------------------------------------------

def wait_stable(bootstrap: str, topic: str, timeout: float = 120.0) -> list[str]:
    """Wait until every partition's last stable offset reaches its high watermark (no transaction
    left open); the partitions where it did not, each with its LSO and HW. librdkafka's ListOffsets
    LATEST carries the consumer's isolation level: the LSO under read_committed, the HW without."""
    deadline = time.monotonic() + timeout
    committed = Consumer({"bootstrap.servers": bootstrap, "group.id": "cut-check",
                          "isolation.level": "read_committed"})
    uncommitted = Consumer({"bootstrap.servers": bootstrap, "group.id": "cut-check",
                            "isolation.level": "read_uncommitted"})
    try:
        while True:
            stuck = []
            for part in range(PARTITIONS):
                tp = TopicPartition(topic, part)
                lso = committed.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                hw = uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)[1]
                if lso < hw:
                    stuck.append(f"{topic}/{part}: LSO {lso} < HW {hw}")
            if not stuck or time.monotonic() > deadline:
                return stuck
            time.sleep(0.5)
    finally:
        committed.close()
        uncommitted.close()


def read_values(bootstrap: str, topic: str, isolation: str) -> dict[int, list[tuple[int, str]]]:
    """Every record of ``topic`` from offset 0 to the end, per partition: (offset, value)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cut-check",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    try:
        ends = {}
        for part in range(PARTITIONS):
            ends[part] = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)[1]
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        done = {p for p, e in ends.items() if e == 0}
        deadline = time.monotonic() + 120
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:          # _PARTITION_EOF
                    if c.position([TopicPartition(topic, m.partition())])[0].offset >= ends[m.partition()]:
                        done.add(m.partition())
                    continue
                raise KafkaException(m.error())
            out[m.partition()].append((m.offset(), m.value().decode()))
            if m.offset() + 1 >= ends[m.partition()]:
                done.add(m.partition())
        assert len(done) == PARTITIONS, f"{topic}: read stopped before the end {ends}"
    finally:
        c.close()
    return out


def committed_offsets(bootstrap: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        got = c.committed([TopicPartition(EVENTS, p) for p in range(PARTITIONS)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def anomalies(bootstrap: str, seen: Seen) -> dict[str, list]:
    """Every broken promise of a synced log, by class (empty lists when there are none)."""
    found: dict[str, list] = {"lost": [], "moved": [], "duplicate": [], "aborted_read": [],
                              "partial_txn": [], "offset_lost": [], "hanging": []}
    found["hanging"] = wait_stable(bootstrap, TXNS)
    events = read_values(bootstrap, EVENTS, "read_committed")
    where = {}
    for part, rows in events.items():
        for off, v in rows:
            if v in where:
                found["duplicate"].append(v)
            where[v] = (part, off)
    for v, at in seen.acked.items():
        if v not in where:
            found["lost"].append(v)
        elif where[v] != at:
            found["moved"].append((v, at, where[v]))
    txns = read_values(bootstrap, TXNS, "read_committed")
    visible: dict[str, int] = {}
    for rows in txns.values():
        for _, v in rows:
            visible[v] = visible.get(v, 0) + 1
    found["duplicate"] += [v for v, n in visible.items() if n > 1]
    for txn, values in seen.committed_txns.items():
        found["lost"] += [v for v in values if v not in visible]
    for txn, values in seen.aborted_txns.items():
        found["aborted_read"] += [v for v in values if v in visible]
    for txn, values in seen.unknown_txns.items():
        n = sum(v in visible for v in values)
        if n not in (0, len(values)):
            found["partial_txn"].append((txn, n, len(values)))
    got = committed_offsets(bootstrap)
    for part, off in seen.offsets.items():
        if got.get(part, -1) < off:
            found["offset_lost"].append((part, off, got.get(part)))
    return found
