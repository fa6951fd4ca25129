"""The consumer protocol embedded in a classic group's JoinGroup / SyncGroup bytes (Kafka's
ConsumerProtocolSubscription and ConsumerProtocolAssignment, versions 0-3), read and written
where a classic member meets a KIP-848 consumer group.

Owns nothing and does no I/O; used in the coordinator worker by ``appliance.group.migration``
(classic members inside a consumer group, and the conversions between the two group types).
Layouts (not flexible; clients/src/main/resources/common/message/ConsumerProtocol*.json):

    Subscription  int16 version, topics [string], user data (nullable bytes),
                  v1+ owned partitions [topic string, partitions [int32]],
                  v2+ generation id int32, v3+ rack id (nullable string)
    Assignment    int16 version, assigned partitions [topic string, partitions [int32]],
                  user data (nullable bytes)

A version above 3 is read as 3 (Kafka's ConsumerProtocol reads what it knows of a newer
version, whose fields are appended ones).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["Subscription", "parse_subscription", "parse_assignment", "encode_assignment",
           "version_of", "MalformedProtocol"]

_h = struct.Struct(">h")
_i = struct.Struct(">i")
HIGHEST_VERSION = 3


class MalformedProtocol(ValueError):
    """The bytes are not a consumer protocol subscription / assignment (Kafka's SchemaException)."""


class Subscription(NamedTuple):
    version: int
    topics: tuple[str, ...]
    owned: dict[str, frozenset[int]]          # v1+ owned partitions by topic name
    rack_id: str | None


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, data: bytes) -> None:
        self.buf = memoryview(bytes(data))
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise MalformedProtocol("truncated consumer protocol bytes")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return _h.unpack(self._take(2))[0]

    def i32(self) -> int:
        return _i.unpack(self._take(4))[0]

    def string(self, nullable: bool = False) -> str | None:
        n = self.i16()
        if n < 0:
            if nullable:
                return None
            raise MalformedProtocol("null string")
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedProtocol("string is not UTF-8") from None

    def nbytes(self) -> None:
        n = self.i32()
        if n >= 0:
            self._take(n)

    def count(self) -> int:
        n = self.i32()
        if n < 0 or n > len(self.buf):
            raise MalformedProtocol("bad array length")
        return n

    def partitions(self) -> dict[str, frozenset[int]]:
        out: dict[str, frozenset[int]] = {}
        for _ in range(self.count()):
            topic = self.string() or ""
            ps = frozenset(self.i32() for _ in range(self.count()))
            out[topic] = out.get(topic, frozenset()) | ps
        return out


def version_of(data: bytes) -> int:
    """The version the bytes start with (Kafka's ConsumerProtocol.deserializeVersion), capped at
    the highest one known."""
    if len(data) < 2:
        raise MalformedProtocol("no version")
    v = _h.unpack_from(data, 0)[0]
    if v < 0:
        raise MalformedProtocol(f"negative version {v}")
    return min(v, HIGHEST_VERSION)


def parse_subscription(data: bytes) -> Subscription:
    r = _Reader(data)
    v = r.i16()
    if v < 0:
        raise MalformedProtocol(f"negative version {v}")
    topics = tuple(r.string() or "" for _ in range(r.count()))
    r.nbytes()                                       # user data: the client assignor's
    owned: dict[str, frozenset[int]] = {}
    rack = None
    if v >= 1:
        owned = r.partitions()
    if v >= 2:
        r.i32()                                      # generation id
    if v >= 3:
        rack = r.string(nullable=True)
    return Subscription(v, topics, owned, rack)


def parse_assignment(data: bytes) -> dict[str, frozenset[int]]:
    """The assigned partitions by topic name; empty bytes are an empty assignment (a member that
    never got one)."""
    if not data:
        return {}
    r = _Reader(data)
    v = r.i16()
    if v < 0:
        raise MalformedProtocol(f"negative version {v}")
    return r.partitions()


def encode_assignment(version: int, assigned: dict[str, frozenset[int]] | dict[str, list[int]]
                      ) -> bytes:
    """A ConsumerProtocolAssignment of ``version`` with no user data."""
    out = bytearray(_h.pack(max(0, min(version, HIGHEST_VERSION))))
    items = sorted((t, sorted(ps)) for t, ps in assigned.items() if ps)
    out += _i.pack(len(items))
    for topic, ps in items:
        b = topic.encode("utf-8")
        out += _h.pack(len(b)) + b
        out += _i.pack(len(ps))
        for p in ps:
            out += _i.pack(p)
    out += _i.pack(-1)                               # user data: null
    return bytes(out)
