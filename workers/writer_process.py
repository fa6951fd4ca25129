"""Writer process: the process that carries one or more partitions' writers (``wp<n>``).

Runs as a child of the supervisor (docs/architecture.md, "Writer processes and their rings"; the
supervisor's placement, ``appliance.supervisor.placement``, decides which partitions it carries:
one, under the process budget, or many past it). Owns what its partitions share: one mailbox with
one ring from each frontend, the coordinator and its cleaner, one ring back to each, one doorbell,
one heartbeat slot, its process page (generation, status, pid, where it starts reading the
coordinator's ring), one flush thread for all its partitions, and the table of its partitions'
writers (``PartitionWriter``, workers/partition_writer.py), each of which owns its partition's
log and producer state. Each partition still has exactly one writer; the process is
single-threaded (the flush thread only runs fdatasync).

Loop (the worker base's, ``workers.base.Worker``, with its own ``drain_inputs`` as the produce
fast path): drain every input ring; a produce record names its partition and goes to that
partition's writer (``PartitionWriter.produce_request``), a message (a marker, a fence,
DescribeProducers, DeleteRecords, the cleaner's begin or swap) names its partition too and the
registry hands it to that writer here; an answer to a KIP-890 verification goes to the writer
that asked. Then every partition that appended publishes its page once and posts its acks, the
fetchers parked on them are rung once each, and the turn's ``flush_outboxes`` rings each
frontend once. Per turn the process looks only at the partitions that have something pending
(a publish, held or durable-waiting answers, a flush, a verification, retired files); the
retention tick looks at every one.

Partitions come and go while the process runs: it follows the assignment the supervisor
publishes (``appliance.catalog.assignment``): a partition newly assigned to it is opened
(recovered) and its page set READY; one no longer assigned (DeleteTopics) is closed and its page
set STOPPED. At its start it opens every partition assigned to it, one after the other, beating
its heartbeat between them, before it publishes READY (a READY process is held to its heartbeat).
A partition that cannot open on a full disk stays RECOVERING and is tried again every
``SPACE_RETRY_S``; the others serve meanwhile once the start is over.

Shared fate, by design: the partitions live and die with the process. A SIGKILL, an exception on
a write path, or ``exit`` after a log-dir failure restarts the process, and every partition it
carried recovers in the new one (each partition's generation moves with its process's: frontends
fail what was in flight with the retriable NOT_LEADER_OR_FOLLOWER).
"""

from __future__ import annotations

import itertools
import logging
import os
import time

from appliance import ipc
from appliance.catalog.assignment import ASSIGNMENT_FILE, AssignmentView
from appliance.config import Config
from appliance.durable import DeferredSync
from appliance.errors import ErrorCode
from appliance.log.cleaner import messages as cm
from appliance.log.files import CLEAN_SHUTDOWN_FILE
from appliance.log.flusher import FlushThread
from appliance.runtime import (COORDINATOR, WORKER_BOOT_ERROR, WRITER_PROCESS_PAGE_FIELDS,
                               WorkerContext, cleaner_of, set_process_title)
from appliance.service import Responder, serves
from appliance.txn.messages import VerifyPartitionResult
from shm.doorbell import MARK_STATE, BellSender
from workers.base import Worker
from workers.partition_writer import CannotOpen, PartitionWriter

log = logging.getLogger("appliance.writer")
SPACE_RETRY_S = 0.5      # how often a partition that cannot recover on a full disk tries again

# How many records one input ring may hand over per loop turn before the others get a turn.
FAIRNESS_BUDGET = 256
# How often a busy writer process looks for a new catalog or assignment. An idle one is woken for
# it: the supervisor rings every writer process's bell when it publishes either, or a
# configuration.
CATALOG_CHECK_S = 0.2
# How long an idle writer process sleeps at most (a quarter of the heartbeat timeout when that is
# shorter). Nothing it owns needs a look more often (flushes, verifications and the retention
# tick shorten the wait; SIGTERM, the flush thread and every producer ring its bell).
IDLE_WRITER_WAIT_S = 2.0


def main(ctx: WorkerContext) -> int:
    return WriterProcess(ctx).main()


class WriterProcess(Worker):
    page_fields = WRITER_PROCESS_PAGE_FIELDS
    # msgpack messages on the same rings (markers, fences, DescribeProducers, verification
    # answers). A failure there stops the process, as one on the produce path does: the restart
    # recovers the logs.
    contain = False

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.pid = os.getpid()
        self.fetcher_bells = [self.topo.bell_path(fx) for fx in ctx.fetchers]
        self.fetchers_due: set[int] = set()          # fetchers to ring at the end of the turn
        self.tick_s = self.cfg.log.retention_check_interval_ms / 1000   # retention and rolls
        self.next_tick = time.monotonic() + self.tick_s
        self.idle_wait = _idle_wait(self.cfg)
        self.next_catalog_check = 0.0
        self.catalog_seen = -1
        self.assignment = AssignmentView(self.topo.file_path(ASSIGNMENT_FILE),
                                         lambda: self.sup_page.read().assignment_version)
        self.assignment_seen = -1
        # The partitions' writers by (topic id, partition); the ones with pending work; the ones
        # waiting for space to recover; the verification questions by request id.
        self.partitions: dict[tuple[bytes, int], PartitionWriter] = {}
        self.busy: set[PartitionWriter] = set()
        self.waiting_space: dict[tuple[bytes, int], PartitionWriter] = {}
        self.next_space_try = 0.0
        self.questions: dict[int, PartitionWriter] = {}
        # Request ids unique across this process's generations and partitions.
        self.request_ids = itertools.count(((self.generation & 0xFFFF) << 40) | 1)
        self.waker = BellSender()      # the flush thread's own socket
        own_bell = self.topo.bell_path(self.name)
        self.flush_thread = FlushThread(lambda: self.waker.ring(own_bell))

    def inputs(self) -> list[str]:
        # The process's cleaner: log.cleaner.processes needs a restart, so the ring between them
        # stays the same for the process's life.
        return list(self.ctx.frontends) + [COORDINATOR,
                                           cleaner_of(self.ctx.name, self.cfg.log.cleaner.processes)]

    outputs = inputs

    # -- life cycle -------------------------------------------------------------------------------
    def start_fields(self) -> dict:
        # Where this generation starts reading the coordinator's ring, published before it takes
        # anything: the coordinator resends only the markers a predecessor took (and may have died
        # holding); the ones still queued there are ours to answer, and a resend would append a
        # second marker.
        return {"coordinator_ring_head": self.mailbox.inputs[COORDINATOR].head}

    def setup(self) -> int | None:
        """Open every partition assigned to this process, one after the other."""
        self.serve(self, on_answer=self._answer)
        asg = self.assignment.get()
        self.assignment_seen = asg.version
        cat = self.catalog.get()
        first = self.generation == 1
        for tid, topic, index in asg.partitions_of(self.name):
            w = self._member(tid, topic, index, cat)
            try:
                problem = w.open()
            except CannotOpen as e:
                if first:
                    # A first start whose log cannot even open (README, "A full disk": the
                    # supervisor gave its disk reserve back before it forked the writers).
                    log.error("%s", e)
                    return WORKER_BOOT_ERROR
                raise
            self.hb.beat(self.ctx.heartbeat_slot)
            if problem is not None:
                self._wait_for_space(w, problem)
        # On a full disk a partition's recovery rewrites the indexes of the unclean tail, the
        # replay the aborted-transaction index, and cannot: it waits RECOVERING (the supervisor
        # does not hold it to the heartbeat) rather than exit, which would stop the appliance or
        # crash-loop it.
        while self.waiting_space and not self.stop:
            time.sleep(SPACE_RETRY_S)
            self.hb.beat(self.ctx.heartbeat_slot)
            self._retry_space()
        if self.stop:
            raise SystemExit(0)
        log.info("writer process %s ready: %d partitions, generation %d", self.name,
                 len(self.partitions), self.generation)
        self._retitle()
        return None

    def _retitle(self) -> None:
        """``ps`` shows what the process carries: ``writer 3 orders-0``, ``writer 3 (250
        partitions)`` (the kernel's 15-character name stays ``writer 3``)."""
        parts = list(self.partitions.values())
        what = (f" {parts[0].topic}-{parts[0].index}" if len(parts) == 1
                else f" ({len(parts)} partitions)" if parts else "")
        set_process_title(f"writer {self.ctx.index}{what}", comm=f"writer {self.ctx.index}")

    def _member(self, tid: bytes, topic: str, index: int, cat) -> PartitionWriter:
        t = cat.topics.get(topic)
        overrides = cat.overrides(t) if t is not None and t.topic_id == tid else {}
        w = self.partitions[(tid, index)] = PartitionWriter(self, topic, tid, index, overrides)
        return w

    def _wait_for_space(self, w: PartitionWriter, problem: str) -> None:
        if w.key not in self.waiting_space:
            log.warning("%s-%d: cannot recover on a full disk (%s): waiting for space",
                        w.topic, w.index, problem)
        self.waiting_space[w.key] = w

    def _retry_space(self) -> None:
        for key, w in list(self.waiting_space.items()):
            if self.partitions.get(key) is not w:
                del self.waiting_space[key]
                continue
            if w.open() is None:
                del self.waiting_space[key]

    def reload(self, old: Config, new: Config) -> None:
        self.idle_wait = _idle_wait(new)
        if new.log.retention_check_interval_ms != old.log.retention_check_interval_ms:
            self.tick_s = new.log.retention_check_interval_ms / 1000
            self.next_tick = min(self.next_tick, time.monotonic() + self.tick_s)
        for w in self._open_members():
            if w.reload(old, new):
                self.next_tick = time.monotonic()      # retention and rolls under the new values

    def on_stop(self) -> None:
        # Drain what is already queued, so that in-flight produce requests get answers.
        while self.drain_inputs():
            pass
        for w in self._open_members():
            w.flush_and_reply(force=True)

    def close(self) -> None:
        # Every partition seals without an fsync of its own; then the fsyncs of all of them
        # run together and only then do the clean-shutdown markers appear (DeferredSync). One
        # after the other, nine fsyncs a partition made a 10,000-partition stop overrun
        # shutdown_timeout_ms and be killed (issue 32).
        failed = None
        deferred = DeferredSync(CLEAN_SHUTDOWN_FILE)
        started = time.monotonic()
        for w in list(self.partitions.values()):
            try:
                w.close(deferred=deferred)
            except BaseException as e:               # close the others' logs all the same
                log.exception("%s-%d: closing failed", w.topic, w.index)
                failed = failed or e
        try:
            deferred.run()
        except OSError as e:
            # No marker was written past the failure: those partitions recover at the next
            # open, as after a crash.
            log.error("syncing the closed partitions failed: %s", e)
            failed = failed or e
        if len(deferred.markers) > 1:
            log.info("%d partitions closed in %.1f s", len(deferred.markers),
                     time.monotonic() - started)
        self.flush_thread.stop()
        self.waker.close()
        for w in self.partitions.values():
            w.stopped()
        if failed is not None:
            raise failed

    def _open_members(self):
        return [w for w in self.partitions.values() if w.log is not None]

    # -- one loop turn ------------------------------------------------------------------------------
    def drain_inputs(self) -> bool:
        """The produce fast path: each produce record to its partition's writer, everything else
        through the registry; then each partition that appended publishes and posts its acks."""
        worked = False
        now_ms = time.time_ns() // 1_000_000
        parts = self.partitions
        busy = self.busy
        key_of = ipc.PRODUCE_KEY.unpack_from
        at = ipc.PRODUCE_KEY_AT
        for src, ring in self.mailbox.inputs.items():
            for _ in range(FAIRNESS_BUDGET):
                mv = ring.peek()
                if mv is None:
                    break
                try:
                    if mv[0] == ipc.KIND_PRODUCE:
                        w = parts.get(key_of(mv, at))
                        if w is None or w.log is None:
                            self._not_here(src, mv)
                        else:
                            w.produce_request(src, mv, now_ms)
                            busy.add(w)
                    else:
                        self.registry.handle(src, mv)
                finally:
                    ring.advance()
                worked = True
        if busy:
            for w in busy:
                w.publish_and_release()
        self._ring_fetchers()
        return worked

    def _not_here(self, src: str, mv: memoryview) -> None:
        """A produce record for a partition this process does not carry (deleted meanwhile, or
        addressed to a predecessor's layout): NOT_LEADER_OR_FOLLOWER, as Kafka answers for a
        partition it does not lead; the client refreshes its metadata and retries."""
        _, _, acks, _, req_id, _, _, _, _, _ = ipc.PRODUCE_HDR.unpack_from(mv, 0)
        if acks != 0:
            self.post(src, ipc.produce_ack(int(ErrorCode.not_leader_or_follower), self.generation,
                                           req_id, -1, -1, -1, "this writer does not carry the partition"))

    def _ring_fetchers(self) -> None:
        due = self.fetchers_due
        if due:
            for j in due:
                self.bells.ring(self.fetcher_bells[j], MARK_STATE)   # a watched page moved
            due.clear()

    def on_turn(self, now: float) -> None:
        busy = self.busy
        if busy:
            for w in list(busy):
                w.turn(now)
                if not w.pending(now):
                    busy.discard(w)
            self._ring_fetchers()
        if self.waiting_space and now >= self.next_space_try:
            self.next_space_try = now + SPACE_RETRY_S
            self._retry_space()
        if now >= self.next_catalog_check:
            self.next_catalog_check = now + CATALOG_CHECK_S
            self._follow_assignment()
            self._follow_catalog()

    def on_tick(self, now: float) -> None:
        for w in self._open_members():
            w.tick()
            if w.log.has_retired or w.commit.publish_due:
                # segments retention renamed .deleted (removed by the turns), or a hanging
                # transaction's abort marker to publish and make durable
                self.busy.add(w)
        self._ring_fetchers()

    def check_config(self) -> None:
        # The supervisor's page moved (a catalog, an assignment or a configuration published,
        # and our bell rung for it): look at them at this turn, not at the next CATALOG_CHECK_S.
        super().check_config()
        self.next_catalog_check = 0.0

    def wait_timeout(self, now: float) -> float:
        timeout = self.idle_wait
        # Capped like every wait: the loop must come round to beat its heartbeat and to see
        # SIGTERM (a sleep of a long interval_ms had the writer killed for both).
        for w in self.busy:
            t = w.wait_timeout(now)
            if t is not None and t < timeout:
                timeout = t
        if self.waiting_space:
            timeout = min(timeout, SPACE_RETRY_S)
        return timeout

    # -- partitions coming and going, live configs ------------------------------------------------
    def _follow_assignment(self) -> None:
        asg = self.assignment.get()
        if asg.version == self.assignment_seen:
            return
        self.assignment_seen = asg.version
        wanted = {(tid, p): topic for tid, topic, p in asg.partitions_of(self.name)}
        cat = self.catalog.get()
        for key in [k for k in self.partitions if k not in wanted]:
            w = self.partitions.pop(key)
            self.busy.discard(w)
            self.waiting_space.pop(key, None)
            for req_id in [r for r, o in self.questions.items() if o is w]:
                del self.questions[req_id]
            t = cat.topics.get(w.topic)
            deleted = t is None or t.topic_id != w.topic_id
            try:
                if w.log is not None and not deleted:
                    w.flush_and_reply(force=True)
                w.close(deleted=deleted)
            finally:
                w.stopped()
            # Each close is a beat: a DeleteTopics of thousands of partitions in one turn had
            # this process killed for a missed heartbeat (392 s at 1,250 partitions).
            self.hb.beat(self.ctx.heartbeat_slot)
            log.info("%s-%d: closed (%s)", w.topic, w.index,
                     "its topic deleted" if deleted else f"no longer assigned to {self.name}")
        for (tid, p), topic in wanted.items():
            if (tid, p) in self.partitions:
                continue
            try:
                w = self._member(tid, topic, p, cat)
            except FileNotFoundError:
                # Its page is gone: the partition was deleted after the assignment we read was
                # published (a DeleteTopics right after the CreateTopics); the next assignment
                # no longer has it. Crashing here took the whole writer process down.
                log.info("%s-%d: deleted before it opened here", topic, p)
                continue
            problem = w.open()
            self.hb.beat(self.ctx.heartbeat_slot)
            if problem is not None:
                self._wait_for_space(w, problem)
        self._retitle()

    def _follow_catalog(self) -> None:
        cat = self.catalog.get()
        if cat.version == self.catalog_seen:
            return
        self.catalog_seen = cat.version
        for w in self._open_members():
            t = cat.topics.get(w.topic)
            if t is None or t.topic_id != w.topic_id:
                continue      # not published yet (a new topic), or being deleted
            overrides = cat.overrides(t)
            if overrides != w.overrides:
                w.apply_settings(overrides)
                self.busy.add(w)

    # -- requests to a partition (msgpack envelopes on the same rings) -----------------------------
    def _to(self, req) -> PartitionWriter | None:
        w = self.partitions.get((req.topic_id, req.partition))
        if w is None or w.log is None:
            return None
        self.busy.add(w)
        return w

    @serves(ipc.WriteMarkerRequest, late=True)
    def _marker(self, m: ipc.WriteMarkerRequest, respond: Responder) -> None:
        w = self._to(m)
        if w is None:
            respond(ipc.WriteMarkerResult(ErrorCode.not_leader_or_follower))
        else:
            w.marker(m, respond)

    @serves(ipc.FenceProducerRequest)
    def _fence(self, msg: ipc.FenceProducerRequest) -> None:
        w = self._to(msg)
        if w is not None:
            w.partition.fence(msg)

    @serves(ipc.DescribeProducersRequest)
    def _describe_producers(self, msg: ipc.DescribeProducersRequest) -> ipc.DescribeProducersResult:
        w = self._to(msg)
        if w is None:
            return ipc.DescribeProducersResult(ErrorCode.not_leader_or_follower)
        return w.partition.describe_producers(msg)

    @serves(ipc.DeleteRecordsRequest)
    def _delete_records(self, req: ipc.DeleteRecordsRequest) -> ipc.DeleteRecordsResult:
        w = self._to(req)
        if w is None:
            return ipc.DeleteRecordsResult(ErrorCode.not_leader_or_follower)
        return w.delete_records(req)

    @serves(cm.CleanerBeginRequest)
    def _cleaner_begin(self, req: cm.CleanerBeginRequest) -> cm.CleanerBeginResult:
        w = self._to(req)
        if w is None:
            return cm.CleanerBeginResult(ErrorCode.not_leader_or_follower)
        return w.partition.cleaner_begin(req)

    @serves(cm.CleanerSwapRequest)
    def _cleaner_swap(self, req: cm.CleanerSwapRequest) -> cm.CleanerSwapResult:
        w = self._to(req)
        if w is None:
            return cm.CleanerSwapResult(ErrorCode.not_leader_or_follower)
        return w.cleaner_swap(req)

    def asked(self, req_id: int, w: PartitionWriter) -> None:
        """``w`` asked the coordinator ``req_id`` (a KIP-890 verification)."""
        self.questions[req_id] = w

    def _answer(self, req_id: int, body) -> None:
        """The coordinator's answer to a verification (the only answer a writer gets)."""
        if isinstance(body, VerifyPartitionResult):
            w = self.questions.pop(req_id, None)
            if w is not None and w.log is not None:
                w.verified(req_id, body)
                self.busy.add(w)


def _idle_wait(cfg: Config) -> float:
    return min(IDLE_WRITER_WAIT_S, cfg.supervisor.heartbeat_timeout_ms / 4000)
