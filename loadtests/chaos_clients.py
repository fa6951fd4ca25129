"""The chaos suite's workload: Jepsen's Kafka queue workload with real clients, each a thread of
``loadtests/chaos.py`` that records what it did into one history (``Recorder``).

* ``CkProducer``: a confluent-kafka (librdkafka) transactional producer. Each transaction sends
  1..N unique values to random partitions, waits for their acks (offsets), then commits, or
  aborts at random. Outcome ``ok`` (committed), ``fail`` (aborted, or commit never asked for)
  or ``info`` (commit asked for, outcome unknown: the producer is then replaced, and its
  successor's ``init_transactions`` fences it).
* ``OwnProducer``: the same with the appliance's own client (``appliance.client.Producer``).
* ``CkConsumer``: a confluent-kafka read_committed consumer in a consumer group (subscribe,
  eager rebalances); after every poll that returned records it commits the group's offsets
  (synchronously). Rebalances (on_assign / on_revoke / on_lost) are recorded with the poll.
* ``CkTxnClient``: consume-transform-produce (KIP-447): a read_committed group consumer and a
  transactional producer; each transaction polls, sends new values, commits the consumed
  positions with ``send_offsets_to_transaction`` (with the consumer's group metadata), then
  commits or aborts at random; after an abort it rewinds to the group's committed offsets (the
  group starts with offsets committed at the log start: ``start_txn_group`` says why).
  Its reads and sends are one ``txn`` operation, which makes write->read cycles (G1c) and
  exactly-once consumption checkable.
* ``final_reads``: after the run, a fresh read_committed consumer assigned every partition from
  the beginning reads until it reaches each partition's end, so every committed value is polled.

Keys of the history are "<topic>-<partition>"; values are unique strings "<client>-<n>". The
RNG of each client is seeded from the run's seed. Client-side waits (backoff before recreating a
client) pace the workload; they never stand in for an event the checker depends on.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)

TXN_TIMEOUT_S = 30.0


class Recorder:
    """The history: completed operations, in completion order (thread-safe)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.ops: list[dict] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 4)

    def add(self, op: dict) -> None:
        op["time"] = self.now()
        with self._lock:
            self.ops.append(op)


class Budget:
    """Transactions left to start (shared by every transactional client); None = unbounded.
    ``keep_going()`` true extends it (the run waits for its faults to come up)."""

    def __init__(self, total: int | None, keep_going: Callable[[], bool] = lambda: False) -> None:
        self.left = total
        self.keep_going = keep_going
        self.started = 0
        self.outcomes = {"ok": 0, "fail": 0, "info": 0}
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.left is not None and self.left <= 0 and not self.keep_going():
                return False
            if self.left is not None and self.left > 0:
                self.left -= 1
            self.started += 1
            return True

    def done(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())


class Shared:
    """What every client of one run shares."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, recorder: Recorder, budget: Budget,
                 stop: threading.Event, abort_p: float, max_sends: int, seed: int,
                 group_protocol: str = "classic") -> None:
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.group_protocol = group_protocol     # the group consumers' group.protocol
        self.recorder, self.budget, self.stop = recorder, budget, stop
        self.abort_p, self.max_sends, self.seed = abort_p, max_sends, seed
        self.client_errors: dict[str, int] = {}
        self.known_hangs: list[str] = []     # clients stuck in a known client-library bug
        self._lock = threading.Lock()

    def key(self, partition: int) -> str:
        return f"{self.topic}-{partition}"

    def count_error(self, what: str) -> None:
        with self._lock:
            self.client_errors[what] = self.client_errors.get(what, 0) + 1


def _quiet() -> dict[str, Any]:
    # Faults make librdkafka log every refused connection; the run's output is the schedule.
    return {"log_level": 2, "log.connection.close": False}


def _ck_common(bootstrap: str, name: str = "") -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000, "socket.connection.setup.timeout.ms": 5000,
            "topic.metadata.refresh.interval.ms": 5000, **_rebootstrap(), **_quiet(), **client_debug(name)}


def _rebootstrap() -> dict[str, Any]:
    """librdkafka's metadata recovery (KIP-899 re-bootstrap) off, unless ``CHAOS_RDKAFKA_REBOOTSTRAP=1``.

    Why: with every broker down (a restart of the appliance: kill-all, a power cut) librdkafka
    re-bootstraps and decommissions its broker handles; a decommissioned handle stays cached as
    the group coordinator, and ``send_offsets_to_transaction`` then waits for a state change of
    that dead handle which never comes (confluentinc/librdkafka#5511, open), past its timeout
    (#5456, open): the consume-transform-produce clients sat 15-30 s in that call after a power
    cut, until the next fault's disconnect woke the lookup, or for ever after the last fault
    (the hangs of the 30 short runs). Seen in their debug log: the TxnOffsetCommit was not sent
    at all for 14 s while the handle looped "Handle is terminating in state TRY_CONNECT"; the
    appliance had answered every request (AddOffsetsToTxn in 17 ms). One fixed bootstrap address
    needs no re-bootstrap; the workload's own behaviour is unchanged."""
    import os
    return {} if os.environ.get("CHAOS_RDKAFKA_REBOOTSTRAP") == "1" else {"metadata.recovery.strategy": "none"}


def client_debug(name: str) -> dict[str, Any]:
    """librdkafka's debug log of the named clients, for diagnosing a stall: ``CHAOS_CLIENT_DEBUG``
    = "t0,t0-consumer" (a transactional client's producer, its group consumer), contexts from
    ``CHAOS_CLIENT_DEBUG_CONTEXTS`` (default broker,eos,cgrp,metadata,protocol). The lines go to
    the chaos tool's stderr as librdkafka writes them (its own timestamp, taken when the line is
    made: a Python ``logger`` would stamp it when the application next polls), each prefixed by
    the client's name (its ``client.id``)."""
    import os
    if not name or name not in os.environ.get("CHAOS_CLIENT_DEBUG", "").split(","):
        return {}
    return {"debug": os.environ.get("CHAOS_CLIENT_DEBUG_CONTEXTS", "broker,eos,cgrp,metadata,protocol"),
            "log_level": 7, "client.id": name}


class Client(threading.Thread):
    """One workload thread: ``name`` is its history process, renamed ``name.<n>`` whenever its
    client is replaced (a new session, as Jepsen gives a crashed client a new process)."""

    def __init__(self, shared: Shared, name: str, index: int) -> None:
        super().__init__(name=name, daemon=True)
        self.s = shared
        self.base = name
        self.generation = 0
        self.rng = random.Random(shared.seed * 1000 + index)
        self.counter = 0
        self.error: BaseException | None = None

    @property
    def process(self) -> str:
        return self.base if self.generation == 0 else f"{self.base}.{self.generation}"

    def value(self) -> str:
        self.counter += 1
        return f"{self.process}-{self.counter}"

    def run(self) -> None:
        try:
            self.body()
        except BaseException as e:          # reported by chaos.py
            self.error = e

    def body(self) -> None:
        raise NotImplementedError

    def backoff(self, seconds: float) -> None:
        self.s.stop.wait(seconds)


# -- confluent-kafka transactional producing -----------------------------------------------------
class CkTxn:
    """A confluent-kafka transactional producer and the outcome rules of one transaction."""

    def __init__(self, client: Client, transactional_id: str, compression: str = "none") -> None:
        self.c, self.tid, self.compression = client, transactional_id, compression
        self.p: Producer | None = None

    def ensure(self) -> bool:
        """A producer with its producer id; False when the run is stopping."""
        while self.p is None:
            if self.c.s.stop.is_set():
                return False
            p = Producer({**_ck_common(self.c.s.bootstrap, self.c.base), "transactional.id": self.tid,
                          "linger.ms": 2, "transaction.timeout.ms": 20000,
                          "message.timeout.ms": 15000, "request.timeout.ms": 10000,
                          "socket.timeout.ms": 10000, "compression.type": self.compression})
            try:
                p.init_transactions(TXN_TIMEOUT_S)
                self.p = p
            except KafkaException as e:
                self.c.s.count_error(f"init_transactions: {e.args[0].name()}")
                _discard(p)
                self.c.backoff(0.5)
        return True

    def replace(self) -> None:
        """Drop the producer; the next ``ensure`` makes a new one (a new history process)."""
        if self.p is not None:
            _discard(self.p)
        self.p = None
        self.c.generation += 1

    def send_all(self, sends: list[tuple[int, str]]) -> list[list]:
        """Produce and wait for the acks; the send micro-ops ([send, key, [offset, value]]).
        Raises KafkaException for a failed or unacknowledged send."""
        acks: dict[str, int | None] = {}
        errors: list[KafkaError] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(err)
            else:
                acks[msg.value().decode()] = msg.offset()

        for partition, v in sends:
            while True:
                try:
                    self.p.produce(self.c.s.topic, value=v.encode(), partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    self.p.poll(0.05)
        left = self.p.flush(TXN_TIMEOUT_S)
        mops = [["send", self.c.s.key(partition), [acks.get(v), v]] for partition, v in sends]
        if errors:
            raise KafkaException(errors[0])
        if left:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "sends not acknowledged"))
        return mops

    def abort(self) -> None:
        """Abort; replace the producer when that fails (its successor's init aborts the
        transaction: it never committed either way)."""
        for _ in range(3):
            try:
                self.p.abort_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as e:
                self.c.s.count_error(f"abort_transaction: {e.args[0].name()}")
                if not e.args[0].retriable():
                    break
        self.replace()

    def commit(self) -> str:
        """Commit: "ok", "fail" (the client had to abort, and the broker accepted the abort:
        it refuses to abort a committed transaction) or "info" (unknown; producer replaced)."""
        for _ in range(3):
            try:
                self.p.commit_transaction(TXN_TIMEOUT_S)
                return "ok"
            except KafkaException as e:
                err: KafkaError = e.args[0]
                self.c.s.count_error(f"commit_transaction: {err.name()}")
                if err.txn_requires_abort():
                    try:
                        self.p.abort_transaction(TXN_TIMEOUT_S)
                        return "fail"
                    except KafkaException as e2:
                        self.c.s.count_error(f"abort_transaction: {e2.args[0].name()}")
                        break
                if not err.retriable():
                    break
        self.replace()
        return "info"

    def failed_before_commit(self, e: KafkaException) -> None:
        """An error before commit was asked for: the transaction cannot have committed."""
        err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
        self.c.s.count_error(f"in transaction: {err.name() if err else e}")
        if err is not None and err.fatal():
            self.replace()
        else:
            self.abort()


def _discard(p: Producer) -> None:
    try:
        p.purge()
        p.flush(0)
    except (KafkaException, RuntimeError):
        pass


# The producers take turns with the codecs, so that the broker's validation and the fetch path
# see every one of them under the faults.
CODECS = ("none", "lz4", "zstd", "gzip", "snappy")


class CkProducer(Client):
    def body(self) -> None:
        txn = CkTxn(self, f"chaos-{self.base}", CODECS[int(self.base[1:]) % len(CODECS)])
        while not self.s.stop.is_set() and txn.ensure() and self.s.budget.take():
            process = self.process
            sends = [(self.rng.randrange(self.s.partitions), self.value())
                     for _ in range(self.rng.randint(1, self.s.max_sends))]
            mops = [["send", self.s.key(p), [None, v]] for p, v in sends]
            outcome = "fail"
            started = self.s.recorder.now()
            try:
                txn.p.begin_transaction()
                mops = txn.send_all(sends)
                if self.rng.random() < self.s.abort_p:
                    txn.abort()
                else:
                    outcome = txn.commit()
            except KafkaException as e:
                txn.failed_before_commit(e)
            self.s.recorder.add({"process": process, "type": outcome, "f": "txn", "value": mops, "start": started})
            self.s.budget.done(outcome)
        if txn.p is not None:
            _discard(txn.p)


# -- the appliance's own client -------------------------------------------------------------------
class OwnProducer(Client):
    def new_producer(self):
        from appliance.client import Producer as OwnClientProducer
        while not self.s.stop.is_set():
            p = OwnClientProducer(bootstrap_servers=self.s.bootstrap, transactional_id=f"chaos-{self.base}",
                                  transaction_timeout_ms=20000, delivery_timeout_ms=15000,
                                  request_timeout_ms=10000, max_block_ms=20000, linger_ms=2)
            try:
                p.init_transactions()
                return p
            except Exception as e:          # the client's KafkaError family and socket errors
                self.s.count_error(f"own init_transactions: {type(e).__name__}")
                _close_own(p)
                self.backoff(0.5)
        return None

    def body(self) -> None:
        from appliance.client import TransactionAbortableError
        p = self.new_producer()
        while p is not None and not self.s.stop.is_set() and self.s.budget.take():
            process = self.process
            sends = [(self.rng.randrange(self.s.partitions), self.value())
                     for _ in range(self.rng.randint(1, self.s.max_sends))]
            mops = [["send", self.s.key(q), [None, v]] for q, v in sends]
            outcome, replace = "fail", False
            asked_commit = False
            started = self.s.recorder.now()
            try:
                p.begin_transaction()
                deliveries = [(q, v, p.send(self.s.topic, v.encode(), partition=q)) for q, v in sends]
                p.flush()
                mops = [["send", self.s.key(q), [d.offset if d.offset is not None and d.offset >= 0 else None, v]]
                        for q, v, d in deliveries]
                if self.rng.random() < self.s.abort_p:
                    p.abort_transaction()
                else:
                    asked_commit = True
                    p.commit_transaction()
                    outcome = "ok"
            except TransactionAbortableError as e:
                self.s.count_error(f"own: {type(e).__name__}")
                try:
                    p.abort_transaction()
                except Exception as e2:
                    self.s.count_error(f"own abort: {type(e2).__name__}")
                    replace = True
                outcome = "fail"
            except Exception as e:
                self.s.count_error(f"own: {type(e).__name__}")
                outcome = "info" if asked_commit else "fail"
                replace = True
            self.s.recorder.add({"process": process, "type": outcome, "f": "txn", "value": mops, "start": started})
            self.s.budget.done(outcome)
            if replace:
                _close_own(p)
                self.generation += 1
                p = self.new_producer()
        if p is not None:
            _close_own(p)


def _close_own(p) -> None:
    try:
        p.close(flush=False)
    except Exception:
        pass


# -- consumers -------------------------------------------------------------------------------------
class _GroupMember:
    """A subscribed confluent-kafka consumer whose rebalances are collected for the history."""

    def __init__(self, client: Client, group: str, extra: dict[str, Any] | None = None) -> None:
        self.client = client
        self.rebalanced: set[str] = set()
        conf = {**_ck_common(client.s.bootstrap, client.base + "-consumer"), "group.id": group,
                "isolation.level": "read_committed", "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "max.poll.interval.ms": 120000,
                "fetch.wait.max.ms": 200, "request.timeout.ms": 10000, **(extra or {})}
        if client.s.group_protocol == "consumer":
            # KIP-848: the broker assigns and sets the heartbeat interval and session timeout
            # (chaos.py gives the appliance the classic members' 500 ms / 6 s); librdkafka
            # refuses the classic-only keys with this protocol.
            conf["group.protocol"] = "consumer"
        else:
            conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                         "partition.assignment.strategy": "roundrobin"})
        self.c = Consumer(conf)
        self.c.subscribe([client.s.topic], on_assign=self._changed, on_revoke=self._changed,
                         on_lost=self._changed)

    def _changed(self, consumer, partitions) -> None:
        self.rebalanced.update(self.client.s.key(tp.partition) for tp in partitions)

    def poll(self, n: int, timeout: float) -> tuple[dict[str, list], list[str]]:
        msgs = self.c.consume(n, timeout)
        reads: dict[str, list] = {}
        for m in msgs:
            if m.error() is not None:
                self.client.s.count_error(f"consume: {m.error().name()}")
                continue
            reads.setdefault(self.client.s.key(m.partition()), []).append([m.offset(), m.value().decode()])
        rebalanced, self.rebalanced = sorted(self.rebalanced), set()
        return reads, rebalanced

    def close(self) -> None:
        try:
            self.c.close()
        except (KafkaException, RuntimeError):
            pass


class CkConsumer(Client):
    group = "chaos-consumers"

    def body(self) -> None:
        # Every other consumer fetches with tiny byte limits: a response then ends inside a
        # transaction, next to its markers and aborted batches, and the next fetch resumes there.
        small = {"fetch.max.bytes": 1024, "message.max.bytes": 1000,
                 "max.partition.fetch.bytes": 256} if int(self.base[1:]) % 2 else {}
        m = _GroupMember(self, self.group, small)
        try:
            while not self.s.stop.is_set():
                reads, rebalanced = m.poll(self.rng.randint(1, 50), 0.5)
                if not reads and not rebalanced:
                    continue
                op = {"process": self.process, "type": "ok", "f": "poll", "value": [["poll", reads]]}
                if rebalanced:
                    op["rebalance"] = rebalanced
                if reads:
                    try:
                        m.c.commit(asynchronous=False)
                    except KafkaException as e:
                        op["commit"] = e.args[0].name()
                        self.s.count_error(f"offset commit: {e.args[0].name()}")
                self.s.recorder.add(op)
        finally:
            m.close()


class CkTxnClient(Client):
    group = "chaos-txn"

    def body(self) -> None:
        m = _GroupMember(self, self.group)
        txn = CkTxn(self, f"chaos-{self.base}")
        try:
            while not self.s.stop.is_set() and txn.ensure() and self.s.budget.take():
                self.one(m, txn)
        finally:
            if txn.p is not None:
                _discard(txn.p)
            m.close()

    def one(self, m: _GroupMember, txn: CkTxn) -> None:
        process = self.process
        started = self.s.recorder.now()
        reads, rebalanced = m.poll(self.rng.randint(1, 20), 0.2)
        sends = [(self.rng.randrange(self.s.partitions), self.value())
                 for _ in range(self.rng.randint(1, max(1, self.s.max_sends // 2)))]
        mops: list[list] = [["poll", reads]] + [["send", self.s.key(p), [None, v]] for p, v in sends]
        outcome = "fail"
        try:
            txn.p.begin_transaction()
            mops = [["poll", reads]] + txn.send_all(sends)
            positions = [tp for tp in m.c.position(m.c.assignment()) if tp.offset >= 0]
            if positions:
                txn.p.send_offsets_to_transaction(positions, m.c.consumer_group_metadata(), TXN_TIMEOUT_S)
            if self.rng.random() < self.s.abort_p:
                txn.abort()
            else:
                outcome = txn.commit()
        except KafkaException as e:
            txn.failed_before_commit(e)
        op = {"process": process, "type": outcome, "f": "txn", "value": mops, "group": self.group,
              "start": started}
        if rebalanced:
            op["rebalance"] = rebalanced
        self.s.recorder.add(op)
        self.s.budget.done(outcome)
        if outcome != "ok":
            self.rewind(m, process, known=outcome == "fail")

    def rewind(self, m: _GroupMember, process: str, known: bool) -> None:
        """Back to the group's committed offsets, so the records of the transaction that did not
        commit are consumed again. After an unknown outcome, or when the rewind fails, the read
        position is anyone's guess: a reset in the history."""
        ok = known
        try:
            assignment = m.c.assignment()
            if assignment:
                for tp in m.c.committed(assignment, TXN_TIMEOUT_S):
                    # Never a logical offset (see ``start_txn_group``): the group's offsets
                    # start at the log start, so a missing one is the log start too.
                    offset = tp.offset if tp.offset >= 0 else \
                        m.c.get_watermark_offsets(tp, TXN_TIMEOUT_S, cached=False)[0]
                    m.c.seek(TopicPartition(tp.topic, tp.partition, offset))
        except KafkaException as e:
            self.s.count_error(f"rewind: {e.args[0].name()}")
            ok = False
        if not ok:
            self.s.recorder.add({"process": process, "type": "ok", "f": "reset", "value": None})


def start_txn_group(bootstrap: str, topic: str, partitions: int) -> None:
    """Commit the consume-transform-produce group's offsets at the log start (0: the topic is
    new) before its members join, as an operator resets a new group "--to-earliest".

    Why: librdkafka (2.16 here) can move a partition back to its start long after the
    application's ``seek``, a client race that a Kafka broker triggers as well. A partition
    without a committed offset is reset with a ListOffsets(EARLIEST); when the application seeks
    while that request is in flight (the rewind after an abort), the answer comes back
    "outdated" and re-arms a 500 ms offset-query timer for BEGINNING that neither the answer to
    the newer query nor a later seek stops; when it fires the partition is reset to offset 0 and
    every record is consumed again (seen as duplicate-consume and nonmonotonic-poll within the
    first seconds of a run, with no fault injected). With committed offsets from the start, and
    seeks to numeric offsets only, the consumer never asks for a logical offset."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    for f in admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(CkTxnClient.group, tps)]).values():
        f.result(60)


# -- the final reads --------------------------------------------------------------------------------
def final_reads(bootstrap: str, topic: str, partitions: int, recorder: Recorder, timeout: float,
                log: Callable[[str], None], damaged: list | None = None,
                isolation: str = "read_committed") -> bool:
    """Read every partition from the beginning to its end with a fresh read_committed consumer;
    True when each partition was read to its high watermark (no transaction left open).

    ``damaged``: the batches a bit flip damaged (``chaos_storage.Damage``). The partition answers
    KAFKA_STORAGE_ERROR at such a batch and librdkafka retries there for ever; a reader whose
    position stays in one is moved past it (a seek, recorded as a ``reset`` of the key), as an
    operator would move a group past records given up.

    ``isolation="read_uncommitted"``: the log as it is, aborted records included, recorded as one
    ``log`` entry per poll (process ``final-log``), which the queue checks leave alone: after a
    power cut under policy ``os`` it tells a committed value whose transaction the cut turned
    into an aborted one (still in the log) from a gap (``queue_power_cuts``)."""
    as_log = isolation == "read_uncommitted"
    c = Consumer({**_ck_common(bootstrap), "group.id": f"chaos-final-{time.time_ns()}",
                  "isolation.level": isolation, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
                  # every batch's CRC-32C checked by the client too (a power cut's torn tail
                  # must be cut by recovery, never served: issue 34's "no bad CRC")
                  "check.crcs": True})
    # The end is the high watermark, asked by a read_uncommitted client: the reader's own
    # watermark query answers with its isolation level, i.e. the LSO, and a transaction left
    # hanging (the LSO pinned below the end for ever) looked like a complete read.
    hw = Consumer({**_ck_common(bootstrap), "group.id": f"chaos-final-hw-{time.time_ns()}",
                   "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
    c.assign(tps)
    deadline = time.monotonic() + timeout
    ends: dict[int, int] = {}
    still: dict[str, int] = {}      # key -> the position an empty round found
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(500, 0.5)
            reads: dict[str, list] = {}
            for m in msgs:
                if m.error() is None:
                    reads.setdefault(f"{topic}-{m.partition()}", []).append([m.offset(), m.value().decode()])
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    log(f"final reads: {topic}-{m.partition()}: {m.error().name()} {m.error().str()}")
            if reads:
                recorder.add({"process": "final-log" if as_log else "final", "type": "ok",
                              "f": "log" if as_log else "poll", "value": [["poll", reads]]})
                continue
            # Nothing came: at the end? The end is the high watermark (read_uncommitted): while
            # a transaction is open the LSO stays below it, and the reader has not read it all.
            done = True
            positions = c.position([TopicPartition(topic, p) for p in range(partitions)])
            for tp in positions:
                # Stuck: no record for two rounds, at or below a damaged batch (the records
                # between, if any, are aborted or markers: the position is the application's).
                key = f"{topic}-{tp.partition}"
                if still.get(key) != tp.offset:
                    still[key] = tp.offset
                    continue
                d = min((d for d in damaged or () if d.key == key and tp.offset <= d.last),
                        key=lambda d: d.first, default=None)
                if d is not None:
                    recorder.add({"process": "final", "type": "ok", "f": "reset", "value": [key]})
                    c.seek(TopicPartition(topic, tp.partition, d.last + 1))
                    log(f"final reads: {key} moved from {tp.offset} past the damaged batch {d.first}-{d.last}")
                    still.pop(key)
                    done = False
            if not done:
                continue
            for tp in positions:
                try:
                    _, high = hw.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=5, cached=False)
                except KafkaException:
                    done = False
                    continue
                ends[tp.partition] = high
                if tp.offset < high:
                    done = False
            if done:
                return True
        lso = {}
        for p in range(partitions):
            try:
                lso[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
            except KafkaException:
                pass
        log(f"final reads incomplete after {timeout:.0f}s: positions "
            f"{[(tp.partition, tp.offset) for tp in c.position(c.assignment())]}, high watermarks {ends}, "
            f"LSOs {lso}" + (" (a transaction left hanging: the LSO stays below the end)"
                             if any(lso.get(p, 0) < ends.get(p, 0) for p in ends) else ""))
        return False
    finally:
        c.close()
        hw.close()
