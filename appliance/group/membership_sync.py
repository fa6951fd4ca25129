"""SyncGroup, Heartbeat and LeaveGroup: a member's requests after its JoinGroup
(``MemberRequests``), sans-IO.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, as a collaborator
of ``appliance.group.membership.GroupCoordinator`` over its ``appliance.group.table.GroupTable``
(the groups, the store, the deferred answers, the clock); owns no state of its own. It gets the
``membership_join.RebalanceProtocol`` at construction and calls it where a member's request
moves the rebalance: the leader's SyncGroup ends the sync phase (``propagate_assignment``), a
failed store or a leave rebalances, a Heartbeat or a SyncGroup answer resets the member's
session (``schedule_hb``). See ``appliance.group.membership`` for the design; behaviour is
Kafka's GroupCoordinator handleSyncGroup, handleHeartbeat and handleLeaveGroup.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from appliance.errors import ErrorCode
from appliance.group.classic_group import ClassicGroup, GroupState, Member, group_record
from appliance.group.membership_join import RebalanceProtocol
from appliance.group.messages import (HeartbeatRequest, LeaveGroupResult, LeaveMember,
                                      LeaveMemberResult, SyncGroupRequest, SyncGroupResult)
from appliance.group.table import SUPERSEDED, GroupTable, Once

__all__ = ["MemberRequests"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState


class MemberRequests:
    """SyncGroup, Heartbeat, LeaveGroup; over a GroupTable, with the RebalanceProtocol."""

    def __init__(self, table: GroupTable, rebalance: RebalanceProtocol) -> None:
        self.table = table
        self.rebalance = rebalance

    def _migration(self, group) -> bool:
        """Is this a KIP-848 consumer group whose classic members ``migration`` answers?"""
        return (group is not None and getattr(group, "group_type", "") == "consumer"
                and self.rebalance.migration is not None)

    # -- SyncGroup --------------------------------------------------------------------------------
    def sync_group(self, req: SyncGroupRequest, respond: Callable[[SyncGroupResult], None]) -> None:
        once = Once(respond)
        self.table.enter()
        try:
            self._sync(req, once)
        except Exception:
            log.exception("SyncGroup of %r failed", req.group_id)
            self.table.reply(once, SyncGroupResult(E.unknown_server_error))
        finally:
            self.table.leave()

    def _sync(self, req: SyncGroupRequest, once: Once) -> None:
        def fail(code: ErrorCode) -> None:
            self.table.reply(once, SyncGroupResult(code))

        if not req.group_id:
            return fail(E.invalid_group_id)
        if not self.table.loaded:
            # Kafka: the rebalance state is lost while loading; make the member rejoin
            return fail(E.rebalance_in_progress)
        if req.api_version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            return fail(E.inconsistent_group_protocol)      # KafkaApis: mandatory from v5
        group = self.table.classic(req.group_id)
        if group is None:
            other = self.table.groups.get(req.group_id)
            if self._migration(other):
                return self.rebalance.migration.sync(other, req, once)
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
            self.rebalance.remove_pending_sync(group, mid)
            self.table.reply(once, SyncGroupResult(E.none, group.protocol_type, group.protocol_name,
                                              member.assignment))
            self.rebalance.schedule_hb(group, member, member.session_timeout_ms)
            return
        # CompletingRebalance: park until the leader's assignment is stored
        if member.sync_respond is not None and member.sync_respond is not once:
            self.table.reply(member.sync_respond, SyncGroupResult(SUPERSEDED))
        member.sync_respond = once
        self.rebalance.remove_pending_sync(group, mid)
        if not group.is_leader(mid):
            return
        given = {m: bytes(a) for m, a in req.assignments}
        assignment = {m: given.get(m, b"") for m in group.members}   # missing ones get nothing
        missing = [m for m in group.members if m not in given]
        if missing:
            log.warning("group %r generation %d: empty assignment for %s", group.group_id,
                        group.generation_id, missing)
        err = self.table.store(group.group_id, group_record(group, assignment))
        if err != E.none:
            self.rebalance.reset_and_propagate_assignment_error(group, err)
            self.rebalance.maybe_prepare_rebalance(group,
                                                   f"storing the assignment failed: {err.name}")
            return
        for m in group.members.values():
            m.assignment = assignment[m.member_id]
        self.rebalance.propagate_assignment(group, E.none)
        group.transition_to(S.Stable, self.table.now())

    # -- Heartbeat --------------------------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        self.table.enter()
        try:
            return self._heartbeat(req)
        except Exception:
            log.exception("Heartbeat of %r failed", req.group_id)
            return E.unknown_server_error
        finally:
            self.table.leave()

    def _heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        if not req.group_id:
            return E.invalid_group_id
        if not self.table.loaded:
            return E.none                               # Kafka: answered blindly while loading
        group = self.table.classic(req.group_id)
        if group is None:
            other = self.table.groups.get(req.group_id)
            if self._migration(other):
                return self.rebalance.migration.heartbeat(other, req)
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
        self.rebalance.schedule_hb(group, member, member.session_timeout_ms)
        return E.rebalance_in_progress if group.is_(S.PreparingRebalance) else E.none

    # -- LeaveGroup -------------------------------------------------------------------------------
    def leave_group(self, group_id: str,
                    members: Iterable[LeaveMember | tuple]) -> LeaveGroupResult:
        """LeaveGroup: v0-2 pass ``[(member_id, None)]`` and answer ``legacy_error``; v3+ the
        batch. An empty member id with a group.instance.id removes that static member (admin)."""
        leaving = [m if isinstance(m, LeaveMember) else LeaveMember(*m) for m in members]
        self.table.enter()
        try:
            return self._leave_group(group_id, leaving)
        except Exception:
            log.exception("LeaveGroup of %r failed", group_id)
            return LeaveGroupResult(E.unknown_server_error, [])
        finally:
            self.table.leave()

    def _leave_group(self, group_id: str, leaving: list[LeaveMember]) -> LeaveGroupResult:
        if not group_id:
            return LeaveGroupResult(E.invalid_group_id, [])
        if not self.table.loaded:
            return LeaveGroupResult(E.coordinator_load_in_progress, [])
        group = self.table.classic(group_id)
        if group is None and self._migration(self.table.groups.get(group_id)):
            return self.rebalance.migration.leave(self.table.groups[group_id], leaving)
        if group is None:
            return LeaveGroupResult(E.none, [
                LeaveMemberResult(m.member_id, m.group_instance_id, E.unknown_member_id)
                for m in leaving])
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
                self.rebalance.remove_pending_member_and_update_group(group, mid)
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
        self.rebalance.remove_member_and_update_group(group, member)
