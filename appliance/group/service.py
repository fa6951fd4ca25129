"""The group requests of the coordinator worker: ring requests in, ring results out.

Runs in the coordinator worker (``workers/coordinator.py``), which registers this service with
its ``appliance.service.Registry``; single-threaded, sans-IO apart from the group log the
``OffsetManager`` writes. Owns the wiring between the membership side
(``appliance.group.membership.GroupCoordinator``), the offsets side
(``appliance.group.offsets.OffsetManager`` over ``appliance.group.store.GroupStateStore``) and the
transaction coordinator (KIP-98 transactional offsets, KIP-447 fencing, KIP-890 verification).
``topics()`` is the coordinator's view of the catalog (name -> topic id, partition count), which
KIP-848's server-side assignors need. Each method serves one request type of
``appliance.group.messages``; JoinGroup and SyncGroup are
answered late, when their rebalance completes (another member's request, or ``tick``), through
the responder the registry hands them.

TxnOffsetCommit (Kafka's GroupCoordinator.handleTxnCommitOffsets with KIP-890 part 1's
verification): the producer must have an Ongoing transaction with this id and epoch that holds the
group's ``__consumer_offsets`` partition (AddOffsetsToTxn) - which is also what guarantees that a
marker (commit, abort, or timeout abort) will come and clear the pending offsets; then, from v3
and only when the request carries group metadata, the KIP-447 generation/member/instance checks;
then the offsets are stored pending. Retriable coordinator answers become COORDINATOR_NOT_AVAILABLE
(KIP-890 "old clients": Kafka's verification turns CONCURRENT_TRANSACTIONS and the other retriable
answers into NOT_ENOUGH_REPLICAS, which its group manager answers as COORDINATOR_NOT_AVAILABLE;
every client retries that one, not all retry CONCURRENT_TRANSACTIONS here), a stale epoch
INVALID_PRODUCER_EPOCH (fatal "fenced" in every client), a transaction without the offsets
partition INVALID_TXN_STATE for v0-3 and TRANSACTION_ABORTABLE for v4 (as Kafka's
AddPartitionsToTxnManager maps its coordinator's answer). v5 (transaction version 2) adds the
partition to the transaction instead of requiring it.
"""

from __future__ import annotations

import logging
from typing import Callable

from appliance.catalog.model import OFFSETS_TOPIC
from appliance.config import FlushPolicy
from appliance.errors import ErrorCode
from appliance.group.membership import GroupCoordinator, MembershipConfig
from appliance.group.messages import (ConsumerGroupDescribeRequest, ConsumerGroupDescribeResult,
                                      ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResult,
                                      DeleteGroupsRequest, DeleteGroupsResult,
                                      DescribedGroup, DescribeGroupsRequest,
                                      DescribeGroupsResult, GroupError,
                                      HeartbeatRequest, HeartbeatResult, JoinGroupRequest,
                                      LeaveGroupRequest, LeaveGroupResult, ListGroupsRequest,
                                      JoinGroupResult, ListGroupsResult, OffsetCommitRequest, OffsetDeleteRequest,
                                      OffsetFetchGroup, OffsetFetchRequest, OffsetFetchResult,
                                      OffsetPartition, OffsetsResult, SyncGroupRequest,
                                      TxnOffsetCommitRequest)
from appliance.group.offsets import OffsetManager
from appliance.group.store import GroupStateStore
from appliance.service import Responder, serves
from appliance.txn.coordinator import partition_for

log = logging.getLogger("appliance.group")
E = ErrorCode

_RETRIABLE_TO_NOT_AVAILABLE = {E.concurrent_transactions, E.coordinator_load_in_progress,
                               E.not_coordinator, E.coordinator_not_available,
                               E.request_timed_out}


class GroupService:
    def __init__(self, directory: str, groups_cfg, flush_policy: str, tc, now_ms: Callable[[], int],
                 topics: Callable[[], dict[str, tuple[bytes, int]]] = dict,
                 group_configs: Callable[[str], dict[str, str]] = lambda gid: {},
                 describe_topic: Callable[[str, str, str], bool] | None = None) -> None:
        self.cfg = groups_cfg
        self.tc = tc
        self.now = now_ms
        self.store = GroupStateStore(directory, flush_policy, now_ms())
        self.offsets = OffsetManager(self.store, offset_metadata_max_bytes=groups_cfg.offset_metadata_max_bytes)
        self.groups = GroupCoordinator(
            _membership_config(groups_cfg),
            persist=lambda g, r: self.offsets.store_group(g, r, self.now()), now_ms=now_ms,
            topics=topics, group_configs=group_configs, describe_topic=describe_topic,
            persist_consumer=lambda g, c, classic=False: self.offsets.store_consumer_group(
                g, c, self.now(), classic))
        self._next_expiry = 0
        # The share groups of this worker (``appliance.group.share_group.ShareService``, set by
        # the worker once both exist): one namespace of group ids, as Kafka's one
        # GroupMetadataManager holds every group type.
        self.share = None

    def _is_share(self, group_id: str) -> bool:
        return self.share is not None and self.share.is_share_group(group_id)

    def reconfigure(self, groups_cfg, flush_policy) -> None:
        """A configuration reload: the new ``[groups]`` section and flush policy."""
        self.cfg = groups_cfg
        self.groups.config = _membership_config(groups_cfg)
        self.offsets.offset_metadata_max_bytes = groups_cfg.offset_metadata_max_bytes
        self.store.flush_policy = FlushPolicy(flush_policy)

    def load(self) -> None:
        records = self.offsets.load()
        self.groups.load(records, offset_groups=self.offsets.groups_with_offsets(),
                         consumer=self.offsets.consumer_group_records())
        log.info("group coordinator loaded %d groups (%d with offsets)", len(self.groups.group_ids()),
                 len(self.offsets.groups_with_offsets()))

    def close(self, clean: bool = True) -> None:
        self.offsets.close(clean)

    # -- timers -----------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        self.groups.tick(now_ms)
        if now_ms >= self._next_expiry:
            self._next_expiry = now_ms + self.cfg.offsets_retention_check_interval_ms
            r = self.offsets.expire_offsets(now_ms, self.cfg.offsets_retention_ms,
                                            self.groups.is_empty_or_dead,
                                            empty_since=self.groups.empty_since,
                                            subscribed_topics=self.groups.subscribed_topics)
            for g in r.deleted_groups:
                self.groups.forget_group(g)
            n = sum(len(v) for v in r.expired.values())
            if n:
                log.info("expired %d offsets of %d groups", n, len(r.expired))

    def next_deadline_ms(self) -> int | None:
        return self.groups.next_deadline_ms()

    def metrics_snapshot(self) -> tuple[list[tuple[str, str, int]],
                                        list[tuple[str, str, int, int]]]:
        """For the metrics: (group id, state, members) of every group, and (group, topic,
        partition, committed offset) of every committed offset."""
        offsets = [(g, tp[0], tp[1], e.offset)
                   for g, parts in self.store.offsets.items() for tp, e in parts.items()]
        return self.groups.summaries(), offsets

    def protocol_metrics(self) -> tuple[dict[str, int], dict[str, int], int]:
        return self.groups.protocol_metrics()

    # -- markers ----------------------------------------------------------------------------------
    def complete_txn(self, producer_id: int, producer_epoch: int, commit: bool,
                     coordinator_epoch: int) -> ErrorCode:
        """A commit/abort marker for an ``__consumer_offsets`` partition: the producer's pending
        offsets become committed or vanish (every group: one marker covers them all)."""
        return self.offsets.complete_txn(producer_id, producer_epoch, commit, self.now(),
                                         coordinator_epoch=coordinator_epoch)

    # -- membership -------------------------------------------------------------------------------
    @serves(JoinGroupRequest, late=True)
    def join_group(self, req: JoinGroupRequest, respond: Responder) -> None:
        if self._is_share(req.group_id):
            # Kafka's classicGroupJoin: a group of another type that is not a consumer group
            respond(JoinGroupResult(E.inconsistent_group_protocol, member_id=""))
            return
        self.groups.join_group(req, respond)

    @serves(SyncGroupRequest, late=True)
    def sync_group(self, req: SyncGroupRequest, respond: Responder) -> None:
        self.groups.sync_group(req, respond)

    @serves(HeartbeatRequest)
    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        return HeartbeatResult(self.groups.heartbeat(req))

    @serves(LeaveGroupRequest)
    def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResult:
        return self.groups.leave_group(req.group_id, req.members)

    @serves(DescribeGroupsRequest)
    def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResult:
        # A share group is not a classic group: GROUP_ID_NOT_FOUND, which the handler answers
        # as Kafka does per version (Dead below v6, "Group X is not a classic group." from v6).
        share = {g for g in req.group_ids if self._is_share(g)}
        described = iter(self.groups.describe_groups([g for g in req.group_ids if g not in share]))
        return DescribeGroupsResult([DescribedGroup(E.group_id_not_found, g, "Dead") if g in share
                                     else next(described) for g in req.group_ids])

    @serves(ListGroupsRequest)
    def list_groups(self, req: ListGroupsRequest) -> ListGroupsResult:
        r = self.groups.list_groups(req.states, req.types)
        if self.share is None or r.error != E.none:
            return r
        return ListGroupsResult(r.error, r.groups + self.share.list_share_groups(req.states,
                                                                                 req.types))

    @serves(DeleteGroupsRequest)
    def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResult:
        # Kafka's GroupCoordinatorService.deleteGroups: share groups first (their share state
        # deleted), then the others.
        share = {g: self.share.delete_share_group(g) for g in dict.fromkeys(req.group_ids)
                 if self._is_share(g)}
        res = self.groups.delete_groups([g for g in req.group_ids if g not in share],
                                        lambda g: self.offsets.delete_group(g, self.now()))
        res.update(share)
        return DeleteGroupsResult([GroupError(g, res.get(g, E.none)) for g in req.group_ids])

    # -- KIP-848 consumer groups ------------------------------------------------------------------
    @serves(ConsumerGroupHeartbeatRequest)
    def consumer_group_heartbeat(self, req: ConsumerGroupHeartbeatRequest
                                 ) -> ConsumerGroupHeartbeatResult:
        if self._is_share(req.group_id):
            return ConsumerGroupHeartbeatResult(E.group_id_not_found,
                                                f"Group {req.group_id} is not a consumer group.")
        return self.groups.consumer_group_heartbeat(req)

    @serves(ConsumerGroupDescribeRequest)
    def consumer_group_describe(self, req: ConsumerGroupDescribeRequest
                                ) -> ConsumerGroupDescribeResult:
        return ConsumerGroupDescribeResult(self.groups.consumer_group_describe(req.group_ids))

    # -- offsets ----------------------------------------------------------------------------------
    @serves(OffsetCommitRequest)
    def offset_commit(self, req: OffsetCommitRequest) -> OffsetsResult:
        if self._is_share(req.group_id):        # Kafka's ShareGroup.validateOffsetCommit
            return OffsetsResult(E.group_id_not_found)
        err = self.groups.validate_offset_commit(req.group_id, req.generation_id, req.member_id,
                                                 req.group_instance_id, api_version=req.api_version,
                                                 partitions=[(o.topic, o.partition)
                                                             for o in req.offsets])
        if err != E.none:
            return OffsetsResult(err)
        res = self.offsets.commit_offsets(req.group_id, _items(req.offsets), self.now())
        return OffsetsResult(E.none, _entries(req.offsets, res))

    @serves(TxnOffsetCommitRequest)
    def txn_offset_commit(self, req: TxnOffsetCommitRequest) -> OffsetsResult:
        part = (OFFSETS_TOPIC, partition_for(req.group_id, self.tc.offsets_topic_partitions))
        # v5 (transaction version 2): the request itself adds the partition (KIP-890 part 2).
        err = self.tc.verify_partition(req.transactional_id, req.producer_id, req.producer_epoch,
                                       part, add=req.api_version >= 5)
        if err in _RETRIABLE_TO_NOT_AVAILABLE:
            err = E.coordinator_not_available
        elif err == E.invalid_txn_state and req.api_version == 4:
            # The offsets partition is not in the transaction (no AddOffsetsToTxn): Kafka's
            # coordinator says TRANSACTION_ABORTABLE, which its broker passes on to v4 clients
            # (KIP-890 ``genericError``) and turns into INVALID_TXN_STATE for v0-3.
            err = E.transaction_abortable
        if err == E.none and self._is_share(req.group_id):
            err = E.group_id_not_found
        if err == E.none and req.api_version >= 3:
            err = self.groups.validate_txn_offset_commit(req.group_id, req.generation_id,
                                                         req.member_id, req.group_instance_id,
                                                         [(o.topic, o.partition)
                                                          for o in req.offsets])
        if err != E.none:
            return OffsetsResult(err)
        res = self.offsets.txn_commit_offsets(req.group_id, req.producer_id, req.producer_epoch,
                                              _items(req.offsets), self.now())
        return OffsetsResult(E.none, _entries(req.offsets, res))

    @serves(OffsetFetchRequest)
    def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResult:
        out = []
        for g in req.groups:
            gate = self.offsets.unavailable()
            if gate is not None:
                out.append(OffsetFetchGroup(g.group_id, [], gate))
                continue
            if self._is_share(g.group_id):      # Kafka's ShareGroup.validateOffsetFetch
                out.append(OffsetFetchGroup(g.group_id, [], E.group_id_not_found))
                continue
            err = self.groups.validate_offset_fetch(g.group_id, g.member_id, g.member_epoch)
            if err != E.none:
                out.append(OffsetFetchGroup(g.group_id, [], err))
                continue
            wanted = None if g.partitions is None else [(e.topic, e.partition) for e in g.partitions]
            out.append(OffsetFetchGroup(g.group_id, self.offsets.fetch_offsets(
                g.group_id, wanted, req.require_stable)))
        return OffsetFetchResult(out)

    @serves(OffsetDeleteRequest)
    def offset_delete(self, req: OffsetDeleteRequest) -> OffsetsResult:
        if self._is_share(req.group_id):        # Kafka's ShareGroup.validateOffsetDelete
            return OffsetsResult(E.group_id_not_found)
        state = self.groups.group_state(req.group_id)
        if state is None and not self.offsets.has_offsets(req.group_id):
            return OffsetsResult(E.group_id_not_found)
        subscribed = self.groups.subscribed_topics(req.group_id) or set()
        results: dict = {}
        doomed = []
        for e in req.partitions:
            if e.topic in subscribed:
                # KIP-496: offsets of a topic the group's members consume cannot be deleted.
                results[(e.topic, e.partition)] = E.group_subscribed_to_topic
            else:
                doomed.append((e.topic, e.partition))
        if doomed:
            results.update(self.offsets.delete_offsets(req.group_id, doomed, self.now()))
        return OffsetsResult(E.none, _entries(req.partitions, results))


def _membership_config(cfg) -> MembershipConfig:
    """The membership side's configs from the ``[groups]`` section."""
    return MembershipConfig(cfg.min_session_timeout_ms, cfg.max_session_timeout_ms,
                            cfg.initial_rebalance_delay_ms, cfg.max_size,
                            cfg.consumer_heartbeat_interval_ms, cfg.consumer_session_timeout_ms,
                            tuple(cfg.consumer_assignors), cfg.consumer_max_size,
                            cfg.consumer_migration_policy)


def _items(offsets: list[OffsetPartition]) -> list[tuple]:
    """The OffsetManager's (topic, partition, offset, leader epoch, metadata) items."""
    return [(o.topic, o.partition, o.offset, o.leader_epoch, o.metadata) for o in offsets]


def _entries(asked: list[OffsetPartition], results: dict) -> list[OffsetPartition]:
    return [OffsetPartition(o.topic, o.partition, error=results.get((o.topic, o.partition), E.none))
            for o in asked]
