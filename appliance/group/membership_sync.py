"""SyncGroup, Heartbeat and LeaveGroup: a member's requests after its JoinGroup.

Part of ``appliance.group.membership.GroupCoordinator`` (a mixin, split out by concern; it runs
in the coordinator worker like the rest and shares its state: ``_groups``, ``_loaded``, the
timers, the queue of answers). See that module for the design; behaviour is Kafka's
GroupCoordinator handleSyncGroup, handleHeartbeat and handleLeaveGroup. Also here: ``Once``, the
answer of a JoinGroup/SyncGroup that may be given later (from a timer or another member's request),
exactly once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

from appliance.errors import ErrorCode
from appliance.group.classic_group import ClassicGroup, GroupState, Member
from appliance.group.messages import (HeartbeatRequest, LeaveGroupResult, LeaveMember,
                                      LeaveMemberResult, SyncGroupRequest, SyncGroupResult)

if TYPE_CHECKING:
    from appliance.group.records import GroupRecord

__all__ = ["MemberRequests", "Once", "SUPERSEDED"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState
# (ours) the answer to a JoinGroup/SyncGroup parked for a member that sent a newer one (Kafka
# drops the older callback and never answers it; we promise to answer every request once)
SUPERSEDED = E.coordinator_not_available


class Once:
    """A respond callable that can be answered once only."""

    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn
        self.done = False


class MemberRequests:
    """SyncGroup, Heartbeat, LeaveGroup; mixed into GroupCoordinator."""

    _groups: dict[str, ClassicGroup]
    _loaded: bool

    if TYPE_CHECKING:
        def _enter(self) -> None: ...
        def _leave(self) -> None: ...
        def _now(self) -> int: ...
        def _reply(self, once: Once | None, result: Any) -> None: ...
        def _store(self, group_id: str, record: GroupRecord | None) -> ErrorCode: ...
        def _record(self, group: ClassicGroup,
                    assignment: dict[str, bytes] | None = None) -> GroupRecord: ...
        def _schedule_hb(self, group: ClassicGroup, member: Member, timeout_ms: int) -> None: ...
        def _maybe_prepare_rebalance(self, group: ClassicGroup, reason: str) -> None: ...
        def _remove_pending_sync(self, group: ClassicGroup, mid: str) -> None: ...
        def _remove_member_and_update_group(self, group: ClassicGroup, member: Member) -> None: ...
        def _remove_pending_member_and_update_group(self, group: ClassicGroup, mid: str) -> None: ...

    # -- SyncGroup --------------------------------------------------------------------------------
    def sync_group(self, req: SyncGroupRequest, respond: Callable[[SyncGroupResult], None]) -> None:
        once = Once(respond)
        self._enter()
        try:
            self._sync(req, once)
        except Exception:
            log.exception("SyncGroup of %r failed", req.group_id)
            self._reply(once, SyncGroupResult(E.unknown_server_error))
        finally:
            self._leave()

    def _sync(self, req: SyncGroupRequest, once: Once) -> None:
        def fail(code: ErrorCode) -> None:
            self._reply(once, SyncGroupResult(code))

        if not req.group_id:
            return fail(E.invalid_group_id)
        if not self._loaded:
            # Kafka: the rebalance state is lost while loading; make the member rejoin
            return fail(E.rebalance_in_progress)
        if req.api_version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            return fail(E.inconsistent_group_protocol)      # KafkaApis: mandatory from v5
        group = self._groups.get(req.group_id)
        if group is None:
            return fail(E.unknown_member_id)
        if group.is_(S.Dead):
            return fail(E.coordinator_not_available)
        mid = req.member_id
        err = group.validate_member(mid, req.group_instance_id)
        if err is not None:
            return fail(err)
        if req.generation_id != group.generation_id:
            return fail(E.illegal_generation)
        if req.protocol_type is not None and req.protocol_type != group.protocol_type:
            return fail(E.inconsistent_group_protocol)
        if req.protocol_name is not None and req.protocol_name != group.protocol_name:
            return fail(E.inconsistent_group_protocol)
        st = group.state
        if st is S.Empty:
            return fail(E.unknown_member_id)
        if st is S.PreparingRebalance:
            return fail(E.rebalance_in_progress)
        member = group.members[mid]
        if st is S.Stable:
            self._remove_pending_sync(group, mid)
            self._reply(once, SyncGroupResult(E.none, group.protocol_type, group.protocol_name,
                                              member.assignment))
            self._schedule_hb(group, member, member.session_timeout_ms)
            return
        # CompletingRebalance: park until the leader's assignment is stored
        if member.sync_respond is not None and member.sync_respond is not once:
            self._reply(member.sync_respond, SyncGroupResult(SUPERSEDED))
        member.sync_respond = once
        self._remove_pending_sync(group, mid)
        if not group.is_leader(mid):
            return
        given = {m: bytes(a) for m, a in req.assignments}
        assignment = {m: given.get(m, b"") for m in group.members}   # missing ones get nothing
        missing = [m for m in group.members if m not in given]
        if missing:
            log.warning("group %r generation %d: empty assignment for %s", group.group_id,
                        group.generation_id, missing)
        err = self._store(group.group_id, self._record(group, assignment))
        if err != E.none:
            self._reset_and_propagate_assignment_error(group, err)
            self._maybe_prepare_rebalance(group, f"storing the assignment failed: {err.name}")
            return
        for m in group.members.values():
            m.assignment = assignment[m.member_id]
        self._propagate_assignment(group, E.none)
        group.transition_to(S.Stable, self._now())

    def _reset_and_propagate_assignment_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == E.none
        ptype, pname = (group.protocol_type, group.protocol_name) if ok else (None, None)
        for m in group.members.values():
            if m.sync_respond is not None:
                once, m.sync_respond = m.sync_respond, None
                self._reply(once, SyncGroupResult(error, ptype, pname, m.assignment))
                # a member parked in SyncGroup counted as alive: its session starts again now
                self._schedule_hb(group, m, m.session_timeout_ms)

    # -- Heartbeat --------------------------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        self._enter()
        try:
            return self._heartbeat(req)
        except Exception:
            log.exception("Heartbeat of %r failed", req.group_id)
            return E.unknown_server_error
        finally:
            self._leave()

    def _heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        if not req.group_id:
            return E.invalid_group_id
        if not self._loaded:
            return E.none                               # Kafka: answered blindly while loading
        group = self._groups.get(req.group_id)
        if group is None:
            return E.unknown_member_id
        if group.is_(S.Dead):
            return E.coordinator_not_available
        err = group.validate_member(req.member_id, req.group_instance_id)
        if err is not None:
            return err
        if req.generation_id != group.generation_id:
            return E.illegal_generation
        if group.is_(S.Empty):
            return E.unknown_member_id
        member = group.members[req.member_id]
        self._schedule_hb(group, member, member.session_timeout_ms)
        return E.rebalance_in_progress if group.is_(S.PreparingRebalance) else E.none

    # -- LeaveGroup -------------------------------------------------------------------------------
    def leave_group(self, group_id: str,
                    members: Iterable[LeaveMember | tuple]) -> LeaveGroupResult:
        """LeaveGroup: v0-2 pass ``[(member_id, None)]`` and answer ``legacy_error``; v3+ the
        batch. An empty member id with a group.instance.id removes that static member (admin)."""
        leaving = [m if isinstance(m, LeaveMember) else LeaveMember(*m) for m in members]
        self._enter()
        try:
            return self._leave_group(group_id, leaving)
        except Exception:
            log.exception("LeaveGroup of %r failed", group_id)
            return LeaveGroupResult(E.unknown_server_error, [])
        finally:
            self._leave()

    def _leave_group(self, group_id: str, leaving: list[LeaveMember]) -> LeaveGroupResult:
        if not group_id:
            return LeaveGroupResult(E.invalid_group_id, [])
        if not self._loaded:
            return LeaveGroupResult(E.coordinator_load_in_progress, [])
        group = self._groups.get(group_id)
        if group is None:
            return LeaveGroupResult(E.none, [LeaveMemberResult(m.member_id, m.group_instance_id,
                                                               E.unknown_member_id) for m in leaving])
        if group.is_(S.Dead):
            return LeaveGroupResult(E.coordinator_not_available, [])
        out = []
        for m in leaving:
            mid, iid = m.member_id or "", m.group_instance_id
            if not mid:
                current = group.current_static_member_id(iid) if iid is not None else None
                if current is None:
                    err = E.unknown_member_id
                else:
                    self._leave_member(group, group.members[current], m.reason)
                    err = E.none
            elif mid in group.pending_members:
                self._remove_pending_member_and_update_group(group, mid)
                err = E.none
            else:
                err = group.validate_member(mid, iid)
                if err is None:
                    self._leave_member(group, group.members[mid], m.reason)
                    err = E.none
            out.append(LeaveMemberResult(mid, iid, err))
        return LeaveGroupResult(E.none, out)

    def _leave_member(self, group: ClassicGroup, member: Member, reason: str | None) -> None:
        log.info("member %s left group %r (reason: %s)", member.member_id, group.group_id,
                 reason or "not provided")
        self._remove_member_and_update_group(group, member)
