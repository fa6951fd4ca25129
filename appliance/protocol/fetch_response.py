"""Hand-written encoders for the two hot responses: Fetch (v4-18) and Produce (v3-13).

Owns nothing; runs in the frontend. kio's writer is pure Python (~9 µs for a one-partition
Produce response, much more for a Fetch) and can only write records it holds as one bytes object;
these encoders emit the fixed parts with ``struct`` and splice the caller's record buffers
(memoryview slices of the read-only segment maps) into the part list untouched: zero copy.

Fetch response body (FetchResponse.json; [vN+] = from version N; flexible = v12+):

    throttle_time_ms int32
    [v7+]  error_code int16 | session_id int32
    responses: array of
        [v4-12] topic string            [v13+] topic_id uuid (16 bytes)
        partitions: array of
            partition_index int32 | error_code int16 | high_watermark int64
            last_stable_offset int64
            [v5+]  log_start_offset int64
            aborted_transactions: nullable array of (producer_id int64, first_offset int64 [tags])
            [v11+] preferred_read_replica int32
            records: nullable bytes
            [flexible] tags: 1 = CurrentLeader (leader_id int32, leader_epoch int32, tags)
        [flexible] tags
    [flexible] tags: [v16+] 0 = NodeEndpoints array of (node_id int32, host string, port int32,
                                                       rack nullable string, tags)

    Arrays/strings/bytes are legacy (int32/int16 length, -1 = null) before v12 and compact
    (uvarint length + 1, 0 = null) from v12.

What Kafka sends, which we copy:
- records: an empty fetch carries MemoryRecords.EMPTY, i.e. size 0, not null (the default
  ``records=()``); pass ``records=None`` only to send null.
- aborted_transactions: null for READ_UNCOMMITTED fetches, a list (possibly empty) for
  READ_COMMITTED ones (LocalLog.emptyFetchDataInfo / KafkaApis: ``abortedTransactions.orElse(null)``).
  The caller decides: None -> null, [] -> empty array.
- tagged fields equal to their default (CurrentLeader -1/-1, empty NodeEndpoints) are not written.

Produce response body (ProduceResponse.json; flexible = v9+):

    responses: array of
        [v3-12] name string             [v13+] topic_id uuid
        partition_responses: array of
            index int32 | error_code int16 | base_offset int64 | log_append_time_ms int64
            [v5+] log_start_offset int64
            [v8+] record_errors: array of (batch_index int32, batch_index_error_message
                  nullable string [tags]) | error_message nullable string
            [flexible] tags: [v10+] 0 = CurrentLeader (leader_id int32, leader_epoch int32, tags)
        [flexible] tags
    throttle_time_ms int32
    [flexible] tags: [v10+] 0 = NodeEndpoints (as in Fetch)
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from appliance.protocol.primitives import (
    I32,
    NO_TAGS,
    UUID_ZERO,
    buffer_len,
    compact_nullable_string,
    compact_string,
    legacy_nullable_string,
    legacy_string,
    uvarint,
)

__all__ = [
    "FETCH_VERSIONS",
    "PRODUCE_VERSIONS",
    "FetchPartition",
    "FetchTopic",
    "NodeEndpoint",
    "encode_fetch_response",
    "node_endpoints_array",
    "ProducePartition",
    "ProduceTopic",
    "encode_produce_response",
]

FETCH_VERSIONS: Final = range(4, 19)
PRODUCE_VERSIONS: Final = range(3, 14)

Buffer = bytes | bytearray | memoryview

_P4: Final = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_P5: Final = struct.Struct(">ihqqq")  # ... + log_start_offset
_HI: Final = struct.Struct(">hi")
_QQ: Final = struct.Struct(">qq")
_QQ_TAGS: Final = struct.Struct(">qqB")
_LEADER_TAG: Final = struct.Struct(">BBBiiB")  # 1 tag | tag | size 9 | leader id | epoch | no tags
_PR3: Final = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_PR5: Final = struct.Struct(">ihqqq")  # ... + log_start_offset
_NULL_LEGACY_ARRAY: Final = b"\xff\xff\xff\xff"
_NULL_COMPACT: Final = b"\x00"


@dataclass(slots=True)
class NodeEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(slots=True)
class FetchPartition:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: Sequence[tuple[int, int]] | None = None  # (producer_id, first_offset)
    preferred_read_replica: int = -1
    records: Sequence[Buffer] | None = ()
    records_len: int | None = None  # sum of the records' byte lengths; computed when None
    current_leader: tuple[int, int] | None = None  # (leader_id, leader_epoch), v12+ only


@dataclass(slots=True)
class FetchTopic:
    name: str
    topic_id: bytes | uuid.UUID | None  # 16 bytes; used from v13 on (None -> zero uuid)
    partitions: list[FetchPartition] = field(default_factory=list)


def node_endpoints_array(node_endpoints: Sequence[NodeEndpoint]) -> bytes:
    """A compact array of NodeEndpoint (node_id int32, host string, port int32, rack
    nullable string, tags): Fetch's tagged field 0 (v16+) and ShareFetch's NodeEndpoints."""
    payload = bytearray(uvarint(len(node_endpoints) + 1))
    for ep in node_endpoints:
        payload += I32.pack(ep.node_id)
        payload += compact_string(ep.host)
        payload += I32.pack(ep.port)
        payload += compact_nullable_string(ep.rack)
        payload += NO_TAGS
    return bytes(payload)


def _node_endpoints_tag(node_endpoints: Sequence[NodeEndpoint]) -> bytes:
    payload = node_endpoints_array(node_endpoints)
    return b"\x01\x00" + uvarint(len(payload)) + payload


def _uuid_bytes(topic_id: bytes | uuid.UUID | None) -> bytes:
    if topic_id is None:
        return UUID_ZERO
    if isinstance(topic_id, uuid.UUID):
        return topic_id.bytes
    if len(topic_id) != 16:
        raise ValueError(f"topic id must be 16 bytes, got {len(topic_id)}")
    return bytes(topic_id)


def encode_fetch_response(
    version: int,
    throttle_time_ms: int,
    error_code: int,
    session_id: int,
    topics: Sequence[FetchTopic],
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> tuple[list[Buffer], int]:
    """Encode a Fetch response body; returns (parts, total byte length).

    The parts are our bytes objects interleaved with the caller's record buffers, which are
    passed through as given (keep them alive and unchanged until written).
    """
    if version not in FETCH_VERSIONS:
        raise ValueError(f"Fetch response version {version} not supported (4-18)")
    flexible = version >= 12
    by_id = version >= 13
    partition_head = _P5 if version >= 5 else _P4
    with_log_start = version >= 5
    with_replica = version >= 11
    parts: list[Buffer] = []
    total = 0
    buf = bytearray(I32.pack(throttle_time_ms))
    if version >= 7:
        buf += _HI.pack(error_code, session_id)
    buf += uvarint(len(topics) + 1) if flexible else I32.pack(len(topics))
    for topic in topics:
        if by_id:
            buf += _uuid_bytes(topic.topic_id)
        elif flexible:
            buf += compact_string(topic.name)
        else:
            buf += legacy_string(topic.name)
        partitions = topic.partitions
        buf += uvarint(len(partitions) + 1) if flexible else I32.pack(len(partitions))
        for p in partitions:
            if with_log_start:
                buf += partition_head.pack(p.partition_index, p.error_code, p.high_watermark,
                                           p.last_stable_offset, p.log_start_offset)
            else:
                buf += partition_head.pack(p.partition_index, p.error_code, p.high_watermark,
                                           p.last_stable_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                buf += _NULL_COMPACT if flexible else _NULL_LEGACY_ARRAY
            elif flexible:
                buf += uvarint(len(aborted) + 1)
                for producer_id, first_offset in aborted:
                    buf += _QQ_TAGS.pack(producer_id, first_offset, 0)
            else:
                buf += I32.pack(len(aborted))
                for producer_id, first_offset in aborted:
                    buf += _QQ.pack(producer_id, first_offset)
            if with_replica:
                buf += I32.pack(p.preferred_read_replica)
            records = p.records
            if records is None:
                buf += _NULL_COMPACT if flexible else _NULL_LEGACY_ARRAY
            else:
                size = p.records_len
                if size is None:
                    size = sum(buffer_len(r) for r in records)
                buf += uvarint(size + 1) if flexible else I32.pack(size)
                if size:
                    chunk = bytes(buf)
                    parts.append(chunk)
                    total += len(chunk) + size
                    parts.extend(records)
                    buf = bytearray()
            if flexible:
                if p.current_leader is None:
                    buf += NO_TAGS
                else:
                    buf += _LEADER_TAG.pack(1, 1, 9, p.current_leader[0], p.current_leader[1], 0)
        if flexible:
            buf += NO_TAGS
    if flexible:
        if version >= 16 and node_endpoints:
            buf += _node_endpoints_tag(node_endpoints)
        else:
            buf += NO_TAGS
    chunk = bytes(buf)
    parts.append(chunk)
    total += len(chunk)
    return parts, total


@dataclass(slots=True)
class ProducePartition:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: Sequence[tuple[int, str | None]] = ()  # (batch_index, message), v8+
    error_message: str | None = None  # v8+
    current_leader: tuple[int, int] | None = None  # (leader_id, leader_epoch), v10+


@dataclass(slots=True)
class ProduceTopic:
    name: str
    topic_id: bytes | uuid.UUID | None  # used from v13 on
    partitions: list[ProducePartition] = field(default_factory=list)


def encode_produce_response(
    version: int,
    topics: Sequence[ProduceTopic],
    throttle_time_ms: int = 0,
    node_endpoints: Sequence[NodeEndpoint] = (),
) -> bytes:
    """Encode a Produce response body (no header)."""
    if version not in PRODUCE_VERSIONS:
        raise ValueError(f"Produce response version {version} not supported (3-13)")
    flexible = version >= 9
    with_log_start = version >= 5
    with_errors = version >= 8
    with_leader = version >= 10
    buf = bytearray(uvarint(len(topics) + 1) if flexible else I32.pack(len(topics)))
    for topic in topics:
        if version >= 13:
            buf += _uuid_bytes(topic.topic_id)
        elif flexible:
            buf += compact_string(topic.name)
        else:
            buf += legacy_string(topic.name)
        partitions = topic.partitions
        buf += uvarint(len(partitions) + 1) if flexible else I32.pack(len(partitions))
        for p in partitions:
            if with_log_start:
                buf += _PR5.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms,
                                 p.log_start_offset)
            else:
                buf += _PR3.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms)
            if with_errors:
                errors = p.record_errors
                if flexible:
                    buf += uvarint(len(errors) + 1)
                    for batch_index, message in errors:
                        buf += I32.pack(batch_index)
                        buf += compact_nullable_string(message)
                        buf += NO_TAGS
                    buf += compact_nullable_string(p.error_message)
                else:
                    buf += I32.pack(len(errors))
                    for batch_index, message in errors:
                        buf += I32.pack(batch_index)
                        buf += legacy_nullable_string(message)
                    buf += legacy_nullable_string(p.error_message)
            if flexible:
                if with_leader and p.current_leader is not None:
                    buf += _LEADER_TAG.pack(1, 0, 9, p.current_leader[0], p.current_leader[1], 0)
                else:
                    buf += NO_TAGS
        if flexible:
            buf += NO_TAGS
    buf += I32.pack(throttle_time_ms)
    if flexible:
        if with_leader and node_endpoints:
            buf += _node_endpoints_tag(node_endpoints)
        else:
            buf += NO_TAGS
    return bytes(buf)
