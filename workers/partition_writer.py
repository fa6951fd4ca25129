"""Partition writer: the one writer of one partition, inside the writer process that carries it.

Runs in a writer process (``workers/writer_process.py``), which carries one or more partitions
and owns what they share (the rings, doorbell, heartbeat, flusher thread and metrics table; see
docs/architecture.md, "Writer processes and their rings"). A ``PartitionWriter`` owns its
partition's ``PartitionLog`` (segments, offset, time and transaction indexes, log start offset)
and ``ProducerStateManager`` (sequence windows, open transactions, LSO) through
``appliance.log.partition.Partition``, and publishes its high watermark, LSO, log start and
active-segment end in the partition's state page. Single-threaded, like its process (the flush
thread only runs fdatasync; see appliance/log/flusher.py): no locks on the write path.

A shell: it moves bytes between its process's rings and the log and carries out what the
partition's sans-IO collaborators (``appliance/log/``) decide:

* ``Partition``: DeleteRecords, DescribeProducers, KIP-939 fences, the cleaner's begin and swap,
  retention and rolls, topic settings; the slot of the KIP-932 share-group state;
* ``TransactionVerifier`` (KIP-890): which parked batch to append, which request to fail with
  which error, which question to ask the coordinator, when to ask again (its actions);
* ``MarkerWriter``: COMMIT/ABORT markers, indexed before the producer state takes them and taken
  back out of the log when the index entry cannot be written (a full disk);
* ``GroupCommit``: when each answer may leave (after the publish, after the fsync) and when to
  start a flush.

Per batch (``produce_request``, called by the process's drain for each produce record that names
this partition): check the generation, patch nothing but the base offset in place, one pwrite
into the segment (``PartitionLog.append``), the producer state, the ack held for the publish.
The fast path (a non-transactional batch, or one of a producer whose transaction is open here)
takes no action object and no call beyond the append's: its two gates (KIP-939 fence, KIP-890
park) read the collaborators' dicts inline; only what they catch goes to the collaborators. The
process publishes each partition that appended once per drain, then posts the acks.

Topic configs apply live: the process follows the published catalog and hands each partition
its topic's ``LogSettings`` (``Catalog.settings``); a changed retention is enforced at once.

A full disk (issue 17): appends answer KAFKA_STORAGE_ERROR and leave the log and the producer
state as they were; retention and time-based rolls that fail are tried again every tick; a
failed abort marker is taken back (``MarkerWriter``). Only what leaves durability unknown (a
failed fsync, the flusher's error, ``LogDirFailure``) stops the writer process, whose recovery
then decides; a partition that cannot open on a full disk waits RECOVERING for space.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from appliance import ipc
from appliance.config import Config
from appliance.catalog.model import partition_metadata
from appliance.data_layout import PARTITION_METADATA_FILE, partition_dir
from appliance.durable import DeferredSync, atomic_write
from appliance.errors import ErrorCode, KafkaError
from appliance import testhooks
from appliance.log.cleaner import messages as cm
from appliance.log.flusher import Flusher
from appliance.log.group_commit import GroupCommit, policy_of
from appliance.log.hanging import HangingWatch
from appliance.log.markers import MarkerWriter
from appliance.log.partition import Partition, load_producer_state
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.verification import (AppendParked, AskCoordinator, FailParked, Parked,
                                        TransactionVerifier)
from appliance.metrics import Histogram, key
from appliance.protocol.records import read_header
from appliance.runtime import COORDINATOR, PARTITION_PAGE_FIELDS, READY, RECOVERING, STOPPED, writer_name
from appliance.service import Responder
from appliance.txn.messages import VerifyPartitionRequest, VerifyPartitionResult
from shm.metrics import MetricsTable
from shm.statepage import StatePage
from shm.topology import Topology

log = logging.getLogger("appliance.writer")


class CannotOpen(Exception):
    """The partition's log cannot be opened (not a full disk): on a first start, a boot error."""


class PartitionWriter:
    """One partition's writer (see the module docstring). ``proc`` is its writer process:
    ``post``, ``reply``, ``bells``, ``topo``, ``cfg``, ``metrics``, ``generation``, the flush
    thread, the shared request ids, and ``ring_fetchers``."""

    def __init__(self, proc, topic: str, topic_id: bytes, index: int,
                 overrides: dict[str, str]) -> None:
        self.proc = proc
        self.topic = topic
        self.topic_id = topic_id
        self.index = index
        self.key = (topic_id, index)
        self.name = writer_name(topic_id, index)
        self.gen = proc.generation
        self.log: PartitionLog | None = None
        self.page = StatePage.open(proc.topo.page_path(self.name), PARTITION_PAGE_FIELDS)
        # The topic's configs over the broker defaults (Catalog.overrides), as the catalog has them.
        self.overrides: dict[str, str] = dict(overrides)
        # The topic's flush.messages / flush.ms, defaulting to [log.flush].
        policy, interval_s, messages = policy_of(self.log_settings())
        self.commit = GroupCommit(policy, interval_s, time.monotonic(), messages)
        # Metrics (appliance.metrics), in the partition's own table (made by the supervisor with
        # its page, outliving the process's restarts): per batch two adds, per publish a few
        # stores; the per-topic series of every partition of a topic sum up.
        try:
            m = self.metrics = open_metrics(proc.topo, self.name)
        except FileNotFoundError:
            self.page.close()       # deleted between the two opens (WriterProcess skips it)
            raise
        topic_l = [("topic", topic)]
        tp = topic_l + [("partition", index)]
        self.mv = m.values
        self.k_messages = m.slot(key("kafka_server_brokertopicmetrics_messagesin", topic_l))
        self.k_bytes = m.slot(key("kafka_server_brokertopicmetrics_bytesin", topic_l))
        self.k_size = m.slot(key("kafka_log_log_size", tp))
        self.k_segments = m.slot(key("kafka_log_log_numlogsegments", tp))
        self.k_producers = m.slot(key("kafka_server_replicamanager_produceridcount"))
        self.k_recovery = m.slot(key("appliance_log_recovery_bytes", tp))
        self.flush_hist = Histogram(m, "kafka_log_logflushstats_logflushrateandtimems")
        self.flushes_seen = 0
        self.segments_seen = -1
        self.sealed_bytes = 0

    # -- life cycle -------------------------------------------------------------------------------
    def open(self) -> str | None:
        """Recover the log and the producer state, then publish the page READY. Returns None, or
        why it cannot yet on a full disk (the process tries again); ``CannotOpen`` otherwise."""
        self.page.reset_seq()
        self.page.publish(generation=self.gen, status=RECOVERING, pid=self.proc.pid)
        testhooks.pause_point("writer", "recovering")
        directory = partition_dir(self.proc.ctx.data_dir, self.topic, self.index)
        try:
            self._check_metadata(directory)
            replayed_from = self._open(directory)
        except (OSError, ValueError) as e:
            opened, self.log = self.log, None
            if opened is not None:
                opened.close(clean=False)        # writes nothing: as a crash would
                raise                            # past the log's open: a crash, as ever
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                return str(e)
            raise CannotOpen(f"cannot open partition log {directory}: {e}") from e
        self.partition = Partition(self.topic, self.index, self.log, self.psm)
        self.markers = MarkerWriter(self.partition)
        self.verifier = TransactionVerifier(self.psm, self.proc.cfg, self.gen, self.proc.request_ids)
        # The fast path's two gates read these dicts of the collaborators directly (the same
        # objects for the writer's life): no call per batch.
        self.fenced = self.partition.fenced
        self.parked = self.verifier.parked
        self.flusher = self.commit.flusher = Flusher(None, self.log.log_end_offset,
                                                     self.proc.flush_thread)
        tx = self.proc.cfg.transactions
        self.hanging = HangingWatch(self.psm, time.monotonic(), 2 * tx.max_timeout_ms / 1000,
                                    enabled=not tx.two_phase_commit_enable)
        self.publish(status=READY)
        log.info("%s-%d ready: log start %d, log end %d, LSO %d, %d producers (replayed from %d), "
                 "generation %d", self.topic, self.index, self.log.log_start_offset,
                 self.log.log_end_offset, self.psm.last_stable_offset(self.log.log_end_offset),
                 len(self.psm.entries), replayed_from, self.gen)
        return None

    def _check_metadata(self, directory: str) -> None:
        """Kafka's partition.metadata, written again (fsynced) when missing or not this topic's:
        the supervisor writes it unsynced (its catalog commit is the durable point), so a crash
        may have lost it."""
        path = os.path.join(directory, PARTITION_METADATA_FILE)
        want = partition_metadata(self.topic_id)
        try:
            with open(path, "rb") as f:
                if f.read() == want:
                    return
        except FileNotFoundError:
            if not os.path.isdir(directory):
                return                        # no directory: the log's open says so
        atomic_write(path, want)

    def _open(self, directory: str) -> int:
        """Recover the log and the producer state; the offset the replay started from."""
        self.log = None
        self.mv[self.k_recovery] = 0            # bytes checked by this try (a retry starts over)

        def progress(nbytes: int) -> None:
            self.mv[self.k_recovery] += nbytes

        self.log = PartitionLog.open(directory, self.log_settings(), _now_ms(), progress)
        self.psm = ProducerStateManager(directory, self.proc.cfg.transactions.producer_id_expiration_ms)
        replayed_from = load_producer_state(self.log, self.psm, _now_ms())
        self.log.crash_hook = testhooks.hook("writer")
        return replayed_from

    def log_settings(self) -> LogSettings:
        """Broker defaults (``[log]``) overlaid with the topic's own configs: a default changed
        by a reload applies to topics that do not override it, as Kafka's dynamic defaults do."""
        return LogSettings.from_config(self.proc.cfg.log, self.overrides)

    def reload(self, old: Config, new: Config) -> bool:
        """The process's reload, for this partition; True when its log was flushed at once (the
        flush policy stopped waiting for fsyncs) or its settings changed."""
        settings = self.log_settings()
        force_flush = self.commit.configure(*policy_of(settings))
        self.verifier.configure(new)
        self.psm.expiration_ms = new.transactions.producer_id_expiration_ms
        changed = settings != self.log.settings
        if changed:
            self.log.update_settings(settings)
        if force_flush:
            # Answers promised an fdatasync: give them one before the policy stops flushing.
            self.flush_and_reply(force=True)
        return changed

    def apply_settings(self, overrides: dict[str, str]) -> None:
        """Apply the topic's effective configs (``[log]`` under ``overrides``) now:
        ``Partition.update_settings``, and retention at once when it changed."""
        self.overrides = overrides
        settings = self.log_settings()
        if self.commit.configure(*policy_of(settings)):
            self.flush_and_reply(force=True)   # answers promised an fdatasync get it
        if self.partition.update_settings(settings):
            self.tick()

    def close(self, deleted: bool = False, deferred: DeferredSync | None = None) -> None:
        """A clean close (the process stops, or the partition left it), or, for a partition
        whose topic was deleted (``deleted``), a close that syncs nothing: its files go.
        ``deferred``: the process stops and makes every partition's fsyncs at once (the seal
        names the log and index files to it; no flush of its own)."""
        if self.log is None:
            return
        if deferred is not None:
            self.log.finish_txn_index_rebuild_if_pending()
        elif not deleted:
            self.log.flush()
        self.partition.close(deleted=deleted, deferred=deferred)
        self.log = None

    def stopped(self) -> None:
        self.page.publish(status=STOPPED)
        self.page.close()
        self.metrics.close()

    # -- the produce fast path --------------------------------------------------------------------
    def produce_request(self, src: str, mv: memoryview, now_ms: int) -> None:
        _, _, acks, gen, req_id, blen, version, tlen, _, _ = ipc.PRODUCE_HDR.unpack_from(mv, 0)
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

    # -- answers that appended nothing (off the fast path) ----------------------------------------
    def _refuse(self, src: str, acks: int, req_id: int, code: ErrorCode,
                message: str | None = None) -> None:
        self._reply(src, acks, 0, ipc.produce_ack(
            int(code), self.gen, req_id, -1, -1, self.log.log_start_offset, message))

    def _reply(self, src: str, acks: int, end: int, ack: bytes) -> None:
        if self.commit.reply(src, acks, end, ack):
            self.proc.post(src, ack)

    def publish_and_release(self) -> None:
        """Publish what this turn appended, then post the acks held for it."""
        c = self.commit
        if c.publish_due:
            c.publish_due = False
            self.publish()
        if c.held:
            post = self.proc.post
            for src, ack in c.held:
                post(src, ack)
            c.held.clear()

    # -- KIP-890 verification (TransactionVerifier's actions) -------------------------------------
    def _park(self, src: str, req_id: int, acks: int, version: int, mv: memoryview, tlen: int,
              batch: memoryview, h) -> None:
        txn_id = bytes(mv[ipc.PRODUCE_HDR.size:ipc.PRODUCE_HDR.size + tlen]).decode() if tlen else ""
        self.carry_out(self.verifier.park(Parked(src, req_id, acks, version, txn_id,
                                                 bytearray(batch)), h, time.monotonic()))

    def verified(self, req_id: int, resp: VerifyPartitionResult) -> None:
        """The coordinator's answer to a verification: each action is carried out before the
        verifier decides the next (``verified``)."""
        self.carry_out(self.verifier.verified(req_id, resp.error, time.monotonic()))

    def carry_out(self, actions) -> None:
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
                    self.proc.asked(req_id, self)
                    self.proc.reply(COORDINATOR, req_id, VerifyPartitionRequest(
                        txn_id, pid, epoch, self.topic, self.index, add=add))

    # -- markers and the other requests (routed here by the process) ------------------------------
    def marker(self, m: ipc.WriteMarkerRequest, respond: Responder) -> None:
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

    def delete_records(self, req: ipc.DeleteRecordsRequest) -> ipc.DeleteRecordsResult:
        result, moved = self.partition.delete_records(req.offset)
        if moved:
            self.publish()
        return result

    def cleaner_swap(self, req: cm.CleanerSwapRequest) -> cm.CleanerSwapResult:
        result, swapped = self.partition.cleaner_swap(
            req, self.log.settings.file_delete_delay_ms / 1000)
        if swapped:
            self.commit.publish_due = True       # readers re-list at the new segments_version
        return result

    # -- timers -------------------------------------------------------------------------------------
    def turn(self, now: float) -> None:
        """Per-turn work while something is pending: overdue verifications, the publish and its
        acks, the group commit, retired files of a swap."""
        if self.verifier.verifying:
            self.carry_out(self.verifier.expire(now))
        self.publish_and_release()
        self.flush_and_reply()
        if self.log.has_retired:
            self.log.delete_retired()

    def pending(self, now: float) -> bool:
        """Whether the next turns still have work here (else the process stops turning it)."""
        c = self.commit
        return bool(self.verifier.verifying or c.publish_due or c.held or c.waiting
                    or self.flusher.busy or self.log.has_retired
                    or c.flush_wait(now, self.log.log_end_offset) is not None)

    def wait_timeout(self, now: float) -> float | None:
        """How long the process may sleep for this partition's sake (None: as long as it likes)."""
        timeout = self.commit.flush_wait(now, self.log.log_end_offset)
        deadline = self.verifier.next_deadline()
        if deadline is not None:
            d = max(0.0, deadline - now)
            timeout = d if timeout is None else min(timeout, d)
        return timeout

    def tick(self) -> None:
        """Retention and rolls (the process's tick, every ``log.retention_check_interval_ms``),
        and the hanging transactions found at the open (``appliance.log.hanging``)."""
        if self.partition.tick(_now_ms()):
            self.publish()
        for h in self.hanging.due(self.psm, time.monotonic()):
            code, _ = self.markers.write(ipc.WriteMarkerRequest(
                h.producer_id, h.producer_epoch, False, h.coordinator_epoch, self.topic_id, self.index),
                _now_ms())
            log.warning("%s-%d: transaction of producer %d (epoch %d) open since offset %d when the "
                        "partition opened, untouched for %.0f s (twice transactions.max_timeout_ms): "
                        "hanging (no coordinator knows it, as after a power cut under flush policy "
                        "os); aborted: %s", self.topic, self.index, h.producer_id, h.producer_epoch,
                        h.first_offset, h.open_s, code.name)
            if code == ErrorCode.none:
                self.commit.publish_due = True       # the LSO moved

    # -- group commit and the page ------------------------------------------------------------------
    def flush_and_reply(self, force: bool = False) -> None:
        """Start a group commit when ``GroupCommit`` says so, post the answers whose batches are
        durable (the process's ``flush_outboxes`` hands them to the rings)."""
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
            post = self.proc.post
            for dst, answer in c.durable_answers():
                post(dst, answer)

    def publish(self, **extra) -> None:
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
        # Wake fetchers that parked a long-poll on this partition (their flag byte is set): the
        # process rings each fetcher once per turn.
        flags = self.page.flags()
        ring = self.proc.fetchers_due
        for j in range(len(self.proc.fetcher_bells)):
            if flags[j]:
                ring.add(j)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def open_metrics(topo: Topology, name: str) -> MetricsTable:
    """The partition's metrics table (made by the supervisor with its page); a private one when
    it is missing, so that counting code never has to ask."""
    try:
        return MetricsTable.open(topo.metrics_path(name))
    except FileNotFoundError:
        return MetricsTable.anonymous(16)
