"""The request and result types of the group membership coordinator, plus its config.

Owns nothing and does no I/O; these are the values ``appliance.group.membership`` takes and
returns (it re-exports every name here). Fields mirror the wire messages (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, DescribeGroups, ListGroups) so that the API handlers copy them across;
version-dependent wire details (which fields exist in which version) stay with the handlers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol, Sequence

from appliance.errors import ErrorCode

__all__ = [
    "GroupConfigLike", "MembershipConfig",
    "JoinGroupRequest", "JoinGroupMember", "JoinGroupResult",
    "SyncGroupRequest", "SyncGroupResult", "HeartbeatRequest",
    "LeaveMember", "LeaveMemberResult", "LeaveGroupResult",
    "DescribedMember", "DescribedGroup", "ListedGroup", "ListGroupsResult", "GroupInfo",
]

E = ErrorCode


# -- configuration --------------------------------------------------------------------------------

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


# -- requests and results (fields mirror the wire) ------------------------------------------------

@dataclass(slots=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int                 # v0: pass the session timeout (or -1)
    protocol_type: str
    protocols: Sequence[tuple[str, bytes]]    # (name, metadata), in preference order
    group_instance_id: str | None = None      # v5+
    client_id: str = ""                       # request header
    client_host: str = ""                     # the peer address, as Kafka shows it ("/1.2.3.4")
    api_version: int = 9                      # v4+: member id required; v9+: SkipAssignment
    reason: str | None = None                 # v8+, logged only


class JoinGroupMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinGroupResult(NamedTuple):
    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None          # v7+ on the wire
    protocol_name: str | None = None          # null only from v7; the handler sends "" before
    leader: str = ""
    skip_assignment: bool = False             # v9+
    members: Sequence[JoinGroupMember] = ()   # the leader's only


@dataclass(slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: Sequence[tuple[str, bytes]] = ()   # (member_id, assignment), leader only
    group_instance_id: str | None = None            # v3+
    protocol_type: str | None = None                # v5+ (mandatory from v5)
    protocol_name: str | None = None                # v5+ (mandatory from v5)
    api_version: int = 5


class SyncGroupResult(NamedTuple):
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class LeaveMember(NamedTuple):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


class LeaveMemberResult(NamedTuple):
    member_id: str
    group_instance_id: str | None
    error: ErrorCode


class LeaveGroupResult(NamedTuple):
    error: ErrorCode
    members: list[LeaveMemberResult]

    @property
    def legacy_error(self) -> ErrorCode:
        """The single error code of LeaveGroup v0-2 (Kafka's LeaveGroupResponse.getError: the
        top-level error, else the first member error)."""
        if self.error != E.none:
            return self.error
        return next((m.error for m in self.members if m.error != E.none), E.none)


class DescribedMember(NamedTuple):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes


class DescribedGroup(NamedTuple):
    error: ErrorCode
    group_id: str
    group_state: str
    protocol_type: str
    protocol_data: str
    members: list[DescribedMember]


class ListedGroup(NamedTuple):
    group_id: str
    protocol_type: str
    group_state: str          # v4+
    group_type: str           # v5+


class ListGroupsResult(NamedTuple):
    error: ErrorCode
    groups: list[ListedGroup]


class GroupInfo(NamedTuple):
    state: str
    protocol_type: str | None
    generation_id: int
    state_timestamp: int | None
    subscribed_topics: frozenset[str] | None
    members: int
