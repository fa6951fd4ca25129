"""One consumer group of the KIP-848 protocol in memory: its epochs, members, target assignment
and the partition ownership that reconciliation reads.

Owns nothing shared and does no I/O; used only by ``appliance.group.consumer_protocol``
(ConsumerGroupHeartbeat's decisions) and ``appliance.group.membership_admin`` (the requests that
look any group up), in the coordinator worker. The groups live in
``appliance.group.table.GroupTable.groups`` beside the classic ones, with ``group_type``
``"consumer"`` (Kafka's Group.GroupType.CONSUMER). This is Kafka's ConsumerGroup /
ConsumerGroupMember / CurrentAssignmentBuilder (group-coordinator module, modern/consumer/);
departures are marked "(ours)".

Epochs (KIP-848 "Group Epoch - Assignment Epoch - Member Epoch"): the *group epoch* is bumped
whenever the group's membership, a member's subscription or the metadata of a subscribed topic
changes; the *target assignment* is computed by the server-side assignor for a group epoch and
carries that epoch (computed at once here, so the group never stays in Assigning); each member's
*member epoch* reaches the assignment epoch once the member has reconciled its part of it.

Reconciliation (``reconcile``, Kafka's CurrentAssignmentBuilder): a member first gives up what
the target takes from it (state UNREVOKED_PARTITIONS, its epoch unchanged, until a heartbeat's
owned partitions no longer list them); only then does it get the new epoch and the partitions of
its target that no other member still owns (``partition_epochs``, the owner's epoch of every
owned partition, assigned or pending revocation); those still owned elsewhere wait
(UNRELEASED_PARTITIONS) and are handed over at a later heartbeat once released. So a partition
is never owned by two members at once.

Assignments are ``{topic_id (16 bytes): frozenset(partitions)}``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from appliance.errors import ErrorCode
from appliance.group.messages import DescribedGroup

E = ErrorCode

__all__ = ["CONSUMER_GROUP_TYPE", "ConsumerGroupState", "MemberState", "ConsumerMember",
           "ClassicMemberMetadata",
           "ConsumerGroup", "Assignment", "LEAVE_GROUP_MEMBER_EPOCH",
           "LEAVE_GROUP_STATIC_MEMBER_EPOCH"]

CONSUMER_GROUP_TYPE = "consumer"                # Kafka's Group.GroupType.CONSUMER
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2

Assignment = dict[bytes, frozenset[int]]


class ConsumerGroupState(enum.Enum):
    """Kafka's ConsumerGroup.ConsumerGroupState, with the names DescribeGroups / ListGroups /
    ConsumerGroupDescribe show."""
    Empty = "Empty"
    Assigning = "Assigning"
    Reconciling = "Reconciling"
    Stable = "Stable"
    Dead = "Dead"

    @property
    def lower(self) -> str:
        return self.value.lower()


class MemberState(enum.Enum):
    """Kafka's MemberState of CurrentAssignmentBuilder."""
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ClassicMemberMetadata(NamedTuple):
    """What a member that speaks the classic protocol inside a consumer group brought in its
    JoinGroup (Kafka's ConsumerGroupMemberMetadataValue.ClassicMemberMetadata): its session
    timeout and its protocols (name, metadata), in its order of preference."""
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(slots=True, eq=False)
class ConsumerMember:
    """ConsumerGroupMember. ``session_seq``/``rebalance_seq`` (and, for a classic member,
    ``join_seq``/``sync_seq``: Kafka's join and sync timeouts) name the live timer entries of
    the table's heap (a fired entry whose seq is no longer the member's is stale; 0: none)."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    # KIP-1251's assignment epochs: for each partition the member owns, the member epoch at
    # which it got it (kept while it keeps it). An offset commit carrying an older member
    # epoch is still the owner's when every partition it names was assigned at or before that
    # epoch. In memory only: after a restart a member has none, and commits need its current
    # epoch, as before KIP-1251.
    assignment_epochs: dict[tuple[bytes, int], int] = field(default_factory=dict)
    session_seq: int = 0
    rebalance_seq: int = 0
    # who last heartbeat as this member (in memory only: "" after a restart until it does),
    # for the topic Describe ACLs its regex matches are filtered by
    principal: str = ""
    address: str = ""
    # a member using the classic protocol (JoinGroup/SyncGroup/Heartbeat) in a consumer group
    classic: ClassicMemberMetadata | None = None
    join_seq: int = 0
    sync_seq: int = 0

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def owned(self) -> Iterable[tuple[bytes, int]]:
        for tid, ps in self.assigned.items():
            for p in ps:
                yield tid, p
        for tid, ps in self.pending_revocation.items():
            for p in ps:
                yield tid, p


def _diff(a: Assignment, b: Assignment) -> Assignment:
    out = {}
    for tid, ps in a.items():
        rest = ps - b.get(tid, frozenset())
        if rest:
            out[tid] = frozenset(rest)
    return out


def _inter(a: Assignment, b: Assignment) -> Assignment:
    out = {}
    for tid, ps in a.items():
        both = ps & b.get(tid, frozenset())
        if both:
            out[tid] = frozenset(both)
    return out


def overlaps(a: Assignment, owned: Assignment | None) -> bool:
    """Does ``owned`` (a heartbeat's owned partitions; None = not sent) still hold any of
    ``a``? Not sent counts as still owned (Kafka's ownsRevokedPartitions)."""
    if not a:
        return False
    if owned is None:
        return True
    return any(ps & owned.get(tid, frozenset()) for tid, ps in a.items())


def is_subset(owned: Assignment | None, of: Assignment) -> bool:
    if owned is None:
        return True
    return all(ps <= of.get(tid, frozenset()) for tid, ps in owned.items())


class ConsumerGroup:
    """ConsumerGroup: epochs, members, the target assignment, the partitions' owners."""

    group_type = CONSUMER_GROUP_TYPE
    protocol_type = "consumer"          # what ListGroups shows for it (Kafka's ConsumerProtocol)

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}        # instance id -> member id
        self.target: dict[str, Assignment] = {}         # member id -> target assignment
        self.partition_epochs: dict[tuple[bytes, int], int] = {}
        # the metadata of the subscribed topics the target was computed for: name -> (id, n)
        self.subscription_metadata: dict[str, tuple[bytes, int]] = {}
        self.assignor = ""                               # the assignor of the last target
        self.state_timestamp: int | None = now_ms
        self.dead = False
        # the records last written for it (``GroupTable.store_consumer_group`` diffs against it)
        self.stored: dict = {}
        # converted from a live classic group (KIP-848 online upgrade): its first store also
        # writes the classic record's tombstone, in the same batch
        self.replaces_classic = False
        # regexes a heartbeat brought that no member had: resolved at the next timer turn
        # (Kafka resolves them asynchronously; in memory only)
        self.unresolved_regexes: set[str] = set()
        # admin compatibility with classic groups (GroupAdmin._drop clears these)
        self.pending_members: dict[str, int] = {}
        self.join_token = self.sync_token = None

    # -- queries ----------------------------------------------------------------------------------
    @property
    def state(self) -> ConsumerGroupState:
        """Kafka's ConsumerGroup.maybeUpdateGroupState, derived rather than stored."""
        if self.dead:
            return ConsumerGroupState.Dead
        if not self.members:
            return ConsumerGroupState.Empty
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.Assigning
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                # a static member that left (-2) keeps its place without reconciling
                if m.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    return ConsumerGroupState.Reconciling
        return ConsumerGroupState.Stable

    def is_(self, state: Any) -> bool:
        """Compares by state name, so the admin code's classic ``GroupState.Empty`` / ``Dead``
        / ``Stable`` checks read consumer groups too."""
        return self.state.value == state.value

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def generation_id(self) -> int:
        return self.group_epoch

    def classic_members(self) -> list[ConsumerMember]:
        return [m for m in self.members.values() if m.classic is not None]

    def supports_classic_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Kafka's ConsumerGroup.supportsClassicProtocols: a "consumer" protocol type and a
        protocol every classic member supports (any, while none is classic)."""
        if protocol_type != "consumer" or not names:
            return False
        classic = self.classic_members()
        return any(all(any(n == p for p, _ in m.classic.protocols) for m in classic)  # type: ignore[union-attr]
                   for n in names)

    def all_classic_except(self, member_id: str) -> bool:
        """Kafka's allMembersUseClassicProtocolExcept: the member uses the consumer protocol and
        every other member the classic one."""
        m = self.members.get(member_id)
        return (m is not None and m.classic is None
                and all(o.classic is not None for o in self.members.values() if o is not m))

    def waiting_on_unreleased(self, member: ConsumerMember) -> bool:
        """Kafka's waitingOnUnreleasedPartition: some partition of the member's target is still
        owned by another member."""
        if member.state is not MemberState.UNRELEASED_PARTITIONS:
            return False
        for tid, ps in self.target.get(member.member_id, {}).items():
            mine = member.assigned.get(tid, frozenset())
            if any(p not in mine and (tid, p) in self.partition_epochs for p in ps):
                return True
        return False

    @property
    def subscribed_topics(self) -> frozenset[str] | None:
        """The topic names any member subscribes to (KIP-496 protects their offsets)."""
        if not self.members:
            return None
        return frozenset(t for m in self.members.values() for t in m.subscribed_topic_names)

    def describe(self) -> DescribedGroup:
        """DescribeGroups of a consumer group: Kafka 4's coordinator looks only for a classic
        group there (GroupIdNotFoundException "Group X is not a classic group": the frontend
        answers Dead, with GROUP_ID_NOT_FOUND from v6); ConsumerGroupDescribe describes it."""
        return DescribedGroup(E.group_id_not_found, self.group_id, ConsumerGroupState.Dead.value)

    def transition_to(self, state: Any, now_ms: int) -> None:
        """Only Dead is ever set (deletion); the other states are derived."""
        if state.value == "Dead":
            self.dead = True
            self.state_timestamp = now_ms

    # -- members and ownership --------------------------------------------------------------------
    def add_member(self, member: ConsumerMember) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove_member(self, member_id: str) -> ConsumerMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.target.pop(member_id, None)
        self._release(member)
        return member

    def _release(self, member: ConsumerMember) -> None:
        for tp in member.owned():
            self.partition_epochs.pop(tp, None)

    def _claim(self, member: ConsumerMember) -> None:
        for tp in member.owned():
            self.partition_epochs[tp] = member.member_epoch

    def replace_static_member(self, old: ConsumerMember, new: ConsumerMember) -> None:
        """A static member rejoining under a new member id takes the old one's place: its
        epoch, assignment and target (Kafka's replaceStaticMember), no group epoch bump."""
        self.members.pop(old.member_id, None)
        target = self.target.pop(old.member_id, None)
        new.member_epoch = self.assignment_epoch if old.member_epoch < 0 else old.member_epoch
        new.previous_member_epoch = old.previous_member_epoch
        new.state = old.state
        new.assigned = old.assigned
        new.pending_revocation = old.pending_revocation
        new.assignment_epochs = old.assignment_epochs
        self.members[new.member_id] = new
        self.static_members[new.instance_id] = new.member_id
        if target is not None:
            self.target[new.member_id] = target
        self._claim(new)

    # -- reconciliation ---------------------------------------------------------------------------
    def reconcile(self, member: ConsumerMember, owned: Assignment | None) -> bool:
        """Move the member towards its target (Kafka's CurrentAssignmentBuilder.build); True if
        it entered UNREVOKED_PARTITIONS just now (the caller starts the rebalance timeout)."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if overlaps(member.pending_revocation, owned):
                return False                       # still owns what it must give up
            self._next(member, owned)
            return member.state is MemberState.UNREVOKED_PARTITIONS
        if (member.state is MemberState.STABLE
                and member.member_epoch == self.assignment_epoch):
            return False
        before = member.state
        self._next(member, owned)
        return (member.state is MemberState.UNREVOKED_PARTITIONS
                and before is not MemberState.UNREVOKED_PARTITIONS)

    def _next(self, member: ConsumerMember, owned: Assignment | None) -> None:
        """Kafka's computeNextAssignment against the member's current target."""
        target = self.target.get(member.member_id, {})
        keep = _inter(member.assigned, target)
        revoke = _diff(member.assigned, target)
        wanted = _diff(target, member.assigned)
        self._release(member)
        if revoke and overlaps(revoke, owned):
            # give up first: the epoch stays, the new partitions wait for the next epoch
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.assigned = keep
            member.pending_revocation = revoke
            self._claim(member)
            return
        unreleased = False
        grown = {tid: set(ps) for tid, ps in keep.items()}
        for tid, ps in wanted.items():
            for p in ps:
                if (tid, p) in self.partition_epochs:
                    unreleased = True              # its old owner has not let it go yet
                else:
                    grown.setdefault(tid, set()).add(p)
        new_epoch = self.assignment_epoch
        if member.member_epoch != new_epoch:
            member.previous_member_epoch = member.member_epoch
        member.member_epoch = new_epoch
        member.assigned = {tid: frozenset(ps) for tid, ps in grown.items() if ps}
        member.pending_revocation = {}
        # KIP-1251: kept partitions keep the epoch they were assigned at, new ones get this one
        before = member.assignment_epochs
        member.assignment_epochs = {(tid, p): before.get((tid, p), new_epoch)
                                    for tid, ps in member.assigned.items() for p in ps}
        member.state = (MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE)
        self._claim(member)


def assigned_at_or_before(member: ConsumerMember, epoch: int,
                          partitions: Iterable[tuple[bytes, int]]) -> bool:
    """KIP-1251 (Kafka's assignment epochs): may ``member``'s commit carrying the older member
    ``epoch`` name these partitions? Each must be owned now (assigned or pending revocation)
    and have been assigned at an epoch ``<= epoch``."""
    owned = set(member.owned())
    got = False
    for tp in partitions:
        got = True
        at = member.assignment_epochs.get(tp)
        if tp not in owned or at is None or at > epoch:
            return False
    return got
