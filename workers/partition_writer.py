"""Partition writer: the process shell of the one writer of one partition.

Runs as a child of the supervisor, one per partition (or K partitions of a topic in one process:
``workers/writer_host.py``). Owns that partition's ``PartitionLog`` (segments, offset, time and
transaction indexes, log start offset) and its ``ProducerStateManager`` (sequence windows, open
transactions, LSO) through ``appliance.log.partition.Partition``, and publishes its high
watermark, LSO, log start and active-segment end in the partition's state page. Single-threaded
(the flusher thread only runs fdatasync; see appliance/log/flusher.py): no locks on the write path.

A shell: it moves bytes between its rings and the log and carries out what the partition's
sans-IO collaborators (``appliance/log/``) decide:

* ``Partition``: DeleteRecords, DescribeProducers, KIP-939 fences, the cleaner's begin and swap,
  retention and rolls, topic settings; the slot of the KIP-932 share-group state;
* ``TransactionVerifier`` (KIP-890): which parked batch to append, which request to fail with
  which error, which question to ask the coordinator, when to ask again (its actions);
* ``MarkerWriter``: COMMIT/ABORT markers, indexed before the producer state takes them and taken
  back out of the log when the index entry cannot be written (a full disk);
* ``GroupCommit``: when each answer may leave (after the publish, after the fsync) and when to
  start a flush.

Loop (the worker base's, ``workers.base.Worker``; this module supplies its hooks, and its own
``drain_inputs`` as the produce fast path): drain every input ring (produce requests from each
frontend; markers and verification answers from the coordinator), append each batch (patch the base
offset in place in the ring, then one pwrite into the segment), publish the new high watermark and
LSO once for the whole group, start a group commit if acks wait for one, then put the acks into
each frontend's ack ring and ring the bells of those that sleep. Wake fetchers parked on this
partition. Sleep on the doorbell when there is nothing to do. The fast path (a non-transactional
batch, or one of a producer whose transaction is open here) takes no action object and no call
beyond the append's: its two gates (KIP-939 fence, KIP-890 park) read the collaborators' dicts
inline; only what they catch goes to the collaborators.

Topic configs apply live: the writer follows the published catalog (its topic's overrides over
the dynamic broker configs, ``Catalog.overrides``) and hands changed ``LogSettings`` to its log,
enforcing a changed retention at once.

A full disk (issue 17): appends answer KAFKA_STORAGE_ERROR and leave the log and the producer
state as they were; retention and time-based rolls that fail are tried again every tick; a
failed abort marker is taken back (``MarkerWriter``). Only what leaves durability unknown (a
failed fsync, the flusher's error, ``LogDirFailure``) stops the writer, whose recovery then
decides; a restart on a full disk waits RECOVERING for space.
"""

from __future__ import annotations

import errno
import logging
import time

from appliance import ipc
from appliance.data_layout import partition_dir
from appliance.config import Config
from appliance.errors import ErrorCode, KafkaError
from appliance import testhooks
from appliance.log.cleaner import messages as cm
from appliance.log.flusher import Flusher
from appliance.log.group_commit import GroupCommit
from appliance.log.markers import MarkerWriter
from appliance.log.partition import Partition, load_producer_state
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.verification import (AppendParked, AskCoordinator, FailParked, Parked,
                                        TransactionVerifier)
from appliance.metrics import Histogram, key
from appliance.protocol.records import read_header
from appliance.runtime import (COORDINATOR, PARTITION_PAGE_FIELDS, WORKER_BOOT_ERROR, WorkerContext,
                               cleaner_of)
from appliance.service import Responder, serves
from appliance.txn.messages import VerifyPartitionRequest, VerifyPartitionResult
from shm.doorbell import BellSender
from workers.base import Worker

log = logging.getLogger("appliance.writer")
SPACE_RETRY_S = 0.5      # how often a restart on a full disk tries its recovery again

# How many records one input ring may hand over per loop turn before the others get a turn.
FAIRNESS_BUDGET = 64
# How often a busy writer looks for a new catalog (config changes). An idle one is woken for it:
# the supervisor rings every writer's bell when it publishes a catalog or a configuration.
CATALOG_CHECK_S = 0.2
# How long an idle writer sleeps at most (a quarter of the heartbeat timeout when that is
# shorter). Nothing it owns needs a look more often (flushes, verifications and the retention
# tick shorten the wait; SIGTERM, the flusher and every producer ring its bell), and with
# hundreds of partitions the writers' wake-ups add up: at 0.5 s, 256 idle writers took 6-8 % of
# a CPU (512 wake-ups a second).
IDLE_WRITER_WAIT_S = 2.0


def main(ctx: WorkerContext) -> int:
    return PartitionWriter(ctx).main()


class PartitionWriter(Worker):
    page_fields = PARTITION_PAGE_FIELDS
    # msgpack messages on the same rings (markers, fences, DescribeProducers, verification
    # answers). A failure there stops the writer, as one on the produce path does: the restart
    # recovers the log.
    contain = False

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.gen = ctx.generation
        self.fetcher_bells = [self.topo.bell_path(fx) for fx in ctx.fetchers]
        flush = self.cfg.log.flush
        self.commit = GroupCommit(flush.policy, flush.interval_ms / 1000, time.monotonic())
        self.tick_s = self.cfg.log.retention_check_interval_ms / 1000   # retention and rolls
        self.next_tick = time.monotonic() + self.tick_s
        self.idle_wait = _idle_wait(self.cfg)
        self.next_catalog_check = 0.0
        self.catalog_seen = -1
        # The topic's configs over the broker defaults (Catalog.overrides), as the catalog has them.
        self.overrides: dict[str, str] = dict(ctx.topic_configs)
        # Metrics (appliance.metrics): per batch two adds into the shared table, per publish a
        # few stores; the per-topic series of every partition of a topic sum up.
        m = self.metrics
        topic = [("topic", ctx.topic)]
        tp = topic + [("partition", ctx.index)]
        self.mv = m.values
        self.k_messages = m.slot(key("kafka_server_brokertopicmetrics_messagesin", topic))
        self.k_bytes = m.slot(key("kafka_server_brokertopicmetrics_bytesin", topic))
        self.k_size = m.slot(key("kafka_log_log_size", tp))
        self.k_segments = m.slot(key("kafka_log_log_numlogsegments", tp))
        self.k_producers = m.slot(key("kafka_server_replicamanager_produceridcount"))
        self.k_recovery = m.slot(key("appliance_log_recovery_bytes", tp))
        self.flush_hist = Histogram(m, "kafka_log_logflushstats_logflushrateandtimems")
        self.flushes_seen = 0
        self.segments_seen = -1
        self.sealed_bytes = 0

    def inputs(self) -> list[str]:
        # The partition's cleaner process: log.cleaner.processes needs a restart, so the ring
        # between them stays the same for the writer's life.
        return list(self.ctx.frontends) + [COORDINATOR,
                                           cleaner_of(self.ctx.name, self.cfg.log.cleaner.processes)]

    outputs = inputs

    # -- life cycle -----------------------------------------------------------------------------
    def start_fields(self) -> dict:
        # Where this generation starts reading the coordinator's ring, published before it takes
        # anything: the coordinator resends only the markers a predecessor took (and may have died
        # holding); the ones still queued there are ours to answer, and a resend would append a
        # second marker.
        return {"coordinator_ring_head": self.mailbox.inputs[COORDINATOR].head}

    def _open(self, directory: str) -> int:
        """Recover the log and the producer state; the offset the replay started from."""
        self.log = None
        self.mv[self.k_recovery] = 0            # bytes checked by this try (a retry starts over)

        def progress(nbytes: int) -> None:
            self.mv[self.k_recovery] += nbytes

        self.log = PartitionLog.open(directory, self._log_settings(), _now_ms(), progress)
        self.psm = ProducerStateManager(directory, self.cfg.transactions.producer_id_expiration_ms)
        replayed_from = load_producer_state(self.log, self.psm, _now_ms())
        self.log.crash_hook = testhooks.hook("writer")
        return replayed_from

    def setup(self) -> int | None:
        testhooks.pause_point("writer", "recovering")
        directory = partition_dir(self.ctx.data_dir, self.ctx.topic, self.ctx.index)
        waiting = False
        while True:
            try:
                replayed_from = self._open(directory)
                break
            except (OSError, ValueError) as e:
                opened, self.log = self.log, None
                if opened is not None:
                    opened.close(clean=False)        # writes nothing: as a crash would
                no_space = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
                if not no_space or (self.gen == 1 and opened is None):
                    if opened is not None:
                        raise                        # past the log's open: a crash, as ever
                    log.error("cannot open partition log %s: %s", directory, e)
                    return WORKER_BOOT_ERROR
                problem = str(e)
            # On a full disk: recovery rewrites the indexes of the unclean tail, the replay the
            # aborted-transaction index, and cannot. Exiting would stop the whole appliance (a
            # boot error) or crash-loop it; the partition waits instead, RECOVERING (the
            # supervisor does not hold it to the heartbeat), and the others keep serving. Only a
            # first start whose log cannot even open keeps the boot error (README, "A full
            # disk": the supervisor gave its disk reserve back before it forked the writers).
            if not waiting:
                log.warning("%s-%d: cannot recover on a full disk (%s): waiting for space",
                            self.ctx.topic, self.ctx.index, problem)
                waiting = True
            if self.stop:
                raise SystemExit(0)              # nothing is open: the drain has nothing to do
            time.sleep(SPACE_RETRY_S)
        self.partition = Partition(self.ctx.topic, self.ctx.index, self.log, self.psm)
        self.markers = MarkerWriter(self.partition)
        self.verifier = TransactionVerifier(self.psm, self.cfg, self.gen)
        # The fast path's two gates read these dicts of the collaborators directly (the same
        # objects for the writer's life): no call per batch.
        self.fenced = self.partition.fenced
        self.parked = self.verifier.parked
        self.serve(self, self.partition, on_answer=self._verified)
        own_bell = self.topo.bell_path(self.ctx.name)
        waker = self.waker = BellSender()   # the flusher thread's own socket
        self.flusher = self.commit.flusher = Flusher(lambda: waker.ring(own_bell),
                                                     self.log.log_end_offset)
        self._publish()                 # the recovered log, before the base publishes READY
        log.info("%s-%d ready: log start %d, log end %d, LSO %d, %d producers (replayed from %d), "
                 "generation %d", self.ctx.topic, self.ctx.index, self.log.log_start_offset,
                 self.log.log_end_offset, self.psm.last_stable_offset(self.log.log_end_offset),
                 len(self.psm.entries), replayed_from, self.gen)
        return None

    def _log_settings(self) -> LogSettings:
        """Broker defaults (``[log]``) overlaid with the topic's own configs: a default changed
        by a reload applies to topics that do not override it, as Kafka's dynamic defaults do."""
        return LogSettings.from_config(self.cfg.log, self.overrides)

    def reload(self, old: Config, new: Config) -> None:
        force_flush = self.commit.configure(new.log.flush.policy, new.log.flush.interval_ms / 1000)
        self.verifier.configure(new)
        self.idle_wait = _idle_wait(new)
        self.psm.expiration_ms = new.transactions.producer_id_expiration_ms
        if new.log.retention_check_interval_ms != old.log.retention_check_interval_ms:
            self.tick_s = new.log.retention_check_interval_ms / 1000
            self.next_tick = min(self.next_tick, time.monotonic() + self.tick_s)
        settings = self._log_settings()
        if settings != self.log.settings:
            self.log.update_settings(settings)
            self.next_tick = time.monotonic()        # retention and rolls under the new values
        if force_flush:
            # Answers promised an fdatasync: give them one before the policy stops flushing.
            self._flush_and_reply(force=True)

    def on_stop(self) -> None:
        # Drain what is already queued, so that in-flight produce requests get answers.
        while self._drain_inputs():
            pass
        self._flush_and_reply(force=True)

    def close(self) -> None:
        self.flusher.stop()
        self.waker.close()
        self.log.flush()
        self.partition.close()

    # -- one loop turn --------------------------------------------------------------------------
    def drain_inputs(self) -> bool:
        return self._drain_inputs()

    def on_turn(self, now: float) -> None:
        if self.verifier.verifying:
            self._carry_out(self.verifier.expire(now))
        self._publish_and_release()
        self._flush_and_reply()
        if self.log.has_retired:
            self.log.delete_retired()
        if now >= self.next_catalog_check:
            self.next_catalog_check = now + CATALOG_CHECK_S
            self._follow_catalog()

    def on_tick(self, now: float) -> None:
        if self.partition.tick(_now_ms()):
            self._publish()

    def check_config(self) -> None:
        # The supervisor's page moved (a catalog or configuration published, and our bell rung
        # for it): look at the catalog at this turn, not at the next CATALOG_CHECK_S.
        super().check_config()
        self.next_catalog_check = 0.0

    def wait_timeout(self, now: float) -> float:
        timeout = self.idle_wait
        # Capped like every wait: the loop must come round to beat its heartbeat and to see
        # SIGTERM (a sleep of a long interval_ms had the writer killed for both).
        flush_in = self.commit.flush_wait(now, self.log.log_end_offset)
        if flush_in is not None:
            timeout = min(timeout, flush_in)
        deadline = self.verifier.next_deadline()
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - now))
        return timeout

    # -- live configs -----------------------------------------------------------------------------
    def _follow_catalog(self) -> None:
        cat = self.catalog.get()
        if cat.version == self.catalog_seen:
            return
        self.catalog_seen = cat.version
        t = cat.topics.get(self.ctx.topic)
        if t is None or t.topic_id != self.ctx.topic_id:
            return      # not published yet (a new topic), or being deleted
        self.apply_settings(cat.overrides(t))

    def apply_settings(self, overrides: dict[str, str]) -> None:
        """Apply the topic's effective configs (``self.cfg.log`` under ``overrides``) now:
        ``Partition.update_settings``, and retention at once when it changed."""
        self.overrides = overrides
        if self.partition.update_settings(self._log_settings()):
            self.on_tick(time.monotonic())

    # -- the produce fast path ----------------------------------------------------------------------
    def _drain_inputs(self) -> bool:
        worked = False
        now_ms = _now_ms()
        for src, ring in self.mailbox.inputs.items():
            for _ in range(FAIRNESS_BUDGET):
                mv = ring.peek()
                if mv is None:
                    break
                try:
                    if mv[0] == ipc.KIND_PRODUCE:
                        self._produce_request(src, mv, now_ms)
                    else:
                        self.registry.handle(src, mv)
                finally:
                    ring.advance()
                worked = True
        self._publish_and_release()
        return worked

    def _produce_request(self, src: str, mv: memoryview, now_ms: int) -> None:
        _, _, acks, gen, req_id, blen, version, tlen = ipc.PRODUCE_HDR.unpack_from(mv, 0)
        start = ipc.PRODUCE_HDR.size + tlen
        if gen != self.gen:
            # Addressed to a predecessor that died: the frontend has already answered the client.
            self._refuse(src, acks, req_id, ErrorCode.not_leader_or_follower)
            return
        batch = mv[start:start + blen]
        h = read_header(batch, 0)
        if self.fenced and h.producer_epoch < self.fenced.get(h.producer_id, -1):
            # KIP-939: an incarnation fenced by InitProducerId(keepPreparedTxn) (Partition.fence)
            self._refuse(src, acks, req_id, ErrorCode.invalid_producer_epoch)
            return
        # KIP-890: TransactionVerifier.must_verify, inline, behind the producer's parked batches.
        if h.is_transactional and (h.producer_id in self.parked or (
                (self.verifier.enabled or version >= 12) and self.psm.needs_verification(h))):
            self._park(src, req_id, acks, version, mv, tlen, batch, h)
            return
        self._append(src, req_id, acks, batch, h, now_ms)

    def _append(self, src: str, req_id: int, acks: int, batch, h, now_ms: int) -> None:
        """Sequence checks, append, producer-state update, and the ack (``GroupCommit``)."""
        idempotent = h.producer_id >= 0
        try:
            if idempotent:
                dup = self.psm.check(h)
                if dup is not None:
                    # A retry of a batch already in the log: its original offsets, nothing appended.
                    lat = dup.timestamp if self.log.settings.log_append_time else -1
                    self._reply(src, acks, dup.last_offset + 1, ipc.produce_ack(
                        0, self.gen, req_id, dup.first_offset, lat, self.log.log_start_offset))
                    return
            info = self.log.append(batch, now_ms)
        except KafkaError as e:
            self._reply(src, acks, 0, ipc.produce_ack(
                int(e.code), self.gen, req_id, -1, -1, self.log.log_start_offset, e.message))
            return
        if idempotent:
            self.psm.update(h, info.base_offset, now_ms,
                            info.log_append_time if info.log_append_time >= 0 else h.max_timestamp)
        mv = self.mv
        mv[self.k_messages] += info.last_offset - info.base_offset + 1
        mv[self.k_bytes] += len(batch)
        self.commit.appended(src, acks, info.last_offset + 1, ipc.produce_ack(
            0, self.gen, req_id, info.base_offset, info.log_append_time, self.log.log_start_offset))

    # -- answers that appended nothing (off the fast path) --------------------------------------------
    def _refuse(self, src: str, acks: int, req_id: int, code: ErrorCode,
                message: str | None = None) -> None:
        self._reply(src, acks, 0, ipc.produce_ack(
            int(code), self.gen, req_id, -1, -1, self.log.log_start_offset, message))

    def _reply(self, src: str, acks: int, end: int, ack: bytes) -> None:
        if self.commit.reply(src, acks, end, ack):
            self.post(src, ack)

    def _publish_and_release(self) -> None:
        """Publish what this turn appended, then post the acks held for it."""
        c = self.commit
        if c.publish_due:
            c.publish_due = False
            self._publish()
        if c.held:
            for src, ack in c.held:
                self.post(src, ack)
            c.held.clear()

    # -- KIP-890 verification (TransactionVerifier's actions) -----------------------------------------
    def _park(self, src: str, req_id: int, acks: int, version: int, mv: memoryview, tlen: int,
              batch: memoryview, h) -> None:
        txn_id = bytes(mv[ipc.PRODUCE_HDR.size:ipc.PRODUCE_HDR.size + tlen]).decode() if tlen else ""
        self._carry_out(self.verifier.park(Parked(src, req_id, acks, version, txn_id,
                                                  bytearray(batch)), h, time.monotonic()))

    def _verified(self, req_id: int, resp: VerifyPartitionResult) -> None:
        """The coordinator's answer to a verification (the only answer a writer gets): each
        action is carried out before the verifier decides the next (``verified``)."""
        self._carry_out(self.verifier.verified(req_id, resp.error, time.monotonic()))

    def _carry_out(self, actions) -> None:
        now_ms = None                # the appends' clock, read once
        for action in actions:
            match action:
                case AppendParked(p, h):
                    if now_ms is None:
                        now_ms = _now_ms()
                    self._append(p.src, p.req_id, p.acks, p.batch, h, now_ms)
                case FailParked(p, code):
                    self._refuse(p.src, p.acks, p.req_id, code, action.message)
                case AskCoordinator(req_id, txn_id, pid, epoch, add):
                    self.reply(COORDINATOR, req_id, VerifyPartitionRequest(
                        txn_id, pid, epoch, self.ctx.topic, self.ctx.index, add=add))

    # -- markers and the other requests (msgpack envelopes on the same rings) ---------------------------
    @serves(ipc.WriteMarkerRequest, late=True)
    def _marker(self, m: ipc.WriteMarkerRequest, respond: Responder) -> None:
        code, end = self.markers.write(m, _now_ms())
        result = ipc.WriteMarkerResult(code)
        if code == ErrorCode.none:
            c = self.commit
            c.publish_due = True                 # the LSO moved
            if c.must_wait(end):
                # answered once the marker is durable, like an acks=-1 batch
                c.wait(end, respond.src, ipc.encode(respond.req_id, result))
                return
        respond(result)

    @serves(ipc.DeleteRecordsRequest)
    def _delete_records(self, req: ipc.DeleteRecordsRequest) -> ipc.DeleteRecordsResult:
        result, moved = self.partition.delete_records(req.offset)
        if moved:
            self._publish()
        return result

    @serves(cm.CleanerSwapRequest)
    def _cleaner_swap(self, req: cm.CleanerSwapRequest) -> cm.CleanerSwapResult:
        result, swapped = self.partition.cleaner_swap(req, self.cfg.log.segment_delete_delay_ms / 1000)
        if swapped:
            self.commit.publish_due = True       # readers re-list at the new segments_version
        return result

    # -- group commit and the page ----------------------------------------------------------------
    def _flush_and_reply(self, force: bool = False) -> None:
        """Start a group commit when ``GroupCommit`` says so, post the answers whose batches are
        durable (``flush_outboxes`` hands them to the rings)."""
        fl = self.flusher
        if fl.error is not None:
            raise fl.error           # durability unknown: die; recovery decides, nothing acked
        if fl.completed != self.flushes_seen:
            self.flushes_seen = fl.completed
            self.flush_hist.observe_us(fl.last_us)
        c = self.commit
        if force:
            self.log.flush()         # synchronous, at shutdown
            fl.durable = max(fl.durable, self.log.log_end_offset)
        elif c.flush_due(time.monotonic(), self.log.log_end_offset):
            fl.start(*self.log.flush_target())
        if c.waiting:
            for dst, answer in c.durable_answers():
                self.post(dst, answer)

    def _publish(self, **extra) -> None:
        lg = self.log
        self.page.publish(high_watermark=lg.log_end_offset,
                          last_stable_offset=self.partition.last_stable_offset(),
                          log_start_offset=lg.log_start_offset,
                          active_base_offset=lg.active_segment_base,
                          active_end_position=lg.active_end_position,
                          segments_version=lg.segments_version,
                          first_unstable_offset=self.psm.first_unstable_offset(), **extra)
        mv = self.mv
        if lg.segments_version != self.segments_seen:
            self.segments_seen = lg.segments_version
            self.sealed_bytes = lg.size_in_bytes() - lg.active_end_position
            mv[self.k_segments] = len(lg.segment_bases())
        mv[self.k_size] = self.sealed_bytes + lg.active_end_position
        mv[self.k_producers] = len(self.psm.entries)
        # Wake fetchers that parked a long-poll on this partition (their flag byte is set).
        flags = self.page.flags()
        for j, path in enumerate(self.fetcher_bells):
            if flags[j]:
                self.bells.ring(path)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _idle_wait(cfg: Config) -> float:
    return min(IDLE_WRITER_WAIT_S, cfg.supervisor.heartbeat_timeout_ms / 4000)
