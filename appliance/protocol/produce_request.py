"""Produce request (key 0), versions 3-13, parsed by hand into views of the frame.

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
    v13:    as v12, but each topic is named by its topic id (16 bytes, KIP-516) instead of its
            name; ``TopicData.name`` is then empty and ``topic_id`` holds the id's bytes

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
MAX_VERSION = 13
FLEXIBLE_FROM = 9
TOPIC_IDS_FROM = 13
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
    topic_id: bytes | None = None       # v13+: the topic's id (the name is then "")


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
            return _parse(frame, pos, _compact_length, _skip_tags, _compact_length,
                          version >= TOPIC_IDS_FROM)
        return _parse(frame, pos, _int16_length, _no_tags, _int32_length, False)
    except ProtocolViolation:
        raise
    except (_Bad, IndexError, struct.error) as e:
        raise ProtocolViolation(f"ProduceRequest v{version}: malformed body ({e})") from None


# The two layouts differ only in how a length is written and in the tagged-field sections: a
# length reader returns (length, position after it), -1 for null (classic: any negative length;
# flexible: 0, the others being the length + 1).

def _int16_length(b: memoryview, p: int) -> tuple[int, int]:
    n = _I16(b, p)[0]
    return (n if n >= 0 else -1), p + 2


def _int32_length(b: memoryview, p: int) -> tuple[int, int]:
    n = _I32(b, p)[0]
    return (n if n >= 0 else -1), p + 4


def _compact_length(b: memoryview, p: int) -> tuple[int, int]:
    n, p = _uvarint(b, p)
    return n - 1, p


def _no_tags(b: memoryview, p: int, end: int) -> int:
    return p


def _text(b: memoryview, p: int, n: int, end: int, field: str) -> str:
    if n > MAX_STRING:             # only a compact length can say more (an int16 cannot)
        raise _Bad(f"string field {field} had invalid length {n}")
    if n > end - p:
        raise _Bad(f"{field} of {n} bytes with only {end - p} left")
    return _string(b, p, n)


def _count(n: int, left: int, field: str) -> int:
    if n < 0:
        raise _Bad(f"non-nullable field {field} was serialized as null")
    if n > left:
        raise _Bad(f"{field}: array of {n} items with only {left} bytes left")
    return n


def _parse(b: memoryview, p: int, string_length, tags, array_length,
           by_id: bool) -> ProduceRequestView:
    """The body in either layout: ``string_length`` and ``array_length`` (also the records'
    length) read the lengths, ``tags`` skips a tagged-field section; ``by_id``: topics are
    named by their 16-byte ids (v13)."""
    end = len(b)
    n, p = string_length(b, p)
    txn: str | None = None
    if n >= 0:                     # transactional_id is nullable
        txn = _text(b, p, n, end, "transactional_id")
        p += n
    acks, timeout_ms = _ACKS_TIMEOUT(b, p)
    p += 6
    count, p = array_length(b, p)
    topics = []
    for _ in range(_count(count, end - p, "topic_data")):
        topic_id = None
        if by_id:
            if end - p < 16:
                raise _Bad(f"topic_id with only {end - p} bytes left")
            name, topic_id = "", bytes(b[p:p + 16])
            p += 16
        else:
            n, p = string_length(b, p)
            if n < 0:
                raise _Bad("non-nullable field name was serialized as null")
            name = _text(b, p, n, end, "name")
            p += n
        pcount, p = array_length(b, p)
        parts = []
        for _ in range(_count(pcount, end - p, "partition_data")):
            index = _I32(b, p)[0]
            size, p = array_length(b, p + 4)
            if size >= 0:
                if size > end - p:
                    raise _Bad(f"records of {size} bytes with only {end - p} left")
                parts.append(PartitionData(index, b[p:p + size]))
                p += size
            else:                  # records is nullable
                parts.append(PartitionData(index, None))
            p = tags(b, p, end)
        p = tags(b, p, end)
        topics.append(TopicData(name, parts, topic_id))
    tags(b, p, end)
    return ProduceRequestView(txn, acks, datetime.timedelta(milliseconds=timeout_ms), topics)
