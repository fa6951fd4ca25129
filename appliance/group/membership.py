"""The consumer-group membership coordinator (Kafka's GroupCoordinator), sans-IO: one state
object and the collaborators that decide over it.

Runs inside the coordinator worker (``workers/coordinator.py``) next to the transaction
coordinator. The worker owns sockets, rings, the group log and the clock; ``GroupCoordinator``
owns the membership of every group (members, generations, the selected protocol, the leader,
assignments, the timers of the rebalance protocol) and decides JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups, ListGroups and DeleteGroups, and the group checks of OffsetCommit and
TxnOffsetCommit (``validate_offset_commit`` / ``validate_txn_offset_commit``, used by
``appliance.group.offsets``' caller). Single-threaded; no I/O, no threads; time comes from
``now_ms``. Nothing here raises into the worker loop: an unexpected error answers
UNKNOWN_SERVER_ERROR.

Behaviour is Kafka's (core/.../coordinator/group/GroupCoordinator.scala, GroupMetadata.scala,
late-2024 trunk, checked against the newer group-coordinator module's classic-group code where
the two differ; the wire-level pieces of KafkaApis/GroupCoordinatorAdapter too). Departures are
marked "(ours)". Split by concern, as Kafka's GroupMetadataManager is around its map of groups:

- ``table.GroupTable``, the state: the groups by id (one namespace for every group type), the
  store (``persist`` and Kafka's storeGroup error mapping), the timer heap, the deferred answers,
  the clock, the configs;
- ``membership_join.RebalanceProtocol``: JoinGroup, the join and sync phases, the timers firing;
- ``membership_sync.MemberRequests``: SyncGroup, Heartbeat, LeaveGroup;
- ``membership_admin.GroupAdmin``: DescribeGroups, ListGroups, DeleteGroups, the OffsetCommit
  checks and the queries of the offsets side;
- ``classic_group``: one classic group's data and its state table.

Each collaborator receives the table; the two that must move a rebalance (a leave, a failed
store, a commit that counts as a heartbeat) receive the RebalanceProtocol at construction. This
class builds them, restores the groups (``load``) and delegates every public method. The requests
and results are the ring types of ``appliance.group.messages``, taken and returned as they are.

Consumer groups (KIP-848, ``consumer_group.ConsumerGroup``) live in the same
``GroupTable.groups`` with ``group_type`` "consumer"; their protocol (ConsumerGroupHeartbeat,
ConsumerGroupDescribe) is the collaborator ``consumer_protocol.ConsumerGroupProtocol``, whose
timer kinds (``SESSION``, ``REBALANCE``) share the table's heap (``_fire`` routes them);
``GroupAdmin`` lists, describes (DescribeGroups: GROUP_ID_NOT_FOUND, as Kafka 4), deletes them
and checks their OffsetCommit/OffsetFetch member epochs; the classic requests find only classic
groups (``GroupTable.classic``). Share groups (KIP-932) would plug in the same way.

Group states (``appliance.group.classic_group.GroupState``; transitions checked there)::

    Empty ----join----> PreparingRebalance --join phase over--> CompletingRebalance
      ^                   ^        |  (no member left)               |  leader's SyncGroup
      |                   |        +-----------> Empty               v  stored
      |                   +--- join / leave / expiry ------------ Stable
    Dead: deleted (DeleteGroups) or dropped (offsets expired); removed from memory at once.

Asynchronous answers. ``join_group`` and ``sync_group`` take a ``respond`` callable that is
called exactly once with the result: at once, or later from ``tick``, from another member's
request, or from ``leave_group``. Answers are queued and delivered when the outermost public call
returns (state is consistent by then); ``respond`` may call back into this class.

Timers (Kafka's purgatories: session expiry, KIP-394 pending members, the join phase with
KIP-134's initial delay, the sync phase) are described in ``membership_join``; ``tick(now)``
fires the due ones and ``next_deadline_ms()`` tells the worker when to wake.

Durability. ``persist(group_id, record)`` is called, and must be durable when it returns, when the
leader's assignment arrives (before anyone gets it), when a static member is replaced without a
rebalance, when a group becomes Empty, and with ``None`` (tombstone) when a group is deleted or
dropped. It may return None or ErrorCode.NONE (success), another ErrorCode, or raise (an
exception with an ErrorCode ``code`` attribute is mapped like that code); failures are mapped as
Kafka's storeGroup maps append errors (``records.store_group_error``). ``load(records)``
restores groups after a restart: a group with members comes back Stable with its generation,
leader and assignments, and every member must heartbeat within its session timeout or is
removed.

Offsets side (``appliance.group.offsets``): ``is_empty_or_dead``, ``empty_since`` and
``subscribed_topics`` have the shapes its ``expire_offsets`` wants; ``on_empty(group_id, ts)`` is
called whenever a group becomes Empty (and at load for Empty groups with a protocol type);
``forget_group`` drops a group the offsets side has deleted; ``remove_empty_groups`` is Kafka's
cleanup of empty groups without offsets. A simple ("standalone") commit with generation -1 to an
unknown group creates an Empty group without protocol type, as Kafka does.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from appliance.errors import ErrorCode
from appliance.group.classic_group import ClassicGroup, GroupState, Member
from appliance.group.consumer_group import ConsumerGroupState
from appliance.group.consumer_protocol import SESSION as CONSUMER_SESSION
from appliance.group import consumer_records
from appliance.group.consumer_protocol import ConsumerGroupProtocol, restore_timers
from appliance.group.membership_admin import GroupAdmin, GroupInfo
from appliance.group.membership_join import NEW_MEMBER_JOIN_TIMEOUT_MS, RebalanceProtocol
from appliance.group.membership_sync import MemberRequests
from appliance.group.migration import GroupMigration
from appliance.group.messages import (ConsumerGroupHeartbeatRequest,
                                      ConsumerGroupHeartbeatResult, DescribedConsumerGroup,
                                      DescribedGroup, HeartbeatRequest, JoinGroupRequest,
                                      JoinGroupResult, LeaveGroupResult, LeaveMember,
                                      ListGroupsResult, SyncGroupRequest, SyncGroupResult)
from appliance.group.records import GroupRecord
from appliance.group.table import GroupTable

__all__ = ["GroupCoordinator", "MembershipConfig", "GroupConfigLike", "NEW_MEMBER_JOIN_TIMEOUT_MS"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState


class GroupConfigLike(Protocol):
    group_min_session_timeout_ms: int
    group_max_session_timeout_ms: int
    group_initial_rebalance_delay_ms: int
    group_max_size: int


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    """Kafka's group.* broker configs for classic groups, with Kafka's defaults."""

    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2**31 - 1
    # KIP-848 consumer groups (group.consumer.*)
    consumer_heartbeat_interval_ms: int = 5000
    consumer_session_timeout_ms: int = 45000
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    consumer_max_size: int = 2**31 - 1
    # group.consumer.migration.policy: bidirectional, upgrade, downgrade, disabled
    consumer_migration_policy: str = "bidirectional"


class GroupCoordinator:
    """The table of groups and the collaborators over it; every public method delegates."""

    def __init__(self, config: GroupConfigLike, persist: Callable[[str, GroupRecord | None], Any],
                 now_ms: Callable[[], int], *,
                 on_empty: Callable[[str, int], None] | None = None,
                 new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
                 topics: Callable[[], dict[str, tuple[bytes, int]]] = dict,
                 persist_consumer: Callable[[str, list], Any] | None = None,
                 group_configs: Callable[[str], dict[str, str]] = lambda gid: {},
                 describe_topic: Callable[[str, str, str], bool] | None = None) -> None:
        self.table = GroupTable(config, persist, now_ms, on_empty=on_empty,
                                persist_consumer=persist_consumer, group_configs=group_configs)
        self.consumer = ConsumerGroupProtocol(self.table, topics, describe_topic=describe_topic)
        self.rebalance = RebalanceProtocol(self.table,
                                           new_member_join_timeout_ms=new_member_join_timeout_ms,
                                           new_uuid=new_uuid)
        self.member_requests = MemberRequests(self.table, self.rebalance)
        self.admin = GroupAdmin(self.table, self.rebalance, topics)
        # KIP-848 online migration: hooks itself into the two protocols
        self.migration = GroupMigration(self.table, self.consumer, self.rebalance)

    @property
    def config(self) -> GroupConfigLike:
        return self.table.config

    @config.setter
    def config(self, config: GroupConfigLike) -> None:
        """A configuration reload (``GroupService.reconfigure``): every collaborator reads the
        table's."""
        self.table.config = config

    @property
    def new_member_join_timeout_ms(self) -> int:
        return self.rebalance.new_member_join_timeout_ms

    # -- life cycle -------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self.table.loaded

    def load(self, records: dict[str, GroupRecord | None], offset_groups: Iterable[str] = (),
             consumer: dict[str, dict] | None = None) -> None:
        """Restore the groups of the group log (Kafka's loadGroupsAndOffsets + onGroupLoaded).
        ``offset_groups``: groups that have offsets but no stored metadata (standalone
        consumers); they come back Empty without protocol type. Until this is called every
        request answers COORDINATOR_LOAD_IN_PROGRESS (SyncGroup: REBALANCE_IN_PROGRESS,
        Heartbeat: NONE, as Kafka); call ``load({})`` for a fresh log. ``consumer``: the
        records of the KIP-848 consumer groups (group -> {ConsumerKey: value}), restored with
        their epochs and assignments; every member gets a fresh session timeout."""
        table = self.table
        if table.loaded:
            log.warning("group coordinator already loaded; load() ignored")
            return
        table.enter()
        try:
            now = table.now()
            for gid, recs in (consumer or {}).items():
                try:
                    cgroup = consumer_records.restore(gid, recs, now)
                except Exception:
                    log.exception("consumer group %r: stored records not loadable; group "
                                  "dropped", gid)
                    continue
                if cgroup is None:
                    continue
                cgroup.stored = dict(recs)
                table.groups[gid] = cgroup
                restore_timers(table, cgroup)
            for gid, rec in records.items():
                if gid in table.groups:
                    log.error("group %r: both classic and consumer records; the consumer "
                              "group is kept", gid)
                    continue
                if rec is None:
                    continue
                try:
                    self._load_group(gid, rec, now)
                except Exception:
                    log.exception("group %r: stored metadata not loadable; group dropped", gid)
                    table.groups.pop(gid, None)
            for gid in offset_groups:
                if gid not in table.groups:
                    table.create_classic_group(gid)
            table.loaded = True
            for group in list(table.groups.values()):
                if group.is_(S.Empty) and group.protocol_type is not None:
                    table.notify_empty(group)
            log.info("group coordinator loaded %d groups", len(table.groups))
        finally:
            table.leave()

    def _load_group(self, gid: str, rec: GroupRecord, now: int) -> None:
        group = ClassicGroup(gid, S.Stable if rec.members else S.Empty, now)
        group.generation_id = rec.generation
        group.protocol_name = rec.protocol
        group.leader_id = rec.leader
        self.table.groups[gid] = group
        for m in rec.members:
            member = Member(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                            m.rebalance_timeout if m.rebalance_timeout >= 0 else m.session_timeout,
                            m.session_timeout, rec.protocol_type,
                            [(rec.protocol or "", bytes(m.subscription))], bytes(m.assignment))
            try:
                group.add(member, None)
            except ValueError as e:                  # a duplicate instance id: not from us
                log.error("group %r: %s; member %r dropped", gid, e, m.member_id)
        group.protocol_type = rec.protocol_type or None
        if group.members and group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))      # (ours) defensive
        if not group.members:
            group.state = S.Empty
        ts = rec.current_state_timestamp
        group.state_timestamp = None if ts == -1 else ts
        group.subscribed_topics = group.compute_subscribed_topics()
        if group.size > self.config.group_max_size:
            log.info("group %r loaded over capacity (%d > %d); rebalancing", gid, group.size,
                     self.config.group_max_size)
            self.rebalance.prepare_rebalance(group)
        for member in group.members.values():
            self.rebalance.schedule_hb(group, member, member.session_timeout_ms)

    # -- timers -----------------------------------------------------------------------------------
    def next_deadline_ms(self) -> int | None:
        """The earliest timer (possibly one that will turn out to be stale), or None."""
        return self.table.next_deadline_ms()

    def tick(self, now_ms: int | None = None) -> None:
        """Fire every timer due at ``now_ms``. Timers a fired one starts are left for the next
        call, so a zero timeout cannot spin."""
        self.table.tick(now_ms, self._fire)

    def _fire(self, kind: int, seq: int, obj: Any, extra: Any, now: int) -> None:
        if kind >= CONSUMER_SESSION:
            self.consumer.fire(kind, seq, obj, extra, now)
        else:
            self.rebalance.fire(kind, seq, obj, extra, now)

    # -- member requests --------------------------------------------------------------------------
    def join_group(self, req: JoinGroupRequest, respond: Callable[[JoinGroupResult], None]) -> None:
        self.rebalance.join_group(req, respond)

    def sync_group(self, req: SyncGroupRequest, respond: Callable[[SyncGroupResult], None]) -> None:
        self.member_requests.sync_group(req, respond)

    def heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        return self.member_requests.heartbeat(req)

    def leave_group(self, group_id: str,
                    members: Iterable[LeaveMember | tuple]) -> LeaveGroupResult:
        """LeaveGroup: v0-2 pass ``[(member_id, None)]`` and answer ``legacy_error``; v3+ the
        batch. An empty member id with a group.instance.id removes that static member (admin)."""
        return self.member_requests.leave_group(group_id, members)

    # -- KIP-848 consumer groups -----------------------------------------------------------------
    def consumer_group_heartbeat(self, req: ConsumerGroupHeartbeatRequest
                                 ) -> ConsumerGroupHeartbeatResult:
        return self.consumer.heartbeat(req)

    def consumer_group_describe(self, group_ids: list[str]) -> list[DescribedConsumerGroup]:
        return self.consumer.describe(group_ids)

    # -- admin ------------------------------------------------------------------------------------
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        return self.admin.describe_groups(group_ids)

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> ListGroupsResult:
        return self.admin.list_groups(states, types)

    def delete_groups(self, group_ids: Iterable[str],
                      on_deleted: Callable[[str], Any]) -> dict[str, ErrorCode]:
        return self.admin.delete_groups(group_ids, on_deleted)

    def forget_group(self, group_id: str) -> bool:
        return self.admin.forget_group(group_id)

    def remove_empty_groups(self, has_offsets: Callable[[str], bool]) -> list[str]:
        return self.admin.remove_empty_groups(has_offsets)

    def ensure_group(self, group_id: str) -> None:
        self.admin.ensure_group(group_id)

    # -- for the offsets side ---------------------------------------------------------------------
    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                               group_instance_id: str | None, *, api_version: int = 8,
                               partitions: list[tuple[str, int]] | None = None) -> ErrorCode:
        return self.admin.validate_offset_commit(group_id, generation_id, member_id,
                                                 group_instance_id, api_version=api_version,
                                                 partitions=partitions)

    def validate_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                                   group_instance_id: str | None,
                                   partitions: list[tuple[str, int]] | None = None) -> ErrorCode:
        return self.admin.validate_txn_offset_commit(group_id, generation_id, member_id,
                                                     group_instance_id, partitions)

    def validate_offset_fetch(self, group_id: str, member_id: str | None,
                              member_epoch: int) -> ErrorCode:
        return self.admin.validate_offset_fetch(group_id, member_id, member_epoch)

    def group_state(self, group_id: str) -> str | None:
        return self.admin.group_state(group_id)

    def is_empty_or_dead(self, group_id: str) -> bool:
        return self.admin.is_empty_or_dead(group_id)

    def empty_since(self, group_id: str) -> int | None:
        return self.admin.empty_since(group_id)

    def subscribed_topics(self, group_id: str) -> set[str] | None:
        return self.admin.subscribed_topics(group_id)

    def group_info(self, group_id: str) -> GroupInfo | None:
        return self.admin.group_info(group_id)

    def summaries(self) -> list[tuple[str, str, int]]:
        return self.admin.summaries()

    def protocol_metrics(self) -> tuple[dict[str, int], dict[str, int], int]:
        """For Kafka's group-coordinator-metrics (KIP-848): groups by type, consumer groups by
        state (lower case, as Kafka's label), consumer group rebalances since the start."""
        by_type = {"classic": 0, "consumer": 0}
        by_state = {s.lower: 0 for s in ConsumerGroupState}
        for g in self.table.groups.values():
            by_type[g.group_type] = by_type.get(g.group_type, 0) + 1
            if g.group_type == "consumer":
                by_state[g.state.lower] += 1
        return by_type, by_state, self.consumer.rebalances

    def group_ids(self) -> list[str]:
        return self.admin.group_ids()
