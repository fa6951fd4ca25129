"""Produce request (key 0), versions 3-12, parsed by hand into views of the frame.

Owns nothing; runs in frontends (``workers.frontend.connection``), on every Produce request.
kio's reader copies every partition's record batch out of the frame into a new ``bytes``; on the
produce path that is a copy of every byte a producer sends, before the one copy that matters
(into the writer's ring). This parser reads the same fields and hands the record batches on as
read-only ``memoryview`` slices of the frame: no copy. The caller must be done with them (or copy
them) before the frame's buffer is reused.

It accepts and refuses exactly what ``messages.decode_request`` (the generated shape check, then
kio's reader) accepts and refuses for these versions, with the same field values
(``tests/unit/test_produce_request.py`` checks both on every version, on valid requests and on
truncated, corrupted and random ones). Layout, Kafka's ProduceRequest.json:

    v3-v8:  transactional_id nullable string (int16 length, -1 = null) | acks int16 |
            timeout_ms int32 | topic_data: int32 count, each: name string (int16 length) |
            partition_data: int32 count, each: index int32 | records nullable bytes (int32 length)
    v9-v12: the same fields, flexible (KIP-482): strings, bytes and arrays with uvarint
            length + 1 (0 = null), and a tagged-field section after each partition, each topic
            and the request; Produce defines no tagged fields, so every tag is skipped

What refuses a request (ProtocolViolation, the connection is closed as Kafka does): a field that
runs past the frame, an array count larger than the bytes left (Kafka's "Tried to allocate a
collection of size N"), a null topic name, a negative length below -1 (null), a null array
(count -1 or a compact 0), a string that is not UTF-8, an over-long or truncated varint. Bytes
after the last field are ignored, as kio ignores them. One difference on purpose: kio reads a null
array as None (which the Produce handler cannot iterate); Kafka's generated reader refuses it
(a non-nullable field), and so does this parser.
"""

from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

from appliance.errors import ProtocolViolation

__all__ = ["MIN_VERSION", "MAX_VERSION", "ProduceRequestView", "TopicData", "PartitionData",
           "parse_produce_request"]

MIN_VERSION = 3
MAX_VERSION = 12
FLEXIBLE_FROM = 9

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ACKS_TIMEOUT = struct.Struct(">hi").unpack_from


class PartitionData(NamedTuple):
    index: int
    records: memoryview | None


class TopicData(NamedTuple):
    name: str
    partition_data: list[PartitionData]


class ProduceRequestView(NamedTuple):
    """The fields the Produce handler reads, as kio's ProduceRequest names them."""
    transactional_id: str | None
    acks: int
    timeout: datetime.timedelta
    topic_data: list[TopicData]


class _Bad(Exception):
    pass


def _uvarint(b: memoryview, p: int) -> tuple[int, int]:
    """Kafka's unsigned varint (at most 5 bytes for an int32 field)."""
    value = 0
    shift = 0
    while True:
        byte = b[p]            # IndexError past the end
        p += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, p
        shift += 7
        if shift > 28:
            raise _Bad("varint is too long")


def _skip_tags(b: memoryview, p: int) -> int:
    count, p = _uvarint(b, p)
    for _ in range(count):
        _tag, p = _uvarint(b, p)
        size, p = _uvarint(b, p)
        p += size
    return p


def _string(b: memoryview, p: int, n: int, what: str) -> str:
    end = p + n
    if end > len(b):
        raise _Bad(f"{what} of {n} bytes runs past the frame")
    return str(b[p:end], "utf-8")          # UnicodeDecodeError: not UTF-8


def parse_produce_request(frame: memoryview, pos: int, version: int) -> ProduceRequestView:
    """Parse the Produce body at ``pos`` of ``frame`` (a read-only memoryview of format 'B').

    Raises ProtocolViolation where ``messages.decode_request`` does."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ProtocolViolation(f"Produce v{version} is not parsed here")
    try:
        if version >= FLEXIBLE_FROM:
            return _flexible(frame, pos)
        return _classic(frame, pos)
    except ProtocolViolation:
        raise
    except (_Bad, IndexError, struct.error, ValueError) as e:   # UnicodeDecodeError is a ValueError
        raise ProtocolViolation(f"ProduceRequest v{version}: malformed body ({e})") from None


def _classic(b: memoryview, p: int) -> ProduceRequestView:
    end = len(b)
    n = _I16(b, p)[0]
    p += 2
    if n >= 0:
        txn: str | None = _string(b, p, n, "transactional_id")
        p += n
    elif n == -1:
        txn = None
    else:
        raise _Bad(f"negative string length {n}")
    acks, timeout_ms = _ACKS_TIMEOUT(b, p)
    p += 6
    count = _I32(b, p)[0]
    p += 4
    if count > end - p:
        raise _Bad(f"array of {count} elements with only {end - p} bytes left")
    if count < 0:
        raise _Bad("null topic_data")
    topics = []
    for _ in range(count):
        n = _I16(b, p)[0]
        p += 2
        if n < 0:
            raise _Bad("null topic name")
        name = _string(b, p, n, "topic name")
        p += n
        pcount = _I32(b, p)[0]
        p += 4
        if pcount > end - p:
            raise _Bad(f"array of {pcount} elements with only {end - p} bytes left")
        if pcount < 0:
            raise _Bad("null partition_data")
        parts = []
        for _ in range(pcount):
            index, size = _I32(b, p)[0], _I32(b, p + 4)[0]
            p += 8
            if size >= 0:
                if p + size > end:
                    raise _Bad(f"records of {size} bytes run past the frame")
                parts.append(PartitionData(index, b[p:p + size]))
                p += size
            elif size == -1:
                parts.append(PartitionData(index, None))
            else:
                raise _Bad(f"negative bytes length {size}")
        topics.append(TopicData(name, parts))
    return ProduceRequestView(txn, acks, datetime.timedelta(milliseconds=timeout_ms), topics)


def _flexible(b: memoryview, p: int) -> ProduceRequestView:
    end = len(b)
    n, p = _uvarint(b, p)
    if n:
        txn: str | None = _string(b, p, n - 1, "transactional_id")
        p += n - 1
    else:
        txn = None
    acks, timeout_ms = _ACKS_TIMEOUT(b, p)
    p += 6
    count, p = _uvarint(b, p)
    count -= 1
    if count > end - p:
        raise _Bad(f"array of {count} elements with only {end - p} bytes left")
    if count < 0:
        raise _Bad("null topic_data")
    topics = []
    for _ in range(count):
        n, p = _uvarint(b, p)
        if not n:
            raise _Bad("null topic name")
        name = _string(b, p, n - 1, "topic name")
        p += n - 1
        pcount, p = _uvarint(b, p)
        pcount -= 1
        if pcount > end - p:
            raise _Bad(f"array of {pcount} elements with only {end - p} bytes left")
        if pcount < 0:
            raise _Bad("null partition_data")
        parts = []
        for _ in range(pcount):
            index = _I32(b, p)[0]
            size, p = _uvarint(b, p + 4)
            if size:
                size -= 1
                if p + size > end:
                    raise _Bad(f"records of {size} bytes run past the frame")
                parts.append(PartitionData(index, b[p:p + size]))
                p += size
            else:
                parts.append(PartitionData(index, None))
            p = _skip_tags(b, p)
        p = _skip_tags(b, p)
        topics.append(TopicData(name, parts))
    p = _skip_tags(b, p)
    if p > end:
        raise _Bad("tagged fields run past the frame")
    return ProduceRequestView(txn, acks, datetime.timedelta(milliseconds=timeout_ms), topics)
