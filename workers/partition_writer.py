"""Partition writer: the one process that writes one partition.

Runs as a child of the supervisor, one per partition. Owns that partition's ``PartitionLog``
(segments, offset and time indexes, log start offset) and publishes its high watermark, log start
and active-segment end in the partition's state page. Single-threaded: no locks on the write path.

Loop: drain every input ring (produce requests from each frontend), append each batch (patch the
base offset in place in the ring, then one copy into the mapped segment), publish the new high
watermark once for the whole group, apply the flush policy once for the group (group commit), then
put the acks into each frontend's ack ring and ring the bells of those that sleep. Wake fetchers
parked on this partition. Sleep on the doorbell when there is nothing to do.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from appliance import ipc
from appliance.catalog import partition_dir
from appliance.errors import ErrorCode, KafkaError
from appliance.log.flusher import Flusher
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.protocol.records import read_header
from appliance.runtime import (DRAINING, HEARTBEAT_FILE, PARTITION_PAGE_FIELDS, READY, RECOVERING,
                               STOPPED, WORKER_BOOT_ERROR, WorkerContext)
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

log = logging.getLogger("appliance.writer")

# How many records one input ring may hand over per loop turn before the others get a turn.
FAIRNESS_BUDGET = 64


def main(ctx: WorkerContext) -> int:
    return PartitionWriter(ctx).run()


class PartitionWriter:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.gen = ctx.generation
        self.topo = Topology(ctx.run_dir)
        self.page = StatePage.open(self.topo.page_path(ctx.name), PARTITION_PAGE_FIELDS)
        self.hb = HeartbeatTable.open(os.path.join(ctx.run_dir, HEARTBEAT_FILE))
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, ctx.name)
        for fe in ctx.frontends:
            self.mailbox.add(fe)
        # Acks that do not fit their ring (a slow or restarting frontend) wait in the outbox's
        # queue and are retried every turn.
        self.acks_out = {fe: Outbox(self.topo, ctx.name, fe, self.bells) for fe in ctx.frontends}
        self.posted: set[str] = set()       # outboxes posted to since their last flush
        self.fetcher_bells = [self.topo.bell_path(fx) for fx in ctx.fetchers]
        self.stop = False
        self.policy = self.cfg.log.flush.policy
        self.flush_interval = self.cfg.log.flush.interval_ms / 1000
        self.last_flush = time.monotonic()
        # acks=-1 answers waiting for their batch to be durable: (end offset, frontend, ack).
        self.await_flush: list[tuple[int, str, bytes]] = []
        self.retention_every = self.cfg.log.retention_check_interval_ms / 1000
        self.next_retention = time.monotonic() + self.retention_every

    # -- life cycle -----------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # the supervisor orders the drain
        self.page.reset_seq()
        self.page.publish(generation=self.gen, status=RECOVERING, pid=os.getpid())
        directory = partition_dir(self.ctx.data_dir, self.ctx.topic, self.ctx.index)
        try:
            settings = LogSettings.from_config(self.cfg.log, self.ctx.topic_configs)
            self.log = PartitionLog.open(directory, settings, _now_ms())
        except (OSError, ValueError) as e:
            log.error("cannot open partition log %s: %s", directory, e)
            return WORKER_BOOT_ERROR
        # Producer state: the newest snapshot plus a replay of the batch headers after it.
        self.psm = ProducerStateManager(directory, self.cfg.transactions.producer_id_expiration_ms)
        replayed_from = self.psm.load(self.log.log_end_offset, self.log.headers_from, _now_ms())
        self.log.roll_listener = self.psm.take_snapshot
        own_bell = self.topo.bell_path(self.ctx.name)
        waker = BellSender()            # the flusher thread's own socket
        self.flusher = Flusher(lambda: waker.ring(own_bell), self.log.log_end_offset)
        self._publish(status=READY)
        log.info("%s-%d ready: log start %d, log end %d, %d producers (replayed from %d), "
                 "generation %d", self.ctx.topic, self.ctx.index, self.log.log_start_offset,
                 self.log.log_end_offset, len(self.psm.entries), replayed_from, self.gen)
        try:
            while not self.stop:
                self._turn()
            # Drain what is already queued, so that in-flight produce requests get answers.
            self.page.publish(status=DRAINING)
            while self._drain_inputs():
                pass
            self._flush_and_ack(force=True)
        finally:
            self.flusher.stop()
            self.log.flush()
            self.psm.take_snapshot(self.log.log_end_offset)   # no replay after a clean stop
            self.log.close(clean=True)
            self.page.publish(status=STOPPED)
        return 0

    def _on_term(self, signum, frame) -> None:
        self.stop = True

    # -- one loop turn --------------------------------------------------------------------------
    def _turn(self) -> None:
        self.hb.beat(self.ctx.heartbeat_slot)
        worked = self._drain_inputs()
        self._flush_and_ack()
        now = time.monotonic()
        if now >= self.next_retention:
            self.next_retention = now + self.retention_every
            changed = self.log.enforce_retention(_now_ms())
            changed = self.log.maybe_roll(_now_ms()) or changed
            self.psm.expire(_now_ms())
            if changed:
                self._publish()
        if not worked:
            timeout = 0.5
            if self.policy == "interval" and self.flusher.durable < self.log.log_end_offset:
                timeout = max(0.0, self.last_flush + self.flush_interval - now)
            if any(box.queued for box in self.acks_out.values()):
                timeout = min(timeout, 0.01)
            self.mailbox.wait(timeout)

    def _drain_inputs(self) -> bool:
        appended = False
        acked: dict[str, list[bytes]] = {}
        now_ms = _now_ms()
        for src, ring in self.mailbox.inputs.items():
            for _ in range(FAIRNESS_BUDGET):
                mv = ring.peek()
                if mv is None:
                    break
                try:
                    ack, acks, end, did_append = self._handle(src, mv, now_ms)
                finally:
                    ring.advance()
                appended |= did_append
                if ack is None:
                    continue
                if acks == -1 and self.policy != "os" and end > self.flusher.durable:
                    # Also a duplicate whose original is not durable yet: never ack more than
                    # the disk holds.
                    self.await_flush.append((end, src, ack))
                else:
                    acked.setdefault(src, []).append(ack)
        if appended:
            self._publish()
        for fe, acks in acked.items():
            box = self.acks_out[fe]
            for ack in acks:
                box.post(ack)
            self.posted.add(fe)
        return appended or bool(acked)

    def _handle(self, src: str, mv: memoryview, now_ms: int) -> tuple[bytes | None, int, int, bool]:
        """Returns (ack or None, acks, offset just past the batch or 0, whether it appended)."""
        if mv[0] != ipc.KIND_PRODUCE:
            self._control(src, mv)
            return None, 0, 0, False
        _, _, acks, gen, req_id, blen, _ = ipc.PRODUCE_HDR.unpack_from(mv, 0)
        if gen != self.gen:
            # Addressed to a predecessor that died: the frontend has already answered the client.
            return ipc.produce_ack(int(ErrorCode.not_leader_or_follower), self.gen, req_id, -1, -1,
                                   self.log.log_start_offset), acks, 0, False
        batch = mv[ipc.PRODUCE_HDR.size:ipc.PRODUCE_HDR.size + blen]
        h = read_header(batch, 0)
        idempotent = h.producer_id >= 0
        try:
            if idempotent:
                dup = self.psm.check(h)
                if dup is not None:
                    # A retry of a batch already in the log: its original offsets, nothing appended.
                    lat = dup.timestamp if self.log.settings.log_append_time else -1
                    return ipc.produce_ack(0, self.gen, req_id, dup.first_offset, lat,
                                           self.log.log_start_offset), acks, dup.last_offset + 1, False
            info = self.log.append(batch, now_ms)
        except KafkaError as e:
            return ipc.produce_ack(int(e.code), self.gen, req_id, -1, -1, self.log.log_start_offset,
                                   e.message), acks, 0, False
        if idempotent:
            self.psm.update(h, info.base_offset, now_ms,
                            info.log_append_time if info.log_append_time >= 0 else h.max_timestamp)
        end = info.last_offset + 1
        if acks == 0:
            return None, acks, end, True
        return ipc.produce_ack(0, self.gen, req_id, info.base_offset, info.log_append_time,
                               self.log.log_start_offset), acks, end, True

    def _control(self, src: str, mv: memoryview) -> None:
        """Requests other than produce on the same ring, answered on the ack ring."""
        try:
            msg = ipc.decode(mv)
        except Exception:
            log.error("undecodable message on the produce ring from %s; dropped", src)
            return
        if isinstance(msg, ipc.DescribeProducersReq):
            reply = ipc.DescribeProducersResp(msg.req_id, 0, [
                ipc.ProducerInfo(e.producer_id, e.epoch, e.last_seq, e.last_timestamp,
                                 e.coordinator_epoch, e.txn_first_offset)
                for e in self.psm.active()])
        else:
            log.error("unexpected %s from %s; dropped", type(msg).__name__, src)
            return
        self.acks_out[src].post(ipc.encode(reply))
        self.posted.add(src)

    def _flush_and_ack(self, force: bool = False) -> None:
        """Start a group commit when acks wait for one (or the interval came), release the acks
        whose batches are durable, and hand every ack to its frontend's ring."""
        fl = self.flusher
        if fl.error is not None:
            raise fl.error           # durability unknown: die; recovery decides, nothing acked
        end = self.log.log_end_offset
        now = time.monotonic()
        if force:
            self.log.flush()         # synchronous, at shutdown
            fl.durable = max(fl.durable, end)
        elif not fl.busy and fl.durable < end and (
                (self.policy == "batch" and self.await_flush)
                or (self.policy == "interval" and now - self.last_flush >= self.flush_interval)):
            self.last_flush = now
            fl.start(*self.log.flush_target())
        if self.await_flush:
            durable = fl.durable
            still = []
            for item in self.await_flush:
                if item[0] <= durable:
                    self.acks_out[item[1]].post(item[2])
                    self.posted.add(item[1])
                else:
                    still.append(item)
            self.await_flush = still
        for fe, box in self.acks_out.items():
            if fe in self.posted or box.queued:
                box.flush()         # one bell per frontend per turn, not one per ack
        self.posted.clear()

    def _publish(self, **extra) -> None:
        lg = self.log
        hw = lg.log_end_offset
        self.page.publish(high_watermark=hw, last_stable_offset=hw, log_start_offset=lg.log_start_offset,
                          active_base_offset=lg.active_segment_base,
                          active_end_position=lg.active_end_position,
                          segments_version=lg.segments_version, first_unstable_offset=-1, **extra)
        # Wake fetchers that parked a long-poll on this partition (their flag byte is set).
        flags = self.page.flags()
        for j, path in enumerate(self.fetcher_bells):
            if flags[j]:
                self.bells.ring(path)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
