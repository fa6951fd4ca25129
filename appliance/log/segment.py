"""One log segment: the writer's active segment, and loading/recovering segment files.

Runs in the partition writer only (readers use ``appliance.log.reader``). A segment is Kafka's
file triple ``<base>.log``, ``<base>.index``, ``<base>.timeindex`` (see ``files.py``), plus
``<base>.txnindex`` once an ABORT marker was written to it (``txn_index.py``).

An append is one ``pwrite`` at the end of the valid bytes (``LogSegment.append`` says why not a
store through a map), so the bytes are in the page cache - visible to every reader process through
its read-only ``MAP_SHARED`` map, and surviving a kill -9 of the writer - before the writer
publishes the new high watermark. The indexes are written through the writer's maps.

A full disk: every file here is as long as the blocks it has. The active ``.log`` is given them
with ``posix_fallocate`` ``SEGMENT_GROW_BYTES`` (1 MiB) ahead of the appends, up to
``segment_bytes`` (the whole of it at the first append when the topic says ``preallocate``) (only what a batch needs when the disk is nearly full: ``durable.grow_file``),
never sparse: readers map the file's size, and on tmpfs even a read of a hole
through a map allocates a page (SIGBUS when the tmpfs is full), while a store into one on any file
system is a SIGBUS when the disk has no block for it. So the room for a batch (and for its index
entries) is taken before any byte of it is written, and a full disk is an ENOSPC there, answered
KAFKA_STORAGE_ERROR with nothing appended; a pwrite that fails anyway is zeroed again and not
counted. A seal (roll) writes its only new files first, so a disk without room leaves the old
segment active and whole; what cannot be accounted for (a failed fsync mid-seal, bytes that cannot
be taken back) is a ``LogDirFailure``, which stops the writer for its recovery to decide, as the
flusher does. On ext4 a write into fallocated blocks takes no new data block (the extent
conversion draws on blocks ext4 reserves for it); a copy-on-write file system (btrfs, ZFS) cannot
promise that, and there a failed write is still answered, not faulted.

Index entries follow Kafka's LogSegment.append: an offset-index entry (last offset of the batch
-> its position) when more than ``index_interval_bytes`` have been appended since the previous
entry, and with it a time-index entry (largest timestamp so far -> offset of the batch that
carried it) if the largest timestamp grew; when the segment becomes inactive (roll, clean close)
a last time-index entry records the segment's largest timestamp, which retention and timestamp
lookups read back.

Sealing (roll or clean close) writes the trimmed index copies, fdatasyncs, truncates ``.log`` in
place to its real size (readers never read past the published end, so no reader touches the cut
pages; the blocks given ahead go back) and renames the trimmed copies over the indexes (readers
keep the old file), then fsyncs - the ``.txnindex`` too, so that a segment below the recovery point
has a complete, durable aborted-transaction index.

Recovery (``recover_segment``) follows Kafka's LogSegment.recover: walk the batches from position
0 checking length, magic, CRC and increasing offsets (gaps are legitimate: a cleaned segment
keeps only some batches, and may be empty) - and, stricter than Kafka, that the records
can be read (framing, compressed data inflated within a bound; ``record_contents.records_ok``),
so that a batch which passed its CRC but not a consumer is cut off too - stop at the first bad
one, truncate the file there and rebuild both indexes from the headers just read. The scan maps
no further than the file's first hole (a file of the older, sparse layout has one). The indexes
of a scanned segment are always rebuilt instead of verified: the scan has already read every
header, rebuilding costs one pass over that list, and it cannot be fooled by entries written for
a batch whose bytes did not survive. Segments that need no scan (``load_segment``) get Kafka's
sanity check plus a header walk from the last index entry to the end of the file.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from dataclasses import dataclass
from typing import NamedTuple

from appliance.log.files import index_path, log_path, timeindex_path, txnindex_path
from appliance.durable import DeferredSync, atomic_write, fsync_dir, grow_file, write_tmp_copies
from appliance.log.index import (CorruptIndex, OffsetIndex, TimeIndex, encode_offset_entries,
                                 encode_time_entries)
from appliance.log.txn_index import TransactionIndex
from appliance.protocol.record_contents import records_ok
from appliance.protocol.records import BatchHeader, batch_crc_ok, iter_batch_headers, scan_valid

__all__ = ["SegmentInfo", "LogSegment", "LogDirFailure", "SegmentMark", "IndexBuild",
           "build_index_entries", "recover_segment", "load_segment", "delete_segment_files",
           "aborted_index_matches"]

log = logging.getLogger("appliance.log")

MAX_RELATIVE_OFFSET = 0x7FFFFFFF
SEGMENT_GROW_BYTES = 1 << 20      # how far ahead of the appends the active .log gets its blocks


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


def _data_end(fd: int, file_size: int) -> int:
    """Where the file's first hole starts (its size when it has none). A segment is written from
    position 0 on, so its bytes lie before that; recovery maps no further, because on tmpfs a
    read of a hole through a map allocates the page (SIGBUS on a full tmpfs). Only a file of an
    older layout, extended sparse to segment_bytes, has such a hole."""
    try:
        return min(file_size, os.lseek(fd, 0, os.SEEK_HOLE))
    except OSError:
        return file_size


def _all_zero(fd: int, start: int, end: int, chunk: int = 1 << 22) -> bool:
    """Whether [start, end) reads as zeros (pread: reading a hole allocates nothing)."""
    for off in range(start, end, chunk):
        piece = os.pread(fd, min(end - off, chunk), off)
        if piece.count(0) != len(piece):
            return False
    try:
        os.lseek(fd, end, os.SEEK_DATA)      # any data after the first hole is not zero
        return False
    except OSError:
        return True


def recover_segment(directory: str, base_offset: int, *, segment_bytes: int,
                    index_bytes: int, interval: int, next_base: int | None = None,
                    max_decompressed_bytes: int = 64 * 1048588, durable: bool = True
                    ) -> tuple[SegmentInfo, bool, IndexBuild]:
    """Scan ``<base>.log`` (length, magic, CRC, contiguous offsets, readable records), truncate
    it after the last valid batch and rebuild its indexes. Returns (info, corrupt, index build) where ``corrupt``
    says that non-zero bytes followed the valid prefix or that the segment does not end where
    ``next_base`` starts - the caller then drops every later segment (Kafka's LogLoader does the
    same: the log must stay a contiguous prefix). ``durable=False`` (the active segment, which
    lies above the recovery point and is recovered again after any unclean stop) writes the
    truncation and the indexes without fsyncs: what the flush policy promised is on disk already,
    and at ten thousand partitions five fsyncs each were most of a restart."""
    path = log_path(directory, base_offset)
    fd = os.open(path, os.O_RDWR)
    try:
        st = os.fstat(fd)
        file_size = st.st_size
        data_end = _data_end(fd, file_size)
        m = _map_read(fd, data_end)
        batches: list[tuple[int, BatchHeader]] = []
        valid_end = 0
        corrupt = False
        if m is not None:
            try:
                batches, valid_end = scan_valid(m, 0, data_end)
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
            finally:
                m.close()
        corrupt = valid_end < file_size and not _all_zero(fd, valid_end, data_end)
        next_offset = (batches[-1][1].base_offset + batches[-1][1].last_offset_delta + 1
                       if batches else base_offset)
        if next_base is not None and next_offset > next_base:
            corrupt = True
        if valid_end < file_size:
            os.ftruncate(fd, valid_end)   # also zeroes whatever a later extension exposes
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    build = build_index_entries(batches, interval)
    if build.max_timestamp >= 0 and (not build.times or build.max_timestamp > build.times[-1][0]):
        build.times.append((build.max_timestamp, build.offset_of_max_timestamp))
    atomic_write(index_path(directory, base_offset),
                 encode_offset_entries(base_offset, build.offsets), sync=durable)
    atomic_write(timeindex_path(directory, base_offset),
                 encode_time_entries(base_offset, build.times), sync=durable)
    info = SegmentInfo(base_offset, valid_end, next_offset, build.max_timestamp,
                       build.offset_of_max_timestamp,
                       batches[0][1].max_timestamp if batches else -1, int(st.st_mtime * 1000))
    return info, corrupt, build


def load_segment(directory: str, base_offset: int, *, next_base: int | None,
                 allow_empty: bool = False, suffix: str = "",
                 rebuild_interval: int | None = None) -> tuple[SegmentInfo, int, int] | None:
    """Load a segment that needs no scan (sealed, or closed cleanly): Kafka's index sanity
    checks, then a header walk from the last offset-index entry that must end exactly at the end
    of the file (and, when known, at or below ``next_base``); then every entry of both indexes
    (order and range, ``check_all``) and the time index's last entry against the batch it names.
    Returns (info, offset entries, time entries), or None when the log itself is off - the
    caller then recovers the segment.

    An index that is missing, torn, or does not match the log (bit rot, issue 34) is rebuilt
    from the batch headers when ``rebuild_interval`` is given (the index interval), as Kafka
    rebuilds an index that fails its sanity check, but without the CRC scan and truncation of a
    recovery: the log of a sealed segment is not what is wrong (the scrub and the fetch path
    check its batches). Without it such a segment is None too.
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
    oidx = tidx = None
    problem: str | None = None
    try:
        try:
            oidx = OffsetIndex(index_path(directory, base_offset) + suffix, base_offset)
            tidx = TimeIndex(timeindex_path(directory, base_offset) + suffix, base_offset)
            oidx.sanity_check(size)
            tidx.sanity_check(size)
            n_off, n_time = oidx.entries, tidx.entries
            if oidx.file_size != n_off * 8 or tidx.file_size != n_time * 12:
                raise CorruptIndex("not trimmed to its entries (torn, or not cleanly sealed)")
            start = oidx.entry(n_off - 1)[1] if n_off else 0
            max_ts, max_ts_off = tidx.last_entry
        except (FileNotFoundError, CorruptIndex) as e:
            problem = str(e) if isinstance(e, CorruptIndex) else f"{e.filename} is missing"
            start, n_off, n_time, max_ts, max_ts_off = 0, 0, 0, -1, -1
        first = next(iter_batch_headers(m, 0, size), None)
        if first is None or first[1].base_offset < base_offset:
            return None
        end, last_h = start, None
        walked: list[tuple[int, BatchHeader]] = []
        for pos, h in iter_batch_headers(m, start, size):
            # Increasing offsets; gaps are where a cleaner removed records.
            if h.magic != 2 or (last_h is not None and h.base_offset <= last_h.last_offset):
                return None
            end, last_h = pos + h.size, h
            if problem is not None:
                walked.append((pos, h))
        if last_h is None or end != size:
            return None
        next_offset = last_h.last_offset + 1
        if next_base is not None and next_offset > next_base:
            return None
        if problem is None:
            try:
                oidx.check_all(size, next_offset)
                tidx.check_all(next_offset)
                if n_time and not _names_its_batch(m, size, oidx, max_ts, max_ts_off):
                    raise CorruptIndex(f"time index {tidx.path}: its last entry ({max_ts}, "
                                       f"{max_ts_off}) does not match the batch at that offset")
            except CorruptIndex as e:
                problem = str(e)
                walked = list(iter_batch_headers(m, 0, size))
        if problem is not None:
            if rebuild_interval is None or suffix:
                return None
            for ix in (oidx, tidx):
                if ix is not None:
                    ix.close()
            oidx = tidx = None
            log.warning("%s: segment %d: %s; rebuilding its offset and time indexes from the log",
                        directory, base_offset, problem)
            build = build_index_entries(walked, rebuild_interval)
            if build.max_timestamp >= 0 and (not build.times or build.max_timestamp > build.times[-1][0]):
                build.times.append((build.max_timestamp, build.offset_of_max_timestamp))
            atomic_write(index_path(directory, base_offset),
                         encode_offset_entries(base_offset, build.offsets))
            atomic_write(timeindex_path(directory, base_offset),
                         encode_time_entries(base_offset, build.times))
            n_off, n_time = len(build.offsets), len(build.times)
            max_ts, max_ts_off = build.max_timestamp, build.offset_of_max_timestamp
        info = SegmentInfo(base_offset, size, next_offset, max_ts, max_ts_off if max_ts >= 0 else -1,
                           first[1].max_timestamp, int(st.st_mtime * 1000))
        return info, n_off, n_time
    finally:
        for ix in (oidx, tidx):
            if ix is not None:
                ix.close()
        m.close()


def aborted_index_matches(directory: str, base_offset: int, *, compacted: bool = False) -> bool:
    """Whether every entry of the segment's ``.txnindex`` names an ABORT marker of its producer
    at its last offset (and, when it lies in this segment, the first batch of that producer's
    transaction at its first offset): the sanity check (``txn_index.sane``) sees order and range
    only, and a flipped producer id or offset would hand read_committed consumers an aborted
    transaction's records as committed (bit rot, issue 34). One short header walk per entry;
    aborts are rare. ``compacted``: a cleaner removes aborted data, and markers past their
    delete horizon, so an offset that names no batch is no damage there; a batch that holds it
    must still be the producer's."""
    from appliance.errors import KafkaError
    from appliance.log.txn_index import read_entries
    from appliance.protocol.records import parse_control_record
    try:
        entries = read_entries(txnindex_path(directory, base_offset))
    except ValueError:
        return False
    if not entries:
        return True
    fd = os.open(log_path(directory, base_offset), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        m = _map_read(fd, size)
    finally:
        os.close(fd)
    if m is None:
        return False
    try:
        with OffsetIndex(index_path(directory, base_offset), base_offset) as oidx:
            def batch_at(offset: int):
                _, pos = oidx.lookup(offset)
                for p, h in iter_batch_headers(m, pos, size):
                    if h.last_offset >= offset:
                        return (p, h) if h.base_offset <= offset else None
                return None
            def first_batch_of(offset: int, pid: int) -> bool:
                # The transaction's first batch starts there, and no batch of its producer
                # other than a marker comes just before it (within the index entry's window:
                # a walk of at most an index interval).
                _, pos = oidx.lookup(offset - 1)
                open_before = False         # a data batch of pid not followed by its marker
                for p, h in iter_batch_headers(m, pos, size):
                    if h.base_offset == offset and not batch_crc_ok(m, p, h.size, h.crc):
                        return True         # damaged: nothing to check it by (as the marker)
                    if h.base_offset >= offset:
                        return (h.base_offset == offset and h.producer_id == pid
                                and h.is_transactional and not h.is_control and not open_before)
                    if h.producer_id == pid:
                        open_before = not h.is_control
                return False

            for e in entries:
                if e.last_stable_offset > e.last_offset + 1:
                    return False        # a later LSO would end read_committed's search early
                got = batch_at(e.last_offset)
                if got is None:
                    if compacted:
                        continue        # the marker went past its delete horizon
                    return False
                p, h = got
                if not batch_crc_ok(m, p, h.size, h.crc):
                    # Rot in the marker itself says nothing about the index: the entry is what
                    # the writer recorded when the marker was whole. A recovery here would cut
                    # the segment before the marker (losing every later batch) and forget the
                    # abort (its records then read as committed); the fetch path refuses the
                    # damaged batch, the scrub reports it (found by the chaos bit flip).
                    log.warning("%s: segment %d: the ABORT marker at offset %d fails its CRC; "
                                "its aborted-transaction index entry is kept", directory,
                                base_offset, h.base_offset)
                    continue
                if not h.is_control or h.producer_id != e.producer_id or h.base_offset != e.last_offset:
                    return False
                try:
                    if parse_control_record(m[p:p + h.size])[0] != 0:      # ABORT
                        return False
                except KafkaError:
                    if not compacted:   # a cleaner may leave a marker's batch emptied
                        return False
                if not base_offset <= e.first_offset < e.last_offset:
                    continue            # (first = last: an abort with no data here)
                if compacted:
                    first = batch_at(e.first_offset)
                    if first is not None and first[1].producer_id != e.producer_id:
                        return False
                elif not first_batch_of(e.first_offset, e.producer_id):
                    return False
        return True
    except (FileNotFoundError, CorruptIndex):
        return False
    finally:
        m.close()


def _names_its_batch(m, size: int, oidx: OffsetIndex, ts: int, offset: int) -> bool:
    """Whether the batch whose last offset is ``offset`` has max timestamp ``ts`` (the time
    index's last entry: the segment's largest timestamp, which retention reads back). A walk
    from the offset index's entry below it: at most an index interval of headers."""
    _, pos = oidx.lookup(offset)
    for _, h in iter_batch_headers(m, pos, size):
        if h.last_offset >= offset:
            return h.last_offset == offset and h.max_timestamp == ts
    return False


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


class LogDirFailure(RuntimeError):
    """An I/O error that leaves the segment in a state the writer cannot account for (a failed
    fsync or truncate in the middle of a seal, bytes that cannot be taken back): the writer must
    stop, and its recovery decides what the log holds, as after a crash."""


class SegmentMark(NamedTuple):
    """The active segment's append state at one moment (``LogSegment.mark``/``rewind``)."""

    size: int
    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    first_batch_timestamp: int
    bytes_since: int


class LogSegment:
    """The writer's active segment: the .log (appended with pwrite, given its blocks ahead of
    the appends) and its indexes."""

    def __init__(self, directory: str, info: SegmentInfo, *, segment_bytes: int, index_bytes: int,
                 interval: int, now_ms: int, offset_entries: int, time_entries: int,
                 bytes_since_last_entry: int, preallocate: bool = False) -> None:
        self.directory = directory
        self.preallocate = preallocate
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
        self.offset_index = self.time_index = None
        try:
            if os.fstat(self._fd).st_size != info.size:
                # Past the valid bytes (a sparse extension of an older layout): cut, so that
                # every byte of the file has its blocks. Readers never read past the high
                # watermark, which lies at or before info.size.
                os.ftruncate(self._fd, info.size)
            self.capacity = info.size       # the file's size: bytes with their blocks
            self.offset_index = OffsetIndex(index_path(directory, self.base_offset), self.base_offset,
                                            writable=True, max_bytes=index_bytes, entries=offset_entries)
            self.time_index = TimeIndex(timeindex_path(directory, self.base_offset), self.base_offset,
                                        writable=True, max_bytes=index_bytes, entries=time_entries)
            # Aborted-transaction index: file created on the first abort (Kafka's lazy creation).
            self.txn_index = TransactionIndex(txnindex_path(directory, self.base_offset),
                                              self.base_offset, writable=True)
        except BaseException:
            for ix in (self.offset_index, self.time_index):
                if ix is not None:
                    ix.close()
            os.close(self._fd)
            raise
        # No blocks taken ahead here: a start on a full disk must leave what the disk reserve gave
        # back to recovery and deletes; the first append takes what it needs.
        self._flushed = info.size

    @classmethod
    def create(cls, directory: str, base_offset: int, *, segment_bytes: int, index_bytes: int,
               interval: int, now_ms: int, preallocate: bool = False) -> "LogSegment":
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
                   time_entries=0, bytes_since_last_entry=0, preallocate=preallocate)

    # -- the file's blocks -------------------------------------------------------------------
    def _grow(self, end: int) -> None:
        """Give the .log its blocks up to at least ``end`` (SEGMENT_GROW_BYTES ahead, within the
        segment's size, or just ``end`` when the disk has no more). Readers map the file's size,
        so every byte they could touch has its blocks; a full disk is this ENOSPC, before
        anything of the batch is written."""
        if end <= self.capacity:
            return
        # preallocate=true (Kafka's FileRecords with preallocate): the whole segment.bytes at
        # the first append, as Kafka sizes a preallocated segment's file at its creation.
        ahead = self._limit if self.preallocate else self.capacity + SEGMENT_GROW_BYTES
        target = max(end, min(ahead, self._limit))
        self.capacity = grow_file(self._fd, self.capacity, target, end)

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

        Room first: the .log's blocks and, when this batch gets an index entry, the indexes'
        (``_grow``, ``reserve``). A full disk fails there with ENOSPC and nothing written. The
        copy is then one pwrite into the page cache, not a store through a map: pwrite fills
        whole pages (5+ GB/s, against 0.4-4 GB/s for stores that fault page by page), and
        readers' shared maps see the same page cache either way. A pwrite that fails anyway
        (an I/O error, a file system that does not keep fallocated blocks) leaves nothing
        counted: the segment's size does not move and the bytes it wrote are zeroed again."""
        pos = self.size
        if pos + size > self.capacity:
            self._grow(pos + size)
        index_due = self._bytes_since > self._interval
        if index_due:
            self.offset_index.reserve()
            self.time_index.reserve()
        written = os.pwrite(self._fd, batch, pos)      # raises with nothing written
        if written != size:
            self._zero(pos, written)
            raise OSError(errno.ENOSPC, f"short write of a record batch ({written} of {size} bytes)")
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = last_offset
        if pos == 0:
            self.first_batch_timestamp = max_timestamp
        if index_due:
            self.offset_index.append(last_offset, pos)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since = 0
        self._bytes_since += size
        self.size = pos + size
        self.next_offset = last_offset + 1
        return pos

    def _zero(self, pos: int, length: int) -> bool:
        """Overwrite [pos, pos + length) with zeros (blocks it already has: no new space), so
        that no reader or recovery can take them for a batch. False if even that fails."""
        try:
            if length > 0 and os.pwrite(self._fd, bytes(length), pos) != length:
                return False
        except OSError:
            return False
        return True

    def mark(self) -> SegmentMark:
        return SegmentMark(self.size, self.next_offset, self.max_timestamp,
                           self.offset_of_max_timestamp, self.first_batch_timestamp,
                           self._bytes_since)

    def rewind(self, mark: SegmentMark) -> None:
        """Take back every append made since ``mark`` (nothing of it may have been published):
        its bytes are zeroed (they are allocated, so this needs no space) and its index entries
        removed, so neither a reader nor a recovery after a crash ever sees them.
        LogDirFailure if the bytes cannot be overwritten."""
        if mark.size < self.size and not self._zero(mark.size, self.size - mark.size):
            raise LogDirFailure(f"cannot take back {self.size - mark.size} bytes of "
                                f"{log_path(self.directory, self.base_offset)}")
        self.offset_index.truncate_to(mark.next_offset)
        self.time_index.truncate_to(mark.next_offset)
        (self.size, self.next_offset, self.max_timestamp, self.offset_of_max_timestamp,
         self.first_batch_timestamp, self._bytes_since) = mark
        self._flushed = min(self._flushed, self.size)

    def flush(self) -> None:
        """fdatasync what was appended since the last flush; msync the indexes."""
        if self._flushed < self.size:
            os.fdatasync(self._fd)
            self._flushed = self.size
        self.offset_index.flush()
        self.time_index.flush()

    def info(self) -> SegmentInfo:
        return SegmentInfo(self.base_offset, self.size, self.next_offset, self.max_timestamp,
                           self.offset_of_max_timestamp, self.first_batch_timestamp, self.created_ms)

    def counts(self) -> tuple[int, int, int]:
        """(offset entries, time entries, bytes since the last offset entry): what reopening
        this segment for appends needs (``reopen``)."""
        return self.offset_index.entries, self.time_index.entries, self._bytes_since

    # -- closing ----------------------------------------------------------------------------
    def dup_fd(self) -> int:
        """A new descriptor of the .log file, for an fdatasync elsewhere (the writer's flusher
        thread): it stays valid after a roll closes ours. The caller closes it."""
        return os.dup(self._fd)

    def seal(self, sync_dir: bool = True, deferred: DeferredSync | None = None) -> SegmentInfo:
        """Make the segment inactive (roll or clean close): final time-index entry, truncate
        the .log to its size and fsync it, replace the indexes by trimmed copies (fsynced).
        ``sync_dir=False``: the caller fsyncs the directory next (a roll: the recovery point's
        checkpoint, which must not pass this segment before its files are durable anyway).

        The trimmed copies are written first, under temporary names: they are the only step
        that needs new blocks, so a full disk fails there (OSError) and leaves the segment
        active and whole. A failure after them is a LogDirFailure. The live indexes are not
        msynced (their trimmed copies replace them) nor the log fdatasynced before its
        truncation (the fsync after it covers the data too): a roll costs fewer syncs, which
        at small segments and 1 KiB records were most of the writer's time.

        ``deferred`` (a clean close of many partitions): nothing is fsynced here; the files
        changed are named to it, which makes them durable before any clean-shutdown marker."""
        tix = self.time_index
        # The reserved last slot is always free, except for a segment reopened under a smaller
        # segment.index.bytes: then the entry is skipped (largest timestamp read back lower).
        # Also skipped when the slot has no blocks and the disk none to give.
        if self.max_timestamp >= 0 and tix._n < tix.max_entries:
            try:
                tix.maybe_append(self.max_timestamp, self.offset_of_max_timestamp,
                                 skip_full_check=True)
            except OSError:
                pass
        sync = deferred is None
        tmps = write_tmp_copies([(ix.path, ix.valid_bytes())
                                 for ix in (self.offset_index, self.time_index)], sync=sync)
        try:
            os.ftruncate(self._fd, self.size)
            if sync:
                os.fsync(self._fd)
            self._flushed = self.size
        except OSError as e:
            for tmp, _ in tmps:
                _unlink_quietly(tmp)
            raise LogDirFailure(f"sealing {log_path(self.directory, self.base_offset)}: {e}") from e
        os.close(self._fd)
        self._fd = -1
        try:
            for tmp, path in tmps:
                os.replace(tmp, path)
            if deferred is not None:
                deferred.file(log_path(self.directory, self.base_offset))
                for _, path in tmps:
                    deferred.file(path)
                if self.txn_index.has_file():
                    deferred.file(self.txn_index.path)
            else:
                if sync_dir:
                    fsync_dir(self.directory)
                self.txn_index.fsync()
        except OSError as e:
            raise LogDirFailure(f"sealing the indexes of segment {self.base_offset}: {e}") from e
        finally:
            for ix in (self.offset_index, self.time_index):
                ix.close()
            self.txn_index.close()
        info = self.info()
        try:
            info.mtime_ms = int(os.stat(log_path(self.directory, self.base_offset)).st_mtime * 1000)
        except FileNotFoundError:
            pass
        return info

    def update_limits(self, *, segment_bytes: int, interval: int, preallocate: bool = False) -> None:
        """Apply changed topic settings."""
        self._limit = segment_bytes
        self.preallocate = preallocate
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
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
