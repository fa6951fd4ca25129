"""Single-producer single-consumer byte ring in shared memory.

Owns: one direction of one channel (see docs/architecture.md, "Runtime directory and channels").
The producer process (e.g. a frontend for the produce ring ``fe<i> -> w...``) only ever calls
``try_put``/``free_bytes``; the consumer process only ``peek``/``advance``/``get``/``empty``, the
``consumer_waiting`` flag and ``ready_slot`` (both of which the producer reads). All state lives
in the shared file: a restarted producer continues from the published tail, a restarted consumer
from the published head (a record it had peeked but not advanced is delivered again).

Layout (offsets relative to the start of the ring inside its region; little-endian)::

    0     +--------------------------------------------------------------+
          | magic u32 "SHMR" | version u16 | flags u16 | capacity u64    |  line 0: written once
          | (bit 0 of flags = records carry CRC-32C)   | zero ...        |
    64    +--------------------------------------------------------------+
          | head u64   (consumer-owned: bytes consumed, never wraps)      |  line 1
    128   +--------------------------------------------------------------+
          | tail u64   (producer-owned: bytes published, never wraps)     |  line 2
    192   +--------------------------------------------------------------+
          | consumer_waiting u64 (consumer-owned: 1 = "ring my bell")     |  line 3
    256   +--------------------------------------------------------------+
          | ready_slot u64 (consumer-owned: this ring's byte in the       |  line 4
          |   consumer's ready map, 0 = none; see shm.ready)              |
    320   +--------------------------------------------------------------+
          | zero up to the page boundary                                  |
    4096  +==============================================================+
          | data area: capacity bytes (power of two >= 4096)              |
          |   position of counter c = c & (capacity - 1)                  |
          +==============================================================+

Each counter sits on its own 64-byte cache line so that the producer's stores to ``tail`` do not
bounce the line the consumer writes ``head`` on. Counters are 64-bit and never wrap in practice
(2**64 bytes), so ``tail - head`` is the used space and ``head == tail`` means empty.

Records (every record starts 8-byte aligned; the data area is a multiple of 8)::

    +------------------+-----------------+------------------------+---------------+
    | length u32       | checksum u32    | payload (length bytes) | pad to 8      |
    +------------------+-----------------+------------------------+---------------+

``length == 0xFFFFFFFF`` is a PADDING record: when a record does not fit between its position and
the end of the data area, the producer covers the rest of the area with one padding record and
puts the record at position 0 (both published by one tail store). Records are therefore always
contiguous, and ``peek`` can hand out a zero-copy view. The consumer skips padding silently.
``max_payload = capacity // 2 - 8`` makes the largest record (header + payload) at most half the
ring, so with the ring empty it fits at any position, with or without the padding in front of it
(wasted tail room r < record size <= position), i.e. a record of that size always fits eventually.

Memory ordering, and which protection applies where:

* Counters are stored with one aligned 8-byte store (item assignment on ``memoryview.cast('Q')``,
  a single machine store in CPython) and read with one aligned 8-byte load, so neither side ever
  sees half a counter.
* The producer copies the payload and writes the record header first, and stores ``tail`` last;
  the consumer loads ``tail`` first and reads the record after. On x86-64 (TSO: stores become
  visible in program order, loads are not reordered with older loads) that is sufficient: a
  consumer that sees the new tail sees the whole record. Checksums are off there (field = 0).
* On any other machine (ARM, POWER, RISC-V: weakly ordered, and Python has no fences) the tail
  store may become visible before the payload stores. There every record carries a CRC-32C over
  (absolute position u64, length u32, payload). The consumer recomputes it; on mismatch (or an
  implausible length) the record is "not yet visible" and ``peek`` returns None to be retried
  later. Covering the absolute position matters: a stale but intact record left at the same
  offset by an earlier lap would otherwise pass as the new one. Padding records carry the checksum
  of (position, 0xFFFFFFFF) for the same reason. This is the torn-read protection; it is
  probabilistic (2**-32 per torn read), which we accept.
* The consumer's loads of a payload happen before its ``head`` store in program order, separated
  by a whole interpreter round trip; the producer never writes into space it has not seen freed.

The mode is chosen by the creator (auto: off on x86-64, on elsewhere, or forced by ``checksums``)
and recorded in the header, so every opener agrees with the producer; opening with an explicit
``checksums`` that contradicts the header is an error.
"""

from __future__ import annotations

import os
import platform
import struct
from typing import Union

from crc32c import crc32c

from .region import PAGE_SIZE, Region

__all__ = ["Ring", "RingCorrupt", "Buffer", "HEADER_SIZE", "PADDING", "default_checksums",
           "ring_fill"]

Buffer = Union[bytes, bytearray, memoryview]

MAGIC = 0x524D4853          # b"SHMR" little-endian
VERSION = 1
FLAG_CHECKSUMS = 1
HEADER_SIZE = PAGE_SIZE     # the data area starts page aligned
PADDING = 0xFFFFFFFF
MIN_CAPACITY = 4096

# Indexes of the counters in the header viewed as u64 items.
_HEAD = 64 // 8
_TAIL = 128 // 8
_WAITING = 192 // 8
_SLOT = 256 // 8

_HEADER = struct.Struct("<IHHQ")     # magic, version, flags, capacity
_REC = struct.Struct("<II")          # length, checksum
_U64 = struct.Struct("<Q")
_POSLEN = struct.Struct("<QI")       # what the checksum covers before the payload

# Machines whose memory model is TSO (x86-64). platform.machine() spells it per OS.
_TSO_MACHINES = frozenset({"x86_64", "amd64", "AMD64", "x64"})


def default_checksums() -> bool:
    """True where records need the torn-read checksum (every machine that is not x86-64)."""
    return platform.machine() not in _TSO_MACHINES


def _crc(abs_pos: int, length: int, parts: tuple[Buffer, ...] | list[Buffer] = ()) -> int:
    c = crc32c(_POSLEN.pack(abs_pos, length))
    for p in parts:
        c = crc32c(p, c)
    return c


def _as_bytes_parts(parts: tuple) -> list[Buffer]:
    """Make every part a flat unsigned-byte buffer (memoryview slice assignment needs format 'B')."""
    out: list[Buffer] = []
    for p in parts:
        t = type(p)
        if t is bytes or t is bytearray:
            out.append(p)
            continue
        mv = p if t is memoryview else memoryview(p)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        out.append(mv)
    return out



class RecordTooLarge(ValueError):
    """A record larger than the ring's ``max_payload``: it can never be put."""

class RingCorrupt(RuntimeError):
    """The ring holds something that is not a record (only raised when checksums are off)."""


class Ring:
    """SPSC byte ring; see the module docstring for layout and ordering."""

    __slots__ = ("_region", "_owns_region", "_offset", "capacity", "max_payload", "checksums",
                 "_mask", "_mv", "_q", "_data", "_next_head")

    def __init__(self, region: Region, offset: int, capacity: int, checksums: bool,
                 owns_region: bool) -> None:
        self._region = region
        self._owns_region = owns_region
        self._offset = offset
        self.capacity = capacity
        self.max_payload = capacity // 2 - 8
        self.checksums = checksums
        self._mask = capacity - 1
        self._mv = memoryview(region.buf)[offset:offset + HEADER_SIZE + capacity]
        self._q = self._mv[:HEADER_SIZE].cast("Q")
        self._data = self._mv[HEADER_SIZE:]
        self._next_head = -1       # head after the record last returned by peek(); -1 = none

    # -- constructors ----------------------------------------------------------------------
    @staticmethod
    def region_size(capacity: int) -> int:
        """Bytes a ring of ``capacity`` occupies in a region (header page + data area)."""
        _check_capacity(capacity)
        return HEADER_SIZE + capacity

    @classmethod
    def create(cls, path: str, capacity: int, *, checksums: bool | None = None) -> "Ring":
        """Create (or replace) the ring file at ``path``, empty, initialised before it is named."""
        _check_capacity(capacity)
        mode = default_checksums() if checksums is None else bool(checksums)
        region = Region.create(path, HEADER_SIZE + capacity,
                               init=lambda buf: _init_header(buf, 0, capacity, mode))
        try:
            return cls._attach(region, 0, capacity, mode, owns_region=True)
        except BaseException:
            region.close()
            raise

    @classmethod
    def open(cls, path: str, *, checksums: bool | None = None) -> "Ring":
        """Open an existing ring file; capacity and checksum mode come from its header."""
        region = Region.open(path)
        try:
            if region.size < HEADER_SIZE:
                raise ValueError(f"{path}: too small to be a ring ({region.size} bytes)")
            capacity = _HEADER.unpack_from(region.buf, 0)[3]
            return cls._attach(region, 0, capacity, checksums, owns_region=True)
        except BaseException:
            region.close()
            raise

    @classmethod
    def on_region(cls, region: Region, offset: int, capacity: int, *, init: bool,
                  checksums: bool | None = None) -> "Ring":
        """A ring at ``offset`` (page aligned) inside a bigger region; ``init`` formats it empty.

        The region stays the caller's: ``close()`` releases the ring's views but does not unmap.
        """
        _check_capacity(capacity)
        if offset % PAGE_SIZE:
            raise ValueError(f"ring offset {offset} is not page aligned")
        if offset < 0 or offset + HEADER_SIZE + capacity > region.size:
            raise ValueError(f"ring of capacity {capacity} at {offset} does not fit in {region!r}")
        if init:
            mode = default_checksums() if checksums is None else bool(checksums)
            _init_header(region.buf, offset, capacity, mode)
            checksums = mode
        return cls._attach(region, offset, capacity, checksums, owns_region=False)

    @classmethod
    def _attach(cls, region: Region, offset: int, capacity: int, checksums: bool | None,
                owns_region: bool) -> "Ring":
        where = region.path or "anonymous region"
        if region.readonly:
            raise ValueError(f"{where}: a ring needs a writable mapping (both ends write)")
        magic, version, flags, cap = _HEADER.unpack_from(region.buf, offset)
        if magic != MAGIC:
            raise ValueError(f"{where}: no ring at offset {offset} (bad magic {magic:#x})")
        if version != VERSION:
            raise ValueError(f"{where}: ring version {version}, expected {VERSION}")
        if cap != capacity:
            raise ValueError(f"{where}: ring capacity {cap}, expected {capacity}")
        _check_capacity(cap)
        if offset + HEADER_SIZE + cap > region.size:
            raise ValueError(f"{where}: truncated ring ({region.size} bytes for capacity {cap})")
        recorded = bool(flags & FLAG_CHECKSUMS)
        if checksums is not None and bool(checksums) != recorded:
            raise ValueError(f"{where}: ring was created with checksums={recorded}, "
                             f"opened with checksums={bool(checksums)}")
        return cls(region, offset, cap, recorded, owns_region)

    # -- producer side ---------------------------------------------------------------------
    def try_put(self, *parts: Buffer) -> bool:
        """Write ``parts`` back to back as one record; False (nothing written) if it does not fit now.

        Raises RecordTooLarge (a ValueError) if the payload exceeds ``max_payload`` (it would
        never fit).
        """
        n = 0
        for p in parts:
            t = type(p)
            if t is bytes or t is bytearray:
                n += len(p)
            else:
                parts = _as_bytes_parts(parts)  # type: ignore[assignment]
                n = sum(len(x) for x in parts)
                break
        if n > self.max_payload:
            raise RecordTooLarge(f"record payload of {n} bytes exceeds max_payload {self.max_payload}")
        q = self._q
        tail = q[_TAIL]
        cap = self.capacity
        pos = tail & self._mask
        rec = (n + 15) & ~7                    # header + payload, rounded up to 8
        room = cap - pos
        if rec <= room:
            if tail - q[_HEAD] + rec > cap:
                return False
        else:
            if tail - q[_HEAD] + room + rec > cap:
                return False
            _REC.pack_into(self._data, pos, PADDING,
                           _crc(tail, PADDING) if self.checksums else 0)
            tail += room
            pos = 0
        data = self._data
        start = pos + 8
        for p in parts:
            end = start + len(p)
            data[start:end] = p
            start = end
        _REC.pack_into(data, pos, n, _crc(tail, n, parts) if self.checksums else 0)
        q[_TAIL] = tail + rec                 # publish: one aligned 8-byte store, after the record
        return True

    def free_bytes(self) -> int:
        """Bytes not holding published records (a record needs 8 + its payload rounded up to 8,
        plus the padding up to the end of the data area when it does not fit before it)."""
        q = self._q
        return self.capacity - (q[_TAIL] - q[_HEAD])

    # -- consumer side ---------------------------------------------------------------------
    def peek(self) -> memoryview | None:
        """Zero-copy view of the next payload (valid until ``advance``), or None if there is none
        visible yet. Calling it again without ``advance`` returns the same record."""
        q = self._q
        head = q[_HEAD]
        tail = q[_TAIL]                        # load tail before reading the record it covers
        if head == tail:
            return None
        data = self._data
        pos = head & self._mask
        n, c = _REC.unpack_from(data, pos)
        if n == PADDING:
            if self.checksums and c != _crc(head, PADDING):
                return None                    # not yet visible (torn) - retry later
            head += self.capacity - pos
            pos = 0
            if head >= tail:
                return self._bad(f"padding at {head} not followed by a record (tail {tail})")
            n, c = _REC.unpack_from(data, 0)
        end = head + ((n + 15) & ~7)
        if n > self.max_payload or end > tail or pos + 8 + n > self.capacity:
            return self._bad(f"record length {n} at {head} overruns tail {tail}")
        view = data[pos + 8:pos + 8 + n]
        if self.checksums and c != _crc(head, n, (view,)):
            view.release()
            return None                        # not yet visible (torn) - retry later
        self._next_head = end
        return view

    def _bad(self, what: str) -> None:
        if self.checksums:
            return None                        # a torn header looks exactly like this: retry
        raise RingCorrupt(f"ring {self._region.path or 'anonymous'}: {what}")

    def advance(self) -> None:
        """Release the record last returned by ``peek`` (publishes the new head)."""
        nh = self._next_head
        if nh < 0:
            raise RuntimeError("Ring.advance() without a record returned by peek()")
        self._next_head = -1
        self._q[_HEAD] = nh

    def get(self) -> bytes | None:
        """Copy of the next payload, released from the ring; None if there is none."""
        view = self.peek()
        if view is None:
            return None
        out = view.tobytes()
        view.release()
        self.advance()
        return out

    def empty(self) -> bool:
        """No published record (a published record not yet visible in checksum mode counts as
        present: the consumer should retry soon rather than sleep)."""
        q = self._q
        return q[_HEAD] == q[_TAIL]

    def used_bytes(self) -> int:
        q = self._q
        return q[_TAIL] - q[_HEAD]

    @property
    def head(self) -> int:
        """Bytes consumed so far (the consumer's counter; never wraps). Any side may read it: a
        record whose ``end`` (the tail just after it was put) is at most ``head`` has been taken."""
        return self._q[_HEAD]

    @property
    def tail(self) -> int:
        """Bytes published so far (the producer's counter): right after ``try_put`` returned True,
        the end position of the record just put."""
        return self._q[_TAIL]

    # -- wake-up flag ----------------------------------------------------------------------
    @property
    def consumer_waiting(self) -> bool:
        return self._q[_WAITING] != 0

    @consumer_waiting.setter
    def consumer_waiting(self, value: bool) -> None:
        self._q[_WAITING] = 1 if value else 0

    @property
    def ready_slot(self) -> int:
        """This ring's byte in the consumer's ready map (``shm.ready``); 0 = none."""
        return self._q[_SLOT]

    @ready_slot.setter
    def ready_slot(self, value: int) -> None:
        self._q[_SLOT] = value

    # -- life cycle ------------------------------------------------------------------------
    @property
    def region(self) -> Region:
        return self._region

    @property
    def path(self) -> str | None:
        return self._region.path

    def close(self) -> None:
        """Release this object's views; unmap if the ring owns its region. Idempotent."""
        self._next_head = -1
        for v in (self._data, self._q, self._mv):
            v.release()
        if self._owns_region:
            self._region.close()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Ring({self._region.path or 'anonymous'!r}, offset={self._offset}, "
                f"capacity={self.capacity}, checksums={self.checksums})")


def ring_fill(path: str) -> tuple[int, int]:
    """(used bytes, capacity) of the ring file at ``path``, read with one pread of its header and
    no mapping: for observers (the metrics collector) that must not hold thousands of maps nor
    write anything. Both counters are single aligned stores, so each value read is whole."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        raw = os.pread(fd, _TAIL * 8 + 8, 0)
    finally:
        os.close(fd)
    magic, _, _, capacity = _HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise ValueError(f"{path}: not a ring")
    head = _U64.unpack_from(raw, _HEAD * 8)[0]
    tail = _U64.unpack_from(raw, _TAIL * 8)[0]
    return max(0, tail - head), capacity


def _check_capacity(capacity: int) -> None:
    if capacity < MIN_CAPACITY or capacity & (capacity - 1):
        raise ValueError(f"ring capacity must be a power of two >= {MIN_CAPACITY}, got {capacity}")


def _init_header(buf, offset: int, capacity: int, checksums: bool) -> None:
    """Format an empty ring: zero the header page, then write magic/version/flags/capacity."""
    mv = memoryview(buf)
    try:
        mv[offset:offset + HEADER_SIZE] = bytes(HEADER_SIZE)
        _HEADER.pack_into(mv, offset, MAGIC, VERSION, FLAG_CHECKSUMS if checksums else 0, capacity)
    finally:
        mv.release()
