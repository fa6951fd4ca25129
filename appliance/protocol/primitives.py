"""Wire primitives of the Kafka protocol shared by the hand-written codecs.

Owns nothing; imported by the frontend (frames, hand-written response encoders) and by anything
that builds protocol bytes by hand. Pure functions, no I/O.

Encodings (all integers big-endian, two's complement):

    int8/16/32/64           fixed width
    unsigned varint         7 bits per byte, least significant group first, high bit = "more"
                            (Kafka reads at most 5 bytes for a varint: ByteUtils.readUnsignedVarint)
    legacy string           int16 length (-1 = null) + UTF-8 bytes
    legacy bytes            int32 length (-1 = null) + bytes
    compact string/bytes    uvarint (length + 1; 0 = null) + bytes          (flexible versions)
    legacy array            int32 count (-1 = null) + items
    compact array           uvarint (count + 1; 0 = null) + items           (flexible versions)
    tagged fields           uvarint count, then per field: uvarint tag, uvarint size, data
                            (KIP-482; only in flexible versions, at the end of every struct)
"""

from __future__ import annotations

import struct
from typing import Final

__all__ = [
    "I8", "I16", "I32", "I64", "U32", "UUID_ZERO", "NO_TAGS",
    "uvarint", "read_uvarint", "buffer_len",
    "legacy_string", "legacy_nullable_string", "compact_string", "compact_nullable_string",
    "compact_length", "legacy_length",
]

I8: Final = struct.Struct(">b")
I16: Final = struct.Struct(">h")
I32: Final = struct.Struct(">i")
I64: Final = struct.Struct(">q")
U32: Final = struct.Struct(">I")

UUID_ZERO: Final = bytes(16)
NO_TAGS: Final = b"\x00"  # an empty tagged-field section

# Most varints we write are tiny (array counts, string lengths, tag numbers): precompute them.
_SMALL_UVARINTS: Final = tuple(bytes((i,)) for i in range(128))


def uvarint(value: int) -> bytes:
    """Encode a non-negative int as an unsigned varint."""
    if value < 128:
        if value < 0:
            raise ValueError(f"unsigned varint cannot hold {value}")
        return _SMALL_UVARINTS[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read an unsigned varint at ``pos``; returns (value, position after it).

    Raises IndexError when the buffer ends inside the varint and ValueError when the varint is
    longer than 5 bytes (Kafka rejects those the same way).
    """
    value = 0
    shift = 0
    for _ in range(5):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("unsigned varint longer than 5 bytes")


def buffer_len(buf: bytes | bytearray | memoryview) -> int:
    """Byte length of a buffer (``len`` of a memoryview counts items, not bytes)."""
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def legacy_length(n: int) -> bytes:
    return I32.pack(n)


def compact_length(n: int | None) -> bytes:
    """Compact array/bytes length prefix: n + 1, or 0 for null."""
    return _SMALL_UVARINTS[0] if n is None else uvarint(n + 1)


def legacy_string(s: str) -> bytes:
    b = s.encode()
    return I16.pack(len(b)) + b


def legacy_nullable_string(s: str | None) -> bytes:
    if s is None:
        return b"\xff\xff"
    b = s.encode()
    return I16.pack(len(b)) + b


def compact_string(s: str) -> bytes:
    b = s.encode()
    return uvarint(len(b) + 1) + b


def compact_nullable_string(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    b = s.encode()
    return uvarint(len(b) + 1) + b
