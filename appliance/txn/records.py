"""Transaction-state log records: TransactionLogKey v0 and TransactionLogValue v0/v1.

Owns nothing and does no I/O; imported by the coordinator worker (``state_manager`` writes and
replays these records). Layouts are Kafka's internal-records JSON specs (TransactionLogKey.json,
TransactionLogValue.json); a record written here has the bytes Kafka's generated serializer would
write for the same field values (``MessageUtil.toVersionPrefixedBytes``: an int16 version, then
the message). All integers big-endian.

TransactionLogKey v0 (the record key)::

    version            int16   0
    transactional_id   int16 length N, N bytes UTF-8          (non-nullable string)

TransactionLogValue v0 (the record value; a null value is a tombstone)::

    version                         int16   0
    producer_id                     int64
    producer_epoch                  int16
    transaction_timeout_ms          int32
    transaction_status              int8    TransactionState id (metadata.TransactionState)
    transaction_partitions          int32 count (-1 = null), then count x
        topic                       int16 length + UTF-8
        partition_ids               int32 count, then count x int32
    transaction_last_update_ms      int64
    transaction_start_ms            int64

TransactionLogValue v1 (first flexible version; the version prefix stays a plain int16)::

    version                         int16   1
    producer_id                     int64
    producer_epoch                  int16
    transaction_timeout_ms          int32
    transaction_status              int8
    transaction_partitions          uvarint count+1 (0 = null), then count x
        topic                       uvarint length+1, UTF-8          (compact string)
        partition_ids               uvarint count+1, then count x int32
        (tagged fields)             uvarint 0                        (none defined)
    transaction_last_update_ms      int64
    transaction_start_ms            int64
    (tagged fields)                 uvarint n, then n x [uvarint tag, uvarint size, size bytes],
                                    ascending tag; a field equal to its default is not written
        tag 0  PreviousProducerId        int64  default -1
        tag 1  NextProducerId            int64  default -1
        tag 2  ClientTransactionVersion  int16  default 0    (upstream's tag 2)
        tag 3  NextProducerEpoch         int16  default -1   (ours: KIP-939 gives it tag 2,
                                                               which Kafka uses for
                                                               ClientTransactionVersion)

uvarint = unsigned LEB128 (protobuf varint, no zig-zag). Tags this module does not know are
skipped on read (that is what tagged fields are for). The partitions field is null for Empty
(Kafka writes null there and ignores the field when it reads an Empty record).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from appliance.protocol.internal_records import (RecordDecodeError, UnknownKeyVersion,
                                                 get_compact_string as _get_compact_string,
                                                 get_string as _get_string, get_uvarint as _get_uvarint,
                                                 need as _need, put_compact_string as _put_compact_string,
                                                 put_string as _put_string, put_uvarint as _put_uvarint,
                                                 read_tagged as _read_tagged, skip_tagged as _skip_tagged,
                                                 version_of as _version)

__all__ = [
    "KEY_VERSION", "VALUE_VERSION", "RecordDecodeError", "UnknownKeyVersion",
    "TransactionLogValue", "encode_key", "decode_key", "encode_value", "decode_value",
]

KEY_VERSION = 0
VALUE_VERSION = 1            # what the state manager writes

TAG_PREVIOUS_PRODUCER_ID = 0
TAG_NEXT_PRODUCER_ID = 1
TAG_CLIENT_TRANSACTION_VERSION = 2
TAG_NEXT_PRODUCER_EPOCH = 3

_h = struct.Struct(">h")
_i = struct.Struct(">i")
_q = struct.Struct(">q")
# producer_id, producer_epoch, timeout, status: the fixed head of every value version
_HEAD = struct.Struct(">qhib")
_TAIL = struct.Struct(">qq")


@dataclass(slots=True)
class TransactionLogValue:
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_status: int
    # [(topic, [partition, ...]), ...]; None = null (Empty)
    transaction_partitions: list[tuple[str, list[int]]] | None
    transaction_last_update_ms: int
    transaction_start_ms: int
    previous_producer_id: int = -1
    next_producer_id: int = -1
    client_transaction_version: int = 0
    next_producer_epoch: int = -1
    unknown_tags: dict[int, bytes] = field(default_factory=dict)   # read-only information


# -- key ----------------------------------------------------------------------------------------

def encode_key(transactional_id: str) -> bytes:
    out = bytearray(_h.pack(KEY_VERSION))
    _put_string(out, transactional_id)
    return bytes(out)


def decode_key(data) -> str:
    """The transactional id of a key; UnknownKeyVersion for versions other than 0."""
    buf = memoryview(data)
    version = _version(buf)
    if version != KEY_VERSION:
        raise UnknownKeyVersion("transaction log", version)
    tid, _ = _get_string(buf, 2)
    return tid


# -- value --------------------------------------------------------------------------------------

def encode_value(v: TransactionLogValue, version: int = VALUE_VERSION) -> bytes:
    if version not in (0, 1):
        raise ValueError(f"unsupported transaction log value version {version}")
    out = bytearray(_h.pack(version))
    out += _HEAD.pack(v.producer_id, v.producer_epoch, v.transaction_timeout_ms,
                      v.transaction_status)
    parts = v.transaction_partitions
    if version == 0:
        if (v.previous_producer_id != -1 or v.next_producer_id != -1
                or v.client_transaction_version != 0 or v.next_producer_epoch != -1):
            # Kafka's serializer refuses non-default values of fields the version lacks.
            raise ValueError("tagged fields need TransactionLogValue v1")
        if parts is None:
            out += _i.pack(-1)
        else:
            out += _i.pack(len(parts))
            for topic, ids in parts:
                _put_string(out, topic)
                out += _i.pack(len(ids))
                for p in ids:
                    out += _i.pack(p)
    else:
        if parts is None:
            _put_uvarint(out, 0)
        else:
            _put_uvarint(out, len(parts) + 1)
            for topic, ids in parts:
                _put_compact_string(out, topic)
                _put_uvarint(out, len(ids) + 1)
                for p in ids:
                    out += _i.pack(p)
                _put_uvarint(out, 0)            # no tagged fields in PartitionsSchema
    out += _TAIL.pack(v.transaction_last_update_ms, v.transaction_start_ms)
    if version == 1:
        tagged: list[tuple[int, bytes]] = []
        if v.previous_producer_id != -1:
            tagged.append((TAG_PREVIOUS_PRODUCER_ID, _q.pack(v.previous_producer_id)))
        if v.next_producer_id != -1:
            tagged.append((TAG_NEXT_PRODUCER_ID, _q.pack(v.next_producer_id)))
        if v.client_transaction_version != 0:
            tagged.append((TAG_CLIENT_TRANSACTION_VERSION, _h.pack(v.client_transaction_version)))
        if v.next_producer_epoch != -1:
            tagged.append((TAG_NEXT_PRODUCER_EPOCH, _h.pack(v.next_producer_epoch)))
        _put_uvarint(out, len(tagged))
        for tag, payload in tagged:
            _put_uvarint(out, tag)
            _put_uvarint(out, len(payload))
            out += payload
    return bytes(out)


def decode_value(data) -> TransactionLogValue | None:
    """None for a tombstone (null value); RecordDecodeError for bytes that are not a v0/v1
    value (Kafka throws on an unknown value version)."""
    if data is None:
        return None
    buf = memoryview(data)
    version = _version(buf)
    if version not in (0, 1):
        raise RecordDecodeError(f"unknown transaction log value version {version}")
    pos = 2
    _need(buf, pos, _HEAD.size)
    pid, epoch, timeout, status = _HEAD.unpack_from(buf, pos)
    pos += _HEAD.size
    parts: list[tuple[str, list[int]]] | None
    if version == 0:
        _need(buf, pos, 4)
        (n,) = _i.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            parts = None
        else:
            parts = []
            for _ in range(n):
                topic, pos = _get_string(buf, pos)
                _need(buf, pos, 4)
                (m,) = _i.unpack_from(buf, pos)
                pos += 4
                _need(buf, pos, 4 * m)
                parts.append((topic, list(struct.unpack_from(f">{m}i", buf, pos))))
                pos += 4 * m
    else:
        n, pos = _get_uvarint(buf, pos)
        if n == 0:
            parts = None
        else:
            parts = []
            for _ in range(n - 1):
                topic, pos = _get_compact_string(buf, pos)
                m, pos = _get_uvarint(buf, pos)
                if m == 0:
                    raise RecordDecodeError("null PartitionIds array")
                m -= 1
                _need(buf, pos, 4 * m)
                parts.append((topic, list(struct.unpack_from(f">{m}i", buf, pos))))
                pos += 4 * m
                pos = _skip_tagged(buf, pos)
    _need(buf, pos, _TAIL.size)
    last_update, start = _TAIL.unpack_from(buf, pos)
    pos += _TAIL.size
    value = TransactionLogValue(pid, epoch, timeout, status, parts, last_update, start)
    if version == 1:
        tagged, pos = _read_tagged(buf, pos)
        for tag, payload in tagged.items():
            if tag == TAG_PREVIOUS_PRODUCER_ID and len(payload) == 8:
                value.previous_producer_id = _q.unpack(payload)[0]
            elif tag == TAG_NEXT_PRODUCER_ID and len(payload) == 8:
                value.next_producer_id = _q.unpack(payload)[0]
            elif tag == TAG_CLIENT_TRANSACTION_VERSION and len(payload) == 2:
                value.client_transaction_version = _h.unpack(payload)[0]
            elif tag == TAG_NEXT_PRODUCER_EPOCH and len(payload) == 2:
                value.next_producer_epoch = _h.unpack(payload)[0]
            elif tag in (0, 1, 2, 3):
                raise RecordDecodeError(f"tagged field {tag} has {len(payload)} bytes")
            else:
                value.unknown_tags[tag] = payload
    return value
