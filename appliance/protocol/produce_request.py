"""Produce request (key 0), versions 3-12, parsed by hand into views of the frame.

Owns nothing; runs in frontends (``workers.frontend.connection``), on every Produce request.
kio's reader copies every partition's record batch out of the frame into a new ``bytes``; on the
produce path that is a copy of every byte a producer sends, before the one copy that matters
(into the writer's ring). This parser reads the same fields and hands the record batches on as
read-only ``memoryview`` slices of the frame: no copy. The caller must be done with them (or copy
them) before the frame's buffer is reused.

It accepts and refuses exactly what ``messages.decode_request`` (the shape check of Kafka's
generated readers, ``appliance.protocol.shape``, then kio's reader, then the lenient re-read)
accepts and refuses for these versions, with the same field values
(``tests/unit/test_produce_request.py`` checks both on every version, on valid requests and on
truncated, corrupted and random ones). Layout, Kafka's ProduceRequest.json:

    v3-v8:  transactional_id nullable string (int16 length) | acks int16 | timeout_ms int32 |
            topic_data: int32 count, each: name string (int16 length) | partition_data: int32
            count, each: index int32 | records nullable bytes (int32 length)
    v9-v12: the same fields, flexible (KIP-482): strings, bytes and arrays with uvarint
            length + 1 (0 = null), and a tagged-field section after each partition, each topic
            and the request; Produce defines no tagged fields, so every tag is skipped

What refuses a request (ProtocolViolation, the connection is closed as Kafka does): a field that
runs past the frame, an array count, string or bytes length larger than the bytes left (Kafka's
"Tried to allocate a collection of size N"), a null where the field is not nullable (the topic
name, topic_data, partition_data), a compact string longer than 0x7fff bytes, a tagged field that
runs past the frame, a varint over 5 bytes. As Kafka's readers do, any negative length of a
nullable field (transactional_id, records) is null, and a string that is not UTF-8 is read with
replacement characters. Bytes after the last field are ignored.
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
MAX_STRING = 0x7FFF

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ACKS_TIMEOUT = struct.Struct(">hi").unpack_from


class PartitionData(NamedTuple):
    index: int
    records: memoryview | bytes | None


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
    """Kafka's unsigned varint, at most 5 bytes (``primitives.read_uvarint``)."""
    value = 0
    shift = 0
    for _ in range(5):
        byte = b[p]            # IndexError past the end
        p += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, p
        shift += 7
    raise _Bad("unsigned varint longer than 5 bytes")


def _skip_tags(b: memoryview, p: int, end: int) -> int:
    count, p = _uvarint(b, p)
    for _ in range(count):
        _tag, p = _uvarint(b, p)
        size, p = _uvarint(b, p)
        if size > end - p:
            raise _Bad(f"tagged field of {size} bytes with only {end - p} left")
        p += size
    return p


def _string(b: memoryview, p: int, n: int) -> str:
    """``n`` bytes at ``p`` (within the frame) as Java's ``new String(bytes, UTF_8)`` reads them."""
    raw = b[p:p + n]
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError:
        text = str(raw, "utf-8", "replace")
        if len(text.encode()) > MAX_STRING:
            # what decode_request refuses: the string no longer fits a string field
            raise _Bad(f"string of {n} bytes is longer once decoded") from None
        return text


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
    except (_Bad, IndexError, struct.error) as e:
        raise ProtocolViolation(f"ProduceRequest v{version}: malformed body ({e})") from None


def _classic(b: memoryview, p: int) -> ProduceRequestView:
    end = len(b)
    n = _I16(b, p)[0]
    p += 2
    txn: str | None = None
    if n >= 0:                     # any negative length is null (Kafka's nullable string)
        if n > end - p:
            raise _Bad(f"transactional_id of {n} bytes with only {end - p} left")
        txn = _string(b, p, n)
        p += n
    acks, timeout_ms = _ACKS_TIMEOUT(b, p)
    p += 6
    count = _I32(b, p)[0]
    p += 4
    if count < 0:
        raise _Bad("non-nullable field topic_data was serialized as null")
    if count > end - p:
        raise _Bad(f"topic_data: array of {count} items with only {end - p} bytes left")
    topics = []
    for _ in range(count):
        n = _I16(b, p)[0]
        p += 2
        if n < 0:
            raise _Bad("non-nullable field name was serialized as null")
        if n > end - p:
            raise _Bad(f"name of {n} bytes with only {end - p} left")
        name = _string(b, p, n)
        p += n
        pcount = _I32(b, p)[0]
        p += 4
        if pcount < 0:
            raise _Bad("non-nullable field partition_data was serialized as null")
        if pcount > end - p:
            raise _Bad(f"partition_data: array of {pcount} items with only {end - p} bytes left")
        parts = []
        for _ in range(pcount):
            index, size = _I32(b, p)[0], _I32(b, p + 4)[0]
            p += 8
            if size >= 0:
                if size > end - p:
                    raise _Bad(f"records of {size} bytes with only {end - p} left")
                parts.append(PartitionData(index, b[p:p + size]))
                p += size
            else:                  # any negative length is null (nullable bytes)
                parts.append(PartitionData(index, None))
        topics.append(TopicData(name, parts))
    return ProduceRequestView(txn, acks, datetime.timedelta(milliseconds=timeout_ms), topics)


def _flexible(b: memoryview, p: int) -> ProduceRequestView:
    end = len(b)
    n, p = _uvarint(b, p)
    txn: str | None = None
    if n:
        n -= 1
        if n > MAX_STRING:
            raise _Bad(f"string field transactional_id had invalid length {n}")
        if n > end - p:
            raise _Bad(f"transactional_id of {n} bytes with only {end - p} left")
        txn = _string(b, p, n)
        p += n
    acks, timeout_ms = _ACKS_TIMEOUT(b, p)
    p += 6
    count, p = _uvarint(b, p)
    count -= 1
    if count < 0:
        raise _Bad("non-nullable field topic_data was serialized as null")
    if count > end - p:
        raise _Bad(f"topic_data: array of {count} items with only {end - p} bytes left")
    topics = []
    for _ in range(count):
        n, p = _uvarint(b, p)
        if not n:
            raise _Bad("non-nullable field name was serialized as null")
        n -= 1
        if n > MAX_STRING:
            raise _Bad(f"string field name had invalid length {n}")
        if n > end - p:
            raise _Bad(f"name of {n} bytes with only {end - p} left")
        name = _string(b, p, n)
        p += n
        pcount, p = _uvarint(b, p)
        pcount -= 1
        if pcount < 0:
            raise _Bad("non-nullable field partition_data was serialized as null")
        if pcount > end - p:
            raise _Bad(f"partition_data: array of {pcount} items with only {end - p} bytes left")
        parts = []
        for _ in range(pcount):
            index = _I32(b, p)[0]
            size, p = _uvarint(b, p + 4)
            if size:
                size -= 1
                if size > end - p:
                    raise _Bad(f"records of {size} bytes with only {end - p} left")
                parts.append(PartitionData(index, b[p:p + size]))
                p += size
            else:
                parts.append(PartitionData(index, None))
            p = _skip_tags(b, p, end)
        p = _skip_tags(b, p, end)
        topics.append(TopicData(name, parts))
    _skip_tags(b, p, end)
    return ProduceRequestView(txn, acks, datetime.timedelta(milliseconds=timeout_ms), topics)
