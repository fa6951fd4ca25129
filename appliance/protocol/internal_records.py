"""Field primitives of Kafka's internal records: the version-prefixed keys and values of the
transaction-state log and the group log (Kafka's ``__transaction_state`` and
``__consumer_offsets``), as ``MessageUtil.toVersionPrefixedBytes`` writes them.

Owns nothing and does no I/O (sans-IO). Used by ``appliance.txn.records`` and
``appliance.group.store`` in the coordinator worker, and by tools that read those logs.

Layouts (integers big-endian)::

    string           int16 length N (-1 = null), N bytes UTF-8        (non-flexible versions)
    bytes            int32 length N (-1 = null), N bytes
    compact string   uvarint N+1 (0 = null), N bytes UTF-8            (flexible versions)
    compact bytes    uvarint N+1 (0 = null), N bytes
    tagged fields    uvarint count, then count x (uvarint tag, uvarint size, size bytes)
    version prefix   int16, the first two bytes of every key and value

Decoders take a memoryview and a position and return (value, position after it); any field that
runs past the end, or a null where none is allowed, raises ``RecordDecodeError``.

The varint encoder and the int16/int32 structs are ``appliance.protocol.primitives``'. Its
decoder ``read_uvarint`` is not used here: it raises IndexError at the end of the buffer, and a
log replay must tell a bad record (``RecordDecodeError``) from a bug.
"""

from __future__ import annotations

from appliance.protocol.primitives import I16 as _h
from appliance.protocol.primitives import I32 as _i
from appliance.protocol.primitives import uvarint

__all__ = ["RecordDecodeError", "UnknownKeyVersion", "need", "put_uvarint", "get_uvarint", "put_string", "get_string",
           "put_compact_string", "get_compact_string", "get_bytes", "put_compact_bytes",
           "get_compact_bytes", "skip_tagged", "read_tagged", "version_of"]

MAX_STRING = 0x7FFF


class RecordDecodeError(ValueError):
    """The bytes are not a valid record of a version the caller reads."""


class UnknownKeyVersion(RecordDecodeError):
    """A key whose version the log does not know. Kafka's loaders of both logs log and skip such
    a record ("a left-over from an aborted upgrade")."""

    def __init__(self, log_name: str, version: int) -> None:
        super().__init__(f"unknown {log_name} key version {version}")
        self.version = version


def need(buf: memoryview, pos: int, n: int) -> None:
    if n < 0 or pos + n > len(buf):
        raise RecordDecodeError("field runs past the end of the record")


def put_uvarint(out: bytearray, n: int) -> None:
    out += uvarint(n)               # ValueError for a negative n


def get_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RecordDecodeError("varint runs past the end of the record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise RecordDecodeError("unsigned varint longer than 5 bytes")


def _utf8(s: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > MAX_STRING:
        raise ValueError(f"string of {len(b)} bytes is longer than {MAX_STRING} bytes")
    return b


def put_string(out: bytearray, s: str | None, *, nullable: bool = False) -> None:
    if s is None:
        if not nullable:
            raise ValueError("null in a non-nullable string field")
        out += _h.pack(-1)
        return
    b = _utf8(s)
    out += _h.pack(len(b))
    out += b


def get_string(buf: memoryview, pos: int, *, nullable: bool = False) -> tuple[str | None, int]:
    need(buf, pos, 2)
    (n,) = _h.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        if not nullable:
            raise RecordDecodeError("null string in a non-nullable field")
        return None, pos
    need(buf, pos, n)
    return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n


def put_compact_string(out: bytearray, s: str | None, *, nullable: bool = False) -> None:
    if s is None:
        if not nullable:
            raise ValueError("null in a non-nullable string field")
        out.append(0)
        return
    b = _utf8(s)
    put_uvarint(out, len(b) + 1)
    out += b


def get_compact_string(buf: memoryview, pos: int, *, nullable: bool = False) -> tuple[str | None, int]:
    n, pos = get_uvarint(buf, pos)
    if n == 0:
        if not nullable:
            raise RecordDecodeError("null string in a non-nullable field")
        return None, pos
    n -= 1
    need(buf, pos, n)
    return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n


def get_bytes(buf: memoryview, pos: int) -> tuple[bytes, int]:
    need(buf, pos, 4)
    (n,) = _i.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        raise RecordDecodeError("null bytes in a non-nullable field")
    need(buf, pos, n)
    return bytes(buf[pos:pos + n]), pos + n


def put_compact_bytes(out: bytearray, b: bytes) -> None:
    put_uvarint(out, len(b) + 1)
    out += b


def get_compact_bytes(buf: memoryview, pos: int) -> tuple[bytes, int]:
    n, pos = get_uvarint(buf, pos)
    if n == 0:
        raise RecordDecodeError("null bytes in a non-nullable field")
    n -= 1
    need(buf, pos, n)
    return bytes(buf[pos:pos + n]), pos + n


def read_tagged(buf: memoryview, pos: int) -> tuple[dict[int, bytes], int]:
    """The tagged fields at ``pos`` as {tag: raw bytes}."""
    count, pos = get_uvarint(buf, pos)
    fields: dict[int, bytes] = {}
    for _ in range(count):
        tag, pos = get_uvarint(buf, pos)
        size, pos = get_uvarint(buf, pos)
        need(buf, pos, size)
        fields[tag] = bytes(buf[pos:pos + size])
        pos += size
    return fields, pos


def skip_tagged(buf: memoryview, pos: int) -> int:
    """The position after the tagged fields at ``pos`` (their contents unread)."""
    count, pos = get_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = get_uvarint(buf, pos)
        size, pos = get_uvarint(buf, pos)
        need(buf, pos, size)
        pos += size
    return pos


def version_of(buf: memoryview) -> int:
    """The int16 version prefix of a key or value."""
    need(buf, 0, 2)
    return _h.unpack_from(buf, 0)[0]
