"""KIP-848's online migration between the classic and the consumer group protocols
(``GroupMigration``), sans-IO.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, as a collaborator
of ``appliance.group.membership.GroupCoordinator`` over its ``appliance.group.table.GroupTable``,
beside ``consumer_protocol.ConsumerGroupProtocol`` and ``membership_join.RebalanceProtocol``
(both get a reference to it: ``migration``). Owns no state of its own: the groups are the
table's, the timers its heap's. Behaviour is Kafka's GroupMetadataManager (group-coordinator
module): validateOnlineUpgrade / convertToConsumerGroup, validateOnlineDowngradeWithFencedMember
/ convertToClassicGroup, and classicGroupJoinToConsumerGroup, classicGroupSyncToConsumerGroup,
classicGroupHeartbeatToConsumerGroup, classicGroupLeaveToConsumerGroup. Departures are marked
"(ours)".

- **The policy** (``[groups] consumer_migration_policy``, Kafka's
  group.consumer.migration.policy: bidirectional, the default, upgrade, downgrade or disabled)
  governs the conversion of a *non-empty* group only; an empty group of either type always
  gives way to the other (that is ``consumer_protocol`` / ``membership_join``).
- **Upgrade**: a ConsumerGroupHeartbeat joining (epoch 0) a live classic group whose protocol
  type is "consumer" converts it when the policy allows and it has at most
  ``consumer_max_size`` members; otherwise GROUP_ID_NOT_FOUND ("Group X is not a consumer
  group"). The consumer group starts at the classic generation as its group and assignment
  epoch; every classic member keeps its assignment as its target and stays a classic member
  (its session timeout and protocols kept as ClassicMemberMetadata). Parked JoinGroup /
  SyncGroup answers get REBALANCE_IN_PROGRESS. The joining member bumps the epoch, so the
  classic members are told to rejoin. The classic record's tombstone and the consumer group's
  records go in one batch (``GroupTable.store_consumer_group``, ``replaces_classic``).
- **Classic members inside a consumer group**: JoinGroup adds or updates the member (its
  subscription and owned partitions from the embedded ConsumerProtocolSubscription), bumps the
  epoch when its subscription changed, reconciles it against the target (revoking first) and
  answers with its member epoch as the generation, no leader, no member list; SyncGroup answers
  its current assignment (a ConsumerProtocolAssignment of its subscription's version); Heartbeat
  answers REBALANCE_IN_PROGRESS while the group epoch is ahead of the member's, it has
  partitions to revoke, or partitions it waited for are free; LeaveGroup removes it. A member
  told to rejoin must JoinGroup within its rebalance timeout, and SyncGroup within it after
  the join, else it is fenced (Kafka's join and sync timeouts); its session timeout is its own.
- **Downgrade**: when the last member using the consumer protocol leaves or is fenced and every
  member left uses the classic protocol, the group becomes a classic group (the policy
  allowing, at most ``max_size`` members): generation = the group epoch, each member's target
  as its assignment, then a rebalance. Also when a static member joining with the classic
  protocol takes the ``group.instance.id`` of the last consumer-protocol member (Kafka's
  validateOnlineDowngradeWithReplacedMemberId): converted in that JoinGroup, Stable, no
  rebalance, the joining member holding the replaced one's target. The consumer records'
  tombstones and the classic record go in one batch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Iterable

from appliance.errors import ErrorCode
from appliance.group.classic_group import (CONSUMER_PROTOCOL_TYPE, ClassicGroup, GroupState,
                                           Member, dedupe_protocols, group_record)
from appliance.group.consumer_group import (Assignment, ClassicMemberMetadata, ConsumerGroup,
                                            ConsumerMember, MemberState)
from appliance.group.embedded_protocol import (MalformedProtocol, encode_assignment,
                                               parse_assignment, parse_subscription, version_of)
from appliance.group.messages import (HeartbeatRequest, JoinGroupRequest, JoinGroupResult,
                                      LeaveGroupResult, LeaveMember, LeaveMemberResult,
                                      SyncGroupRequest, SyncGroupResult)
from appliance.group.table import GroupTable, Once

if TYPE_CHECKING:
    from appliance.group.consumer_protocol import ConsumerGroupProtocol
    from appliance.group.membership_join import RebalanceProtocol

__all__ = ["GroupMigration", "MIGRATION_POLICIES"]

log = logging.getLogger("appliance.group.consumer")

E = ErrorCode
S = GroupState
MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


class GroupMigration:
    """The conversions and the classic requests to consumer groups; over a GroupTable."""

    def __init__(self, table: GroupTable, consumer: ConsumerGroupProtocol,
                 rebalance: RebalanceProtocol) -> None:
        self.table = table
        self.consumer = consumer
        self.rebalance = rebalance
        consumer.migration = self
        rebalance.migration = self

    # -- the policy -------------------------------------------------------------------------------
    def _policy(self) -> str:
        return str(getattr(self.table.config, "consumer_migration_policy", "bidirectional")).lower()

    def upgrade_enabled(self) -> bool:
        return self._policy() in ("bidirectional", "upgrade")

    def downgrade_enabled(self) -> bool:
        return self._policy() in ("bidirectional", "downgrade")

    # -- topic names <-> ids ----------------------------------------------------------------------
    def _ids(self, by_name: dict[str, frozenset[int]]) -> Assignment:
        topics = self.consumer.topics()
        out: dict[bytes, frozenset[int]] = {}
        for name, ps in by_name.items():
            t = topics.get(name)
            if t is not None and ps:
                out[t[0]] = frozenset(p for p in ps if 0 <= p < t[1])
        return {tid: ps for tid, ps in out.items() if ps}

    def _names(self, by_id: Assignment) -> dict[str, frozenset[int]]:
        names = {tid: name for name, (tid, _n) in self.consumer.topics().items()}
        return {names[tid]: ps for tid, ps in by_id.items() if tid in names and ps}

    # -- upgrade ----------------------------------------------------------------------------------
    def can_upgrade(self, group: ClassicGroup) -> bool:
        """Kafka's validateOnlineUpgrade."""
        gid = group.group_id
        if not self.upgrade_enabled():
            log.info("cannot upgrade classic group %r to a consumer group: the online upgrade is "
                     "disabled (consumer_migration_policy %s)", gid, self._policy())
            return False
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            log.info("cannot upgrade classic group %r to a consumer group: it does not use the "
                     "consumer embedded protocol", gid)
            return False
        if group.size > self.table.config.consumer_max_size:
            log.info("cannot upgrade classic group %r to a consumer group: its size exceeds the "
                     "consumer group maximum size", gid)
            return False
        return True

    def upgrade(self, classic: ClassicGroup) -> ConsumerGroup:
        """Kafka's convertToConsumerGroup / ConsumerGroup.fromClassicGroup: the consumer group
        the classic one becomes (not yet in the table; its first store writes the classic
        tombstone). Raises MalformedProtocol when a member's embedded protocol does not parse."""
        t = self.table
        now = t.now()
        group = ConsumerGroup(classic.group_id, now)
        group.group_epoch = group.assignment_epoch = classic.generation_id
        for m in classic.members.values():
            meta = (m.metadata(classic.protocol_name) if classic.protocol_name
                    else (m.protocols[0][1] if m.protocols else b""))
            sub = parse_subscription(meta)
            assigned = self._ids(parse_assignment(m.assignment))
            cm = ConsumerMember(m.member_id, m.group_instance_id, sub.rack_id, m.client_id,
                                m.client_host, m.rebalance_timeout_ms,
                                tuple(sorted(set(sub.topics))))
            cm.member_epoch = cm.previous_member_epoch = classic.generation_id
            cm.assigned = assigned
            cm.classic = ClassicMemberMetadata(m.session_timeout_ms,
                                               tuple((n, bytes(d)) for n, d in m.protocols))
            group.target[cm.member_id] = assigned
            group.add_member(cm)
            group._claim(cm)
        group.subscription_metadata = self.consumer._subscription_metadata(group)
        group.replaces_classic = True
        # the classic group's rebalance is over: its parked members rejoin the new one
        for m in classic.members.values():
            join, sync = m.join_respond, m.sync_respond
            m.join_respond = m.sync_respond = None
            t.reply(join, JoinGroupResult(E.rebalance_in_progress, member_id=m.member_id))
            t.reply(sync, SyncGroupResult(E.rebalance_in_progress))
        for cm in group.members.values():
            self._session(group, cm)
        log.info("classic group %r (generation %d, %d members) upgraded to a consumer group",
                 classic.group_id, classic.generation_id, classic.size)
        return group

    # -- downgrade --------------------------------------------------------------------------------
    def maybe_downgrade(self, group: ConsumerGroup, leaving: ConsumerMember) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember + convertToClassicGroup: True when the
        group became a classic one (``leaving`` is gone with it)."""
        gid = group.group_id
        if not group.all_classic_except(leaving.member_id) or len(group.members) <= 1:
            return False
        if not self.downgrade_enabled():
            log.info("cannot downgrade consumer group %r to a classic group: the online downgrade "
                     "is disabled (consumer_migration_policy %s)", gid, self._policy())
            return False
        if len(group.members) - 1 > self.table.config.group_max_size:
            log.info("cannot downgrade consumer group %r to a classic group: its size is greater "
                     "than the classic group maximum size", gid)
            return False
        return self._convert_to_classic(group, leaving, rebalance=True)

    def downgrade_on_replacement(self, group: ConsumerGroup, replaced_consumer_member: bool,
                                 members_before: int) -> bool:
        """Kafka's validateOnlineDowngradeWithReplacedMemberId: a static member joining with the
        classic protocol replaced the group's static member ``replaced_consumer_member`` (it
        used the consumer protocol), and now every member uses the classic protocol. No size
        floor (the group is not emptied); ``members_before`` counts the replaced one."""
        if not replaced_consumer_member or any(m.classic is None for m in group.members.values()):
            return False
        if not self.downgrade_enabled():
            log.info("cannot downgrade consumer group %r to a classic group: the online downgrade "
                     "is disabled (consumer_migration_policy %s)", group.group_id, self._policy())
            return False
        if members_before > self.table.config.group_max_size:
            log.info("cannot downgrade consumer group %r to a classic group: its size is greater "
                     "than the classic group maximum size", group.group_id)
            return False
        return True

    def _convert_to_classic(self, group: ConsumerGroup, leaving: ConsumerMember | None, *,
                            rebalance: bool) -> bool:
        """Kafka's convertToClassicGroup / ClassicGroup.fromConsumerGroup: every member but
        ``leaving`` becomes a classic member with its target as its assignment, the generation
        is the group epoch; the consumer records' tombstones and the classic record in one
        batch. ``rebalance``: a member left (Kafka then prepares a rebalance); a static member's
        replacement (``leaving`` None: the joining member already holds the replaced one's
        place and target) keeps the group Stable."""
        gid = group.group_id
        t = self.table
        now = t.now()
        classic = ClassicGroup(gid, S.Stable, now)
        classic.generation_id = group.group_epoch
        for m in group.members.values():
            if m is leaving or m.classic is None:
                continue
            classic.add(Member(m.member_id, m.instance_id, m.client_id, m.client_host,
                               m.rebalance_timeout_ms, m.classic.session_timeout_ms,
                               CONSUMER_PROTOCOL_TYPE, list(m.classic.protocols)))
        classic.protocol_type = CONSUMER_PROTOCOL_TYPE
        try:
            classic.protocol_name = classic.select_protocol()
            for m in classic.members.values():
                version = version_of(m.metadata(classic.protocol_name))
                m.assignment = encode_assignment(
                    version, self._names(group.target.get(m.member_id, {})))
        except (ValueError, MalformedProtocol) as e:
            log.warning("cannot downgrade consumer group %r: %s", gid, e)
            return False
        classic.subscribed_topics = classic.compute_subscribed_topics()
        err = t.store_consumer_group(group, drop=True, classic=group_record(classic))
        if err != E.none:
            log.warning("consumer group %r: the downgrade is not stored (%s); it stays a "
                        "consumer group", gid, err.name)
            return False
        group.transition_to(S.Dead, now)
        if leaving is not None:
            leaving.session_seq = leaving.rebalance_seq = -1
        t.groups[gid] = classic
        for m in classic.members.values():
            self.rebalance.schedule_hb(classic, m, m.session_timeout_ms)
        log.info("consumer group %r downgraded to a classic group (generation %d, %d members%s)",
                 gid, classic.generation_id, classic.size,
                 "" if rebalance else ": a classic static member replaced the last "
                 "consumer-protocol member")
        if rebalance:
            self.rebalance.prepare_rebalance(classic, f"Downgrade group {gid} from consumer to "
                                                      f"classic.")
        return True

    # -- timers -----------------------------------------------------------------------------------
    def _session(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        from appliance.group.consumer_protocol import SESSION
        timeout = (m.classic.session_timeout_ms if m.classic is not None
                   else self.table.consumer_session_timeout_ms(group.group_id))
        m.session_seq = self.table.push(self.table.now() + timeout, SESSION, m, group)

    def _join_timeout_if_absent(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        from appliance.group.consumer_protocol import JOIN_TIMEOUT
        if m.join_seq <= 0:
            m.join_seq = self.table.push(self.table.now() + m.rebalance_timeout_ms, JOIN_TIMEOUT,
                                         m, group)

    # -- classic requests to a consumer group -----------------------------------------------------
    def _member(self, group: ConsumerGroup, member_id: str, instance_id: str | None
                ) -> tuple[ConsumerMember | None, ErrorCode]:
        """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
        if instance_id is None:
            m = group.members.get(member_id)
        else:
            mid = group.static_members.get(instance_id)
            m = group.members.get(mid) if mid is not None else None
            if m is not None and m.member_id != member_id:
                return None, E.fenced_instance_id
        if m is None or m.classic is None:
            return None, E.unknown_member_id
        return m, E.none

    def join(self, group: ConsumerGroup, req: JoinGroupRequest, once: Once) -> None:
        """Kafka's classicGroupJoinToConsumerGroup (a non-empty consumer group)."""
        t = self.table
        cfg = t.config
        given = req.member_id or ""
        mid = given or self.consumer.new_member_id()

        def fail(code: ErrorCode, member_id: str = given) -> None:
            t.reply(once, JoinGroupResult(code, member_id=member_id))

        if group.size >= cfg.consumer_max_size and (not given or given not in group.members):
            return fail(E.group_max_size_reached)
        protocols = dedupe_protocols(req.protocols)
        if not group.supports_classic_protocols(req.protocol_type, {p for p, _ in protocols}):
            return fail(E.inconsistent_group_protocol)
        iid = req.group_instance_id
        if not given and iid is None and req.api_version >= 4:
            log.info("group %r: a dynamic member with unknown member id joins the consumer group; "
                     "it gets %s and must rejoin with it", group.group_id, mid)
            return fail(E.member_id_required, mid)
        try:
            sub = parse_subscription(protocols[0][1])
        except MalformedProtocol as e:
            log.warning("group %r: JoinGroup of %s: malformed embedded consumer protocol: %s",
                        group.group_id, mid, e)
            return fail(E.unknown_server_error)
        rt = req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms
        member: ConsumerMember | None
        bump = False
        members_before = len(group.members)
        # the instance id's member before this join used the consumer protocol (a downgrade
        # once every member is classic: Kafka's step 4 of classicGroupJoinToConsumerGroup)
        replaced_consumer_member = False
        if iid is None:
            member = group.members.get(mid)
        else:
            old_id = group.static_members.get(iid)
            old = group.members.get(old_id) if old_id is not None else None
            replaced_consumer_member = old is not None and old.classic is None
            if old is None:
                member = None
            elif old.member_id == mid:
                member = old
            elif not given:
                # KIP-345: the instance id rejoins under a new member id and takes its place
                member = ConsumerMember(mid, iid, old.rack_id, req.client_id, req.client_host, rt)
                member.subscribed_topic_names = old.subscribed_topic_names
                group.replace_static_member(old, member)
                old.session_seq = old.rebalance_seq = old.join_seq = old.sync_seq = -1
            else:
                return fail(E.fenced_instance_id)
        if member is None:
            member = ConsumerMember(mid, iid, sub.rack_id, req.client_id, req.client_host, rt)
            group.add_member(member)
            bump = True
            log.info("group %r: member %s joins the consumer group using the classic protocol",
                     group.group_id, mid)
        if sub.rack_id is not None:
            member.rack_id = sub.rack_id
        member.rebalance_timeout_ms = rt
        member.client_id, member.client_host = req.client_id, req.client_host
        member.classic = ClassicMemberMetadata(req.session_timeout_ms, tuple(protocols))
        names = tuple(sorted(set(sub.topics)))
        if names != member.subscribed_topic_names:
            member.subscribed_topic_names = names
            bump = True
        if member.subscribed_topic_regex is not None:       # it used the consumer protocol
            member.subscribed_topic_regex = None
            bump = True
        meta = self.consumer._subscription_metadata(group)
        if meta != group.subscription_metadata:
            group.subscription_metadata = meta
            bump = True
        if bump:
            self.consumer._bump(group)
        group.reconcile(member, self._ids(sub.owned))
        if (self.downgrade_on_replacement(group, replaced_consumer_member, members_before)
                and self._convert_to_classic(group, None, rebalance=False)):
            # Kafka: no session or sync timeout of the consumer group; the classic group's
            # heartbeats are scheduled, the member syncs with its epoch as the generation.
            return t.reply(once, JoinGroupResult(E.none, member.member_id, member.member_epoch,
                                                 CONSUMER_PROTOCOL_TYPE, protocols[0][0], "",
                                                 False, []))
        err = t.store_consumer_group(group)
        if err != E.none:
            return fail(err)
        member.join_seq = 0                                   # the rejoin came: no join timeout
        self._session(group, member)
        from appliance.group.consumer_protocol import SYNC_TIMEOUT
        member.sync_seq = t.push(t.now() + rt, SYNC_TIMEOUT, member, group)
        t.reply(once, JoinGroupResult(E.none, member.member_id, member.member_epoch,
                                      CONSUMER_PROTOCOL_TYPE, protocols[0][0], "", False, []))

    def sync(self, group: ConsumerGroup, req: SyncGroupRequest, once: Once) -> None:
        """Kafka's classicGroupSyncToConsumerGroup."""
        t = self.table
        if not group.members:
            return t.reply(once, SyncGroupResult(E.unknown_member_id))
        member, err = self._member(group, req.member_id, req.group_instance_id)
        if member is None:
            return t.reply(once, SyncGroupResult(err))
        assert member.classic is not None
        if req.generation_id != member.member_epoch:
            return t.reply(once, SyncGroupResult(E.illegal_generation))
        name = member.classic.protocols[0][0]
        if ((req.protocol_type is not None and req.protocol_type != CONSUMER_PROTOCOL_TYPE)
                or (req.protocol_name is not None and req.protocol_name != name)):
            return t.reply(once, SyncGroupResult(E.inconsistent_group_protocol))
        if (group.group_epoch > member.member_epoch
                and member.state is not MemberState.UNREVOKED_PARTITIONS):
            self._join_timeout_if_absent(group, member)
            return t.reply(once, SyncGroupResult(E.rebalance_in_progress))
        member.sync_seq = 0
        self._session(group, member)
        try:
            version = version_of(member.classic.protocols[0][1])
        except MalformedProtocol:
            version = 0
        t.reply(once, SyncGroupResult(E.none, req.protocol_type or CONSUMER_PROTOCOL_TYPE,
                                      req.protocol_name or name,
                                      encode_assignment(version, self._names(member.assigned))))

    def heartbeat(self, group: ConsumerGroup, req: HeartbeatRequest) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup."""
        member, err = self._member(group, req.member_id, req.group_instance_id)
        if member is None:
            return err
        if req.generation_id != member.member_epoch:
            return E.illegal_generation
        self._session(group, member)
        if (member.member_epoch < group.group_epoch
                or member.state is MemberState.UNREVOKED_PARTITIONS
                or (member.state is MemberState.UNRELEASED_PARTITIONS
                    and not group.waiting_on_unreleased(member))):
            self._join_timeout_if_absent(group, member)
            return E.rebalance_in_progress
        return E.none

    def leave(self, group: ConsumerGroup, leaving: Iterable[LeaveMember]) -> LeaveGroupResult:
        """Kafka's classicGroupLeaveToConsumerGroup: each member (by member id, or by instance
        id: an admin removal with no member id) must use the classic protocol."""
        out = []
        removed = False
        for lm in leaving:
            mid, iid = lm.member_id or "", lm.group_instance_id
            if iid is None:
                m = group.members.get(mid)
                err = E.none if m is not None and m.classic is not None else E.unknown_member_id
            else:
                sid = group.static_members.get(iid)
                m = group.members.get(sid) if sid is not None else None
                if m is None:
                    err = E.unknown_member_id
                elif mid and m.member_id != mid:
                    err = E.fenced_instance_id
                elif m.classic is None:
                    err = E.unknown_member_id
                else:
                    err = E.none
            if err == E.none and m is not None:
                mid = m.member_id
                self.consumer._fence(group, m, f"left the group (LeaveGroup; reason: "
                                               f"{lm.reason or 'not provided'})")
                m.join_seq = m.sync_seq = -1
                removed = True
            out.append(LeaveMemberResult(mid, iid, err))
        if removed:
            err = self.table.store_consumer_group(group)
            if err != E.none:
                return LeaveGroupResult(err, [])
        return LeaveGroupResult(E.none, out)
