"""One classic consumer group in memory: its state, members and protocol bookkeeping.

Owns nothing shared and does no I/O; used only by ``appliance.group.membership`` and its
collaborators (the group coordinator in the coordinator worker), which decide and call these
helpers; the groups themselves live in ``appliance.group.table.GroupTable``. A classic group's
``group_type`` is ``"classic"`` (Kafka's Group.GroupType.CLASSIC): the table's namespace is
shared with the consumer (KIP-848) and share (KIP-932) groups to come. ``group_record`` is a
group in its stored form (``records.GroupRecord``). This is Kafka's
GroupMetadata/MemberMetadata (core/.../coordinator/group/, late-2024 trunk; the same rules as
ClassicGroup/ClassicGroupMember of the newer group-coordinator module). Departures are marked
"(ours)".

States and Kafka's allowed transitions (``VALID_PREVIOUS``; ``ClassicGroup.transition_to``
checks them and raises ``IllegalGroupTransition``, which the coordinator turns into an error code):

    ===================  =====================================================
    state                reached from
    ===================  =====================================================
    Empty                PreparingRebalance (last member gone)
    PreparingRebalance   Empty, Stable, CompletingRebalance
    CompletingRebalance  PreparingRebalance (join phase over, new generation)
    Stable               CompletingRebalance (leader's assignment stored)
    Dead                 any state (group deleted or dropped; never stored)
    ===================  =====================================================
"""

from __future__ import annotations

import enum
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any

from appliance.errors import ErrorCode
from appliance.group.messages import DescribedGroup, DescribedMember
from appliance.group.records import GroupMemberRecord, GroupRecord

E = ErrorCode

__all__ = ["GroupState", "VALID_PREVIOUS", "IllegalGroupTransition", "Member", "ClassicGroup",
           "parse_subscription_topics", "dedupe_protocols", "group_record",
           "CONSUMER_PROTOCOL_TYPE", "CLASSIC_GROUP_TYPE"]

CONSUMER_PROTOCOL_TYPE = "consumer"
CLASSIC_GROUP_TYPE = "classic"                  # Kafka's Group.GroupType.CLASSIC (ListGroups v5)


class GroupState(enum.Enum):
    Empty = "Empty"
    PreparingRebalance = "PreparingRebalance"
    CompletingRebalance = "CompletingRebalance"
    Stable = "Stable"
    Dead = "Dead"

    @property
    def lower(self) -> str:
        return self.value.lower()


S = GroupState
VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    S.Empty: frozenset({S.PreparingRebalance}),
    S.PreparingRebalance: frozenset({S.Stable, S.CompletingRebalance, S.Empty}),
    S.CompletingRebalance: frozenset({S.PreparingRebalance}),
    S.Stable: frozenset({S.CompletingRebalance}),
    S.Dead: frozenset({S.Stable, S.PreparingRebalance, S.CompletingRebalance, S.Empty, S.Dead}),
}


class IllegalGroupTransition(Exception):
    pass


Protocols = list[tuple[str, bytes]]


@dataclass(slots=True, eq=False)
class Member:
    """MemberMetadata. ``join_respond``/``sync_respond`` are the parked JoinGroup/SyncGroup
    answers (Kafka's awaitingJoinCallback/awaitingSyncCallback)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_respond: Any = None
    sync_respond: Any = None
    is_new: bool = False
    removed: bool = False
    # heartbeat timer (Kafka's DelayedHeartbeat): the due time, and the heap entry that watches it
    hb_deadline: int | None = None
    hb_entry: int | None = None
    hb_entry_deadline: int = 0

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def awaiting_join(self) -> bool:
        return self.join_respond is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_respond is not None

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        return b""                 # (ours) Kafka throws; unreachable for a consistent group

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols, same order, same metadata bytes."""
        return len(protocols) == len(self.protocols) and all(
            a[0] == b[0] and bytes(a[1]) == bytes(b[1]) for a, b in zip(protocols, self.protocols))

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """At its heartbeat deadline, is the member still alive? A new member must have been
        heard of; a member parked in JoinGroup or SyncGroup counts as alive (its rebalance
        timeout governs it); any other member needed a heartbeat since the deadline was set
        (which re-arms the deadline, so reaching it means none came)."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync


def dedupe_protocols(protocols) -> Protocols:
    """(ours) The first entry of each protocol name; Kafka's request collection is keyed by name,
    so duplicates only come from a broken client and would skew the support counts."""
    seen: set[str] = set()
    out: Protocols = []
    for name, data in protocols:
        if name not in seen:
            seen.add(name)
            out.append((name, bytes(data)))
    return out


class ClassicGroup:
    """GroupMetadata without the offsets (those are ``appliance.group.offsets``)."""

    group_type = CLASSIC_GROUP_TYPE

    def __init__(self, group_id: str, state: GroupState, now_ms: int) -> None:
        self.group_id = group_id
        self.state = state
        self.state_timestamp: int | None = now_ms
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.generation_id = 0
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}        # group.instance.id -> member id
        self.pending_members: dict[str, int] = {}       # KIP-394 member id -> timer token
        self.supported_protocols: Counter[str] = Counter()
        self.pending_sync: set[str] = set()
        self.new_member_added = False
        self.subscribed_topics: frozenset[str] | None = None
        # the join phase (Kafka's DelayedJoin / InitialDelayedJoin) and the sync phase
        # (DelayedSync): a token naming the live heap entry, None when none is running
        self.join_token: int | None = None
        self.join_initial = False
        self.join_delay_ms = 0
        self.join_remaining_ms = 0
        self.sync_token: int | None = None

    # -- queries ----------------------------------------------------------------------------------
    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def size(self) -> int:
        return len(self.members)

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[S.PreparingRebalance]

    def current_static_member_id(self, instance_id: str) -> str | None:
        return self.static_members.get(instance_id)

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        if self.is_(S.Empty):
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[p] == n for p in names)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those every member supports;
        most votes wins (a tie goes to the protocol voted first, in member order: ours, Kafka's
        tie-break is hash order)."""
        if not self.members:
            raise ValueError("cannot select a protocol for an empty group")
        n = len(self.members)
        candidates = {p for p, c in self.supported_protocols.items() if c == n}
        votes: Counter[str] = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda p: votes[p])        # max keeps the first of equal counts

    def current_member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """What the leader gets in its JoinGroup answer: every member with its metadata for the
        selected protocol."""
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()]

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Kafka's validateCurrentMember. KIP-345: a group.instance.id must exist and map to
        this member id, else the sender is fenced (FENCED_INSTANCE_ID) or unknown; without one
        the member id must exist."""
        if instance_id is not None:
            current = self.static_members.get(instance_id)
            if current is None:
                return E.unknown_member_id
            return None if current == member_id else E.fenced_instance_id
        return None if member_id in self.members else E.unknown_member_id

    def validate_offset_commit(self, generation_id: int, member_id: str, instance_id: str | None,
                               *, transactional: bool) -> ErrorCode | None:
        """Kafka's validateOffsetCommit (ClassicGroup's, the same in GroupCoordinator.scala)."""
        if self.is_(S.Dead):
            return E.coordinator_not_available
        if generation_id < 0 and self.is_(S.Empty):
            return None                    # admin client or a consumer without group management
        if generation_id >= 0 or member_id or instance_id is not None:
            err = self.validate_member(member_id, instance_id)
            if err is not None:
                return err
            if generation_id != self.generation_id:
                return E.illegal_generation
        elif not transactional and not self.is_(S.Empty):
            return E.unknown_member_id     # only members commit to a non-empty group (v0-style)
        if not transactional and self.is_(S.CompletingRebalance):
            return E.rebalance_in_progress  # a valid member that has not synced yet
        return None

    def describe(self) -> DescribedGroup:
        """Kafka's GroupMetadata.summary: metadata, assignments and protocol only when Stable."""
        stable = self.is_(S.Stable)
        members = [DescribedMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                   m.metadata(self.protocol_name) if stable else b"",
                                   m.assignment if stable else b"")
                   for m in self.members.values()]
        return DescribedGroup(E.none, self.group_id, self.state.value, self.protocol_type or "",
                              (self.protocol_name or "") if stable else "", members)

    # -- changes ----------------------------------------------------------------------------------
    def transition_to(self, state: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalGroupTransition(
                f"group {self.group_id!r}: {self.state.value} -> {state.value} is not allowed")
        self.state = state
        self.state_timestamp = now_ms

    def add(self, member: Member, respond: Any = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise ValueError(f"static member {member.group_instance_id!r} is already in "
                                 f"group {self.group_id!r}")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(name for name, _ in member.protocols)
        member.join_respond = respond
        member.removed = False
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> Member | None:
        """Drops the member (or pending member id) from every index; answers nothing."""
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(name for name, _ in member.protocols)
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
            member.removed = True
            member.hb_deadline = None
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.pop(member_id, None)
        self.pending_sync.discard(member_id)
        return member

    def update_member(self, member: Member, protocols: Protocols, rebalance_timeout_ms: int,
                      session_timeout_ms: int, respond: Any) -> None:
        self.supported_protocols.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        self.supported_protocols.update(name for name, _ in protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_respond = respond

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """The member object keeps everything but gets the new id (KIP-345); the caller fences
        whatever the old id had parked."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        if old_id in self.pending_sync:                 # (ours) keep the sync bookkeeping exact
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def maybe_elect_new_joined_leader(self) -> bool:
        """If the leader did not rejoin, any member that did becomes leader. False when no
        member rejoined (or there is no leader at all)."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join:
            return True
        for mid, m in self.members.items():
            if m.awaiting_join:
                self.leader_id = mid
                return True
        return False

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(S.CompletingRebalance, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(S.Empty, now_ms)
        self.pending_sync.clear()

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """Kafka's computeSubscribedTopics: for a "consumer" group, the union of the topics in
        every member's subscription (parsed as ConsumerProtocolSubscription v0, the prefix of
        every version); None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            t = parse_subscription_topics(m.metadata(self.protocol_name))
            if t is None:
                return None
            topics |= t
        return frozenset(topics)


def group_record(group: ClassicGroup, assignment: dict[str, bytes] | None = None) -> GroupRecord:
    """The group as stored (GroupMetadataValue); ``assignment`` replaces the members' own."""
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


_h = struct.Struct(">h")
_i = struct.Struct(">i")


def parse_subscription_topics(data: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (int16 version >= 0, then v0's topics array:
    int32 count, count x int16-length UTF-8 string). None when it does not parse."""
    try:
        (version,) = _h.unpack_from(data, 0)
        if version < 0:
            return None
        (n,) = _i.unpack_from(data, 2)
        if n < 0 or n > len(data):
            return None
        pos = 6
        out: set[str] = set()
        for _ in range(n):
            (ln,) = _h.unpack_from(data, pos)
            pos += 2
            if ln < 0 or pos + ln > len(data):
                return None
            out.add(bytes(data[pos:pos + ln]).decode("utf-8"))
            pos += ln
        return out
    except (struct.error, UnicodeDecodeError):
        return None

