"""Hand-written encoder of the ShareFetch response (v1-2, KIP-932): the share consumers' hot answer.

Owns nothing; runs in the frontend. As for Fetch (``appliance.protocol.fetch_response``): kio's
writer is pure Python, and a ShareFetch answer (hundreds of records and their acquired ranges,
several times a millisecond with eight members on one partition) cost the frontend about a
third of its time per ShareFetch in building and writing the entities; this one packs the fixed
parts with ``struct`` and splices the caller's record buffers (memoryviews of the read-only
segment maps) into the part list untouched.

ShareFetch response body (ShareFetchResponse.json; every version flexible; v1 and v2 alike):

    throttle_time_ms int32 | error_code int16 | error_message compact nullable string
    acquisition_lock_timeout_ms int32
    responses: compact array of
        topic_id uuid
        partitions: compact array of
            partition_index int32 | error_code int16 | error_message compact nullable string
            acknowledge_error_code int16 | acknowledge_error_message compact nullable string
            current_leader: leader_id int32 | leader_epoch int32 | tags
            records: compact bytes (Kafka sends size 0 for none)
            acquired_records: compact array of (first_offset int64, last_offset int64,
                                                delivery_count int16, tags)
            tags
        tags
    node_endpoints: compact array of (node_id int32, host compact string, port int32,
                                      rack compact nullable string, tags)
    tags
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final, Sequence

from appliance.protocol.fetch_response import NodeEndpoint, _uuid_bytes, node_endpoints_array
from appliance.protocol.primitives import (I32, NO_TAGS, buffer_len, compact_nullable_string,
                                           uvarint)

__all__ = ["SHARE_FETCH_VERSIONS", "SharePartitionData", "ShareTopic",
           "encode_share_fetch_response"]

SHARE_FETCH_VERSIONS: Final = range(1, 3)

Buffer = bytes | bytearray | memoryview

_HEAD: Final = struct.Struct(">ih")          # throttle_time_ms, error_code
_P: Final = struct.Struct(">ih")             # partition_index, error_code
_H: Final = struct.Struct(">h")
_LEADER: Final = struct.Struct(">iiB")       # leader_id, leader_epoch, no tags
_ACQUIRED: Final = struct.Struct(">qqhB")    # first, last, delivery count, no tags


@dataclass(slots=True)
class SharePartitionData:
    partition_index: int
    error_code: int = 0
    error_message: str | None = None
    acknowledge_error_code: int = 0
    acknowledge_error_message: str | None = None
    current_leader: tuple[int, int] = (-1, -1)      # (leader_id, leader_epoch)
    records: Sequence[Buffer] = ()                  # () is empty (size 0): never null
    acquired_records: Sequence[tuple[int, int, int]] = ()   # (first, last, delivery count)


@dataclass(slots=True)
class ShareTopic:
    topic_id: bytes
    partitions: list[SharePartitionData] = field(default_factory=list)


def encode_share_fetch_response(
    version: int,
    throttle_time_ms: int,
    error_code: int,
    error_message: str | None,
    acquisition_lock_timeout_ms: int,
    topics: Sequence[ShareTopic],
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> tuple[list[Buffer], int]:
    """Encode a ShareFetch response body; returns (parts, total byte length). The parts are
    our bytes objects interleaved with the caller's record buffers, passed through as given
    (keep them alive and unchanged until written)."""
    if version not in SHARE_FETCH_VERSIONS:
        raise ValueError(f"ShareFetch response version {version} not supported (1-2)")
    parts: list[Buffer] = []
    total = 0
    buf = bytearray(_HEAD.pack(throttle_time_ms, error_code))
    buf += compact_nullable_string(error_message)
    buf += I32.pack(acquisition_lock_timeout_ms)
    buf += uvarint(len(topics) + 1)
    for topic in topics:
        buf += _uuid_bytes(topic.topic_id)
        buf += uvarint(len(topic.partitions) + 1)
        for p in topic.partitions:
            buf += _P.pack(p.partition_index, p.error_code)
            buf += compact_nullable_string(p.error_message)
            buf += _H.pack(p.acknowledge_error_code)
            buf += compact_nullable_string(p.acknowledge_error_message)
            buf += _LEADER.pack(p.current_leader[0], p.current_leader[1], 0)
            # Records: Kafka sends MemoryRecords.EMPTY (size 0) when it has none, never null.
            records = p.records
            size = sum(buffer_len(r) for r in records)
            buf += uvarint(size + 1)
            if size:
                chunk = bytes(buf)
                parts.append(chunk)
                total += len(chunk) + size
                parts.extend(r for r in records if buffer_len(r))
                buf = bytearray()
            buf += uvarint(len(p.acquired_records) + 1)
            for first, last, count in p.acquired_records:
                buf += _ACQUIRED.pack(first, last, count, 0)
            buf += NO_TAGS
        buf += NO_TAGS
    buf += node_endpoints_array(node_endpoints)
    buf += NO_TAGS
    chunk = bytes(buf)
    parts.append(chunk)
    total += len(chunk)
    return parts, total
