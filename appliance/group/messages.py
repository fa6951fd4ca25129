"""The group coordinator's requests and results, as they travel the rings.

Owns nothing and does no I/O; imported by frontends (the API handlers build the requests) and the
coordinator worker, where ``appliance.group.service`` serves them with the membership side
(``appliance.group.membership.GroupCoordinator``, which takes and returns these types) and the
offsets side (``appliance.group.offsets.OffsetManager``). Fields are Kafka's (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ListGroups, DeleteGroups, OffsetCommit,
TxnOffsetCommit, OffsetFetch, OffsetDelete, and KIP-848's ConsumerGroupHeartbeat and
ConsumerGroupDescribe); version-dependent wire details stay with the
handlers, which pass the request version on as ``api_version`` where the answer depends on it.
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

E = ErrorCode


# -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------

class JoinGroupMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinGroupResult(Message):
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None          # v7+ on the wire
    protocol_name: str | None = None          # null only from v7; the handler sends "" before
    leader: str = ""
    skip_assignment: bool = False             # v9+
    members: list[JoinGroupMember] = []       # the leader's only


class JoinGroupRequest(Request):
    """Answered when the join phase completes (every known member rejoined, or the rebalance
    timeout passed)."""
    group_id: str
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int                 # v0: pass the session timeout (or -1)
    protocol_type: str
    protocols: list[tuple[str, bytes]]        # (name, metadata), in preference order
    group_instance_id: str | None = None      # v5+
    client_id: str = ""                       # request header
    client_host: str = ""                     # the peer address, as Kafka shows it ("/1.2.3.4")
    api_version: int = 9                      # v4+: member id required; v9+: SkipAssignment
    reason: str | None = None                 # v8+, logged only

    def error_reply(self, code: ErrorCode) -> JoinGroupResult:
        return JoinGroupResult(code)


class SyncGroupResult(Message):
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class SyncGroupRequest(Request):
    """Answered once the leader's assignment is stored (or at once, when it already is)."""
    group_id: str
    generation_id: int
    member_id: str
    assignments: list[tuple[str, bytes]] = []     # (member_id, assignment), leader only
    group_instance_id: str | None = None          # v3+
    protocol_type: str | None = None              # v5+ (mandatory from v5)
    protocol_name: str | None = None              # v5+ (mandatory from v5)
    api_version: int = 5

    def error_reply(self, code: ErrorCode) -> SyncGroupResult:
        return SyncGroupResult(code)


class HeartbeatResult(Message):
    error: ErrorCode


class HeartbeatRequest(Request):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None

    def error_reply(self, code: ErrorCode) -> HeartbeatResult:
        return HeartbeatResult(code)


class LeaveMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


class LeaveMemberResult(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


class LeaveGroupResult(Message):
    error: ErrorCode
    members: list[LeaveMemberResult] = []

    @property
    def legacy_error(self) -> ErrorCode:
        """The single error code of LeaveGroup v0-2 (Kafka's LeaveGroupResponse.getError: the
        top-level error, else the first member error)."""
        if self.error != E.none:
            return self.error
        return next((m.error for m in self.members if m.error != E.none), E.none)


class LeaveGroupRequest(Request):
    """v0-2 leave one member (by id); v3+ a batch (KIP-345), where an empty member id with a
    group.instance.id removes that static member."""
    group_id: str
    members: list[LeaveMember]

    def error_reply(self, code: ErrorCode) -> LeaveGroupResult:
        return LeaveGroupResult(code)


# -- DescribeGroups, ListGroups, DeleteGroups -----------------------------------------------------

class DescribedMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


class DescribedGroup(msgspec.Struct, array_like=True, frozen=True):
    error: ErrorCode
    group_id: str
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: list[DescribedMember] = []


class DescribeGroupsResult(Message):
    groups: list[DescribedGroup]


class DescribeGroupsRequest(Request):
    group_ids: list[str]

    def error_reply(self, code: ErrorCode) -> DescribeGroupsResult:
        return DescribeGroupsResult([DescribedGroup(code, g) for g in self.group_ids])


class ListedGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    protocol_type: str
    group_state: str          # v4+
    group_type: str           # v5+


class ListGroupsResult(Message):
    error: ErrorCode
    groups: list[ListedGroup] = []


class ListGroupsRequest(Request):
    states: list[str]         # v4+ (KIP-518)
    types: list[str]          # v5+ (KIP-848)

    def error_reply(self, code: ErrorCode) -> ListGroupsResult:
        return ListGroupsResult(code)


class GroupError(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    error: ErrorCode


class DeleteGroupsResult(Message):
    results: list[GroupError]


class DeleteGroupsRequest(Request):
    group_ids: list[str]

    def error_reply(self, code: ErrorCode) -> DeleteGroupsResult:
        return DeleteGroupsResult([GroupError(g, code) for g in self.group_ids])


# -- Offsets: OffsetCommit, TxnOffsetCommit, OffsetDelete, OffsetFetch ----------------------------

class OffsetPartition(msgspec.Struct, array_like=True, frozen=True):
    """One partition of an offsets request or answer (offset -1, leader epoch -1, metadata ""
    when there is no committed offset)."""
    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = ""
    error: ErrorCode = E.none


class OffsetsResult(Message):
    """The answer to OffsetCommit, TxnOffsetCommit and OffsetDelete: an error for the request,
    or one per partition."""
    error: ErrorCode
    offsets: list[OffsetPartition] = []


class OffsetCommitRequest(Request):
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    offsets: list[OffsetPartition]
    api_version: int

    def error_reply(self, code: ErrorCode) -> OffsetsResult:
        return OffsetsResult(code)


class TxnOffsetCommitRequest(Request):
    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    generation_id: int
    member_id: str
    group_instance_id: str | None
    offsets: list[OffsetPartition]
    api_version: int

    def error_reply(self, code: ErrorCode) -> OffsetsResult:
        return OffsetsResult(code)


class OffsetDeleteRequest(Request):
    group_id: str
    partitions: list[OffsetPartition]

    def error_reply(self, code: ErrorCode) -> OffsetsResult:
        return OffsetsResult(code)


class OffsetFetchGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    partitions: list[OffsetPartition] | None   # None: every partition with a committed offset
    error: ErrorCode = E.none
    member_id: str | None = None               # v9+ (KIP-848): checked for consumer groups
    member_epoch: int = -1


class OffsetFetchResult(Message):
    groups: list[OffsetFetchGroup]


class OffsetFetchRequest(Request):
    groups: list[OffsetFetchGroup]
    require_stable: bool                       # v7+ (KIP-447)

    def error_reply(self, code: ErrorCode) -> OffsetFetchResult:
        return OffsetFetchResult([OffsetFetchGroup(g.group_id, [], code) for g in self.groups])


# -- ConsumerGroupHeartbeat, ConsumerGroupDescribe (KIP-848) ----------------------------------------

class TopicPartitions(msgspec.Struct, array_like=True, frozen=True):
    """One topic of a KIP-848 assignment: its id (16 bytes) and partitions."""
    topic_id: bytes
    partitions: list[int]


class ConsumerGroupHeartbeatResult(Message):
    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: list[TopicPartitions] | None = None     # None: unchanged (not sent)


class ConsumerGroupHeartbeatRequest(Request):
    """Fields are the request's; None where the client sent null (= unchanged)."""
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None           # v1+
    server_assignor: str | None = None
    topic_partitions: list[TopicPartitions] | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1
    # the connection's principal and address: the member's regex matches are filtered by its
    # topic Describe ACLs (KAFKA-18813) in the coordinator
    principal: str = ""
    address: str = ""

    def error_reply(self, code: ErrorCode) -> ConsumerGroupHeartbeatResult:
        return ConsumerGroupHeartbeatResult(code)


class DescribedConsumerMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    assignment: list[TopicPartitions]
    target_assignment: list[TopicPartitions]
    member_type: int = 1          # v1 (KIP-1099): 0 a classic-protocol member, 1 consumer


class DescribedConsumerGroup(msgspec.Struct, array_like=True, frozen=True):
    error: ErrorCode
    group_id: str
    error_message: str | None = None
    group_state: str = ""
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor_name: str = ""
    members: list[DescribedConsumerMember] = []


class ConsumerGroupDescribeResult(Message):
    groups: list[DescribedConsumerGroup]


class ConsumerGroupDescribeRequest(Request):
    group_ids: list[str]

    def error_reply(self, code: ErrorCode) -> ConsumerGroupDescribeResult:
        return ConsumerGroupDescribeResult([DescribedConsumerGroup(code, g) for g in self.group_ids])


# -- KIP-932 share groups (appliance.group.share_group) ---------------------------------------------

class ShareGroupHeartbeatResult(Message):
    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: list[TopicPartitions] | None = None     # None: unchanged (not sent)


class ShareGroupHeartbeatRequest(Request):
    """Fields are the request's; None where the client sent null (= unchanged)."""
    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: list[str] | None = None
    client_id: str = ""
    client_host: str = ""

    def error_reply(self, code: ErrorCode) -> ShareGroupHeartbeatResult:
        return ShareGroupHeartbeatResult(code)


class DescribedShareMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    assignment: list[TopicPartitions]


class DescribedShareGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    error: ErrorCode
    error_message: str | None = None
    state: str = "Dead"
    group_epoch: int = -1
    assignment_epoch: int = -1
    members: list[DescribedShareMember] = []


class ShareGroupDescribeResult(Message):
    groups: list[DescribedShareGroup]


class ShareGroupDescribeRequest(Request):
    group_ids: list[str]

    def error_reply(self, code: ErrorCode) -> ShareGroupDescribeResult:
        return ShareGroupDescribeResult([DescribedShareGroup(g, code) for g in self.group_ids])


class ShareAckBatch(msgspec.Struct, array_like=True, frozen=True):
    first_offset: int
    last_offset: int
    types: list[int]


class ShareFetchPart(msgspec.Struct, array_like=True, frozen=True):
    """A partition a ShareFetch/ShareAcknowledge names, with its acknowledgements."""
    topic_id: bytes
    partition: int
    acks: list[ShareAckBatch] = []


class SharePartResult(msgspec.Struct, array_like=True, frozen=True):
    topic_id: bytes
    partition: int
    error: ErrorCode = E.none
    ack_error: ErrorCode = E.none
    acquired: list[tuple[int, int, int]] = []   # (first, last, delivery count)
    next_offset: int = -1                       # where new records would come: the long poll's
    acked: bool = False                         # the request acknowledged something here
    # How many log batch ends past the last acquired offset the share partition knows
    # (``SharePartition.bounds``): the frontend's read looks ahead for more only when few are.
    bounds_left: int = 0


class ShareFetchResult(Message):
    error: ErrorCode
    error_message: str | None = None
    parts: list[SharePartResult] = []
    lock_ms: int = 0
    # Session partitions the frontend may long-poll: (topic id, partition).
    session: list[tuple[bytes, int]] = []
    # The group's share.isolation.level: 1 (read_committed) has the frontend read as a
    # read_committed fetch and archive the aborted records it acquired (REJECT, again=True).
    isolation_level: int = 0
    # Nothing was acquired, the member holds nothing on its session's partitions, and records
    # are there that only a lock being freed makes acquirable (others hold them, or the
    # in-flight window is full): the frontend waits in the coordinator (``wait_ms``), not in
    # the fetcher's long poll, which records already there would end at once.
    park: bool = False


class ShareFetchRequest(Request):
    """ShareFetch (``acquire``: acquire records) or ShareAcknowledge. ``session_epoch`` as on
    the wire; ``again``: the frontend's second try after a long poll, which neither checks nor
    moves the session epoch and carries no acknowledgements. ``parts`` are what the request
    named (a fetch acquires from every partition of the session)."""
    group_id: str
    member_id: str
    session_epoch: int
    parts: list[ShareFetchPart] = []
    forgotten: list[tuple[bytes, int]] = []
    acquire: bool = True
    max_records: int = 500
    again: bool = False
    # (topic id, partition, first, last): acquire the AVAILABLE offsets of these ranges too, the
    # rest of the log batch the frontend read an acquisition ending inside (as ``again``: no
    # session epoch, no acknowledgements; Kafka's batch_optimized acquisition).
    extend: list[tuple[bytes, int, int, int]] = []
    # (topic id, partition, first, last): offsets the member acquired but the read could not
    # carry (the request's max_bytes ended before them): AVAILABLE again with their delivery
    # count as before, as if never acquired (Kafka acquires only the batches it fetched). Sent
    # as ``extend`` is.
    unacquire: list[tuple[bytes, int, int, int]] = []
    # (topic id, partition, last offsets of log batches): where the log batches the frontend's
    # read saw end, so that later acquisitions end where a batch ends
    # (``SharePartition.learn_bounds``) instead of inside one: sent with ``extend``, or alone
    # (``again``, nothing else) when the read looked ahead and needed no extension.
    bounds: list[tuple[bytes, int, list[int]]] = []
    # ShareFetch v2's share_acquire_mode record_limit (KIP-1206): ``max_records`` is a hard
    # limit, no acquisition is rounded up to a batch's end.
    record_limit: bool = False
    # A ShareFetch of MaxBytes 0: its session and acknowledgements as any fetch's, nothing
    # acquired (its read could carry nothing).
    acquire_none: bool = False
    # is_renew_ack (v2, KIP-1222): the acknowledgements may RENEW locks (nothing is acquired).
    renew: bool = False
    # With ``again``, or on an incremental first try without acknowledgements: when nothing
    # can be acquired and the answer would say ``park``, the coordinator holds the request up
    # to this long, until a lock of the group is freed (Kafka's DelayedShareFetch); 0 answers
    # at once.
    wait_ms: int = 0
    # The frontend connection the request came on (``KafkaConnection.connection_id``): a session
    # opened at epoch 0 belongs to it, and is closed, its records released, when that
    # connection closes (``ShareConnectionClosed``; Kafka's ShareSessionCache ties a session to
    # the connection of its initial epoch).
    connection: str = ""

    def error_reply(self, code: ErrorCode) -> ShareFetchResult:
        return ShareFetchResult(code)


class ShareConnectionClosed(Request):
    """A frontend's client connection closed: the share sessions it opened (``sessions``:
    (group id, member id)) close if they still belong to it, and their members' acquired records
    are released at once (Kafka's ShareSessionCache ConnectionDisconnectListener, onMemberLeave:
    a consumer killed -9 loses its records to the others when its socket closes, not only at its
    locks' end). Answered with a ``ShareConnectionClosedResult``."""
    connection: str
    sessions: list[tuple[str, str]]

    def error_reply(self, code: ErrorCode) -> ShareConnectionClosedResult:
        return ShareConnectionClosedResult(code)


class ShareFrontendStarted(Request):
    """A frontend worker started (``frontend``: its worker name, ``pid``: its process): the
    share sessions opened on connections of an earlier process of that name are closed and
    their members' records released. A frontend killed -9 takes its connections with it and tells
    nobody, as a crashed Kafka broker does; Kafka's new leader of a share partition then starts
    from the persisted state, in which nothing is acquired, and so does this. Answered with a
    ``ShareConnectionClosedResult``."""
    frontend: str
    pid: int

    def error_reply(self, code: ErrorCode) -> ShareConnectionClosedResult:
        return ShareConnectionClosedResult(code)


class ShareConnectionClosedResult(Message):
    error: ErrorCode
    closed: int = 0        # the sessions that were still the connection's and are now closed


# -- KIP-932 share-group offsets admin: DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91),
# DeleteShareGroupOffsets (92); topics by name, resolved by the coordinator against the catalog.

class ShareOffsetPartition(msgspec.Struct, array_like=True, frozen=True):
    partition: int
    start_offset: int = -1                     # -1: the share partition is not initialized
    lag: int = -1                              # v1 of 90 (KIP-1226); -1: not known
    error: ErrorCode = E.none
    error_message: str | None = None


class ShareOffsetsTopic(msgspec.Struct, array_like=True, frozen=True):
    topic: str
    topic_id: bytes                            # 16 zero bytes: not in the catalog
    partitions: list[ShareOffsetPartition] = []
    error: ErrorCode = E.none                  # DeleteShareGroupOffsets answers per topic
    error_message: str | None = None


class ShareOffsetsGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    topics: list[ShareOffsetsTopic] = []
    error: ErrorCode = E.none
    error_message: str | None = None


class ShareOffsetsAsk(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    topics: list[tuple[str, list[int]]] | None     # None: every initialized partition


class DescribeShareOffsetsResult(Message):
    groups: list[ShareOffsetsGroup]


class DescribeShareOffsetsRequest(Request):
    groups: list[ShareOffsetsAsk]

    def error_reply(self, code: ErrorCode) -> DescribeShareOffsetsResult:
        return DescribeShareOffsetsResult([ShareOffsetsGroup(g.group_id, [], code)
                                           for g in self.groups])


class ShareOffsetsChangeResult(Message):
    """AlterShareGroupOffsets (per partition) and DeleteShareGroupOffsets (per topic)."""
    error: ErrorCode
    error_message: str | None = None
    topics: list[ShareOffsetsTopic] = []


class AlterShareOffsetsRequest(Request):
    group_id: str
    topics: list[tuple[str, list[tuple[int, int]]]]     # (topic, [(partition, start offset)])

    def error_reply(self, code: ErrorCode) -> ShareOffsetsChangeResult:
        return ShareOffsetsChangeResult(code)


class DeleteShareOffsetsRequest(Request):
    group_id: str
    topics: list[str]

    def error_reply(self, code: ErrorCode) -> ShareOffsetsChangeResult:
        return ShareOffsetsChangeResult(code)
