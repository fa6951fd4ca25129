"""Coordinator worker: the transaction coordinator, and the group coordinator with its offsets.

Runs as one child of the supervisor. Owns ``<data_dir>/__coordinator/``: the transaction-state log
(``appliance.txn.state_manager``), the coordinator epoch, the producer-id blocks, and the group
log with groups, committed and pending offsets (``<data_dir>/__coordinator/group-log``). The logic
is sans-IO: ``appliance.txn.coordinator.TransactionCoordinator`` and
``appliance.group.service.GroupService``; this module gives them the worker base's loop
(``workers.base.Worker``: set-up, hooks for the timers). It serves the requests that
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

import errno
import logging
import os
import time

import msgspec

from appliance.data_layout import COORDINATOR_DIR, GROUP_LOG_DIR, SHARE_LOG_DIR
from appliance.config import Config, FlushPolicy
from appliance.group.service import GroupService
from appliance.group.share_group import ShareService, share_config
from appliance.group.share_store import ShareStateStore
from appliance.durable import atomic_write, make_dirs
from appliance.metrics import COORDINATOR_SNAPSHOT, key as mkey
from appliance.acl.authorizer import Authorizer
from appliance.acl.model import AclOperation, ResourceType
from appliance.acl.store import PUBLISHED_FILE as ACL_PUBLISHED_FILE, AclView
from appliance.catalog.assignment import ASSIGNMENT_FILE, AssignmentView
from appliance.log.compacted_log import CompactedLogCorrupt
from appliance.runtime import (WORKER_DATA_DIR_ERROR, COORDINATOR_PAGE_FIELDS, PARTITION_PAGE_FIELDS,
                              WRITER_PROCESS_PAGE_FIELDS, WorkerContext, writer_name)
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.service import TransactionService
from appliance.txn.state_manager import TransactionStateManager, bump_coordinator_epoch
from shm.doorbell import BellSender
from shm.statepage import StatePage
from shm.topology import Outbox, Topology
from workers.base import Worker

log = logging.getLogger("appliance.coordinator")

TICK_S = 0.2
METRICS_S = 1.0
SPACE_RETRY_S = 0.5      # how often a start on a full disk tries to persist its epoch again

# Kafka's GroupMetadataManager gauges, by the state they count.
GROUP_STATE_GAUGES = {
    "Stable": "kafka_coordinator_group_groupmetadatamanager_numgroupsstable",
    "PreparingRebalance": "kafka_coordinator_group_groupmetadatamanager_numgroupspreparingrebalance",
    "CompletingRebalance":
        "kafka_coordinator_group_groupmetadatamanager_numgroupscompletingrebalance",
    "Empty": "kafka_coordinator_group_groupmetadatamanager_numgroupsempty",
    "Dead": "kafka_coordinator_group_groupmetadatamanager_numgroupsdead",
}
TXN_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
              "CompleteAbort", "PrepareEpochFence")
COUNTERS = {"commits": "kafka_coordinator_transaction_commits",
            "aborts": "kafka_coordinator_transaction_aborts",
            "timedout_aborts": "kafka_coordinator_transaction_timedout_aborts"}


def main(ctx: WorkerContext) -> int:
    return Coordinator(ctx).main()


class ProcessLink:
    """The coordinator's end of one writer process: its ring and its process page."""

    def __init__(self, topo: Topology, name: str, bells: BellSender, posted: set[str]) -> None:
        self.name = name
        self.out = Outbox(topo, "co", name, bells)
        self.page = StatePage.open(topo.page_path(name), WRITER_PROCESS_PAGE_FIELDS, readonly=True)
        self._posted = posted


class WriterLink:
    """The coordinator's end of one partition's writer (what the marker channel's ``WriterLink``
    protocol asks for): the ring and page of the writer process that carries it, and the
    partition every message to it names."""

    def __init__(self, proc: ProcessLink, topic_id: bytes, partition: int) -> None:
        self.proc = proc
        self.name = proc.name
        self.out = proc.out
        self.topic_id = topic_id
        self.partition = partition

    def state(self):
        return self.proc.page.read()

    def post(self, raw: bytes) -> int:
        self.proc._posted.add(self.name)
        return self.out.post(raw)

    def is_queued(self, raw: bytes) -> bool:
        return self.out.is_queued(raw)

    def consumed(self) -> int:
        return self.out.ring.head


class Coordinator(Worker):
    page_fields = COORDINATOR_PAGE_FIELDS
    tick_s = TICK_S

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.catalog_seen = -1
        self._topics_version = -1
        self._topics_map: dict[str, tuple[bytes, int]] = {}
        self.writers: dict[tuple[str, int], WriterLink] = {}     # (topic, partition) -> link
        self.processes: dict[str, ProcessLink] = {}              # writer process -> link
        self.assignment = AssignmentView(self.topo.file_path(ASSIGNMENT_FILE),
                                         lambda: self.sup_page.read().assignment_version)
        self.assignment_seen = -1
        self._pages: dict[tuple[bytes, int], StatePage] = {}    # partition pages (share groups)
        self.dir = os.path.join(ctx.data_dir, COORDINATOR_DIR)
        make_dirs(self.dir)     # durable: its logs and producer-id blocks are synced in it
        self.next_metrics = 0.0
        self._metrics_error: str | None = None    # the last "not published" reason logged

    # -- life cycle -----------------------------------------------------------------------------
    def setup(self) -> int | None:
        """Start, waiting for space on a full disk; WORKER_DATA_DIR_ERROR if a log is damaged
        beyond what its load repairs (``CompactedLogCorrupt``).

        A start writes before it can serve: the new coordinator epoch (nothing may be served
        under an epoch that is not durable: a later start could hand it out again, and the
        writers would take the markers of a dead instance as current), and the recovery of
        both logs after an unclean stop (indexes rebuilt). A coordinator that exited on ENOSPC
        there would be restarted into the same failure until the supervisor's crash-loop rule
        stopped the whole appliance. So it gives back what it opened and tries again every
        ``SPACE_RETRY_S``, RECOVERING and beating its heartbeat meanwhile (frontends answer
        COORDINATOR_NOT_AVAILABLE, which clients retry), until it starts or the appliance
        stops."""
        waiting = False
        while True:
            opened: list = []
            try:
                epoch = self._start(opened)
                break
            except CompactedLogCorrupt as e:
                # A damaged log the load may not repair (issue 34: a sealed segment's batch
                # fails its CRC; a record that cannot be decoded): a restart would meet the same
                # bytes, so the appliance stops with exit 3 and this message names the file.
                log.error("cannot start: %s", e)
                for part in reversed(opened):
                    part.close(clean=False)
                return WORKER_DATA_DIR_ERROR
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                for part in reversed(opened):
                    try:
                        part.close(clean=False)
                    except Exception:            # giving back what a failed start opened
                        pass
                if not waiting:
                    log.warning("cannot start on a full disk (%s): waiting for space on the data dir", e)
                    waiting = True
            if self.stop:
                raise SystemExit(0)              # nothing is open: the drain has nothing to do
            # Alive and waiting on purpose: the supervisor holds a starting coordinator to its
            # heartbeat (only writers' recovery is exempt), which a wait longer than the timeout
            # would otherwise miss.
            self.hb.beat(self.ctx.heartbeat_slot)
            time.sleep(SPACE_RETRY_S)
        if waiting:
            log.info("space on the data dir again: started")
        log.info("transaction coordinator ready: coordinator epoch %d", epoch)

    def _start(self, opened: list) -> int:
        epoch = bump_coordinator_epoch(self.dir)
        self.page.publish(coordinator_epoch=epoch)
        txn_log = TransactionStateManager(self.dir, self.cfg.log.flush.policy, _now_ms())
        opened.append(txn_log)
        # The supervisor holds a starting coordinator to its heartbeat: each log's replay beats
        # it as it goes (CompactedLog.progress), so that a load longer than heartbeat_timeout_ms
        # (big logs on a slow machine) is not taken for a hang and crash-looped until the
        # supervisor stops the appliance.
        beat = lambda: self.hb.beat(self.ctx.heartbeat_slot)  # noqa: E731
        txn_log.progress = beat
        self.tc = TransactionCoordinator(txn_log, ProducerIdManager(self.dir), self.cfg.transactions,
                                         epoch, _now_ms)
        self.tc.load()
        # Between the loads: the supervisor holds a starting coordinator to its heartbeat.
        self.hb.beat(self.ctx.heartbeat_slot)
        self.gs = GroupService(os.path.join(self.dir, GROUP_LOG_DIR), self.cfg.groups,
                               self.cfg.log.flush.policy, self.tc, _now_ms, topics=self._topics,
                               group_configs=self._group_configs,
                               describe_topic=self._describe_topic())
        opened.append(self.gs)
        self.gs.store.progress = beat
        self.gs.load()
        self.hb.beat(self.ctx.heartbeat_slot)
        store = ShareStateStore(os.path.join(self.dir, SHARE_LOG_DIR), self.cfg.log.flush.policy,
                                _now_ms())
        opened.append(store)
        store.progress = beat
        self.share = ShareService(store, share_config(self.cfg.groups), _now_ms, self._topics,
                                  self._marks,
                                  other_group=lambda g: self.gs.groups.group_state(g) is not None,
                                  group_configs=self._group_configs)
        self.share.load()
        self.gs.share = self.share          # one namespace of group ids (ListGroups, DeleteGroups)
        # Counters continue from what the predecessor left in the table.
        m = self.metrics
        self.counter_slots = {stat: m.slot(mkey(name)) for stat, name in COUNTERS.items()}
        self.counter_base = {stat: m.values[i] for stat, i in self.counter_slots.items()}
        self.rebalance_slot = m.slot(mkey("kafka_server_group_coordinator_metrics_consumer_group_rebalance"))
        self.rebalance_base = m.values[self.rebalance_slot]
        self.markers = self.tc.markers
        self.markers.attach(self.writers.get, self.gs.complete_txn,
                            first_id=((self.generation & 0xFFFF) << 40) | 1)
        self.txns = TransactionService(self.tc, lambda: time.monotonic_ns() // 1_000_000,
                                       self.cfg.transactions.add_partitions_retry_backoff_max_ms)
        self.serve(self.txns, self.gs, self.share, on_answer=self.markers.on_answer)
        return epoch

    def drain_inputs(self) -> bool:
        # Writers come and go with the catalog: their rings are inputs from this turn on.
        self._sync_writers()
        return super().drain_inputs()

    def on_tick(self, now: float) -> None:
        self.tc.tick(_now_ms())
        self.markers.check(now)
        self.markers.send_fences()
        if now >= self.next_metrics:
            self.next_metrics = now + METRICS_S
            self._publish_metrics()

    def on_turn(self, now: float) -> None:
        self.gs.tick(_now_ms())
        self.share.tick(_now_ms())
        markers = self.markers
        markers.send_marker_jobs()
        self.txns.retry_waiting()        # after this turn's marker answers
        if markers.fences_due:
            markers.send_fences()
        if self.tc.needs_restart:
            # Fenced by a newer coordinator epoch, or a log sync failed: start over from the
            # log under a new epoch (the supervisor restarts us).
            log.error("transaction coordinator must restart; exiting")
            self.exit(1)

    def wait_timeout(self, now: float) -> float:
        wait = TICK_S
        due = self.gs.next_deadline_ms()
        share_due = self.share.next_deadline_ms()
        if share_due is not None:
            due = share_due if due is None else min(due, share_due)
        if due is not None:
            wait = min(wait, max(0.0, (due - _now_ms()) / 1000))
        markers_wait = self.txns.wait_s()
        if markers_wait is not None:
            wait = min(wait, markers_wait)
        return wait

    def on_stop(self) -> None:
        self.txns.answer_waiting()
        if not self.exit_code:
            try:
                self.gs.close()
                self.share.close()
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # Sealing the group log (trimmed index copies, the clean-shutdown marker) needs
                # room; without it the stop goes on, and the next start recovers the log's tail
                # as after a crash.
                log.warning("file system full at stop: group log closed without the "
                            "clean-shutdown marker")

    def reload(self, old: Config, new: Config) -> None:
        self.tc.reconfigure(new.transactions, new.log.flush.policy)
        self.txns.wait_ms = new.transactions.add_partitions_retry_backoff_max_ms
        self.gs.reconfigure(new.groups, new.log.flush.policy)
        self.share.cfg = share_config(new.groups)
        self.share.store.flush_policy = FlushPolicy(new.log.flush.policy)

    def _publish_metrics(self) -> None:
        """Once a second: the gauges and counters into this worker's table, the per-group
        offsets into the snapshot file (appliance.metrics)."""
        m = self.metrics
        v = m.values
        tc = self.tc
        m.set(mkey("kafka_coordinator_transaction_transactionstatemanager_activetransactionopentimemaxms"),
              tc.active_transaction_open_time_max_ms())
        states = tc.state_counts()
        for state in TXN_STATES:
            m.set(mkey("kafka_coordinator_transaction_transactionstatemanager_transactions",
                      [("state", state)]), states.get(state, 0))
        for stat, slot in self.counter_slots.items():
            v[slot] = self.counter_base[stat] + tc.stats[stat]
        groups, offsets = self.gs.metrics_snapshot()
        by_state: dict[str, int] = {}
        for _, state, _ in groups:
            by_state[state] = by_state.get(state, 0) + 1
        m.set(mkey("kafka_coordinator_group_groupmetadatamanager_numgroups"), len(groups))
        for state, name in GROUP_STATE_GAUGES.items():
            m.set(mkey(name), by_state.get(state, 0))
        m.set(mkey("kafka_coordinator_group_groupmetadatamanager_numoffsets"), len(offsets))
        by_type, by_state, rebalances = self.gs.protocol_metrics()
        for proto, n in by_type.items():
            m.set(mkey("kafka_server_group_coordinator_metrics_group_count",
                       [("protocol", proto)]), n)
        for state, n in by_state.items():
            m.set(mkey("kafka_server_group_coordinator_metrics_consumer_group_count",
                       [("state", state)]), n)
        share_states, share_parts = self.share.share_metrics()
        m.set(mkey("kafka_server_group_coordinator_metrics_group_count", [("protocol", "share")]),
              sum(share_states.values()))
        for state, n in share_states.items():
            m.set(mkey("kafka_server_group_coordinator_metrics_share_group_count",
                       [("state", state)]), n)
        v[self.rebalance_slot] = self.rebalance_base + rebalances
        try:
            atomic_write(self.topo.file_path(COORDINATOR_SNAPSHOT), msgspec.msgpack.encode(
                {"groups": groups, "offsets": offsets, "share": share_parts}), sync=False)
        except OSError as e:
            # Once, then on change (a full runtime dir would otherwise log this every second).
            if str(e) != self._metrics_error:
                log.warning("group metrics not published: %s", e)
                self._metrics_error = str(e)
            return
        if self._metrics_error is not None:
            log.info("group metrics published again")
            self._metrics_error = None

    def _describe_topic(self):
        """With the authorizer on, (principal, address, topic) -> may it Describe the topic,
        over the ACLs the supervisor publishes (as a frontend reads them): KIP-848 regex
        matches are filtered by it. None while the authorizer is off."""
        if not self.cfg.authorizer.enable:
            return None
        az = Authorizer.from_config(self.cfg.authorizer,
                                    AclView(self.topo.file_path(ACL_PUBLISHED_FILE), self.sup_page))
        return lambda principal, address, topic: az.authorize(
            principal, address, AclOperation.DESCRIBE, ResourceType.TOPIC, topic)

    def _group_configs(self, group_id: str) -> dict[str, str]:
        """The GROUP config resource of a group (KIP-848), from the published catalog."""
        return self.catalog.get().group_configs.get(group_id, {})

    def _topics(self) -> dict[str, tuple[bytes, int]]:
        """name -> (topic id, partitions) of the published catalog, for KIP-848's assignors;
        rebuilt only when the catalog's version changes."""
        cat = self.catalog.get()
        if self._topics_version != cat.version:
            self._topics_map = {t.name: (t.topic_id, t.partitions) for t in cat.topics.values()}
            self._topics_version = cat.version
        return self._topics_map

    def _marks(self, topic_id: bytes, partition: int) -> tuple[int, int, int] | None:
        """(high watermark, log start offset, last stable offset) of a partition from its state
        page, for the share partitions; None when the catalog has no such partition or its page
        is not there."""
        info = self.catalog.get().by_id(topic_id)
        if info is None or not 0 <= partition < info.partitions:
            return None
        key = (topic_id, partition)
        page = self._pages.get(key)
        if page is None:
            try:
                page = StatePage.open(self.topo.page_path(writer_name(topic_id, partition)),
                                      PARTITION_PAGE_FIELDS, readonly=True)
            except FileNotFoundError:
                return None
            self._pages[key] = page
        st = page.read()
        return st.high_watermark, st.log_start_offset, st.last_stable_offset

    # -- writers ---------------------------------------------------------------------------------
    def _sync_writers(self) -> None:
        cat = self.catalog.get()
        asg = self.assignment.get()
        if cat.version == self.catalog_seen and asg.version == self.assignment_seen:
            return
        self.catalog_seen = cat.version
        self.assignment_seen = asg.version
        wanted: dict[tuple[str, int], tuple[str, bytes]] = {}
        for t in cat.topics.values():
            for p in range(t.partitions):
                proc = asg.process_of(t.topic_id, p)
                if proc is not None:
                    wanted[(t.name, p)] = (proc, t.topic_id)
        procs = {proc for proc, _ in wanted.values()}
        for name in [n for n in self.processes if n not in procs]:
            del self.processes[name]
            self.mailbox.remove(name)
            self.outboxes.pop(name, None)
            self.topo.forget(name, self.bells)
        for name in procs - self.processes.keys():
            try:
                self.processes[name] = ProcessLink(self.topo, name, self.bells, self.posted)
                self.mailbox.add(name)
            except FileNotFoundError:
                self.catalog_seen = -1           # its rings are not there yet: look again
                continue
            self.outboxes[name] = self.processes[name].out
        for key, link in list(self.writers.items()):
            want = wanted.get(key)
            if want is None or want[0] != link.name or self.processes.get(link.name) is not link.proc:
                del self.writers[key]
        for key, (proc, tid) in wanted.items():
            if key not in self.writers and proc in self.processes:
                self.writers[key] = WriterLink(self.processes[proc], tid, key[1])


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
