"""Partition writer: the one process that writes one partition.

Runs as a child of the supervisor, one per partition. Owns that partition's ``PartitionLog``
(segments, offset, time and transaction indexes, log start offset) and its
``ProducerStateManager`` (sequence windows, open transactions, LSO), and publishes its high
watermark, LSO, log start and active-segment end in the partition's state page. Single-threaded
(the flusher thread only runs fdatasync; see appliance/log/flusher.py): no locks on the write path.

Loop (the worker base's, ``workers.base.Worker``; this module supplies its hooks, and its own
``drain_inputs`` as the produce fast path): drain every input ring (produce requests from each
frontend; markers and verification answers from the coordinator), append each batch (patch the base
offset in place in the ring, then one pwrite into the segment), publish the new high watermark and
LSO once for the whole group, start a group commit if acks wait for one, then put the acks into
each frontend's ack ring and ring the bells of those that sleep. Wake fetchers parked on this
partition. Sleep on the doorbell when there is nothing to do.

Topic configs apply live: the writer follows the published catalog (its topic's overrides over
the dynamic broker configs, ``Catalog.overrides``) and hands changed ``LogSettings`` to its log,
enforcing a changed retention at once. DeleteRecords moves the log start offset here
(``PartitionLog.delete_records``: persisted, then whole segments below it deleted).

Transactions (docs/transactions.md): a transactional batch from a producer with no open
transaction on this partition is parked, with every later batch of that producer, until the
coordinator confirms (KIP-890 part 1: verify only) or performs (part 2, Produce v12: implicit add)
that the partition belongs to the producer's transaction. A marker arriving meanwhile voids the
confirmation (the race guard), and the batch is refused with INVALID_TXN_STATE. An implicit add
that meets the previous transaction's markers still on their way (CONCURRENT_TRANSACTIONS) is
asked again, with a new guard, every ``add_partitions_retry_backoff_ms`` for up to
``add_partitions_retry_backoff_max_ms`` before the client is told, as Kafka's ReplicaManager does
for clients of transaction version 2: a Produce is costly to retry and the client's backoff long.

A full disk (issue 17): appends answer KAFKA_STORAGE_ERROR and leave the log and the producer
state as they were; retention and time-based rolls that fail are tried again every tick; an
abort marker is indexed before the producer state takes it and taken back out of the log when its
index entry cannot be written. Only what leaves durability unknown (a failed fsync, the flusher's
error, ``LogDirFailure``) stops the writer, whose recovery then decides.
"""

from __future__ import annotations

import collections
import errno
import itertools
import logging
import time
from dataclasses import dataclass

from appliance import ipc
from appliance.catalog import partition_dir
from appliance.config import Config
from appliance.errors import ErrorCode, KafkaError
from appliance import testhooks
from appliance.log import swap
from appliance.log.cleaner import messages as cm
from appliance.log.flusher import Flusher
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.txn_index import AbortedTxn
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

# KIP-890 verification failures as a producer sees them (Kafka's ReplicaManager and
# AddPartitionsToTxnManager): retriable coordinator trouble becomes NOT_ENOUGH_REPLICAS, which old
# clients retry without a metadata refresh (CONCURRENT_TRANSACTIONS only for Produce before v12).
_VERIFY_ERRORS = {
    ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
    ErrorCode.transaction_abortable: ErrorCode.invalid_txn_state,
    ErrorCode.concurrent_transactions: ErrorCode.not_enough_replicas,
    ErrorCode.network_exception: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_load_in_progress: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_not_available: ErrorCode.not_enough_replicas,
    ErrorCode.not_coordinator: ErrorCode.not_enough_replicas,
    ErrorCode.request_timed_out: ErrorCode.not_enough_replicas,
}


def main(ctx: WorkerContext) -> int:
    return PartitionWriter(ctx).main()


@dataclass
class Parked:
    """A produce request waiting for its partition to be verified (a copy of the batch: the ring
    slot it came in is reused)."""
    src: str
    req_id: int
    acks: int
    version: int
    txn_id: str
    batch: bytearray


@dataclass
class Verifying:
    req_id: int | None       # the question in flight; None: waiting to ask again
    token: object            # the KIP-890 guard of the question in flight
    deadline: float          # when its answer is overdue, or (req_id None) when to ask again
    started: float           # the first question: the retries' window counts from it


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
        self.policy = self.cfg.log.flush.policy
        self.flush_interval = self.cfg.log.flush.interval_ms / 1000
        self.last_flush = time.monotonic()
        # Replies waiting for their batch or marker to be durable: (end offset, peer, reply).
        self.await_flush: list[tuple[int, str, bytes]] = []
        # Acks of appends not yet on the state page: posted right after the turn's publish, so
        # that a client that fetches what it was told is written finds it (Kafka moves the
        # leader's log end offset before it answers; regression: a Fetch right after an acks=1
        # answer got OFFSET_OUT_OF_RANGE while the ring carried the ack ahead of the page).
        self.held_acks: list[tuple[str, bytes]] = []
        self.tick_s = self.cfg.log.retention_check_interval_ms / 1000   # retention and rolls
        self.next_tick = time.monotonic() + self.tick_s
        self.verify_enabled = self.cfg.transactions.partition_verification_enable
        self.verify_timeout = self.cfg.server.internal_request_timeout_ms / 1000
        self._retry_settings(self.cfg)
        self.idle_wait = _idle_wait(self.cfg)
        self.parked: dict[int, collections.deque[Parked]] = {}     # by producer id
        self.verifying: dict[int, Verifying] = {}                  # by producer id
        self.fenced: dict[int, int] = {}                           # producer id -> lowest epoch allowed
        self.verify_reqs: dict[int, int] = {}                      # request id -> producer id
        self._ids = itertools.count(((self.gen & 0xFFFF) << 40) | 1)
        self.dirty = False                   # something to publish this turn
        self.next_catalog_check = 0.0
        self.catalog_seen = -1
        # The topic's configs over the broker defaults (Catalog.overrides), as the catalog has them.
        self.overrides: dict[str, str] = dict(ctx.topic_configs)
        self._tick_problem: str | None = None
        self._marker_trouble = False         # an abort marker failed (full disk): logged once
        self.serve(self, on_answer=self._verified)
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
        # Producer state: the newest snapshot plus a replay of the batches after it, which also
        # rebuilds the aborted-transaction index of the segments recovery had to scan.
        self.psm = ProducerStateManager(directory, self.cfg.transactions.producer_id_expiration_ms)
        rebuild_from = self.log.txn_index_rebuild_from

        def rebuilt(done, lso):
            if done.aborted and done.last_offset >= rebuild_from:
                self.log.append_aborted(AbortedTxn(done.producer_id, done.first_offset,
                                                   done.last_offset, lso))

        # Replay must start at or below the first segment whose index recovery dropped, or the
        # entries of its aborts would never come back.
        replayed_from = self.psm.load(self.log.log_end_offset, self.log.headers_from, _now_ms(),
                                      on_completed=rebuilt, max_start_offset=rebuild_from)
        self.log.finish_txn_index_rebuild()
        # Producer snapshots at each roll (Kafka's onSegmentRolled), so that a recovery
        # replays from the newest segment rather than from an older snapshot.
        # At a roll the recovery point's checkpoint comes right after and fsyncs the directory.
        self.log.roll_listener = lambda offset: self.psm.take_snapshot(offset, sync_dir=False)
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
        own_bell = self.topo.bell_path(self.ctx.name)
        waker = self.waker = BellSender()   # the flusher thread's own socket
        self.flusher = Flusher(lambda: waker.ring(own_bell), self.log.log_end_offset)
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

    def reload(self, old, new) -> None:
        waited = self.policy.ack_waits_for_sync
        self.policy = new.log.flush.policy
        self.flush_interval = new.log.flush.interval_ms / 1000
        self.verify_enabled = new.transactions.partition_verification_enable
        self.verify_timeout = new.server.internal_request_timeout_ms / 1000
        self._retry_settings(new)
        self.idle_wait = _idle_wait(new)
        self.psm.expiration_ms = new.transactions.producer_id_expiration_ms
        if new.log.retention_check_interval_ms != old.log.retention_check_interval_ms:
            self.tick_s = new.log.retention_check_interval_ms / 1000
            self.next_tick = min(self.next_tick, time.monotonic() + self.tick_s)
        settings = self._log_settings()
        if settings != self.log.settings:
            self.log.update_settings(settings)
            self.next_tick = time.monotonic()        # retention and rolls under the new values
        if waited and not self.policy.ack_waits_for_sync and self.await_flush:
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
        self._close_log()

    def _close_log(self) -> None:
        """Snapshot (no replay after a clean stop) and seal the log. On a full disk both are
        given up, never the stop: the next open replays and recovers the tail, as after a crash
        (the log itself is already in the page cache)."""
        try:
            self.psm.take_snapshot(self.log.log_end_offset)
            self.log.close(clean=True)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("%s-%d: file system full at stop: closing without the clean-shutdown "
                        "marker (the next start recovers the tail)", self.ctx.topic, self.ctx.index)

    # -- one loop turn --------------------------------------------------------------------------
    def drain_inputs(self) -> bool:
        return self._drain_inputs()

    def on_turn(self, now: float) -> None:
        self._expire_verifications()
        self._publish_and_release()
        self._flush_and_reply()
        if self.log.has_retired:
            self.log.delete_retired()
        if now >= self.next_catalog_check:
            self.next_catalog_check = now + CATALOG_CHECK_S
            self._follow_catalog()

    def on_tick(self, now: float) -> None:
        changed = False
        try:
            changed = self.log.enforce_retention(_now_ms())
            changed = self.log.maybe_roll(_now_ms()) or changed
        except OSError as e:
            # A full disk (or a failed checkpoint write): retention and the time-based roll are
            # tried again at the next tick; appends meanwhile answer KAFKA_STORAGE_ERROR.
            self._tick_trouble(str(e))
        else:
            self._tick_trouble(None)
        self.psm.expire(_now_ms())
        if changed:
            self._publish()

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
        segment size and index interval to the active segment, retention at once (a smaller
        retention.ms deletes its segments now, not at the next check), the rest to what
        follows."""
        self.overrides = overrides
        new = self._log_settings()
        old = self.log.settings
        if new == old:
            return
        changed = {f: getattr(new, f) for f in new.__struct_fields__ if getattr(new, f) != getattr(old, f)}
        log.info("%s-%d: settings changed: %s", self.ctx.topic, self.ctx.index,
                 ", ".join(f"{k}={v}" for k, v in changed.items()))
        self.log.update_settings(new)
        if changed.keys() & {"retention_ms", "retention_bytes", "segment_ms", "cleanup_policy",
                             "max_compaction_lag_ms"}:
            self.on_tick(time.monotonic())

    # -- DeleteRecords ------------------------------------------------------------------------------
    @serves(ipc.DeleteRecordsRequest)
    def _delete_records(self, req: ipc.DeleteRecordsRequest) -> ipc.DeleteRecordsResult:
        """Kafka's Partition.deleteRecordsOnLeader: -1 means the high watermark; an offset past
        it is OFFSET_OUT_OF_RANGE; one below the log start changes nothing. The answer is the
        log start offset after it (the low watermark)."""
        if not self.log.settings.delete:
            # Kafka's Partition.deleteRecordsOnLeader: only a log whose policy deletes.
            return ipc.DeleteRecordsResult(
                ErrorCode.policy_violation, -1,
                f"Records of partition {self.ctx.topic}-{self.ctx.index} can not be deleted due "
                f"to the configured policy")
        hw = self.log.log_end_offset
        offset = hw if req.offset == -1 else req.offset
        if offset < 0 or offset > hw:
            return ipc.DeleteRecordsResult(
                ErrorCode.offset_out_of_range, -1,
                f"Cannot increment the log start offset to {offset} of partition "
                f"{self.ctx.topic}-{self.ctx.index} since it is larger than the high watermark {hw}"
                if offset > hw else f"The offset {offset} is not valid")
        try:
            moved = self.log.delete_records(offset)
        except OSError as e:
            # The new log start could not be persisted (a full disk): nothing changed.
            return ipc.DeleteRecordsResult(ErrorCode.kafka_storage_error, -1,
                                           f"cannot persist the log start offset: {e}")
        if moved:
            log.info("%s-%d: records below %d deleted (DeleteRecords)", self.ctx.topic,
                     self.ctx.index, offset)
            self._publish()
        return ipc.DeleteRecordsResult(ErrorCode.none, self.log.log_start_offset)
    def _tick_trouble(self, problem: str | None) -> None:
        """Log a failing retention/roll once, and once when it works again."""
        if problem is not None and self._tick_problem is None:
            log.warning("%s-%d: retention or time-based roll failed (tried again each tick): %s",
                        self.ctx.topic, self.ctx.index, problem)
        elif problem is None and self._tick_problem is not None:
            log.info("%s-%d: retention and rolls work again", self.ctx.topic, self.ctx.index)
        self._tick_problem = problem

    def check_config(self) -> None:
        # The supervisor's page moved (a catalog or configuration published, and our bell rung
        # for it): look at the catalog at this turn, not at the next CATALOG_CHECK_S.
        super().check_config()
        self.next_catalog_check = 0.0

    def wait_timeout(self, now: float) -> float:
        timeout = self.idle_wait
        if self.policy.periodic and self.flusher.durable < self.log.log_end_offset:
            # Capped like every wait: the loop must come round to beat its heartbeat and to
            # see SIGTERM (a sleep of a long interval_ms had the writer killed for both).
            timeout = min(timeout, max(0.0, self.last_flush + self.flush_interval - now))
        if self.verifying:
            timeout = min(timeout, max(0.0, min(v.deadline for v in self.verifying.values()) - now))
        return timeout

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

    # -- produce ----------------------------------------------------------------------------------
    def _produce_request(self, src: str, mv: memoryview, now_ms: int) -> None:
        _, _, acks, gen, req_id, blen, version, tlen = ipc.PRODUCE_HDR.unpack_from(mv, 0)
        start = ipc.PRODUCE_HDR.size + tlen
        if gen != self.gen:
            # Addressed to a predecessor that died: the frontend has already answered the client.
            self._reply_produce(src, acks, 0, ipc.produce_ack(
                int(ErrorCode.not_leader_or_follower), self.gen, req_id, -1, -1, self.log.log_start_offset))
            return
        txn_id = bytes(mv[ipc.PRODUCE_HDR.size:start]).decode() if tlen else ""
        batch = mv[start:start + blen]
        h = read_header(batch, 0)
        if self.fenced and h.producer_epoch < self.fenced.get(h.producer_id, -1):
            # KIP-939: an incarnation fenced by InitProducerId(keepPreparedTxn) (FenceProducerRequest)
            self._reply_produce(src, acks, 0, ipc.produce_ack(
                int(ErrorCode.invalid_producer_epoch), self.gen, req_id, -1, -1, self.log.log_start_offset))
            return
        if h.is_transactional and (h.producer_id in self.parked or (
                (self.verify_enabled or version >= 12) and self.psm.needs_verification(h))):
            self._park(Parked(src, req_id, acks, version, txn_id, bytearray(batch)), h)
            return
        self._append(src, req_id, acks, batch, h, now_ms)

    def _append(self, src: str, req_id: int, acks: int, batch, h, now_ms: int) -> None:
        """Sequence checks, append, producer-state update, and the ack (now or after a flush)."""
        idempotent = h.producer_id >= 0
        try:
            if idempotent:
                dup = self.psm.check(h)
                if dup is not None:
                    # A retry of a batch already in the log: its original offsets, nothing appended.
                    lat = dup.timestamp if self.log.settings.log_append_time else -1
                    self._reply_produce(src, acks, dup.last_offset + 1, ipc.produce_ack(
                        0, self.gen, req_id, dup.first_offset, lat, self.log.log_start_offset))
                    return
            info = self.log.append(batch, now_ms)
        except KafkaError as e:
            self._reply_produce(src, acks, 0, ipc.produce_ack(
                int(e.code), self.gen, req_id, -1, -1, self.log.log_start_offset, e.message))
            return
        if idempotent:
            self.psm.update(h, info.base_offset, now_ms,
                            info.log_append_time if info.log_append_time >= 0 else h.max_timestamp)
        mv = self.mv
        mv[self.k_messages] += info.last_offset - info.base_offset + 1
        mv[self.k_bytes] += len(batch)
        self.dirty = True
        self._reply_produce(src, acks, info.last_offset + 1, ipc.produce_ack(
            0, self.gen, req_id, info.base_offset, info.log_append_time, self.log.log_start_offset))

    def _reply_produce(self, src: str, acks: int, end: int, ack: bytes) -> None:
        if acks == 0:
            return
        if acks == -1 and end > self.flusher.durable and self.policy.ack_waits_for_sync:
            # Also a duplicate whose original is not durable yet: never ack more than the disk holds.
            self.await_flush.append((end, src, ack))
        elif self.dirty:
            self.held_acks.append((src, ack))       # after the publish (see held_acks)
        else:
            self.post(src, ack)

    def _publish_and_release(self) -> None:
        """Publish what this turn appended, then post the acks held for it."""
        if self.dirty:
            self.dirty = False
            self._publish()
        if self.held_acks:
            for src, ack in self.held_acks:
                self.post(src, ack)
            self.held_acks.clear()

    # -- KIP-890 verification ---------------------------------------------------------------------
    def _retry_settings(self, cfg: Config) -> None:
        self.add_retry_s = cfg.transactions.add_partitions_retry_backoff_ms / 1000
        self.add_retry_max_s = cfg.transactions.add_partitions_retry_backoff_max_ms / 1000

    def _park(self, p: Parked, h) -> None:
        pid = h.producer_id
        queue = self.parked.setdefault(pid, collections.deque())
        queue.append(p)
        if pid in self.verifying:
            return
        if not p.txn_id:
            self._fail_parked(pid, ErrorCode.transactional_id_authorization_failed)
            return
        self._ask(pid, p, h, time.monotonic())

    def _ask(self, pid: int, p: Parked, h, started: float) -> None:
        """Ask the coordinator about the first parked batch of ``pid``, under a new guard."""
        req_id = next(self._ids)
        token = self.psm.start_verification(pid, h.producer_epoch)
        self.verifying[pid] = Verifying(req_id, token, time.monotonic() + self.verify_timeout, started)
        self.verify_reqs[req_id] = pid
        self.reply(COORDINATOR, req_id, VerifyPartitionRequest(
            p.txn_id, pid, h.producer_epoch, self.ctx.topic, self.ctx.index, add=p.version >= 12))

    def _verified(self, req_id: int, resp: VerifyPartitionResult) -> None:
        """The coordinator's answer to a verification (the only answer a writer gets)."""
        pid = self.verify_reqs.pop(req_id, None)
        if pid is None:
            return                           # timed out earlier and answered already
        v = self.verifying.pop(pid)
        held = self.parked.get(pid)
        # An implicit add (KIP-890 part 2) that met the previous transaction's markers.
        add_concurrent = (resp.error == ErrorCode.concurrent_transactions and bool(held)
                          and held[0].version >= 12)
        if add_concurrent:
            # Ask again after the backoff while the window lasts (Kafka's ReplicaManager
            # maybeRetryOnConcurrentTransactions; the window counts from the first question).
            now = time.monotonic()
            if now - v.started < self.add_retry_max_s:
                self.verifying[pid] = Verifying(None, None, now + self.add_retry_s, v.started)
                return
        if resp.error == ErrorCode.none and not self.psm.verification_valid(pid, v.token):
            # A marker for this producer landed between the check and now (KIP-890 race guard).
            self._fail_parked(pid, ErrorCode.invalid_txn_state)
            return
        if resp.error != ErrorCode.none:
            # Transaction version 2 clients get CONCURRENT_TRANSACTIONS itself, as Kafka's
            # ReplicaManager passes it on for them: common at a commit, and clearer.
            code = resp.error if add_concurrent else _VERIFY_ERRORS.get(resp.error, resp.error)
            self._fail_parked(pid, code)
            return
        now_ms = _now_ms()
        queue = self.parked.pop(pid, collections.deque())
        first = True                         # the batch this verification was for
        while queue:
            p = queue.popleft()
            h = read_header(p.batch, 0)
            if not first and h.is_transactional and (self.verify_enabled or p.version >= 12) \
                    and self.psm.needs_verification(h):
                # It belongs to a later transaction of this producer: verify again, in order.
                self._park(p, h)
                self.parked[pid].extend(queue)
                return
            first = False
            self._append(p.src, p.req_id, p.acks, p.batch, h, now_ms)

    def _fail_parked(self, pid: int, code: ErrorCode) -> None:
        for p in self.parked.pop(pid, ()):
            c = code
            if c == ErrorCode.invalid_txn_state and p.version > 10:
                # Kafka answers Produce v11+ with the abortable error (KafkaApis: genericError).
                c = ErrorCode.transaction_abortable
            self._reply_produce(p.src, p.acks, 0, ipc.produce_ack(
                int(c), self.gen, p.req_id, -1, -1, self.log.log_start_offset,
                f"transaction verification failed: {c.name}"))

    def _expire_verifications(self) -> None:
        if not self.verifying:
            return
        now = time.monotonic()
        for pid, v in list(self.verifying.items()):
            if v.deadline > now:
                continue
            if v.req_id is None:             # the backoff of a retried add is over
                p = self.parked[pid][0]
                self._ask(pid, p, read_header(p.batch, 0), v.started)
                continue
            del self.verifying[pid]
            self.verify_reqs.pop(v.req_id, None)
            self._fail_parked(pid, ErrorCode.not_enough_replicas)

    # -- markers and other requests ------------------------------------------------------------
    # msgpack requests on the same rings: markers and KIP-939 fences from the coordinator,
    # DescribeProducers and WriteTxnMarkers from frontends.

    @serves(ipc.WriteMarkerRequest, late=True)
    def _marker(self, m: ipc.WriteMarkerRequest, respond: Responder) -> None:
        code, end = self._write_marker(m, _now_ms())
        result = ipc.WriteMarkerResult(code)
        if code == ErrorCode.none and self.policy.ack_waits_for_sync and end > self.flusher.durable:
            # answered once the marker is durable, like an acks=-1 batch
            self.await_flush.append((end, respond.src, ipc.encode(respond.req_id, result)))
        else:
            respond(result)

    @serves(ipc.FenceProducerRequest)
    def _fence(self, msg: ipc.FenceProducerRequest) -> None:
        if msg.producer_epoch > self.fenced.get(msg.producer_id, -1):
            self.fenced[msg.producer_id] = msg.producer_epoch

    @serves(ipc.DescribeProducersRequest)
    def _describe_producers(self, msg: ipc.DescribeProducersRequest) -> ipc.DescribeProducersResult:
        return ipc.DescribeProducersResult(ErrorCode.none, [
            ipc.ProducerInfo(e.producer_id, e.epoch, e.last_seq, e.last_timestamp,
                             e.coordinator_epoch, e.txn_first_offset)
            for e in self.psm.active()])

    def _write_marker(self, m: ipc.WriteMarkerRequest, now_ms: int) -> tuple[ErrorCode, int]:
        """Append a COMMIT/ABORT marker, end the producer's transaction here, index an abort,
        recompute the LSO. Returns (error code, offset just past the marker)."""
        try:
            self.psm.check_marker(m.producer_id, m.producer_epoch, m.coordinator_epoch)
            info = self.log.append_control(m.producer_id, m.producer_epoch, m.commit,
                                           m.coordinator_epoch, now_ms)
        except KafkaError as e:
            return e.code, 0
        if not m.commit:
            # The aborted-transaction entry, before the LSO moves past the marker (published at
            # the end of this turn) and before the producer's state takes the marker: if the
            # disk cannot take it, the marker is taken back out of the log and the coordinator,
            # answered KAFKA_STORAGE_ERROR, sends it again (Kafka's marker channel retries it).
            first, lso = self.psm.preview_completion(m.producer_id, info.base_offset,
                                                     self.log.log_end_offset)
            try:
                self.log.append_aborted(AbortedTxn(m.producer_id, first, info.last_offset, lso))
            except OSError as e:
                # Logged once while the disk stays full: the coordinator resends every marker
                # about ten times a second (regression: a full disk flooded the log with it).
                if not self._marker_trouble:
                    log.warning("%s-%d: abort marker of producer %d not written (markers are sent "
                                "again until the disk takes them; logged once): %s",
                                self.ctx.topic, self.ctx.index, m.producer_id, e)
                self._marker_trouble = True
                self.log.undo_control(info)
                return ErrorCode.kafka_storage_error, 0
            if self._marker_trouble:
                log.info("%s-%d: abort markers are written again", self.ctx.topic, self.ctx.index)
                self._marker_trouble = False
        self.psm.complete_txn(m.producer_id, m.producer_epoch, m.coordinator_epoch,
                              info.base_offset, not m.commit, now_ms)
        if m.producer_id in self.fenced and self.fenced[m.producer_id] <= m.producer_epoch:
            del self.fenced[m.producer_id]          # the marker's epoch fences it from now on
        self.dirty = True
        return ErrorCode.none, info.last_offset + 1

    # -- the cleaner (appliance.log.cleaner: it reads and writes copies; the swap is ours) --------
    @serves(cm.CleanerBeginRequest)
    def _cleaner_begin(self, req: cm.CleanerBeginRequest) -> cm.CleanerBeginResult:
        if req.cursor < 0:
            # A copy no swap of ours named: its cleaner died, or gave up, while writing it.
            swap.remove_cleaned(self.log.directory)
        items = sorted((e.producer_id, e.last_offset if e.batches else -1, e.epoch)
                       for e in self.psm.active() if e.producer_id > req.cursor)
        page = items[:cm.PRODUCERS_PER_ANSWER]
        more = page[-1][0] if len(items) > len(page) else -1
        return cm.CleanerBeginResult(ErrorCode.none, cm.pack_producers(page), more)

    @serves(cm.CleanerSwapRequest)
    def _cleaner_swap(self, req: cm.CleanerSwapRequest) -> cm.CleanerSwapResult:
        """Swap a cleaned copy in (``PartitionLog.replace_segments``). A full disk at the
        commit changes nothing and answers KAFKA_STORAGE_ERROR (the cleaner tries again after
        its back-off; the writer lives on, as for a produce on a full disk); after the commit
        nothing needs space. Another failure after the commit point is an OSError that stops
        the writer (``contain`` is off): the restart's open finishes the swap."""
        try:
            self.log.replace_segments([(base, [tuple(x) for x in old]) for base, old in req.groups],
                                      req.checkpoint, self.cfg.log.segment_delete_delay_ms / 1000)
        except swap.SwapNoSpace as e:
            log.warning("%s-%d: cleaned copies not swapped in: %s", self.ctx.topic, self.ctx.index, e)
            return cm.CleanerSwapResult(ErrorCode.kafka_storage_error, str(e))
        except swap.SwapRefused as e:
            log.info("%s-%d: cleaned copies refused: %s", self.ctx.topic, self.ctx.index, e)
            return cm.CleanerSwapResult(ErrorCode.invalid_request, str(e))
        self.dirty = True                    # readers re-list at the new segments_version
        return cm.CleanerSwapResult(ErrorCode.none)

    # -- group commit and replies ---------------------------------------------------------------
    def _flush_and_reply(self, force: bool = False) -> None:
        """Start a group commit when replies wait for one (or the interval came), release the
        replies whose batches are durable (``flush_outboxes`` hands them to the rings)."""
        fl = self.flusher
        if fl.error is not None:
            raise fl.error           # durability unknown: die; recovery decides, nothing acked
        if fl.completed != self.flushes_seen:
            self.flushes_seen = fl.completed
            self.flush_hist.observe_us(fl.last_us)
        end = self.log.log_end_offset
        now = time.monotonic()
        if force:
            self.log.flush()         # synchronous, at shutdown
            fl.durable = max(fl.durable, end)
        elif not fl.busy and fl.durable < end and (
                (self.policy.group_commit and self.await_flush)
                or (self.policy.periodic and now - self.last_flush >= self.flush_interval)):
            self.last_flush = now
            fl.start(*self.log.flush_target())
        if self.await_flush:
            durable = fl.durable
            still = []
            for item in self.await_flush:
                if item[0] <= durable:
                    self.post(item[1], item[2])
                else:
                    still.append(item)
            self.await_flush = still

    def _publish(self, **extra) -> None:
        lg = self.log
        hw = lg.log_end_offset
        # Never below the log start (Kafka's maybeIncrementFirstUnstableOffset): DeleteRecords
        # may move it past the start of an open transaction.
        lso = max(self.psm.last_stable_offset(hw), lg.log_start_offset)
        self.page.publish(high_watermark=hw, last_stable_offset=lso,
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
