"""The classic consumer-group membership coordinator (Kafka's GroupCoordinator), sans-IO.

Runs inside the coordinator worker (``workers/coordinator.py``) next to the transaction
coordinator. The worker owns sockets, rings, the group log and the clock; this class owns the
membership of every classic group (members, generations, the selected protocol, the leader,
assignments, the timers of the rebalance protocol) and decides JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups, ListGroups and DeleteGroups, and the group checks of OffsetCommit and
TxnOffsetCommit (``validate_offset_commit`` / ``validate_txn_offset_commit``, used by
``appliance.group.offsets``' caller). Single-threaded; no I/O, no threads; time comes from
``now_ms``. Nothing here raises into the worker loop: an unexpected error answers
UNKNOWN_SERVER_ERROR.

Behaviour is Kafka's (core/.../coordinator/group/GroupCoordinator.scala, GroupMetadata.scala,
late-2024 trunk, checked against the newer group-coordinator module's classic-group code where
the two differ; the wire-level pieces of KafkaApis/GroupCoordinatorAdapter too). Departures are
marked "(ours)". Split by concern: this module holds the life cycle, the timers, JoinGroup and
the rebalance; SyncGroup, Heartbeat and LeaveGroup are in ``membership_sync`` and
DescribeGroups/ListGroups/DeleteGroups and the offsets-side queries in ``membership_admin`` (both
mixins); one group's data and state table in ``classic_group``. The requests and results are the
ring types of ``appliance.group.messages``, taken and returned as they are.

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

Timers (Kafka's purgatories) sit in one heap of deadlines; ``tick(now)`` fires the due ones and
``next_deadline_ms()`` tells the worker when to wake. The worker must call ``tick`` regularly
(each loop turn is fine: it is O(due timers)).

- session expiry (heartbeat purgatory): every member has a deadline, reset by Heartbeat, by a
  SyncGroup answer, by an OffsetCommit in Stable/PreparingRebalance, and at the end of a join
  phase. At the deadline a member that is parked in JoinGroup/SyncGroup counts as alive (the
  rebalance timeout governs it); any other member is removed and the group rebalances. A new
  member parked in its first JoinGroup is removed after ``new_member_join_timeout_ms`` (Kafka's
  NewMemberJoinTimeoutMs, 5 minutes).
- KIP-394 (member id required): a JoinGroup v4+ without member id and without group.instance.id
  gets MEMBER_ID_REQUIRED and a generated id ``client_id + "-" + uuid``; that pending id must
  rejoin within its session timeout or is forgotten (the join phase does not wait for it longer).
- join phase (DelayedJoin): ends when every known member and pending id has rejoined, or at the
  group's rebalance timeout (max over members); dynamic members that did not rejoin are removed,
  static ones are kept (KIP-345) and must then SyncGroup in time.
- KIP-134 initial delay (InitialDelayedJoin): a rebalance of an Empty group waits
  group_initial_rebalance_delay_ms, and again (up to the rebalance timeout in all) as long as new
  members keep arriving during a delay.
- sync phase (DelayedSync): members that do not send SyncGroup within the rebalance timeout after
  the join phase are removed and the group rebalances.

Durability. ``persist(group_id, record)`` is called, and must be durable when it returns, when the
leader's assignment arrives (before anyone gets it), when a static member is replaced without a
rebalance, when a group becomes Empty, and with ``None`` (tombstone) when a group is deleted or
dropped. It may return None or ErrorCode.NONE (success), another ErrorCode, or raise (an
exception with an ErrorCode ``code`` attribute is mapped like that code); failures are mapped as
Kafka's storeGroup maps append errors. ``load(records)`` restores groups after a restart: a group
with members comes back Stable with its generation, leader and assignments, and every member must
heartbeat within its session timeout or is removed.

Offsets side (``appliance.group.offsets``): ``is_empty_or_dead``, ``empty_since`` and
``subscribed_topics`` have the shapes its ``expire_offsets`` wants; ``on_empty(group_id, ts)`` is
called whenever a group becomes Empty (and at load for Empty groups with a protocol type);
``forget_group`` drops a group the offsets side has deleted; ``remove_empty_groups`` is Kafka's
cleanup of empty groups without offsets. A simple ("standalone") commit with generation -1 to an
unknown group creates an Empty group without protocol type, as Kafka does.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from appliance.errors import ErrorCode
from appliance.group.classic_group import ClassicGroup, GroupState, Member, dedupe_protocols
from appliance.group.membership_admin import GroupAdmin, _store_error
from appliance.group.membership_sync import SUPERSEDED, MemberRequests, Once
from appliance.group.messages import (JoinGroupMember, JoinGroupRequest, JoinGroupResult,
                                      SyncGroupResult)
from appliance.group.records import GroupMemberRecord, GroupRecord

__all__ = ["GroupCoordinator", "MembershipConfig", "GroupConfigLike", "NEW_MEMBER_JOIN_TIMEOUT_MS"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000     # GroupCoordinator.NewMemberJoinTimeoutMs


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


_HB, _PENDING, _JOIN, _SYNC = range(4)


class GroupCoordinator(GroupAdmin, MemberRequests):
    def __init__(self, config: GroupConfigLike, persist: Callable[[str, GroupRecord | None], Any],
                 now_ms: Callable[[], int], *,
                 on_empty: Callable[[str, int], None] | None = None,
                 new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.config = config
        self._persist = persist
        self._now_fn = now_ms
        self._on_empty = on_empty
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self._uuid = new_uuid
        self._groups: dict[str, ClassicGroup] = {}
        self._heap: list[tuple[int, int, int, Any, Any]] = []
        self._seq = itertools.count(1)
        self._out: deque[tuple[Once, Any]] = deque()
        self._depth = 0
        self._clock: int | None = None
        self._loaded = False

    # -- plumbing ---------------------------------------------------------------------------------
    def _now(self) -> int:
        return self._clock if self._clock is not None else self._now_fn()

    def _enter(self) -> None:
        self._depth += 1

    def _leave(self) -> None:
        self._depth -= 1
        if self._depth:
            return
        self._depth += 1                     # replies made by a respond that re-enters wait here
        try:
            while self._out:
                once, result = self._out.popleft()
                try:
                    once.fn(result)
                except Exception:
                    log.exception("respond callback failed")
        finally:
            self._depth -= 1

    def _reply(self, once: Once | None, result: Any) -> None:
        if once is None or once.done:
            return
        once.done = True
        self._out.append((once, result))

    def _push(self, deadline: int, kind: int, obj: Any, extra: Any = None) -> int:
        seq = next(self._seq)
        heapq.heappush(self._heap, (deadline, seq, kind, obj, extra))
        return seq

    def _live(self, group: ClassicGroup) -> bool:
        return group.state is not S.Dead and self._groups.get(group.group_id) is group

    def _store(self, group_id: str, record: GroupRecord | None) -> ErrorCode:
        try:
            r = self._persist(group_id, record)
        except Exception as e:
            log.error("storing group %r failed: %r", group_id, e)
            return _store_error(getattr(e, "code", None))
        if r is None or r is True or (not isinstance(r, bool) and r == E.none):
            return E.none
        log.error("storing group %r failed: %s", group_id, getattr(r, "name", r))
        return _store_error(r)

    def _record(self, group: ClassicGroup, assignment: dict[str, bytes] | None = None) -> GroupRecord:
        members = [GroupMemberRecord(
            member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms,
            session_timeout=m.session_timeout_ms, subscription=m.metadata(group.protocol_name),
            assignment=m.assignment if assignment is None else assignment.get(m.member_id, b""))
            for m in group.members.values()]
        ts = group.state_timestamp
        return GroupRecord(protocol_type=group.protocol_type or "", generation=group.generation_id,
                           protocol=group.protocol_name, leader=group.leader_id,
                           current_state_timestamp=-1 if ts is None else ts, members=members)

    def _create(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, S.Empty, self._now())
        self._groups[group_id] = group
        return group

    def _notify_empty(self, group: ClassicGroup) -> None:
        if self._on_empty is not None:
            try:
                ts = group.state_timestamp
                self._on_empty(group.group_id, self._now() if ts is None else ts)
            except Exception:
                log.exception("on_empty hook failed for group %r", group.group_id)

    # -- life cycle -------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self, records: dict[str, GroupRecord | None], offset_groups: Iterable[str] = ()) -> None:
        """Restore the groups of the group log (Kafka's loadGroupsAndOffsets + onGroupLoaded).
        ``offset_groups``: groups that have offsets but no stored metadata (standalone
        consumers); they come back Empty without protocol type. Until this is called every
        request answers COORDINATOR_LOAD_IN_PROGRESS (SyncGroup: REBALANCE_IN_PROGRESS,
        Heartbeat: NONE, as Kafka); call ``load({})`` for a fresh log."""
        if self._loaded:
            log.warning("group coordinator already loaded; load() ignored")
            return
        self._enter()
        try:
            now = self._now()
            for gid, rec in records.items():
                if rec is None:
                    continue
                try:
                    self._load_group(gid, rec, now)
                except Exception:
                    log.exception("group %r: stored metadata not loadable; group dropped", gid)
                    self._groups.pop(gid, None)
            for gid in offset_groups:
                if gid not in self._groups:
                    self._create(gid)
            self._loaded = True
            for group in list(self._groups.values()):
                if group.is_(S.Empty) and group.protocol_type is not None:
                    self._notify_empty(group)
            log.info("group coordinator loaded %d groups", len(self._groups))
        finally:
            self._leave()

    def _load_group(self, gid: str, rec: GroupRecord, now: int) -> None:
        group = ClassicGroup(gid, S.Stable if rec.members else S.Empty, now)
        group.generation_id = rec.generation
        group.protocol_name = rec.protocol
        group.leader_id = rec.leader
        self._groups[gid] = group
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
            self._prepare_rebalance(group)
        for member in group.members.values():
            self._schedule_hb(group, member, member.session_timeout_ms)

    # -- timers -----------------------------------------------------------------------------------
    def next_deadline_ms(self) -> int | None:
        """The earliest timer (possibly one that will turn out to be stale), or None."""
        return self._heap[0][0] if self._heap else None

    def tick(self, now_ms: int | None = None) -> None:
        """Fire every timer due at ``now_ms``. Timers a fired one starts are left for the next
        call, so a zero timeout cannot spin."""
        now = self._now_fn() if now_ms is None else now_ms
        self._enter()
        self._clock = now
        try:
            first_new = next(self._seq)
            heap = self._heap
            while heap and heap[0][0] <= now and heap[0][1] < first_new:
                _, seq, kind, obj, extra = heapq.heappop(heap)
                try:
                    self._fire(kind, seq, obj, extra, now)
                except Exception:
                    log.exception("group timer failed")
        finally:
            self._clock = None
            self._leave()

    def _fire(self, kind: int, seq: int, obj: Any, extra: Any, now: int) -> None:
        if kind == _HB:
            member: Member = obj
            group: ClassicGroup = extra
            if member.hb_entry != seq:
                return
            member.hb_entry = None
            if member.removed or member.hb_deadline is None or not self._live(group):
                return
            if member.hb_deadline > now:                         # extended since: watch again
                member.hb_entry = self._push(member.hb_deadline, _HB, member, group)
                member.hb_entry_deadline = member.hb_deadline
                return
            member.hb_deadline = None
            if not member.has_satisfied_heartbeat():
                log.info("member %s of group %r failed (session timeout); removing it",
                         member.member_id, group.group_id)
                self._remove_member_and_update_group(group, member)
        elif kind == _PENDING:
            group = obj
            if self._live(group) and group.pending_members.get(extra) == seq:
                log.info("pending member %s of group %r did not rejoin; forgotten", extra,
                         group.group_id)
                self._remove_pending_member_and_update_group(group, extra)
        elif kind == _JOIN:
            group = obj
            if not self._live(group) or group.join_token != seq:
                return
            if group.join_initial and group.new_member_added and group.join_remaining_ms != 0:
                # KIP-134: new members arrived during the delay: wait again, within the budget
                group.new_member_added = False
                delay = min(self.config.group_initial_rebalance_delay_ms, group.join_remaining_ms)
                remaining = max(group.join_remaining_ms - group.join_delay_ms, 0)
                self._start_join_timer(group, delay, True, remaining)
            else:
                self._complete_join(group)
        elif kind == _SYNC:
            group = obj
            if self._live(group) and group.sync_token == seq:
                group.sync_token = None
                self._expire_pending_sync(group, extra)

    def _schedule_hb(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None:
        """Kafka's completeAndScheduleNextExpiration: the member's deadline is now + timeout."""
        deadline = self._now() + timeout_ms
        member.hb_deadline = deadline
        if member.hb_entry is None or deadline < member.hb_entry_deadline:
            member.hb_entry = self._push(deadline, _HB, member, group)
            member.hb_entry_deadline = deadline

    def _start_join_timer(self, group: ClassicGroup, delay_ms: int, initial: bool,
                          remaining_ms: int = 0) -> None:
        group.join_initial = initial
        group.join_delay_ms = delay_ms
        group.join_remaining_ms = remaining_ms
        group.join_token = self._push(self._now() + delay_ms, _JOIN, group)

    # -- JoinGroup --------------------------------------------------------------------------------
    def join_group(self, req: JoinGroupRequest, respond: Callable[[JoinGroupResult], None]) -> None:
        once = Once(respond)
        self._enter()
        try:
            self._join(req, once)
        except Exception:
            log.exception("JoinGroup of %r failed", req.group_id)
            self._reply(once, JoinGroupResult(E.unknown_server_error, member_id=req.member_id))
        finally:
            self._leave()

    def _join(self, req: JoinGroupRequest, once: Once) -> None:
        mid = req.member_id or ""
        if not req.group_id:
            return self._reply(once, JoinGroupResult(E.invalid_group_id, member_id=mid))
        if not self._loaded:
            return self._reply(once, JoinGroupResult(E.coordinator_load_in_progress, member_id=mid))
        cfg = self.config
        if not (cfg.group_min_session_timeout_ms <= req.session_timeout_ms
                <= cfg.group_max_session_timeout_ms):
            return self._reply(once, JoinGroupResult(E.invalid_session_timeout, member_id=mid))
        group = self._groups.get(req.group_id)
        if group is None:
            if mid:
                return self._reply(once, JoinGroupResult(E.unknown_member_id, member_id=mid))
            group = self._create(req.group_id)
        if not self._accept_joining_member(group, mid):
            self._forget_member(group, mid)
            self._reply(once, JoinGroupResult(E.group_max_size_reached))
        elif not mid:
            self._new_member_join(group, req, once)
        else:
            self._current_member_join(group, mid, req, once)
        if group.is_(S.PreparingRebalance):
            self._maybe_complete_join(group)

    def _accept_joining_member(self, group: ClassicGroup, mid: str) -> bool:
        if group.state in (S.Empty, S.Dead):
            return True
        if group.is_(S.PreparingRebalance):
            # counting members that already rejoined lets the last ones to rejoin be refused
            m = group.members.get(mid)
            return (m is not None and m.awaiting_join) or \
                group.num_awaiting_join() < self.config.group_max_size
        return group.has(mid) or group.size < self.config.group_max_size

    @staticmethod
    def _timeouts(req: JoinGroupRequest) -> tuple[int, int]:
        rt = req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms
        return rt, req.session_timeout_ms

    def _new_member_join(self, group: ClassicGroup, req: JoinGroupRequest, once: Once) -> None:
        if group.is_(S.Dead):
            return self._reply(once, JoinGroupResult(E.coordinator_not_available))
        protocols = dedupe_protocols(req.protocols)
        if not group.supports_protocols(req.protocol_type, {p for p, _ in protocols}):
            return self._reply(once, JoinGroupResult(E.inconsistent_group_protocol))
        iid = req.group_instance_id
        new_id = f"{iid if iid is not None else req.client_id}-{self._uuid()}"
        if iid is not None:
            old_id = group.current_static_member_id(iid)
            if old_id is not None:
                log.info("static member %r of group %r rejoins with a new member id; %s replaces %s",
                         iid, group.group_id, new_id, old_id)
                self._update_static_member_and_rebalance(group, old_id, new_id, iid, req,
                                                         protocols, once)
            else:
                self._add_member_and_rebalance(group, new_id, iid, req, protocols, once)
        elif req.api_version >= 4:
            # KIP-394: hand out the id, remember it, and wait for the rejoin that carries it
            group.pending_members[new_id] = self._push(self._now() + req.session_timeout_ms,
                                                       _PENDING, group, new_id)
            self._reply(once, JoinGroupResult(E.member_id_required, member_id=new_id))
        else:
            self._add_member_and_rebalance(group, new_id, None, req, protocols, once)

    def _current_member_join(self, group: ClassicGroup, mid: str, req: JoinGroupRequest,
                             once: Once) -> None:
        if group.is_(S.Dead):
            return self._reply(once, JoinGroupResult(E.coordinator_not_available, member_id=mid))
        protocols = dedupe_protocols(req.protocols)
        if not group.supports_protocols(req.protocol_type, {p for p, _ in protocols}):
            return self._reply(once, JoinGroupResult(E.inconsistent_group_protocol, member_id=mid))
        if mid in group.pending_members:
            if req.group_instance_id is not None:
                # Kafka throws IllegalStateException here (a pending id is never static)
                return self._reply(once, JoinGroupResult(E.unknown_server_error, member_id=mid))
            return self._add_member_and_rebalance(group, mid, None, req, protocols, once)
        err = group.validate_member(mid, req.group_instance_id)
        if err is not None:
            return self._reply(once, JoinGroupResult(err, member_id=mid))
        member = group.members[mid]
        st = group.state
        if st is S.PreparingRebalance:
            self._update_member_and_rebalance(group, member, req, protocols, once)
        elif st is S.CompletingRebalance:
            if member.matches(protocols):
                # a lost JoinGroup answer: send the current generation again
                self._reply(once, self._current_join_result(group, mid,
                                                            with_members=group.is_leader(mid)))
            else:
                self._update_member_and_rebalance(group, member, req, protocols, once)
        elif st is S.Stable:
            if group.is_leader(mid) or not member.matches(protocols):
                # a rejoining leader forces a rebalance (e.g. topic metadata changed)
                self._update_member_and_rebalance(group, member, req, protocols, once)
            else:
                self._reply(once, self._current_join_result(group, mid, with_members=False))
        else:
            log.warning("member %s rejoins group %r in unexpected state %s", mid, group.group_id,
                        st.value)
            self._reply(once, JoinGroupResult(E.unknown_member_id, member_id=mid))

    def _current_join_result(self, group: ClassicGroup, mid: str, *, with_members: bool,
                             leader: str | None = None, skip: bool = False) -> JoinGroupResult:
        members = ([JoinGroupMember(*t) for t in group.current_member_metadata()]
                   if with_members else [])
        return JoinGroupResult(E.none, mid, group.generation_id, group.protocol_type,
                               group.protocol_name,
                               (group.leader_id if leader is None else leader) or "", skip, members)

    def _add_member_and_rebalance(self, group: ClassicGroup, mid: str, iid: str | None,
                                  req: JoinGroupRequest, protocols, once: Once) -> None:
        rt, st = self._timeouts(req)
        member = Member(mid, iid, req.client_id, req.client_host, rt, st, req.protocol_type,
                        protocols, is_new=True)
        if group.is_(S.PreparingRebalance) and group.generation_id == 0:
            group.new_member_added = True            # KIP-134: the initial delay may extend
        group.add(member, once)
        # a member parked in its first JoinGroup cannot heartbeat: bound its wait instead
        self._schedule_hb(group, member, self.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance(group, f"adding new member {mid}")

    def _update_member_and_rebalance(self, group: ClassicGroup, member: Member,
                                     req: JoinGroupRequest, protocols, once: Once) -> None:
        if member.join_respond is not None and member.join_respond is not once:
            self._reply(member.join_respond, JoinGroupResult(SUPERSEDED, member_id=member.member_id))
        rt, st = self._timeouts(req)
        group.update_member(member, protocols, rt, st, once)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoins")

    def _update_static_member_and_rebalance(self, group: ClassicGroup, old_id: str, new_id: str,
                                            iid: str, req: JoinGroupRequest, protocols,
                                            once: Once) -> None:
        """KIP-345: a known group.instance.id rejoining without member id takes over the old
        member's place under a new id; the old id is fenced. A Stable group whose protocol
        choice does not change skips the rebalance (only the new id is stored)."""
        if group.state in (S.Empty, S.Dead):           # Kafka: IllegalStateException
            return self._reply(once, JoinGroupResult(E.unknown_server_error))
        current_leader = group.leader_id
        member = group.members[old_id]
        old_join, old_sync = member.join_respond, member.sync_respond
        member.join_respond = member.sync_respond = None
        self._reply(old_join, JoinGroupResult(E.fenced_instance_id, member_id=old_id))
        self._reply(old_sync, SyncGroupResult(E.fenced_instance_id))
        group.replace_static_member(iid, old_id, new_id)
        self._schedule_hb(group, member, member.session_timeout_ms)
        old_protocols = member.protocols
        old_rt, old_st = member.rebalance_timeout_ms, member.session_timeout_ms
        rt, st = self._timeouts(req)
        group.update_member(member, protocols, rt, st, once)
        if group.is_(S.Stable):
            if group.protocol_name == group.select_protocol():
                err = self._store(group.group_id, self._record(group))
                member.join_respond = None
                if err != E.none:
                    # revert: the old id stays the member; the new one is told the store failed
                    group.update_member(member, old_protocols, old_rt, old_st, None)
                    group.replace_static_member(iid, new_id, old_id)
                    self._schedule_hb(group, member, member.session_timeout_ms)
                    self._reply(once, JoinGroupResult(
                        err, "", group.generation_id, group.protocol_type, group.protocol_name,
                        current_leader or ""))
                elif req.api_version >= 9:
                    # JoinGroup v9: a static leader learns it leads but must not reassign
                    is_leader = group.is_leader(new_id)
                    self._reply(once, self._current_join_result(
                        group, new_id, with_members=is_leader, skip=is_leader))
                else:
                    # before v9: answer with the old leader id, so a returning leader does not
                    # compute an assignment a Stable group would never hand out
                    self._reply(once, self._current_join_result(
                        group, new_id, with_members=False, leader=current_leader or ""))
            else:
                self._maybe_prepare_rebalance(group, f"static member {iid} changes the protocol")
        elif group.is_(S.CompletingRebalance):
            # the leader may be assigning to the old id: start over
            self._prepare_rebalance(group, f"static member {iid} replaced during sync")

    def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str = "") -> None:
        if group.is_(S.CompletingRebalance):
            self._reset_and_propagate_assignment_error(group, E.rebalance_in_progress)
        group.pending_sync.clear()
        group.sync_token = None
        if group.is_(S.Empty):
            delay = self.config.group_initial_rebalance_delay_ms
            self._start_join_timer(group, delay, True,
                                   max(group.rebalance_timeout_ms() - delay, 0))
        else:
            self._start_join_timer(group, group.rebalance_timeout_ms(), False)
        group.transition_to(S.PreparingRebalance, self._now())
        log.info("preparing to rebalance group %r (generation %d): %s", group.group_id,
                 group.generation_id, reason)
        self._maybe_complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> None:
        if (group.join_token is not None and not group.join_initial
                and group.has_all_members_joined()):
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        """Kafka's onCompleteJoin: the join phase is over."""
        group.join_token = None
        for m in [m for m in group.members.values() if not m.awaiting_join and not m.is_static]:
            log.info("member %s of group %r did not rejoin in time; removed", m.member_id,
                     group.group_id)
            self._forget_member(group, m.member_id)
        if group.is_(S.Dead):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # only static members left and none rejoined: wait another rebalance timeout
            log.warning("group %r: no member rejoined; waiting again", group.group_id)
            self._start_join_timer(group, group.rebalance_timeout_ms(), False)
            return
        group.init_next_generation(self._now())
        if group.is_(S.Empty):
            log.info("group %r is now empty (generation %d)", group.group_id, group.generation_id)
            err = self._store(group.group_id, self._record(group))
            if err != E.none:
                # Kafka only warns: no member can act on the older stored generation
                log.warning("group %r: empty metadata not stored (%s)", group.group_id, err.name)
            self._notify_empty(group)
            return
        log.info("group %r stabilized at generation %d with %d members (protocol %s)",
                 group.group_id, group.generation_id, group.size, group.protocol_name)
        leader_view = [JoinGroupMember(*t) for t in group.current_member_metadata()]
        for m in list(group.members.values()):
            if m.join_respond is not None:
                once, m.join_respond = m.join_respond, None
                self._reply(once, JoinGroupResult(
                    E.none, m.member_id, group.generation_id, group.protocol_type,
                    group.protocol_name, group.leader_id or "", False,
                    leader_view if group.is_leader(m.member_id) else []))
            self._schedule_hb(group, m, m.session_timeout_ms)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        group.sync_token = self._push(self._now() + group.rebalance_timeout_ms(), _SYNC, group,
                                      group.generation_id)

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        """Kafka's onExpirePendingSync: members that never sent SyncGroup are removed."""
        if generation != group.generation_id or group.state not in (S.CompletingRebalance, S.Stable):
            return
        if not group.pending_sync:
            return
        missing = sorted(group.pending_sync)
        for mid in missing:
            self._forget_member(group, mid)
        self._prepare_rebalance(group, f"members {missing} did not sync in time")

    def _remove_pending_sync(self, group: ClassicGroup, mid: str) -> None:
        group.pending_sync.discard(mid)
        if not group.pending_sync:
            group.sync_token = None

    def _forget_member(self, group: ClassicGroup, mid: str) -> None:
        """Remove without any rebalance bookkeeping (Kafka's group.remove). (ours) Anything the
        member still had parked is answered UNKNOWN_MEMBER_ID."""
        member = group.remove(mid)
        if member is not None:
            join, sync = member.join_respond, member.sync_respond
            member.join_respond = member.sync_respond = None
            self._reply(join, JoinGroupResult(E.unknown_member_id))
            self._reply(sync, SyncGroupResult(E.unknown_member_id))

    def _remove_member_and_update_group(self, group: ClassicGroup, member: Member) -> None:
        self._forget_member(group, member.member_id)
        if group.state in (S.Stable, S.CompletingRebalance):
            self._maybe_prepare_rebalance(group, f"member {member.member_id} removed")
        elif group.is_(S.PreparingRebalance):
            self._maybe_complete_join(group)

    def _remove_pending_member_and_update_group(self, group: ClassicGroup, mid: str) -> None:
        group.remove(mid)
        if group.is_(S.PreparingRebalance):
            self._maybe_complete_join(group)
