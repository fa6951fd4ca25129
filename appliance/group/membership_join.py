"""JoinGroup and the classic rebalance protocol: the join and sync phases and the timers that end
them (``RebalanceProtocol``), sans-IO.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, as a collaborator
of ``appliance.group.membership.GroupCoordinator`` over its ``appliance.group.table.GroupTable``
(the groups, the store, the timer heap, the deferred answers, the clock). Owns no state of its
own besides its settings (``new_member_join_timeout_ms``, the member-id generator): it decides
JoinGroup, runs the rebalance (prepare, complete the join, hand out the assignment) and fires the
classic timers the table's ``tick`` hands it (``fire``). The other collaborators get a reference
to it at construction and call its operations where a request of theirs changes the rebalance
(``membership_sync.MemberRequests``: a leave or a failed store rebalances, a SyncGroup is part of
the sync phase; ``membership_admin.GroupAdmin``: an OffsetCommit counts as a heartbeat).

Behaviour is Kafka's GroupCoordinator handleJoinGroup, prepareRebalance, onCompleteJoin,
DelayedJoin/InitialDelayedJoin/DelayedSync/DelayedHeartbeat (see ``appliance.group.membership``
for the design). Timers (Kafka's purgatories) sit in the table's heap of deadlines; the worker's
``tick(now)`` fires the due ones and ``next_deadline_ms()`` tells it when to wake. The worker must
call ``tick`` regularly (each loop turn is fine: it is O(due timers)).

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
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Callable

from appliance.errors import ErrorCode
from appliance.group.classic_group import (CLASSIC_GROUP_TYPE, ClassicGroup, GroupState, Member,
                                           dedupe_protocols, group_record)
from appliance.group.messages import (JoinGroupMember, JoinGroupRequest, JoinGroupResult,
                                      SyncGroupResult)
from appliance.group.table import SUPERSEDED, GroupTable, Once

__all__ = ["RebalanceProtocol", "NEW_MEMBER_JOIN_TIMEOUT_MS"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000     # GroupCoordinator.NewMemberJoinTimeoutMs

# the kinds of the table's timer entries this protocol schedules and fires
_HB, _PENDING, _JOIN, _SYNC = range(4)


class RebalanceProtocol:
    """JoinGroup, the join and sync phases, the classic timers; over a GroupTable."""

    def __init__(self, table: GroupTable, *,
                 new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.table = table
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self._uuid = new_uuid
        # KIP-848's online migration (``migration.GroupMigration`` sets itself): a JoinGroup to
        # a live consumer group is its; None: refused INCONSISTENT_GROUP_PROTOCOL
        self.migration: Any = None

    # -- timers -----------------------------------------------------------------------------------
    def fire(self, kind: int, seq: int, obj: Any, extra: Any, now: int) -> None:
        if kind == _HB:
            member: Member = obj
            group: ClassicGroup = extra
            if member.hb_entry != seq:
                return
            member.hb_entry = None
            if member.removed or member.hb_deadline is None or not self.table.live(group):
                return
            if member.hb_deadline > now:                         # extended since: watch again
                member.hb_entry = self.table.push(member.hb_deadline, _HB, member, group)
                member.hb_entry_deadline = member.hb_deadline
                return
            member.hb_deadline = None
            if not member.has_satisfied_heartbeat():
                log.info("member %s of group %r failed (session timeout); removing it",
                         member.member_id, group.group_id)
                self.remove_member_and_update_group(group, member)
        elif kind == _PENDING:
            group = obj
            if self.table.live(group) and group.pending_members.get(extra) == seq:
                log.info("pending member %s of group %r did not rejoin; forgotten", extra,
                         group.group_id)
                self.remove_pending_member_and_update_group(group, extra)
        elif kind == _JOIN:
            group = obj
            if not self.table.live(group) or group.join_token != seq:
                return
            if group.join_initial and group.new_member_added and group.join_remaining_ms != 0:
                # KIP-134: new members arrived during the delay: wait again, within the budget
                group.new_member_added = False
                delay = min(self.table.config.group_initial_rebalance_delay_ms,
                            group.join_remaining_ms)
                remaining = max(group.join_remaining_ms - group.join_delay_ms, 0)
                self._start_join_timer(group, delay, True, remaining)
            else:
                self._complete_join(group)
        elif kind == _SYNC:
            group = obj
            if self.table.live(group) and group.sync_token == seq:
                group.sync_token = None
                self._expire_pending_sync(group, extra)

    def schedule_hb(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None:
        """Kafka's completeAndScheduleNextExpiration: the member's deadline is now + timeout."""
        deadline = self.table.now() + timeout_ms
        member.hb_deadline = deadline
        if member.hb_entry is None or deadline < member.hb_entry_deadline:
            member.hb_entry = self.table.push(deadline, _HB, member, group)
            member.hb_entry_deadline = deadline

    def _start_join_timer(self, group: ClassicGroup, delay_ms: int, initial: bool,
                          remaining_ms: int = 0) -> None:
        group.join_initial = initial
        group.join_delay_ms = delay_ms
        group.join_remaining_ms = remaining_ms
        group.join_token = self.table.push(self.table.now() + delay_ms, _JOIN, group)

    # -- JoinGroup --------------------------------------------------------------------------------
    def join_group(self, req: JoinGroupRequest, respond: Callable[[JoinGroupResult], None]) -> None:
        once = Once(respond)
        self.table.enter()
        try:
            self._join(req, once)
        except Exception:
            log.exception("JoinGroup of %r failed", req.group_id)
            self.table.reply(once, JoinGroupResult(E.unknown_server_error, member_id=req.member_id))
        finally:
            self.table.leave()

    def _join(self, req: JoinGroupRequest, once: Once) -> None:
        mid = req.member_id or ""
        if not req.group_id:
            return self.table.reply(once, JoinGroupResult(E.invalid_group_id, member_id=mid))
        if not self.table.loaded:
            return self.table.reply(once, JoinGroupResult(E.coordinator_load_in_progress,
                                                          member_id=mid))
        cfg = self.table.config
        if not (cfg.group_min_session_timeout_ms <= req.session_timeout_ms
                <= cfg.group_max_session_timeout_ms):
            return self.table.reply(once, JoinGroupResult(E.invalid_session_timeout, member_id=mid))
        other = self.table.groups.get(req.group_id)
        if other is not None and other.group_type != CLASSIC_GROUP_TYPE:
            if not other.is_(S.Empty):
                # KIP-848: a classic member joins a live consumer group as a classic member
                # (Kafka's classicGroupJoinToConsumerGroup); the policy does not govern this
                if self.migration is None or other.group_type != "consumer":
                    return self.table.reply(once, JoinGroupResult(E.inconsistent_group_protocol,
                                                                  member_id=mid))
                return self.migration.join(other, req, once)
            # Kafka's maybeDeleteEmptyConsumerGroup: an empty consumer group gives way
            err = self.table.store_consumer_group(other, drop=True)
            if err != E.none:
                return self.table.reply(once, JoinGroupResult(err, member_id=mid))
            other.transition_to(S.Dead, self.table.now())
            del self.table.groups[req.group_id]
        group = self.table.classic(req.group_id)
        if group is None:
            if mid:
                return self.table.reply(once, JoinGroupResult(E.unknown_member_id, member_id=mid))
            group = self.table.create_classic_group(req.group_id)
        if not self._accept_joining_member(group, mid):
            self._forget_member(group, mid)
            self.table.reply(once, JoinGroupResult(E.group_max_size_reached))
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
                group.num_awaiting_join() < self.table.config.group_max_size
        return group.has(mid) or group.size < self.table.config.group_max_size

    @staticmethod
    def _timeouts(req: JoinGroupRequest) -> tuple[int, int]:
        rt = req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms
        return rt, req.session_timeout_ms

    def _new_member_join(self, group: ClassicGroup, req: JoinGroupRequest, once: Once) -> None:
        if group.is_(S.Dead):
            return self.table.reply(once, JoinGroupResult(E.coordinator_not_available))
        protocols = dedupe_protocols(req.protocols)
        if not group.supports_protocols(req.protocol_type, {p for p, _ in protocols}):
            return self.table.reply(once, JoinGroupResult(E.inconsistent_group_protocol))
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
            group.pending_members[new_id] = self.table.push(
                self.table.now() + req.session_timeout_ms, _PENDING, group, new_id)
            self.table.reply(once, JoinGroupResult(E.member_id_required, member_id=new_id))
        else:
            self._add_member_and_rebalance(group, new_id, None, req, protocols, once)

    def _current_member_join(self, group: ClassicGroup, mid: str, req: JoinGroupRequest,
                             once: Once) -> None:
        if group.is_(S.Dead):
            return self.table.reply(once, JoinGroupResult(E.coordinator_not_available,
                                                          member_id=mid))
        protocols = dedupe_protocols(req.protocols)
        if not group.supports_protocols(req.protocol_type, {p for p, _ in protocols}):
            return self.table.reply(once, JoinGroupResult(E.inconsistent_group_protocol,
                                                          member_id=mid))
        if mid in group.pending_members:
            if req.group_instance_id is not None:
                # Kafka throws IllegalStateException here (a pending id is never static)
                return self.table.reply(once, JoinGroupResult(E.unknown_server_error,
                                                              member_id=mid))
            return self._add_member_and_rebalance(group, mid, None, req, protocols, once)
        err = group.validate_member(mid, req.group_instance_id)
        if err is not None:
            return self.table.reply(once, JoinGroupResult(err, member_id=mid))
        member = group.members[mid]
        st = group.state
        if st is S.PreparingRebalance:
            self._update_member_and_rebalance(group, member, req, protocols, once)
        elif st is S.CompletingRebalance:
            if member.matches(protocols):
                # a lost JoinGroup answer: send the current generation again
                self.table.reply(once, self._current_join_result(group, mid,
                                                            with_members=group.is_leader(mid)))
            else:
                self._update_member_and_rebalance(group, member, req, protocols, once)
        elif st is S.Stable:
            if group.is_leader(mid) or not member.matches(protocols):
                # a rejoining leader forces a rebalance (e.g. topic metadata changed)
                self._update_member_and_rebalance(group, member, req, protocols, once)
            else:
                self.table.reply(once, self._current_join_result(group, mid, with_members=False))
        else:
            log.warning("member %s rejoins group %r in unexpected state %s", mid, group.group_id,
                        st.value)
            self.table.reply(once, JoinGroupResult(E.unknown_member_id, member_id=mid))

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
        self.schedule_hb(group, member, self.new_member_join_timeout_ms)
        self.maybe_prepare_rebalance(group, f"adding new member {mid}")

    def _update_member_and_rebalance(self, group: ClassicGroup, member: Member,
                                     req: JoinGroupRequest, protocols, once: Once) -> None:
        if member.join_respond is not None and member.join_respond is not once:
            self.table.reply(member.join_respond,
                             JoinGroupResult(SUPERSEDED, member_id=member.member_id))
        rt, st = self._timeouts(req)
        group.update_member(member, protocols, rt, st, once)
        self.maybe_prepare_rebalance(group, f"member {member.member_id} rejoins")

    def _update_static_member_and_rebalance(self, group: ClassicGroup, old_id: str, new_id: str,
                                            iid: str, req: JoinGroupRequest, protocols,
                                            once: Once) -> None:
        """KIP-345: a known group.instance.id rejoining without member id takes over the old
        member's place under a new id; the old id is fenced. A Stable group whose protocol
        choice does not change skips the rebalance (only the new id is stored)."""
        if group.state in (S.Empty, S.Dead):           # Kafka: IllegalStateException
            return self.table.reply(once, JoinGroupResult(E.unknown_server_error))
        current_leader = group.leader_id
        member = group.members[old_id]
        old_join, old_sync = member.join_respond, member.sync_respond
        member.join_respond = member.sync_respond = None
        self.table.reply(old_join, JoinGroupResult(E.fenced_instance_id, member_id=old_id))
        self.table.reply(old_sync, SyncGroupResult(E.fenced_instance_id))
        group.replace_static_member(iid, old_id, new_id)
        self.schedule_hb(group, member, member.session_timeout_ms)
        old_protocols = member.protocols
        old_rt, old_st = member.rebalance_timeout_ms, member.session_timeout_ms
        rt, st = self._timeouts(req)
        group.update_member(member, protocols, rt, st, once)
        if group.is_(S.Stable):
            if group.protocol_name == group.select_protocol():
                err = self.table.store(group.group_id, group_record(group))
                member.join_respond = None
                if err != E.none:
                    # revert: the old id stays the member; the new one is told the store failed
                    group.update_member(member, old_protocols, old_rt, old_st, None)
                    group.replace_static_member(iid, new_id, old_id)
                    self.schedule_hb(group, member, member.session_timeout_ms)
                    self.table.reply(once, JoinGroupResult(
                        err, "", group.generation_id, group.protocol_type, group.protocol_name,
                        current_leader or ""))
                elif req.api_version >= 9:
                    # JoinGroup v9: a static leader learns it leads but must not reassign
                    is_leader = group.is_leader(new_id)
                    self.table.reply(once, self._current_join_result(
                        group, new_id, with_members=is_leader, skip=is_leader))
                else:
                    # before v9: answer with the old leader id, so a returning leader does not
                    # compute an assignment a Stable group would never hand out
                    self.table.reply(once, self._current_join_result(
                        group, new_id, with_members=False, leader=current_leader or ""))
            else:
                self.maybe_prepare_rebalance(group, f"static member {iid} changes the protocol")
        elif group.is_(S.CompletingRebalance):
            # the leader may be assigning to the old id: start over
            self.prepare_rebalance(group, f"static member {iid} replaced during sync")

    def maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, reason)

    def prepare_rebalance(self, group: ClassicGroup, reason: str = "") -> None:
        if group.is_(S.CompletingRebalance):
            self.reset_and_propagate_assignment_error(group, E.rebalance_in_progress)
        group.pending_sync.clear()
        group.sync_token = None
        if group.is_(S.Empty):
            delay = self.table.config.group_initial_rebalance_delay_ms
            self._start_join_timer(group, delay, True,
                                   max(group.rebalance_timeout_ms() - delay, 0))
        else:
            self._start_join_timer(group, group.rebalance_timeout_ms(), False)
        group.transition_to(S.PreparingRebalance, self.table.now())
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
        group.init_next_generation(self.table.now())
        if group.is_(S.Empty):
            log.info("group %r is now empty (generation %d)", group.group_id, group.generation_id)
            err = self.table.store(group.group_id, group_record(group))
            if err != E.none:
                # Kafka only warns: no member can act on the older stored generation
                log.warning("group %r: empty metadata not stored (%s)", group.group_id, err.name)
            self.table.notify_empty(group)
            return
        log.info("group %r stabilized at generation %d with %d members (protocol %s)",
                 group.group_id, group.generation_id, group.size, group.protocol_name)
        leader_view = [JoinGroupMember(*t) for t in group.current_member_metadata()]
        for m in list(group.members.values()):
            if m.join_respond is not None:
                once, m.join_respond = m.join_respond, None
                self.table.reply(once, JoinGroupResult(
                    E.none, m.member_id, group.generation_id, group.protocol_type,
                    group.protocol_name, group.leader_id or "", False,
                    leader_view if group.is_leader(m.member_id) else []))
            self.schedule_hb(group, m, m.session_timeout_ms)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        group.sync_token = self.table.push(self.table.now() + group.rebalance_timeout_ms(), _SYNC,
                                           group, group.generation_id)

    def _expire_pending_sync(self, group: ClassicGroup, generation: int) -> None:
        """Kafka's onExpirePendingSync: members that never sent SyncGroup are removed."""
        if generation != group.generation_id or group.state not in (S.CompletingRebalance, S.Stable):
            return
        if not group.pending_sync:
            return
        missing = sorted(group.pending_sync)
        for mid in missing:
            self._forget_member(group, mid)
        self.prepare_rebalance(group, f"members {missing} did not sync in time")

    def remove_pending_sync(self, group: ClassicGroup, mid: str) -> None:
        group.pending_sync.discard(mid)
        if not group.pending_sync:
            group.sync_token = None

    def reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
        self.propagate_assignment(group, error)

    def propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == E.none
        ptype, pname = (group.protocol_type, group.protocol_name) if ok else (None, None)
        for m in group.members.values():
            if m.sync_respond is not None:
                once, m.sync_respond = m.sync_respond, None
                self.table.reply(once, SyncGroupResult(error, ptype, pname, m.assignment))
                # a member parked in SyncGroup counted as alive: its session starts again now
                self.schedule_hb(group, m, m.session_timeout_ms)

    def _forget_member(self, group: ClassicGroup, mid: str) -> None:
        """Remove without any rebalance bookkeeping (Kafka's group.remove). (ours) Anything the
        member still had parked is answered UNKNOWN_MEMBER_ID."""
        member = group.remove(mid)
        if member is not None:
            join, sync = member.join_respond, member.sync_respond
            member.join_respond = member.sync_respond = None
            self.table.reply(join, JoinGroupResult(E.unknown_member_id))
            self.table.reply(sync, SyncGroupResult(E.unknown_member_id))

    def remove_member_and_update_group(self, group: ClassicGroup, member: Member) -> None:
        self._forget_member(group, member.member_id)
        if group.state in (S.Stable, S.CompletingRebalance):
            self.maybe_prepare_rebalance(group, f"member {member.member_id} removed")
        elif group.is_(S.PreparingRebalance):
            self._maybe_complete_join(group)

    def remove_pending_member_and_update_group(self, group: ClassicGroup, mid: str) -> None:
        group.remove(mid)
        if group.is_(S.PreparingRebalance):
            self._maybe_complete_join(group)
