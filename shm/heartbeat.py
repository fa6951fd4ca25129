"""Heartbeat table: one monotonic timestamp per worker slot.

Owns: the ``heartbeats`` file in the runtime directory (created by the supervisor). Each worker
stores into its own slot every loop turn (or from a timer in asyncio workers); the supervisor reads
all slots and SIGKILLs a worker whose slot is older than ``supervisor.heartbeat_timeout_ms`` (see
docs/architecture.md, "Heartbeats").

Layout (little-endian)::

    0          +---------------------------------------------------------+
               | magic u32 "SHMB" | version u16 | zero u16 | slots u32   |  line 0
    64         +---------------------------------------------------------+
               | slot 0: u64 monotonic ns of the last beat (0 = never)   |  one 64-byte
    64 + 64*i  | slot i                                                  |  line per slot
               +---------------------------------------------------------+

A slot has one writer, and a beat is one aligned 8-byte store, so readers never see half a
timestamp. Each slot has its own cache line because beats are frequent and come from different
processes (no false sharing). Timestamps are ``time.monotonic_ns()``: CLOCK_MONOTONIC is one clock
for the whole machine, so values from different processes compare.
"""

from __future__ import annotations

import struct
import time

from .region import Region

__all__ = ["HeartbeatTable"]

MAGIC = 0x424D4853          # b"SHMB" little-endian
VERSION = 1
_HDR = struct.Struct("<IHHI")
_STRIDE = 64 // 8           # u64 items per slot


class HeartbeatTable:
    __slots__ = ("slots", "_region", "_q")

    def __init__(self, region: Region) -> None:
        magic, version, _, slots = _HDR.unpack_from(region.buf, 0)
        where = region.path or "anonymous region"
        if magic != MAGIC:
            raise ValueError(f"{where}: not a heartbeat table (bad magic {magic:#x})")
        if version != VERSION:
            raise ValueError(f"{where}: heartbeat table version {version}, expected {VERSION}")
        if region.size < self.size_for(slots):
            raise ValueError(f"{where}: truncated heartbeat table")
        self.slots = slots
        self._region = region
        self._q = memoryview(region.buf)[:self.size_for(slots)].cast("Q")

    @staticmethod
    def size_for(slots: int) -> int:
        return 64 + 64 * slots

    @classmethod
    def create(cls, path: str, slots: int) -> "HeartbeatTable":
        """Create (or replace) the table file; every slot 0 (never beaten)."""
        _check_slots(slots)
        region = Region.create(path, cls.size_for(slots),
                               init=lambda buf: _HDR.pack_into(buf, 0, MAGIC, VERSION, 0, slots))
        return cls._wrap(region)

    @classmethod
    def open(cls, path: str, *, readonly: bool = False) -> "HeartbeatTable":
        return cls._wrap(Region.open(path, readonly=readonly))

    @classmethod
    def anonymous(cls, slots: int) -> "HeartbeatTable":
        """A table in shared anonymous memory, for children forked after this call."""
        _check_slots(slots)
        region = Region.anonymous(cls.size_for(slots))
        _HDR.pack_into(region.buf, 0, MAGIC, VERSION, 0, slots)
        return cls._wrap(region)

    @classmethod
    def _wrap(cls, region: Region) -> "HeartbeatTable":
        try:
            return cls(region)
        except BaseException:
            region.close()
            raise

    def _index(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise IndexError(f"heartbeat slot {slot} out of range 0..{self.slots - 1}")
        return _STRIDE * (slot + 1)

    def beat(self, slot: int, now_ns: int | None = None) -> None:
        """Record a beat (one aligned 8-byte store); ``now_ns`` defaults to time.monotonic_ns()."""
        self._q[self._index(slot)] = time.monotonic_ns() if now_ns is None else now_ns

    def last(self, slot: int) -> int:
        """Monotonic ns of the slot's last beat; 0 = never (or cleared)."""
        return self._q[self._index(slot)]

    def clear(self, slot: int) -> None:
        """Forget the slot's beats (the supervisor does this before it starts a worker in it)."""
        self._q[self._index(slot)] = 0

    @property
    def path(self) -> str | None:
        return self._region.path

    def close(self) -> None:
        self._q.release()
        self._region.close()

    def __enter__(self) -> "HeartbeatTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_slots(slots: int) -> None:
    if not 0 < slots <= 0xFFFFFFFF:
        raise ValueError(f"heartbeat slots must be positive, got {slots}")
