"""Kafka's offset and time indexes of one log segment, as memory maps.

The partition writer opens the active segment's indexes writable (up to
``log.segment_index_bytes``, the file given its blocks a step at a time, see "the file's blocks"
below) and appends; fetchers and the writer's own timestamp lookups open them read-only. Formats
and lookup semantics are Kafka's (OffsetIndex, TimeIndex, AbstractIndex); values are big-endian::

    offset index, 8 bytes per entry           time index, 12 bytes per entry
    0      4  relative offset  u32            0      8  timestamp        i64
    4      4  position         u32  <-commit  8      4  relative offset  u32  <-commit

An offset-index entry maps the *last* offset of a batch to the position where that batch starts;
``lookup(o)`` returns the greatest entry with offset <= o (or ``(base, 0)``). A time-index entry
``(t, o)`` says "the largest timestamp up to offset o is t"; ``lookup(t)`` returns the greatest
entry with timestamp <= t (or ``(-1, base)``). Entries are strictly increasing.

How a reader knows how many entries are valid without trusting the zeros of unwritten slots:
every entry has a *commit word* (marked above) that is never 0 in a written entry - an offset
entry's position is never 0 (Kafka's rule adds the first entry only after index.interval.bytes
have gone by, so the batch at position 0 is never indexed), and a time entry other than the first
has a relative offset >= 1 (its offset is that of a later batch than the previous entry's). The
writer stores the rest of the entry first and the commit word last, as one aligned 4-byte native
store (through a ``memoryview.cast('I')``, never byte by byte as ``struct.pack_into`` does), so a
reader that sees a non-zero commit word sees the whole entry (x86-TSO store order). The valid
count is then the first slot whose commit word is 0 - found by binary search, since the zero
region is a suffix. A first time entry with timestamp 0 and relative offset 0 is indistinguishable
from an empty slot, but both give the same lookup answer (start at the segment's base offset).
Readers also only use an entry for offsets below the high watermark they were given.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import sys

from appliance.durable import atomic_write, grow_file
from shm.region import allocate

__all__ = ["CorruptIndex", "OffsetIndex", "TimeIndex", "encode_offset_entries", "encode_time_entries"]

_MAX_RELATIVE = 0x7FFFFFFF
INDEX_GROW_BYTES = 64 * 1024      # what the writer allocates at a time (8192 offset entries)
_OFF_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
_U32 = struct.Struct(">I")
_Q = struct.Struct(">q")
_LITTLE = sys.byteorder == "little"


def _allocated_entries(fd: int, count: int, entry_size: int) -> int:
    """The writer's open: give the file's ``count`` entries their blocks (a file of an older
    layout was extended sparse), or, on a full disk, count only those before its first hole."""
    if not count:
        return 0
    try:
        allocate(fd, count * entry_size)
        return count
    except OSError:
        try:
            hole = os.lseek(fd, 0, os.SEEK_HOLE)
        except OSError:
            return 0
        return min(count, hole // entry_size)


def _native_word(value: int) -> int:
    """The u32 whose native in-memory bytes are ``value`` big-endian (for the commit store)."""
    return int.from_bytes(value.to_bytes(4, "big"), sys.byteorder) if _LITTLE else value


class CorruptIndex(Exception):
    """An index file failed its sanity check; the caller rebuilds it from the log."""


class _Index:
    ENTRY_SIZE = 0
    _WORDS = 0          # u32 words per entry
    _COMMIT = 0         # which word of an entry is the commit word

    def __init__(self, path: str, base_offset: int, *, writable: bool = False, max_bytes: int = 0,
                 entries: int | None = None) -> None:
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        e = self.ENTRY_SIZE
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._words: memoryview | None = None
        self._final = False
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY, 0o644)
        try:
            st = os.fstat(fd)
            self.inode = st.st_ino
            self.file_size = st.st_size
            self._alloc = st.st_size // e          # whole entries the file holds (with blocks)
            if writable:
                self.max_entries = max(max_bytes // e, entries or 0, self._alloc)
                self._alloc = _allocated_entries(fd, self._alloc, e)
            else:
                self.max_entries = self._alloc
            self._map_entries(fd, self._alloc)
        except BaseException:
            os.close(fd)
            self.close()
            raise
        if writable:
            self._fd = fd                          # kept: the file grows while it is active
        else:
            os.close(fd)
        self._n = 0
        self._flushed = 0
        self._n = entries if entries is not None else self._detect_count(0)
        self._flushed = self._n
        if writable:
            try:
                self.reserve()
            except OSError:
                pass     # a full disk: the first append that needs the room says so (ENOSPC)

    # -- the file's blocks ------------------------------------------------------------------
    # The file holds only slots that have their blocks (posix_fallocate), and the maps cover
    # just the file: a store into a sparse page on a full disk, or on tmpfs even a read of one,
    # is a SIGBUS, and a map past the end of the file is one too. The writer grows the file
    # INDEX_GROW_BYTES at a time, before the append that needs the room (``reserve``, called
    # before the batch is written), so a full disk is an ENOSPC with nothing written; it keeps a
    # free slot after the last entry while the index can still grow, so a reader whose map is
    # all written entries knows the file has grown (or is final) and looks once (``entries``).
    def _map_entries(self, fd: int, count: int) -> None:
        words, m = self._words, self._map
        self._words = self._map = None
        if words is not None:
            words.release()
        if m is not None:
            m.close()
        if count:
            prot = (mmap.PROT_READ | mmap.PROT_WRITE) if self.writable else mmap.PROT_READ
            self._map = mmap.mmap(fd, count * self.ENTRY_SIZE, mmap.MAP_SHARED, prot)
            self._words = memoryview(self._map).cast("I")

    def reserve(self) -> None:
        """Make sure the next entry, and one free slot after it, have their blocks (writer).
        OSError (ENOSPC) when the file system has no room for the next entry."""
        if self._n + 1 >= self._alloc and self._alloc < self.max_entries:
            need = min(self.max_entries, self._n + 2)
            want = min(self.max_entries, max(need, self._alloc + INDEX_GROW_BYTES // self.ENTRY_SIZE))
            e = self.ENTRY_SIZE
            try:
                grow_file(self._fd, self._alloc * e, want * e, need * e)
            finally:
                got = os.fstat(self._fd).st_size // e       # ext4 keeps what it allocated
                if got > self._alloc:
                    self._map_entries(self._fd, got)
                    self._alloc = got
                    self.file_size = got * e
        if self._n >= self._alloc:
            raise OSError(errno.ENOSPC, f"no room in {self.path} for another entry")

    def _follow_growth(self) -> None:
        """Reader whose map holds only written entries: remap if the writer grew the file; once
        the file is seen to be final (trimmed, replaced, or at its size limit), never look again."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._final = True
            return
        try:
            st = os.fstat(fd)
            count = st.st_size // self.ENTRY_SIZE
            if st.st_ino != self.inode or count <= self._alloc:
                self._final = True
                return
            self._map_entries(fd, count)
            self._alloc = self.max_entries = count
            self.file_size = st.st_size
        finally:
            os.close(fd)

    # -- entry count ------------------------------------------------------------------------
    def _committed(self, slot: int) -> bool:
        return self._words[slot * self._WORDS + self._COMMIT] != 0   # type: ignore[index]

    def _detect_count(self, lo: int) -> int:
        """First slot >= lo whose commit word is 0 (slots below lo are known to be written)."""
        hi = self._alloc
        while lo < hi:
            mid = (lo + hi) // 2
            if self._committed(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    @property
    def entries(self) -> int:
        """Valid entries: exact for the writer; for a reader, re-detected (entries only grow
        in a mapped file - shrinking happens by replacing the file, see files.py)."""
        if not self.writable:
            if self._map is not None:
                self._n = self._detect_count(self._n)
            if self._n >= self._alloc and not self._final:
                self._follow_growth()
                if self._map is not None:
                    self._n = self._detect_count(self._n)
        return self._n

    def is_full(self) -> bool:
        return self._n >= self.max_entries

    def _relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if rel < 0 or rel > _MAX_RELATIVE:
            raise ValueError(f"offset {offset} is not representable in the index of segment "
                             f"{self.base_offset}")
        return rel

    # -- writer -----------------------------------------------------------------------------
    def _truncate_entries(self, n: int) -> None:
        """Forget entries n.. (commit words first, so a concurrent reader stops at n)."""
        assert self.writable
        for slot in range(self._n - 1, n - 1, -1):
            self._words[slot * self._WORDS + self._COMMIT] = 0   # type: ignore[index]
        if self._map is not None and self._n > n:
            self._map[n * self.ENTRY_SIZE:self._n * self.ENTRY_SIZE] = bytes((self._n - n) * self.ENTRY_SIZE)
        self._n = n
        self._flushed = min(self._flushed, n)

    def flush(self) -> None:
        """msync the entries appended since the last flush."""
        if self._map is None or self._flushed >= self._n:
            return
        start = (self._flushed * self.ENTRY_SIZE) // mmap.PAGESIZE * mmap.PAGESIZE
        end = self._n * self.ENTRY_SIZE
        self._map.flush(start, end - start)
        self._flushed = self._n

    def valid_bytes(self) -> bytes:
        n = self.entries
        return bytes(self._map[:n * self.ENTRY_SIZE]) if self._map is not None and n else b""

    def write_trimmed(self) -> None:
        """Replace the file by one holding just the valid entries (Kafka's trimToValidSize),
        atomically, so readers mapping the old file never touch a truncated page."""
        atomic_write(self.path, self.valid_bytes())

    def close(self) -> None:
        if self._words is not None:
            self._words.release()
            self._words = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class OffsetIndex(_Index):
    """Offset -> position of the batch (entry = last offset of a batch, its start position)."""

    ENTRY_SIZE = 8
    _WORDS = 2
    _COMMIT = 1

    def __init__(self, path: str, base_offset: int, *, writable: bool = False, max_bytes: int = 0,
                 entries: int | None = None) -> None:
        super().__init__(path, base_offset, writable=writable, max_bytes=max_bytes, entries=entries)
        self.last_offset = self.entry(self._n - 1)[0] if self._n else base_offset

    def entry(self, n: int) -> tuple[int, int]:
        rel, pos = _OFF_ENTRY.unpack_from(self._map, n * 8)    # type: ignore[arg-type]
        return self.base_offset + rel, pos

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """Greatest entry with offset <= target, or (base_offset, 0) when there is none."""
        n = self.entries
        rel = target_offset - self.base_offset
        lo, hi = 0, n                   # find the first slot whose offset > target
        m = self._map
        while lo < hi:
            mid = (lo + hi) // 2
            if _U32.unpack_from(m, mid * 8)[0] <= rel:   # type: ignore[arg-type]
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return self.base_offset, 0
        return self.entry(lo - 1)

    def append(self, offset: int, position: int) -> None:
        if self._n >= self.max_entries:
            raise ValueError(f"attempt to append to a full index {self.path}")
        if self._n and offset <= self.last_offset:
            raise ValueError(f"index offset {offset} is not larger than the last one {self.last_offset}")
        if position <= 0:
            raise ValueError("position 0 is never indexed (it is the empty-slot marker)")
        rel = self._relative(offset)
        n = self._n
        if n + 1 >= self._alloc:
            self.reserve()
        _U32.pack_into(self._map, n * 8, rel)                    # type: ignore[arg-type]
        self._words[n * 2 + 1] = _native_word(position)          # type: ignore[index]  commit
        self._n = n + 1
        self.last_offset = offset

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset`` (Kafka's truncateTo)."""
        n = self._n
        keep = 0
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < offset:
                lo = mid + 1
            else:
                hi = mid
        keep = lo
        self._truncate_entries(keep)
        self.last_offset = self.entry(keep - 1)[0] if keep else self.base_offset

    def sanity_check(self, log_size: int | None = None) -> None:
        n = self.entries
        if self.file_size % self.ENTRY_SIZE and not self.writable:
            raise CorruptIndex(f"index {self.path} has {self.file_size} bytes, not a multiple of 8")
        if not n:
            return
        last_off, last_pos = self.entry(n - 1)
        if last_off < self.base_offset:
            raise CorruptIndex(f"index {self.path}: last offset {last_off} < base {self.base_offset}")
        if n > 1:
            prev_off, prev_pos = self.entry(n - 2)
            if prev_off >= last_off or prev_pos >= last_pos:
                raise CorruptIndex(f"index {self.path}: entries are not increasing at the end")
        if log_size is not None and last_pos >= log_size:
            raise CorruptIndex(f"index {self.path}: position {last_pos} is past the log end {log_size}")

    def check_all(self, log_size: int, next_offset: int) -> None:
        """Every entry, not just the last two (bit rot, issue 34): offsets and positions
        strictly increasing, positions inside the log, offsets below ``next_offset``. In C
        loops (sorted, set): a few ms for the index of a 1 GiB segment."""
        words = _u32_words(self.valid_bytes())
        offs, poss = words[0::2], words[1::2]
        if not offs:
            return
        if (offs != sorted(offs) or poss != sorted(poss) or len(set(offs)) != len(offs)
                or len(set(poss)) != len(poss)):
            raise CorruptIndex(f"index {self.path}: entries are not increasing")
        if poss[0] <= 0 or poss[-1] >= log_size or self.base_offset + offs[-1] >= next_offset:
            raise CorruptIndex(f"index {self.path}: an entry lies outside the segment")


class TimeIndex(_Index):
    """Timestamp -> offset: (t, o) = the largest timestamp up to offset o is t."""

    ENTRY_SIZE = 12
    _WORDS = 3
    _COMMIT = 2

    def __init__(self, path: str, base_offset: int, *, writable: bool = False, max_bytes: int = 0,
                 entries: int | None = None) -> None:
        super().__init__(path, base_offset, writable=writable, max_bytes=max_bytes, entries=entries)
        self._last = self.entry(self._n - 1) if self._n else (-1, base_offset)

    def _detect_count(self, lo: int) -> int:
        if self._alloc == 0:
            return 0
        if lo == 0:
            # Slot 0 may legitimately have relative offset 0: decide it on the whole entry.
            k = super()._detect_count(1)
            if k == 1:
                return 0 if _TIME_ENTRY.unpack_from(self._map, 0) == (0, 0) else 1   # type: ignore[arg-type]
            return k
        return super()._detect_count(lo)

    def entry(self, n: int) -> tuple[int, int]:
        ts, rel = _TIME_ENTRY.unpack_from(self._map, n * 12)      # type: ignore[arg-type]
        return ts, self.base_offset + rel

    @property
    def last_entry(self) -> tuple[int, int]:
        if not self.writable:
            n = self.entries
            return self.entry(n - 1) if n else (-1, self.base_offset)
        return self._last

    def is_full(self) -> bool:
        # Kafka keeps the last slot for the entry written when the segment is rolled.
        return self._n >= self.max_entries - 1

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp <= target, or (-1, base_offset) when there is none."""
        n = self.entries
        lo, hi = 0, n
        m = self._map
        while lo < hi:
            mid = (lo + hi) // 2
            if _Q.unpack_from(m, mid * 12)[0] <= target_timestamp:   # type: ignore[arg-type]
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return -1, self.base_offset
        return self.entry(lo - 1)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Append (timestamp, offset) if timestamp is larger than the last entry's (Kafka's
        maybeAppend); returns whether an entry was written."""
        n = self._n
        if not skip_full_check and self.is_full():
            raise ValueError(f"attempt to append to a full time index {self.path}")
        if n >= self.max_entries:
            raise ValueError(f"time index {self.path} has no room")
        last_ts, last_off = self._last
        if n and offset < last_off:
            raise ValueError(f"time index offset {offset} is smaller than the last one {last_off}")
        if n and timestamp < last_ts:
            raise ValueError(f"time index timestamp {timestamp} is smaller than the last one {last_ts}")
        if timestamp <= last_ts:
            return False
        rel = self._relative(offset)
        if n and rel == 0:
            return False     # cannot happen (see module docstring); never write an uncommittable entry
        if n + 1 >= self._alloc:
            self.reserve()
        _Q.pack_into(self._map, n * 12, timestamp)                # type: ignore[arg-type]
        self._words[n * 3 + 2] = _native_word(rel)                # type: ignore[index]  commit
        self._n = n + 1
        self._last = (timestamp, offset)
        return True

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        n = self._n
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[1] < offset:
                lo = mid + 1
            else:
                hi = mid
        self._truncate_entries(lo)
        self._last = self.entry(lo - 1) if lo else (-1, self.base_offset)

    def sanity_check(self, log_size: int | None = None) -> None:
        n = self.entries
        if self.file_size % self.ENTRY_SIZE and not self.writable:
            raise CorruptIndex(f"time index {self.path} has {self.file_size} bytes, not a multiple of 12")
        if not n:
            return
        first_ts = self.entry(0)[0]
        last_ts, last_off = self.entry(n - 1)
        if last_ts < first_ts:
            raise CorruptIndex(f"time index {self.path}: last timestamp {last_ts} < first {first_ts}")
        if last_off < self.base_offset:
            raise CorruptIndex(f"time index {self.path}: last offset {last_off} < base {self.base_offset}")

    def check_all(self, next_offset: int) -> None:
        """Every entry (bit rot, issue 34): timestamps never decreasing, offsets strictly
        increasing and below ``next_offset``."""
        raw = self.valid_bytes()
        if not raw:
            return
        ts = [t for t, _ in _TIME_ENTRY.iter_unpack(raw)]
        offs = [o for _, o in _TIME_ENTRY.iter_unpack(raw)]
        if ts != sorted(ts) or offs != sorted(offs) or len(set(offs)) != len(offs):
            raise CorruptIndex(f"time index {self.path}: entries are not increasing")
        if self.base_offset + offs[-1] >= next_offset:
            raise CorruptIndex(f"time index {self.path}: an entry lies outside the segment")


def _u32_words(raw: bytes) -> list[int]:
    """Big-endian u32 words of ``raw`` as a list (array's C loops, then one byte swap)."""
    import array
    a = array.array("I")
    a.frombytes(raw)
    if _LITTLE:
        a.byteswap()
    return a.tolist()


def encode_offset_entries(base_offset: int, entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_OFF_ENTRY.pack(o - base_offset, p) for o, p in entries)


def encode_time_entries(base_offset: int, entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_TIME_ENTRY.pack(t, o - base_offset) for t, o in entries)
