"""The stored metadata of a classic consumer group: Kafka's GroupMetadataValue v4 as plain structs.

Owns nothing and does no I/O. It is the contract between the two halves of the group coordinator
in the coordinator worker: ``appliance.group.membership`` builds a ``GroupRecord``
(``classic_group.group_record``) when a group must be made durable (the leader's SyncGroup, a
static member replaced without a rebalance, a group that became Empty) and gets them back in
``GroupCoordinator.load`` after a restart; ``appliance.group.store`` encodes them to and from
the bytes Kafka writes for the GroupMetadataValue record (internal-records/GroupMetadataValue.json)
in the group log. A tombstone (the group was deleted) is ``None`` rather than a record.
``store_group_error`` is the other half of that contract: Kafka's storeGroup mapping of a failed
append to the error the members get, the one function both halves use
(``offsets.OffsetManager.store_group`` / ``delete_group`` for the group log's errors,
``table.GroupTable.store`` for what ``persist`` returns).

Field names are the spec's, in snake_case, in the spec's order; the defaults are the spec's
defaults for fields older versions lack.
"""

from __future__ import annotations

from typing import Any

import msgspec

from appliance.errors import ErrorCode

__all__ = ["GroupRecord", "GroupMemberRecord", "store_group_error"]

E = ErrorCode


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


def store_group_error(code: Any) -> ErrorCode:
    """Kafka's storeGroup mapping of a failed append to the error the members get."""
    try:
        code = E(int(code))
    except (TypeError, ValueError):
        return E.coordinator_not_available          # (ours) a failure without a Kafka code
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas,
                E.not_enough_replicas_after_append):
        return E.coordinator_not_available
    if code in (E.not_leader_or_follower, E.kafka_storage_error):
        return E.not_coordinator
    if code == E.request_timed_out:
        return E.rebalance_in_progress
    if code in (E.message_too_large, E.record_list_too_large, E.invalid_fetch_size):
        return E.unknown_server_error
    return code
