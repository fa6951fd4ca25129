"""Coordinator worker: the transaction coordinator, and the group coordinator with its offsets.

Runs as one child of the supervisor. Owns ``<data_dir>/__coordinator/``: the transaction-state log
(``appliance.txn.state_manager``), the coordinator epoch, the producer-id blocks, and the group
log with groups, committed and pending offsets (``<data_dir>/__coordinator/group-log``). The logic
is sans-IO: ``appliance.txn.coordinator.TransactionCoordinator`` and
``appliance.group.service.GroupService``; this module is their loop. It serves the requests that
reach it (from frontends, and the KIP-890 verifications from partition writers) through one
``appliance.service.Registry`` over ``TransactionService`` and ``GroupService``, hands the
writers' marker answers to the ``TransactionMarkerChannelManager`` (``appliance.txn.
marker_channel``, attached here to the writers' rings and to the group log), and runs the timers
(transaction timeouts, transactional-id expiration, group sessions and rebalances, marker
resends).

The generation published in this worker's state page lets frontends fail what a dead predecessor
held instead of waiting for a timeout; the coordinator epoch published there is what the
WriteTxnMarkers API compares a marker's epoch with.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from appliance import ipc, metrics
from appliance.catalog import COORDINATOR_DIR, PUBLISHED_FILE, CatalogView
from appliance.group.service import GroupService
from appliance.runtime import (COORDINATOR_PAGE_FIELDS, HEARTBEAT_FILE, PARTITION_PAGE_FIELDS,
                               READY, RECOVERING, SUPERVISOR, SUPERVISOR_PAGE_FIELDS,
                               WorkerContext, writer_name)
from appliance.service import Registry
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.service import TransactionService
from appliance.txn.state_manager import TransactionStateManager, bump_coordinator_epoch
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

log = logging.getLogger("appliance.coordinator")

TICK_S = 0.2
METRICS_S = 1.0


def main(ctx: WorkerContext) -> int:
    return Coordinator(ctx).run()


class WriterLink:
    """The coordinator's end of one partition writer: its rings and its state page (what the
    marker channel's ``WriterLink`` protocol asks for)."""

    def __init__(self, topo: Topology, name: str, bells: BellSender, posted: set[str]) -> None:
        self.name = name
        self.out = Outbox(topo, "co", name, bells)
        self.page = StatePage.open(topo.page_path(name), PARTITION_PAGE_FIELDS, readonly=True)
        self._posted = posted

    def state(self):
        return self.page.read()

    def post(self, raw: bytes) -> int:
        self._posted.add(self.name)
        return self.out.post(raw)

    def is_queued(self, raw: bytes) -> bool:
        return self.out.is_queued(raw)

    def consumed(self) -> int:
        return self.out.ring.head


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
        self.dir = os.path.join(ctx.data_dir, COORDINATOR_DIR)
        os.makedirs(self.dir, exist_ok=True)
        self.stop = False
        self.posted: set[str] = set()

    # -- life cycle -----------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        page = StatePage.open(self.topo.page_path(self.ctx.name), COORDINATOR_PAGE_FIELDS)
        page.reset_seq()
        page.publish(generation=self.ctx.generation, status=RECOVERING, pid=os.getpid())
        epoch = bump_coordinator_epoch(self.dir)
        page.publish(coordinator_epoch=epoch)
        self.tc = TransactionCoordinator(
            TransactionStateManager(self.dir, self.cfg.log.flush.policy, _now_ms()),
            ProducerIdManager(self.dir), self.cfg.transactions, epoch, _now_ms)
        self.tc.load()
        self.gs = GroupService(os.path.join(self.dir, "group-log"), self.cfg.groups,
                               self.cfg.log.flush.policy, self.tc, _now_ms)
        self.gs.load()
        markers = self.tc.markers
        markers.attach(self.writers.get, self.gs.complete_txn,
                       first_id=((self.ctx.generation & 0xFFFF) << 40) | 1)
        self.registry = Registry(TransactionService(self.tc), self.gs, post=self._reply,
                                 on_answer=markers.on_answer)
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
                markers.check(now)
                markers.send_fences()
                if now >= next_metrics:
                    next_metrics = now + METRICS_S
                    self._publish_metrics()
            self.gs.tick(_now_ms())
            markers.send_marker_jobs()
            if markers.fences_due:
                markers.send_fences()
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
                self.mailbox.remove(link.name)
                self.outboxes.pop(link.name, None)
                self.topo.forget(link.name)
        for key, name in wanted.items():
            if key in self.writers:
                continue
            try:
                link = WriterLink(self.topo, name, self.bells, self.posted)
                self.mailbox.add(name)
            except FileNotFoundError:
                continue
            self.writers[key] = link
            self.outboxes[name] = link.out

    # -- rings ------------------------------------------------------------------------------------
    def _drain(self) -> bool:
        worked = False
        for src, ring in list(self.mailbox.inputs.items()):
            while (raw := ring.get()) is not None:
                worked = True
                self.registry.handle(src, raw)
        return worked

    def _reply(self, dst: str, req_id: int, body: ipc.Message) -> None:
        box = self.outboxes.get(dst)
        if box is not None:
            box.post(ipc.encode(req_id, body))
            self.posted.add(dst)

    def _flush(self) -> None:
        for name in self.posted:
            box = self.outboxes.get(name)
            if box is not None:
                box.flush()
        self.posted.clear()
        for box in self.outboxes.values():
            if box.queued:
                box.flush()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
