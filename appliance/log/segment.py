"""One log segment: the writer's active segment, and loading/recovering segment files.

Runs in the partition writer only (readers use ``appliance.log.reader``). A segment is Kafka's
file triple ``<base>.log``, ``<base>.index``, ``<base>.timeindex`` (see ``files.py``), plus
``<base>.txnindex`` once an ABORT marker was written to it (``txn_index.py``).

The active segment's ``.log`` is preallocated (sparse ``ftruncate`` to ``segment_bytes``); an
append is one ``pwrite`` at the end of the valid bytes (``LogSegment.append`` says why not a store
through a map), so the bytes are in the page cache - visible to every reader process through its
read-only ``MAP_SHARED`` map, and surviving a kill -9 of the writer - before the writer publishes
the new high watermark. A full disk is an ENOSPC from that pwrite, answered KAFKA_STORAGE_ERROR
with nothing appended. The writer also maps the file ``MAP_SHARED``, only to msync the appended
range on a flush (``flush``); the indexes are written through their own maps.

Index entries follow Kafka's LogSegment.append: an offset-index entry (last offset of the batch
-> its position) when more than ``index_interval_bytes`` have been appended since the previous
entry, and with it a time-index entry (largest timestamp so far -> offset of the batch that
carried it) if the largest timestamp grew; when the segment becomes inactive (roll, clean close)
a last time-index entry records the segment's largest timestamp, which retention and timestamp
lookups read back.

Sealing (roll or clean close) msyncs, truncates ``.log`` in place to its real size (readers never
read past the published end, so no reader touches the cut pages) and replaces the indexes by
trimmed copies (rename; readers keep the old file), then fsyncs - the ``.txnindex`` too, so
that a segment below the recovery point has a complete, durable aborted-transaction index.

Recovery (``recover_segment``) follows Kafka's LogSegment.recover: walk the batches from position
0 checking length, magic, CRC and increasing offsets (gaps are legitimate: a cleaned segment
keeps only some batches, and may be empty) - and, stricter than Kafka, that the records
can be read (framing, compressed data inflated within a bound; ``record_contents.records_ok``),
so that a batch which passed its CRC but not a consumer is cut off too - stop at the first bad one, truncate the file
there and rebuild both indexes from the headers just read. The indexes of a scanned segment are
always rebuilt instead of verified: the scan has already read every header, rebuilding costs one
pass over that list, and it cannot be fooled by entries written for a batch whose bytes did not
survive. Segments that need no scan (``load_segment``) get Kafka's sanity check plus a header walk
from the last index entry to the end of the file.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from appliance.log.files import atomic_write, index_path, log_path, timeindex_path, txnindex_path
from appliance.log.index import (CorruptIndex, OffsetIndex, TimeIndex, encode_offset_entries,
                                 encode_time_entries)
from appliance.log.txn_index import TransactionIndex
from appliance.protocol.record_contents import records_ok
from appliance.protocol.records import BatchHeader, iter_batch_headers, scan_valid

__all__ = ["SegmentInfo", "LogSegment", "IndexBuild", "build_index_entries", "recover_segment",
           "load_segment", "delete_segment_files"]

MAX_RELATIVE_OFFSET = 0x7FFFFFFF


@dataclass(slots=True)
class SegmentInfo:
    """What the writer remembers about a segment (sealed or active)."""

    base_offset: int
    size: int                         # valid bytes
    next_offset: int                  # last offset + 1 (= base_offset when empty)
    max_timestamp: int = -1           # largest batch max timestamp (-1 = none)
    offset_of_max_timestamp: int = -1
    first_batch_timestamp: int = -1   # max timestamp of the first batch (time-based roll)
    mtime_ms: int = 0                 # file mtime: retention age when there are no timestamps

    def largest_timestamp(self) -> int:
        """Kafka's LogSegment.largestTimestamp: max timestamp, else the file's mtime."""
        return self.max_timestamp if self.max_timestamp >= 0 else self.mtime_ms


@dataclass(slots=True)
class IndexBuild:
    offsets: list[tuple[int, int]]
    times: list[tuple[int, int]]
    bytes_since_last_entry: int
    max_timestamp: int
    offset_of_max_timestamp: int


def build_index_entries(batches: list[tuple[int, BatchHeader]], interval: int) -> IndexBuild:
    """The index entries Kafka's LogSegment.recover would write for these batches."""
    offsets: list[tuple[int, int]] = []
    times: list[tuple[int, int]] = []
    max_ts, max_ts_off = -1, -1
    last_entry_pos = 0
    end = 0
    for pos, h in batches:
        last = h.base_offset + h.last_offset_delta
        if h.max_timestamp > max_ts:
            max_ts, max_ts_off = h.max_timestamp, last
        if pos - last_entry_pos > interval:
            offsets.append((last, pos))
            if max_ts > (times[-1][0] if times else -1) and (not times or max_ts_off > times[-1][1]):
                times.append((max_ts, max_ts_off))
            last_entry_pos = pos
        end = pos + h.batch_length + 12
    return IndexBuild(offsets, times, end - last_entry_pos if batches else 0, max_ts, max_ts_off)


def _map_read(fd: int, size: int) -> mmap.mmap | None:
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ) if size else None


def _all_zero(m: mmap.mmap, start: int, end: int, chunk: int = 1 << 22) -> bool:
    for off in range(start, end, chunk):
        piece = m[off:min(end, off + chunk)]
        if piece.count(0) != len(piece):
            return False
    return True


def recover_segment(directory: str, base_offset: int, *, active: bool, segment_bytes: int,
                    index_bytes: int, interval: int, next_base: int | None = None,
                    max_decompressed_bytes: int = 64 * 1048588
                    ) -> tuple[SegmentInfo, bool, IndexBuild]:
    """Scan ``<base>.log`` (length, magic, CRC, contiguous offsets, readable records), truncate
    it after the last valid batch and rebuild its indexes. Returns (info, corrupt, index build) where ``corrupt``
    says that non-zero bytes followed the valid prefix or that the segment does not end where
    ``next_base`` starts - the caller then drops every later segment (Kafka's LogLoader does the
    same: the log must stay a contiguous prefix)."""
    path = log_path(directory, base_offset)
    fd = os.open(path, os.O_RDWR)
    try:
        st = os.fstat(fd)
        file_size = st.st_size
        m = _map_read(fd, file_size)
        batches: list[tuple[int, BatchHeader]] = []
        valid_end = 0
        corrupt = False
        if m is not None:
            try:
                batches, valid_end = scan_valid(m, 0, file_size)
                expected = base_offset
                for i, (pos, h) in enumerate(batches):       # offsets must increase
                    # (not be contiguous: a cleaned segment keeps gaps where records went).
                    # A batch whose CRC holds but whose records a consumer cannot read (broken
                    # framing, undecodable or oversized compressed data) is as corrupt as a torn
                    # one: truncate there instead of serving it, or crashing on it, forever.
                    if (h.base_offset < expected or h.last_offset_delta < 0
                            or not records_ok(m, pos, h, max_bytes=max_decompressed_bytes)):
                        batches, valid_end = batches[:i], pos
                        break
                    expected = h.base_offset + h.last_offset_delta + 1
                corrupt = valid_end < file_size and not _all_zero(m, valid_end, file_size)
            finally:
                m.close()
        next_offset = (batches[-1][1].base_offset + batches[-1][1].last_offset_delta + 1
                       if batches else base_offset)
        if next_base is not None and next_offset > next_base:
            corrupt = True
        if valid_end < file_size:
            os.ftruncate(fd, valid_end)   # also zeroes whatever a later extension exposes
        if active and valid_end < segment_bytes:
            os.ftruncate(fd, segment_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    build = build_index_entries(batches, interval)
    if not active and build.max_timestamp >= 0 and (
            not build.times or build.max_timestamp > build.times[-1][0]):
        build.times.append((build.max_timestamp, build.offset_of_max_timestamp))
    prealloc_o = index_bytes - index_bytes % 8 if active else None
    prealloc_t = index_bytes - index_bytes % 12 if active else None
    atomic_write(index_path(directory, base_offset),
                 encode_offset_entries(base_offset, build.offsets), size=prealloc_o)
    atomic_write(timeindex_path(directory, base_offset),
                 encode_time_entries(base_offset, build.times), size=prealloc_t)
    info = SegmentInfo(base_offset, valid_end, next_offset, build.max_timestamp,
                       build.offset_of_max_timestamp,
                       batches[0][1].max_timestamp if batches else -1, int(st.st_mtime * 1000))
    return info, corrupt, build


def load_segment(directory: str, base_offset: int, *, next_base: int | None,
                 allow_empty: bool = False, suffix: str = "") -> tuple[SegmentInfo, int, int] | None:
    """Load a segment that needs no scan (sealed, or closed cleanly): Kafka's index sanity
    checks, then a header walk from the last offset-index entry that must end exactly at the end
    of the file (and, when known, at or below ``next_base``). Returns (info, offset entries,
    time entries), or None when anything is off - the caller then recovers the segment.
    ``suffix``: after each file's name (a cleaner's ``.cleaned`` copy, checked before a swap)."""
    path = log_path(directory, base_offset) + suffix
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size == 0:
            # The last segment (a roll just made it), or a sealed one a cleaner emptied.
            if next_base is None and not allow_empty:
                return None
            oidx = tidx = None
            try:
                oidx = OffsetIndex(index_path(directory, base_offset) + suffix, base_offset)
                tidx = TimeIndex(timeindex_path(directory, base_offset) + suffix, base_offset)
                if oidx.entries or tidx.entries:
                    return None
            except (FileNotFoundError, CorruptIndex):
                return None
            finally:
                for ix in (oidx, tidx):
                    if ix is not None:
                        ix.close()
            return SegmentInfo(base_offset, 0, base_offset, mtime_ms=int(st.st_mtime * 1000)), 0, 0
        m = _map_read(fd, size)
    finally:
        os.close(fd)
    assert m is not None
    try:
        try:
            oidx = OffsetIndex(index_path(directory, base_offset) + suffix, base_offset)
        except FileNotFoundError:
            return None
        try:
            tidx = TimeIndex(timeindex_path(directory, base_offset) + suffix, base_offset)
        except FileNotFoundError:
            oidx.close()
            return None
        try:
            oidx.sanity_check(size)
            tidx.sanity_check(size)
            n_off, n_time = oidx.entries, tidx.entries
            if oidx.file_size != n_off * 8 or tidx.file_size != n_time * 12:
                return None               # not trimmed: not a cleanly sealed segment
            start = oidx.entry(n_off - 1)[1] if n_off else 0
            max_ts, max_ts_off = tidx.last_entry
        except CorruptIndex:
            return None
        finally:
            oidx.close()
            tidx.close()
        first = next(iter_batch_headers(m, 0, size), None)
        if first is None or first[1].base_offset < base_offset:
            return None
        end, last_h = start, None
        for pos, h in iter_batch_headers(m, start, size):
            # Increasing offsets; gaps are where a cleaner removed records.
            if h.magic != 2 or (last_h is not None and h.base_offset <= last_h.last_offset):
                return None
            end, last_h = pos + h.size, h
        if last_h is None or end != size:
            return None
        next_offset = last_h.last_offset + 1
        if next_base is not None and next_offset > next_base:
            return None
        info = SegmentInfo(base_offset, size, next_offset, max_ts, max_ts_off if max_ts >= 0 else -1,
                           first[1].max_timestamp, int(st.st_mtime * 1000))
        return info, n_off, n_time
    finally:
        m.close()


def delete_segment_files(directory: str, base_offset: int) -> None:
    """Indexes first, the log last: a crash in between leaves a .log whose missing indexes are
    rebuilt, or (if the segment was below the log start offset) deleted again at open. The
    ``.txnindex`` goes with them (KIP-98: deleted with its segment)."""
    for p in (txnindex_path(directory, base_offset), index_path(directory, base_offset),
              timeindex_path(directory, base_offset), log_path(directory, base_offset)):
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


class LogSegment:
    """The writer's active segment: the preallocated .log (appended with pwrite, mapped for
    msync) and its indexes."""

    def __init__(self, directory: str, info: SegmentInfo, *, segment_bytes: int, index_bytes: int,
                 interval: int, now_ms: int, offset_entries: int, time_entries: int,
                 bytes_since_last_entry: int) -> None:
        self.directory = directory
        self.base_offset = info.base_offset
        self.size = info.size
        self.next_offset = info.next_offset
        self.max_timestamp = info.max_timestamp
        self.offset_of_max_timestamp = info.offset_of_max_timestamp
        self.first_batch_timestamp = info.first_batch_timestamp
        self.created_ms = now_ms
        self._interval = interval
        self._limit = segment_bytes
        self._bytes_since = bytes_since_last_entry if info.size else 0
        self._fd = os.open(log_path(directory, self.base_offset), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.capacity = max(segment_bytes, info.size)
            if os.fstat(self._fd).st_size < self.capacity:
                os.ftruncate(self._fd, self.capacity)       # sparse preallocation
            self._map = mmap.mmap(self._fd, self.capacity, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
            self.offset_index = OffsetIndex(index_path(directory, self.base_offset), self.base_offset,
                                            writable=True, max_bytes=index_bytes, entries=offset_entries)
            self.time_index = TimeIndex(timeindex_path(directory, self.base_offset), self.base_offset,
                                        writable=True, max_bytes=index_bytes, entries=time_entries)
            # Aborted-transaction index: file created on the first abort (Kafka's lazy creation).
            self.txn_index = TransactionIndex(txnindex_path(directory, self.base_offset),
                                              self.base_offset, writable=True)
        except BaseException:
            os.close(self._fd)
            raise
        self._flushed = info.size

    @classmethod
    def create(cls, directory: str, base_offset: int, *, segment_bytes: int, index_bytes: int,
               interval: int, now_ms: int) -> "LogSegment":
        # Indexes before the log: index files without a .log are orphans that open() deletes.
        # A leftover .txnindex under this name describes some older log: it goes.
        try:
            os.unlink(txnindex_path(directory, base_offset))
        except FileNotFoundError:
            pass
        for p in (index_path(directory, base_offset), timeindex_path(directory, base_offset)):
            os.close(os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
        os.close(os.open(log_path(directory, base_offset), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
        return cls(directory, SegmentInfo(base_offset, 0, base_offset), segment_bytes=segment_bytes,
                   index_bytes=index_bytes, interval=interval, now_ms=now_ms, offset_entries=0,
                   time_entries=0, bytes_since_last_entry=0)

    # -- appending ---------------------------------------------------------------------------
    def has_room(self, size: int, last_offset: int) -> bool:
        """Kafka's LogSegment.shouldRoll without the time rule: the batch fits, neither index is
        full, and its last offset is representable relative to the base offset."""
        return (self.size + size <= self._limit
                and self.offset_index._n < self.offset_index.max_entries
                and self.time_index._n < self.time_index.max_entries - 1
                and last_offset - self.base_offset <= MAX_RELATIVE_OFFSET)

    def rolling_base_timestamp(self) -> int:
        """Kafka's rollingBasedTimestamp: the first batch's max timestamp, -1 when unknown."""
        return self.first_batch_timestamp

    def append(self, batch, size: int, last_offset: int, max_timestamp: int) -> int:
        """Copy one batch (offsets already assigned) to the end; returns its position.

        The copy is one pwrite into the page cache, not a store through our mapping: a store to
        a fresh page of the sparse file faults, zero-fills the page and reserves its block one
        page at a time (measured 0.4-4 GB/s), pwrite fills whole pages (5+ GB/s), and readers'
        shared maps see the same page cache either way. A full disk is then an ENOSPC error
        (answered KAFKA_STORAGE_ERROR, nothing appended) instead of a SIGBUS."""
        pos = self.size
        written = os.pwrite(self._fd, batch, pos)
        if written != size:
            raise OSError(28, f"short write of a record batch ({written} of {size} bytes)")
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if pos == 0:
            self.first_batch_timestamp = max_timestamp
        if self._bytes_since > self._interval:
            self.offset_index.append(last_offset, pos)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since = 0
        self._bytes_since += size
        self.size = pos + size
        self.next_offset = last_offset + 1
        return pos

    def flush(self) -> None:
        """msync what was appended since the last flush (log and indexes)."""
        if self._flushed < self.size:
            start = self._flushed // mmap.PAGESIZE * mmap.PAGESIZE
            self._map.flush(start, self.size - start)
            self._flushed = self.size
        self.offset_index.flush()
        self.time_index.flush()

    def info(self) -> SegmentInfo:
        return SegmentInfo(self.base_offset, self.size, self.next_offset, self.max_timestamp,
                           self.offset_of_max_timestamp, self.first_batch_timestamp, self.created_ms)

    # -- closing ----------------------------------------------------------------------------
    def dup_fd(self) -> int:
        """A new descriptor of the .log file, for an fdatasync elsewhere (the writer's flusher
        thread): it stays valid after a roll closes ours. The caller closes it."""
        return os.dup(self._fd)

    def seal(self) -> SegmentInfo:
        """Make the segment inactive (roll or clean close): final time-index entry, msync,
        truncate the .log to its size, replace the indexes by trimmed copies, fsync."""
        tix = self.time_index
        # The reserved last slot is always free, except for a segment reopened under a smaller
        # segment.index.bytes: then the entry is skipped (largest timestamp read back lower).
        if self.max_timestamp >= 0 and tix._n < tix.max_entries:
            tix.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        self.flush()
        self._map.close()
        os.ftruncate(self._fd, self.size)
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        for ix in (self.offset_index, self.time_index):
            ix.write_trimmed()
            ix.close()
        self.txn_index.fsync()
        self.txn_index.close()
        info = self.info()
        try:
            info.mtime_ms = int(os.stat(log_path(self.directory, self.base_offset)).st_mtime * 1000)
        except FileNotFoundError:
            pass
        return info

    def update_limits(self, *, segment_bytes: int, interval: int) -> None:
        """Apply changed topic settings (the file keeps its mapped size)."""
        self._limit = min(segment_bytes, self.capacity)
        self._interval = interval

    def close(self, clean: bool = True) -> SegmentInfo | None:
        """Clean: ``seal()`` (files truncated to their real size). Not clean: ``abandon()``."""
        if clean:
            return self.seal()
        self.abandon()
        return None

    def abandon(self) -> None:
        """Release maps and descriptors without flushing or trimming (as a crash would)."""
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        if not self._map.closed:
            self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
