"""Connection tables: how many client connections one frontend holds per IP address.

Owns: nothing by itself. The supervisor creates one table per frontend (``conns.fe<i>`` in the
runtime dir) when a per-IP connection limit is configured; that frontend is its only writer and
every frontend reads all of them: the connections of one address over the whole broker are the
sum over the frontends' tables (Kafka's ConnectionQuotas counts them in one map under a lock; our
frontends are separate processes that accept on one socket).

Layout (little-endian)::

    0     magic u32 "CONN" | version u16 | zero u16 | capacity u32 | zero u32
    16    seq u64: even = stable, odd = a rebuild is in progress (readers retry)
    24    used u32: slots whose key is set (live or not)
    64    slots[capacity]: address 16 bytes (IPv4 as ::ffff:a.b.c.d) | count u32 | zero u32

Open addressing with linear probing from ``crc32(address) % capacity``; an all-zero key ends a
probe (no peer has the address ::). A count going back to 0 keeps its key, so that probes for
other addresses still pass it; when the used slots reach three quarters of the capacity the
owner rebuilds the table from the counts it keeps in memory (seq odd meanwhile). A count is one
aligned 4-byte store: a reader sees the old or the new value. Readers therefore get counts that
are exact up to the connections accepted at the same moment by other frontends: the limits are
enforced across frontends to within one connection per frontend, where Kafka's are exact.
"""

from __future__ import annotations

import ipaddress
import struct
import time
import zlib

from .region import Region

__all__ = ["ConnectionTable", "address_key"]

MAGIC = 0x4E4E4F43          # b"CONN" little-endian
VERSION = 1
HEADER = 64
SLOT = 24
_HEAD = struct.Struct("<IHHII")
_SEQ = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_EMPTY = bytes(16)
DEFAULT_CAPACITY = 8192


def address_key(host: str) -> bytes:
    """16 bytes naming an IP address (IPv4 mapped into IPv6), the tables' key."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if ip.version == 4:
        return b"\x00" * 10 + b"\xff\xff" + ip.packed
    return ip.packed


class ConnectionTable:
    """One frontend's table. ``owner`` (read-write) keeps the counts; others only ``count``."""

    def __init__(self, region: Region, owner: bool) -> None:
        self.region = region
        self.buf = region.buf
        magic, version, _, capacity, _ = _HEAD.unpack_from(self.buf, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{region.path}: not a connection table")
        self.capacity = capacity
        self.owner = owner
        self.counts: dict[bytes, int] = {}        # the owner's own truth, for rebuilds
        self.full = False                         # more live addresses than the table holds

    @classmethod
    def create(cls, path: str, capacity: int = DEFAULT_CAPACITY) -> "ConnectionTable":
        def init(buf) -> None:
            _HEAD.pack_into(buf, 0, MAGIC, VERSION, 0, capacity, 0)
        return cls(Region.create(path, HEADER + capacity * SLOT, init=init), owner=True)

    @classmethod
    def open(cls, path: str, owner: bool = False) -> "ConnectionTable":
        table = cls(Region.open(path, readonly=not owner), owner)
        if owner:
            table._rebuild()          # a restarted frontend starts with no connections
        return table

    def close(self) -> None:
        self.region.close()

    # -- readers ---------------------------------------------------------------------------
    def count(self, key: bytes) -> int:
        """Connections this table's frontend holds from address ``key``."""
        for attempt in range(1000):
            seq = _SEQ.unpack_from(self.buf, 16)[0]
            if seq & 1:
                time.sleep(0.0001 if attempt > 10 else 0)
                continue
            slot = self._find(key)
            n = 0 if slot is None else _U32.unpack_from(self.buf, HEADER + slot * SLOT + 16)[0]
            if _SEQ.unpack_from(self.buf, 16)[0] == seq:
                return n
        return 0      # a writer that died mid-rebuild: its frontend holds no connection now

    def _find(self, key: bytes, for_insert: bool = False) -> int | None:
        cap = self.capacity
        i = zlib.crc32(key) % cap
        buf = self.buf
        for _ in range(cap):
            at = HEADER + i * SLOT
            k = buf[at:at + 16]
            if k == key:
                return i
            if k == _EMPTY:
                return i if for_insert else None
            i = (i + 1) % cap
        return None

    # -- the owner -------------------------------------------------------------------------
    def add(self, key: bytes, delta: int) -> int:
        """Change this frontend's count for ``key`` by ``delta``; returns the new count."""
        n = self.counts.get(key, 0) + delta
        if n > 0:
            self.counts[key] = n
        else:
            self.counts.pop(key, None)
            n = 0
        slot = self._find(key, for_insert=True)
        at = None if slot is None else HEADER + slot * SLOT
        if at is None or self.buf[at:at + 16] == _EMPTY:
            if n == 0:
                return 0
            limit = self.capacity * 3 // 4
            used = _U32.unpack_from(self.buf, 24)[0]
            if at is None or used + 1 > limit:
                # Rebuild only when that frees enough room; else this address goes uncounted.
                if len(self.counts) <= limit - self.capacity // 8:
                    self._rebuild()
                else:
                    self.full = True
                return n
            self.buf[at:at + 16] = key
            _U32.pack_into(self.buf, 24, used + 1)
        _U32.pack_into(self.buf, at + 16, n)
        return n

    def _rebuild(self) -> None:
        """Write the table afresh from ``counts`` (the keys of finished connections go)."""
        buf = self.buf
        seq = _SEQ.unpack_from(buf, 16)[0] | 1          # odd: readers wait (repairs an odd one)
        _SEQ.pack_into(buf, 16, seq)
        buf[HEADER:HEADER + self.capacity * SLOT] = bytes(self.capacity * SLOT)
        used = 0
        limit = self.capacity * 3 // 4
        self.full = False
        for key, n in self.counts.items():
            if used + 1 > limit:
                self.full = True          # those addresses go uncounted (limit not enforced)
                break
            at = HEADER + self._find(key, for_insert=True) * SLOT
            buf[at:at + 16] = key
            _U32.pack_into(buf, at + 16, n)
            used += 1
        _U32.pack_into(buf, 24, used)
        _SEQ.pack_into(buf, 16, seq + 1)
