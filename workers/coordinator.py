"""Coordinator worker: the transaction coordinator, and the group coordinator with its offsets.

Runs as one child of the supervisor. Owns ``<data_dir>/__coordinator/``: the transaction-state log
(``appliance.txn.state_manager``), the coordinator epoch, the producer-id blocks. The request
logic is the sans-IO ``appliance.txn.coordinator.TransactionCoordinator``; this module is its
loop: it serves the requests frontends forward, answers writers' KIP-890 verification requests,
carries marker jobs to the partition writers and their acks back, and runs the timers
(transaction timeouts, transactional-id expiration). Group and offset requests go to
``appliance.group.service.GroupService`` (``<data_dir>/__coordinator/group-log``); JoinGroup and
SyncGroup are answered when their rebalance completes, through ``_reply``.

Markers: each (job, partition) becomes a WriteMarkerReq on the ring to that partition's writer.
A marker is sent again when the writer that took it from the ring died before answering: its
generation changed and the message ends at or before the ring head the new generation started
from (``coordinator_ring_head`` in its page). A message still in the ring is left to the new
writer: resending it too would append the marker twice. A duplicate marker is harmless to readers
(Kafka's coordinator resends markers after a failover too) but moves offsets, so it is kept to
the case where the first may or may not be in the log. Markers for the
``__consumer_offsets`` partitions of AddOffsetsToTxn are applied here: the group log gets the
control record and the producer's pending transactional offsets become committed or vanish.

The generation published in this worker's state page lets frontends fail what a dead predecessor
held instead of waiting for a timeout.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass

from appliance import ipc, metrics
from appliance.catalog import PUBLISHED_FILE, CatalogView
from appliance.errors import ErrorCode
from appliance.group.service import GroupService
from appliance.runtime import (HEARTBEAT_FILE, PARTITION_PAGE_FIELDS, READY, RECOVERING, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_PAGE_FIELDS, WorkerContext, writer_name)
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, bump_coordinator_epoch
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

log = logging.getLogger("appliance.coordinator")

COORDINATOR_DIR = "__coordinator"
OFFSETS_TOPIC = "__consumer_offsets"
MARKER_RESEND_S = 15.0     # a marker taken by a live writer and never answered (last resort)
TICK_S = 0.2
METRICS_S = 1.0


def main(ctx: WorkerContext) -> int:
    return Coordinator(ctx).run()


@dataclass
class SentMarker:
    job_id: int
    partition: tuple[str, int]
    writer: str
    msg: ipc.WriteMarkerReq
    # Set by each (re)post, _post_marker:
    generation: int = 0     # the writer's generation when posted (or since seen to take over)
    deadline: float = 0.0
    raw: bytes = b""        # the posted record (identity: is it still in the outbox queue?)
    end: int = -1           # ring position just past it, -1 while unknown (it was queued)


class WriterLink:
    """The coordinator's end of one partition writer: its rings and its state page."""

    def __init__(self, topo: Topology, name: str, bells: BellSender) -> None:
        self.name = name
        self.out = Outbox(topo, "co", name, bells)
        self.page = StatePage.open(topo.page_path(name), PARTITION_PAGE_FIELDS, readonly=True)

    def generation(self) -> int:
        return self.page.read().generation


class Coordinator:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.topo = Topology(ctx.run_dir)
        self.hb = HeartbeatTable.open(os.path.join(ctx.run_dir, HEARTBEAT_FILE))
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, ctx.name)
        for fe in ctx.frontends:
            self.mailbox.add(fe)
        self.outboxes: dict[str, Outbox] = {fe: Outbox(self.topo, ctx.name, fe, self.bells)
                                            for fe in ctx.frontends}
        self.sup_page = StatePage.open(self.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS,
                                       readonly=True)
        self.catalog = CatalogView(self.topo.file_path(PUBLISHED_FILE),
                                   lambda: self.sup_page.read().catalog_version)
        self.catalog_seen = -1
        self.writers: dict[tuple[str, int], WriterLink] = {}     # (topic, partition) -> link
        self.writer_partition: dict[str, tuple[str, int]] = {}
        self.dir = os.path.join(ctx.data_dir, COORDINATOR_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.sent: dict[int, SentMarker] = {}                     # request id -> marker in flight
        self._ids = itertools.count(((ctx.generation & 0xFFFF) << 40) | 1)
        self.stop = False
        self.posted: set[str] = set()
        # KIP-939 fences sent: (partition, producer id) -> (writer generation, epoch)
        self.fenced: dict[tuple[tuple[str, int], int], tuple[int, int]] = {}
        self.fences_due = False

    # -- life cycle -----------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        page = StatePage.open(self.topo.page_path(self.ctx.name), WORKER_PAGE_FIELDS)
        page.reset_seq()
        page.publish(generation=self.ctx.generation, status=RECOVERING, pid=os.getpid())
        epoch = bump_coordinator_epoch(self.dir)
        self.tc = TransactionCoordinator(
            TransactionStateManager(self.dir, self.cfg.log.flush.policy, _now_ms()),
            ProducerIdManager(self.dir), self.cfg.transactions, epoch, _now_ms)
        self.tc.load()
        self.gs = GroupService(os.path.join(self.dir, "group-log"), self.cfg.groups,
                               self.cfg.log.flush.policy, self.tc, _now_ms)
        self.gs.load()
        page.publish(status=READY)
        log.info("transaction coordinator ready: coordinator epoch %d", epoch)
        next_tick = next_metrics = 0.0
        while not self.stop:
            self.hb.beat(self.ctx.heartbeat_slot)
            self._sync_writers()
            worked = self._drain()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + TICK_S
                self.tc.tick(_now_ms())
                self._check_markers(now)
                self._send_fences()
                if now >= next_metrics:
                    next_metrics = now + METRICS_S
                    self._publish_metrics()
            self.gs.tick(_now_ms())
            self._send_marker_jobs()
            if self.fences_due:
                self._send_fences()
            self._flush()
            if self.tc.needs_restart:
                # Fenced by a newer coordinator epoch, or a log sync failed: start over from the
                # log under a new epoch (the supervisor restarts us).
                log.error("transaction coordinator must restart; exiting")
                return 1
            if not worked:
                wait = min(TICK_S, max(0.0, next_tick - time.monotonic()))
                due = self.gs.next_deadline_ms()
                if due is not None:
                    wait = min(wait, max(0.0, (due - _now_ms()) / 1000))
                self.mailbox.wait(wait)
        self.gs.close()
        return 0

    def _publish_metrics(self) -> None:
        try:
            metrics.publish(self.ctx.data_dir, "coordinator", {
                metrics.ACTIVE_TXN_OPEN_TIME_MAX: self.tc.active_transaction_open_time_max_ms()})
        except OSError as e:
            log.warning("metrics not published: %s", e)

    def _on_term(self, signum, frame) -> None:
        self.stop = True

    # -- writers ---------------------------------------------------------------------------------
    def _sync_writers(self) -> None:
        cat = self.catalog.get()
        if cat.version == self.catalog_seen:
            return
        self.catalog_seen = cat.version
        wanted = {(t.name, p): writer_name(t.topic_id, p)
                  for t in cat.topics.values() for p in range(t.partitions)}
        for key, link in list(self.writers.items()):
            if wanted.get(key) != link.name:
                del self.writers[key]
                self.writer_partition.pop(link.name, None)
                self.mailbox.remove(link.name)
                self.outboxes.pop(link.name, None)
                self.topo.forget(link.name)
        for key, name in wanted.items():
            if key in self.writers:
                continue
            try:
                link = WriterLink(self.topo, name, self.bells)
                self.mailbox.add(name)
            except FileNotFoundError:
                continue
            self.writers[key] = link
            self.writer_partition[name] = key
            self.outboxes[name] = link.out

    # -- requests ---------------------------------------------------------------------------------
    def _drain(self) -> bool:
        worked = False
        for src, ring in list(self.mailbox.inputs.items()):
            while (raw := ring.get()) is not None:
                worked = True
                try:
                    msg = ipc.decode(raw)
                except Exception:
                    log.exception("undecodable message from %s", src)
                    continue
                try:
                    reply = self._handle(src, msg)
                except Exception:
                    # A bug costs this request, never the coordinator.
                    log.exception("%s %s from %s failed", type(msg).__name__,
                                  getattr(msg, "req_id", "?"), src)
                    reply = _error_reply(msg, ErrorCode.unknown_server_error)
                if reply is not None:
                    self._reply(src, reply)
        return worked

    def _reply(self, src: str, reply) -> None:
        box = self.outboxes.get(src)
        if box is not None:
            box.post(ipc.encode(reply))
            self.posted.add(src)

    def _handle(self, src: str, msg):
        tc = self.tc
        if isinstance(msg, ipc.WriteMarkerResp):
            sent = self.sent.pop(msg.req_id, None)
            if sent is not None:
                tc.on_marker_result(sent.job_id, sent.partition, ErrorCode(msg.error_code))
            return None
        if isinstance(msg, ipc.VerifyTxnReq):
            err = tc.verify_partition(msg.transactional_id, msg.producer_id, msg.producer_epoch,
                                      (msg.topic, msg.partition), add=msg.add)
            return ipc.VerifyTxnResp(msg.req_id, int(err))
        if isinstance(msg, ipc.InitProducerIdReq):
            if msg.keep_prepared_txn:
                self.fences_due = True
            r = tc.init_producer_id(msg.transactional_id, msg.transaction_timeout_ms, msg.producer_id,
                                    msg.producer_epoch, api_version=msg.version,
                                    enable_2pc=msg.enable_2pc, keep_prepared_txn=msg.keep_prepared_txn)
            return ipc.InitProducerIdResp(msg.req_id, int(r.error), r.producer_id, r.producer_epoch,
                                          r.ongoing_producer_id, r.ongoing_producer_epoch)
        if isinstance(msg, ipc.AddPartitionsToTxnReq):
            parts = [(t.topic, p) for t in msg.topics for p in t.partitions]
            errors = tc.add_partitions(msg.transactional_id, msg.producer_id, msg.producer_epoch,
                                       parts, api_version=msg.version)
            return ipc.AddPartitionsToTxnResp(msg.req_id, [
                ipc.PartitionError(t, p, int(errors.get((t, p), ErrorCode.none))) for t, p in parts])
        if isinstance(msg, ipc.AddOffsetsToTxnReq):
            err = tc.add_offsets(msg.transactional_id, msg.producer_id, msg.producer_epoch,
                                 msg.group_id, api_version=msg.version)
            return ipc.TxnResp(msg.req_id, int(err))
        if isinstance(msg, ipc.EndTxnReq):
            r = tc.end_txn(msg.transactional_id, msg.producer_id, msg.producer_epoch, msg.commit,
                           api_version=msg.version)
            return ipc.TxnResp(msg.req_id, int(r.error), r.producer_id, r.producer_epoch)
        if self.gs.handle(src, msg, self._reply):
            return None
        if isinstance(msg, ipc.ListTransactionsReq):
            return self._list(msg)
        if isinstance(msg, ipc.DescribeTransactionsReq):
            return self._describe(msg)
        log.error("unexpected %s from %s", type(msg).__name__, src)
        return None

    def _list(self, msg: ipc.ListTransactionsReq) -> ipc.ListTransactionsResp:
        r = self.tc.list_transactions(msg.state_filters, msg.producer_id_filters, msg.duration_filter_ms,
                                      msg.transactional_id_pattern)
        return ipc.ListTransactionsResp(msg.req_id, int(r.error), list(r.unknown_state_filters), [
            ipc.TxnListing(t.transactional_id, t.producer_id, t.state) for t in r.transactions])

    def _describe(self, msg: ipc.DescribeTransactionsReq) -> ipc.DescribeTransactionsResp:
        out = []
        for d in self.tc.describe_transactions(msg.transactional_ids):
            topics: dict[str, list[int]] = {}
            for t, p in sorted(d.partitions):
                topics.setdefault(t, []).append(p)
            out.append(ipc.TxnDescription(int(d.error), d.transactional_id, d.state, d.timeout_ms,
                                          d.start_time_ms, d.producer_id, d.producer_epoch,
                                          [ipc.TxnPartitions(t, ps) for t, ps in topics.items()]))
        return ipc.DescribeTransactionsResp(msg.req_id, out)

    # -- markers ----------------------------------------------------------------------------------
    def _send_marker_jobs(self) -> None:
        for job in self.tc.take_marker_jobs():
            for partition in job.partitions:
                self._send_marker(job, partition)

    def _send_marker(self, job, partition: tuple[str, int]) -> None:
        topic, _ = partition
        if topic == OFFSETS_TOPIC:
            # Pending transactional offsets live in this worker's group log: the marker is a
            # control record there, written now (KIP-98 §5.2).
            err = self.gs.complete_txn(job.producer_id, job.producer_epoch, job.commit,
                                       job.coordinator_epoch)
            self.tc.on_marker_result(job.job_id, partition, err)
            return
        link = self.writers.get(partition)
        if link is None:
            self.tc.on_marker_result(job.job_id, partition, ErrorCode.unknown_topic_or_partition)
            return
        msg = ipc.WriteMarkerReq(0, job.producer_id, job.producer_epoch, job.commit,
                                 job.coordinator_epoch)
        self._post_marker(link, SentMarker(job.job_id, partition, link.name, msg), time.monotonic())

    def _post_marker(self, link: WriterLink, s: SentMarker, now: float) -> None:
        """Post (again) under a fresh request id: a late answer to an earlier id is ignored."""
        req_id = next(self._ids)
        s.msg = ipc.WriteMarkerReq(req_id, s.msg.producer_id, s.msg.producer_epoch, s.msg.commit,
                                   s.msg.coordinator_epoch)
        s.raw = ipc.encode(s.msg)
        s.generation = link.generation()
        s.deadline = now + MARKER_RESEND_S
        self.sent[req_id] = s
        s.end = link.out.post(s.raw)
        self.posted.add(link.name)

    def _send_fences(self) -> None:
        """KIP-939 (ours): tell the writers of every kept transaction's partitions to refuse the
        earlier incarnations' batches; again whenever a writer restarted."""
        self.fences_due = False
        live = set()
        for pid, epoch, partitions in self.tc.kept_fences():
            for partition in partitions:
                link = self.writers.get(partition)
                if link is None:
                    continue
                key = (partition, pid)
                live.add(key)
                stamp = (link.generation(), epoch)
                if self.fenced.get(key) != stamp:
                    self.fenced[key] = stamp
                    link.out.post(ipc.encode(ipc.FenceProducerReq(pid, epoch)))
                    self.posted.add(link.name)
        for key in set(self.fenced) - live:
            del self.fenced[key]

    def _check_markers(self, now: float) -> None:
        """Resend the markers a dead writer took without answering (see the module docstring),
        and, as a last resort, those taken but unanswered long after the deadline."""
        for req_id, s in list(self.sent.items()):
            link = self.writers.get(s.partition)
            if link is None:
                del self.sent[req_id]
                self.tc.on_marker_result(s.job_id, s.partition, ErrorCode.unknown_topic_or_partition)
                continue
            page = link.page.read()
            if page.generation != s.generation:
                if link.out.is_queued(s.raw) or page.coordinator_ring_head < s.end:
                    s.generation = page.generation      # the new writer will take it and answer
                    continue
            elif now < s.deadline:
                continue
            elif link.out.is_queued(s.raw) or link.out.ring.head < s.end:
                s.deadline = now + MARKER_RESEND_S      # not taken yet: the writer is busy
                continue
            else:
                log.warning("%s took a marker (producer %d) %.0f s ago and has not answered: "
                            "sending it again", link.name, s.msg.producer_id, MARKER_RESEND_S)
            del self.sent[req_id]
            self._post_marker(link, s, now)

    def _flush(self) -> None:
        for name in self.posted:
            box = self.outboxes.get(name)
            if box is not None:
                box.flush()
        self.posted.clear()
        for box in self.outboxes.values():
            if box.queued:
                box.flush()


def _error_reply(msg, code: ErrorCode):
    rid = getattr(msg, "req_id", 0)
    if isinstance(msg, ipc.InitProducerIdReq):
        return ipc.InitProducerIdResp(rid, int(code))
    if isinstance(msg, ipc.AddPartitionsToTxnReq):
        return ipc.AddPartitionsToTxnResp(rid, [ipc.PartitionError(t.topic, p, int(code))
                                                for t in msg.topics for p in t.partitions])
    if isinstance(msg, ipc.VerifyTxnReq):
        return ipc.VerifyTxnResp(rid, int(code))
    if isinstance(msg, (ipc.AddOffsetsToTxnReq, ipc.EndTxnReq)):
        return ipc.TxnResp(rid, int(code))
    if isinstance(msg, ipc.ListTransactionsReq):
        return ipc.ListTransactionsResp(rid, int(code), [], [])
    if isinstance(msg, ipc.DescribeTransactionsReq):
        return ipc.DescribeTransactionsResp(rid, [ipc.TxnDescription(int(code), t)
                                                  for t in msg.transactional_ids])
    if isinstance(msg, ipc.JoinGroupReq):
        return ipc.JoinGroupResp(rid, int(code))
    if isinstance(msg, ipc.SyncGroupReq):
        return ipc.SyncGroupResp(rid, int(code))
    if isinstance(msg, ipc.HeartbeatReq):
        return ipc.GroupResp(rid, int(code))
    if isinstance(msg, ipc.LeaveGroupReq):
        return ipc.LeaveGroupResp(rid, int(code))
    if isinstance(msg, (ipc.OffsetCommitReq, ipc.TxnOffsetCommitReq, ipc.OffsetDeleteReq)):
        return ipc.OffsetsResp(rid, int(code))
    if isinstance(msg, ipc.OffsetFetchReq):
        return ipc.OffsetFetchResp(rid, [ipc.OffsetFetchGroup(g.group_id, [], int(code)) for g in msg.groups])
    if isinstance(msg, ipc.DescribeGroupsReq):
        return ipc.DescribeGroupsResp(rid, [ipc.DescribedGroup(int(code), g) for g in msg.group_ids])
    if isinstance(msg, ipc.ListGroupsReq):
        return ipc.ListGroupsResp(rid, int(code))
    if isinstance(msg, ipc.DeleteGroupsReq):
        return ipc.DeleteGroupsResp(rid, [ipc.GroupError(g, int(code)) for g in msg.group_ids])
    return None


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
