"""The stored metadata of a classic consumer group: Kafka's GroupMetadataValue v4 as plain structs.

Owns nothing and does no I/O. It is the contract between the two halves of the group coordinator
in the coordinator worker: ``appliance.group.membership`` builds a ``GroupRecord`` when a group
must be made durable (the leader's SyncGroup, a static member replaced without a rebalance, a
group that became Empty) and gets them back in ``GroupCoordinator.load`` after a restart;
``appliance.group.store`` encodes them to and from the bytes Kafka writes for the
GroupMetadataValue record (internal-records/GroupMetadataValue.json) in the group log.
A tombstone (the group was deleted) is ``None`` rather than a record.

Field names are the spec's, in snake_case, in the spec's order; the defaults are the spec's
defaults for fields older versions lack.
"""

from __future__ import annotations

import msgspec

__all__ = ["GroupRecord", "GroupMemberRecord"]


class GroupMemberRecord(msgspec.Struct, frozen=True, kw_only=True):
    """GroupMetadataValue.MemberMetadata."""

    member_id: str
    group_instance_id: str | None = None      # v3+ (KIP-345 static membership)
    client_id: str
    client_host: str
    rebalance_timeout: int = -1                # v1+; a v0 record means the session timeout
    session_timeout: int
    subscription: bytes                        # the member's metadata for the selected protocol
    assignment: bytes                          # what the leader assigned it


class GroupRecord(msgspec.Struct, frozen=True, kw_only=True):
    """GroupMetadataValue: one group's generation, selected protocol, leader and members."""

    protocol_type: str                         # "" when the group never had one
    generation: int
    protocol: str | None                       # null for an Empty group
    leader: str | None                         # null for an Empty group
    current_state_timestamp: int = -1          # v2+; -1 = unknown
    members: list[GroupMemberRecord] = []
