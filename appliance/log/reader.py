"""Read-only access to a partition's log from processes other than its writer.

Fetchers use ``LogReader`` to turn (fetch offset, max bytes, high watermark) into byte ranges of
segment files; frontends use ``SegmentViews`` to copy those ranges into Fetch responses straight
from their own read-only maps. Both map files ``MAP_SHARED``/``PROT_READ``, so they see the
writer's appends through the page cache as soon as the writer has copied them.

Rules that keep a reader safe while the writer appends, rolls, deletes and restarts:

* Never touch a byte at or past the high watermark. Offsets are contiguous and the high watermark
  always falls on a batch boundary, so "a batch starts at offset e and e < high watermark" means
  the whole batch is written; the reader reads the header at a position only after establishing
  that (from the previous batch's last offset, or from an index entry <= the fetch offset). It
  never probes the bytes after the last published batch, which may be a batch being copied, or
  pages the writer has cut off with ``ftruncate`` (touching those would raise SIGBUS).
* Segment boundaries come from the segment list: the batch with offset e lives at offset 0 of the
  next segment when that segment's base offset is e, else right after the previous batch. Callers
  must ``refresh()`` when the state page's ``segments_version`` differs from the one they saw at
  the last refresh, before reading with a high watermark taken from that same state-page read
  (the writer creates a segment's files before it bumps the version, and bumps the version before
  it publishes any offset in the new segment).
* Index files are replaced (renamed over), never shrunk in place, so an old map stays valid;
  ``refresh()`` re-opens maps whose file was replaced. The active segment's index files grow
  (the writer gives them blocks a step at a time); a reader's map covers the file's size when
  it was opened and follows the growth (``appliance.log.index``). Index answers are only hints:
  the header found there must agree, else the segment is scanned from position 0.
* Every byte of a segment's or index's file has its blocks (the writer allocates them before
  it writes; see ``appliance.log.segment``), so a map never touches a hole: on tmpfs reading a
  hole through a map allocates a page, a SIGBUS when the tmpfs is full.
* Second line of defence for a caller that missed a refresh: before reading past the furthest
  batch it has verified in the last listed segment, the reader checks that file's real size (one
  ``stat``), and treats a shortfall as "stale: refresh and retry".
* A deleted segment stays readable through a map made before the unlink.
* Maps are cached per segment, at most ``max_open_segments`` of them (LRU), so a consumer reading
  a long log from the start does not exhaust ``vm.max_map_count``.

Bit rot (issue 34): a batch whose CRC-32C fails is never handed out. ``read`` checks the CRC of
every batch it returns (``verify_crc``, ``[log.scrub] verify_fetches``) unless this reader has
already checked that byte range of that file lately: each segment remembers one checked range of
positions, which a consumer reading forwards extends batch by batch, so that a second consumer,
or a fetch that hands the same batches out again, costs no second pass. The range is trusted for
``crc_trust_s`` (30 s) from its first check only: a page the kernel evicted and read back from a
disk that rotted meanwhile shows the reader's map other bytes, and a consumer group that reads
the same data an hour later gets them checked again. A bad batch after
good ones ends the read there (the good ones are served); a bad batch first is ``CorruptBatch``:
KAFKA_STORAGE_ERROR for that partition only, as Kafka answers for a log it cannot read. The
check is stateless across processes: each fetcher finds it again, so nothing has to be told to
anyone (the cleaner's scrub finds it without a reader; see docs/architecture.md, "Bit rot").

ListOffsets by timestamp reads the (offset, timestamp) of a batch's records without building
keys or values, inflating a compressed batch no further than ``max_decompressed_bytes``.

Aborted transactions for read_committed fetches (``collect_aborted``) come from the segments'
``.txnindex`` files, read with ``pread`` (never mapped). The file of a segment that is not the
last listed one is complete (the writer only appends to the active segment's) and is cached
until the next ``refresh()``; the last one is read again on every call. Entries whose marker is
at or past the caller's high watermark are not trusted (the writer appends an entry before it
publishes a high watermark past its marker).
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
import time
from collections import OrderedDict
from typing import Iterable, NamedTuple

from appliance.errors import CorruptRecord, ErrorCode, KafkaError
from appliance.log.files import (index_path, list_segment_bases, log_path, retired_log_path,
                                 timeindex_path, txnindex_path)
from appliance.log.index import OffsetIndex, TimeIndex
from appliance.log.txn_index import AbortedTxn, collect_entries, read_entries
from appliance.protocol.record_contents import DEFAULT_DECOMPRESSED_FACTOR, offsets_and_timestamps
from appliance.protocol.records import (ATTRIBUTES_OFFSET, HEADER_SIZE, MAGIC, BatchHeader,
                                        read_header)
from crc32c import crc32c

__all__ = ["Slice", "ReadResult", "LogReader", "SegmentViews", "CorruptBatch"]


class CorruptBatch(KafkaError):
    """A stored batch failed its CRC-32C (bit rot, a damaged disk): KAFKA_STORAGE_ERROR for its
    partition. ``path``, ``position`` and ``offset`` (the batch's base offset) say where."""

    def __init__(self, path: str, position: int, offset: int, last_offset: int) -> None:
        super().__init__(ErrorCode.kafka_storage_error,
                         f"record batch at offset {offset} (position {position} of {path}) "
                         "fails its CRC: the log cannot be read there")
        self.path = path
        self.position = position
        self.offset = offset
        self.last_offset = last_offset


class Slice(NamedTuple):
    segment_base: int
    position: int
    length: int
    inode: int = 0             # of the .log read (a cleaner swap puts another file under the name)


class ReadResult(NamedTuple):
    slices: list[Slice]
    bytes: int
    first_batch_offset: int    # -1 when nothing was returned
    next_offset: int = -1      # just past the last batch returned; the fetch offset when none
                               # (read_committed: the upper bound for collect_aborted)


class _Stale(Exception):
    """The segment list or a map no longer matches the files: refresh and retry."""


class _Segment:
    __slots__ = ("directory", "base", "known_end", "_log", "_log_len", "_oidx", "_tidx",
                 "txn_cache", "ino", "end", "crc_lo", "crc_hi", "crc_since")

    def __init__(self, directory: str, base: int) -> None:
        self.directory = directory
        self.base = base
        self.known_end = 0          # end of the furthest batch verified in this segment
        self._log: mmap.mmap | None = None
        self._log_len = 0
        self.ino = 0                # inode of the mapped .log (0: not mapped yet)
        self.end = -1               # real size of a sealed segment (-1: not looked at since refresh)
        self._oidx: OffsetIndex | None = None
        self._tidx: TimeIndex | None = None
        self.txn_cache: list[AbortedTxn] | None = None   # .txnindex entries, sealed segments only
        # Positions [crc_lo, crc_hi) of the mapped file hold batches whose CRC this reader checked,
        # the first of them at crc_since (monotonic s).
        self.crc_lo = self.crc_hi = 0
        self.crc_since = 0.0

    def crc_ok(self, pos: int, size: int, crc: int, now: float, trust_s: float) -> bool:
        """Whether the batch at ``pos`` (``size`` bytes) matches its stored CRC (taken on trust
        inside the range checked in the last ``trust_s`` seconds)."""
        end = pos + size
        if now - self.crc_since > trust_s:
            self.crc_lo = self.crc_hi = 0
        if self.crc_lo <= pos and end <= self.crc_hi:
            return True
        with memoryview(self.log(end)) as mv, mv[pos + ATTRIBUTES_OFFSET:end] as body:
            if crc32c(body) != crc:
                return False
        if self.crc_hi > self.crc_lo and self.crc_lo <= pos <= self.crc_hi:
            self.crc_hi = max(self.crc_hi, end)
        else:
            self.crc_lo, self.crc_hi, self.crc_since = pos, end, now
        return True

    def log(self, need_end: int) -> mmap.mmap:
        """A map of the .log covering [0, need_end); remaps when the file has grown."""
        if self._log is not None and need_end <= self._log_len:
            return self._log
        try:
            fd = os.open(log_path(self.directory, self.base), os.O_RDONLY)
        except FileNotFoundError:
            raise _Stale from None
        try:
            m, st = _map_whole(fd)
            size = st.st_size
            if size < need_end or (self.ino and st.st_ino != self.ino):
                # Shorter than what we know is there, or another file under the name (a cleaner
                # swap): what we read so far came from the old one.
                m.close()
                raise _Stale
        finally:
            os.close(fd)
        if self._log is not None:
            self._log.close()
        if self.ino != st.st_ino:
            self.crc_lo = self.crc_hi = 0
        self._log, self._log_len, self.ino = m, size, st.st_ino
        return m

    def sealed_end(self) -> int:
        """The real size of this sealed segment's .log (one stat after each refresh): positions
        below it hold whole batches. _Stale if the file under the name is not the one mapped."""
        if self.end < 0:
            try:
                st = os.stat(log_path(self.directory, self.base))
            except FileNotFoundError:
                raise _Stale from None
            if self.ino and st.st_ino != self.ino:
                raise _Stale
            self.end = st.st_size
        return self.end

    def offset_index(self) -> OffsetIndex | None:
        if self._oidx is None:
            try:
                self._oidx = OffsetIndex(index_path(self.directory, self.base), self.base)
            except FileNotFoundError:
                return None
        return self._oidx

    def time_index(self) -> TimeIndex | None:
        if self._tidx is None:
            try:
                self._tidx = TimeIndex(timeindex_path(self.directory, self.base), self.base)
            except FileNotFoundError:
                return None
        return self._tidx

    def replaced(self) -> bool:
        """Whether a file we hold was replaced since we opened it (a cleaner swap renames new
        files over a segment's names), or an index resized (a writer reopening a trimmed index
        grows it in place)."""
        if self._log is not None:
            try:
                if os.stat(log_path(self.directory, self.base)).st_ino != self.ino:
                    return True
            except FileNotFoundError:
                return True
        for ix, path in ((self._oidx, index_path), (self._tidx, timeindex_path)):
            if ix is None:
                continue
            try:
                st = os.stat(path(self.directory, self.base))
            except FileNotFoundError:
                return True
            if st.st_ino != ix.inode or st.st_size != ix.file_size:
                return True
        return False

    def close(self) -> None:
        for ix in (self._oidx, self._tidx):
            if ix is not None:
                ix.close()
        self._oidx = self._tidx = None
        if self._log is not None:
            self._log.close()
            self._log = None
            self._log_len = 0
        self.ino = 0
        self.crc_lo = self.crc_hi = 0


def _map_whole(fd: int) -> tuple[mmap.mmap, os.stat_result]:
    """A read-only map of the whole file and the stat it was made with. A roll cuts the active
    segment to its size under us (regression: "mmap length is greater than file size" between
    the fstat and the mmap, answered UNKNOWN_SERVER_ERROR): look again."""
    for _ in range(3):
        st = os.fstat(fd)
        if st.st_size == 0:
            raise _Stale
        try:
            return mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ), st
        except ValueError:
            continue
    raise _Stale


def _sealed_max_timestamp(directory: str, base: int) -> int:
    """The largest timestamp of a sealed segment: the last entry of its trimmed time index (the
    writer appends it when sealing), read with one pread - no map. -1 when unknown."""
    try:
        fd = os.open(timeindex_path(directory, base), os.O_RDONLY)
    except FileNotFoundError:
        return 1 << 62            # unknown: search the segment
    try:
        size = os.fstat(fd).st_size
        if size < 12 or size % 12:
            return -1 if size == 0 else 1 << 62
        return struct.unpack(">q", os.pread(fd, 8, size - 12))[0]
    finally:
        os.close(fd)


# A read that finds the files changed under its segment list (_Stale) lists them again and
# reads again. A roll or a retention delete needs one retry, but a cleaner swap is several
# renames (a group's indexes, then its log, then the retired names of its other segments), so a
# listing made in the middle of one goes stale again at the next rename; on a loaded machine
# the writer can be descheduled between them. Answering CORRUPT_MESSAGE then would fail a
# healthy consumer (librdkafka hands it to the application as INVALID_MSG, seen once while a
# consumer read across swaps). Only a log that stays inconsistent after these retries is
# reported corrupt.
STALE_RETRIES = 8
# How long a byte range whose batches passed their CRC is taken on trust (see the docstring).
CRC_TRUST_S = 30.0


def _out_of_range(offset: int, lso: int, hw: int) -> KafkaError:
    return KafkaError(ErrorCode.offset_out_of_range,
                      f"fetch offset {offset} is outside [{lso}, {hw}]")


class LogReader:
    """Read-only view of one partition directory (any process, any number of them).

    At most ``max_open_segments`` segments keep their maps open (least recently used are
    closed): a consumer reading a long log from the start must not pile up one mapping per
    segment (vm.max_map_count). Nothing handed out refers to these maps, so closing is safe.
    """

    def __init__(self, directory: str, *, max_open_segments: int = 8,
                 max_decompressed_bytes: int = DEFAULT_DECOMPRESSED_FACTOR * 1048588,
                 verify_crc: bool = True, bases: list[int] | None = None) -> None:
        """``bases``: the segment list, when the caller knows it is current (a fetcher reopening
        a partition whose segments_version has not moved since it last listed the directory);
        else the directory is listed."""
        self.directory = directory
        # Check the CRC of every batch ``read`` hands out (each byte range once per crc_trust_s).
        self.verify_crc = verify_crc
        self.crc_trust_s = CRC_TRUST_S
        # Timestamp lookups walk a compressed batch's records: never inflating more than this.
        self.max_decompressed_bytes = max_decompressed_bytes
        self._segs: list[_Segment] = []
        self._bases: list[int] = []
        self._open: OrderedDict[int, _Segment] = OrderedDict()
        self._max_open = max(2, max_open_segments)
        self.refresh(bases)

    def _seg(self, i: int) -> _Segment:
        seg = self._segs[i]
        lru = self._open
        if seg.base in lru:
            lru.move_to_end(seg.base)
        else:
            lru[seg.base] = seg
            while len(lru) > self._max_open:
                lru.popitem(last=False)[1].close()
        return seg

    def refresh(self, bases: list[int] | None = None) -> None:
        """Re-list segments (call when the state page's segments_version changed); ``bases``:
        the list, known current, instead of the directory's listing."""
        old = {s.base: s for s in self._segs}
        segs = []
        for b in (list_segment_bases(self.directory) if bases is None else bases):
            s = old.pop(b, None)
            if s is not None and s.replaced():
                s.close()
                s = None
            segs.append(s or _Segment(self.directory, b))
        for s in old.values():
            s.close()
        for s in segs:
            # A restarted writer may have rebuilt .txnindex files; only a refresh sees that. A
            # segment that was the last listed may have been sealed (cut to its size) since.
            s.txn_cache = None
            s.end = -1
        self._segs = segs
        self._bases = [s.base for s in segs]
        live = {s.base: s for s in segs}
        self._open = OrderedDict((b, live[b]) for b in self._open if b in live and live[b] is self._open[b])

    def segment_bases(self) -> list[int]:
        return list(self._bases)

    def close(self) -> None:
        for s in self._segs:
            s.close()
        self._segs, self._bases = [], []
        self._open.clear()

    # -- walking -----------------------------------------------------------------------------
    # Offsets increase but need not be contiguous: a cleaner removes records and whole batches
    # (Kafka keeps each retained batch's base offset and last offset delta), so the batch after
    # one ending at offset e starts at e or later, and a sealed segment may end before the next
    # one's base offset, or be empty. The last listed segment (the active one) is never cleaned:
    # its batches are contiguous from its base offset, and its bytes past the published end are
    # never read. While a cleaner swap is being made, the cleaned copy of a group of segments may
    # be listed beside the old segments it replaces: a batch that ends below what was already
    # read is one of those and is skipped, so a reader sees the old or the new data of a range,
    # in offset order, never twice.

    def _header(self, i: int, pos: int) -> BatchHeader:
        """The header of a batch known to be published at (segment i, pos).

        Past the furthest batch verified so far in the last listed segment, the file's real size
        is checked first: if a caller skipped a refresh after a roll, that segment may have been
        cut to its real size under our (larger) map, and reading there would be a SIGBUS."""
        seg = self._seg(i)
        file_size = -1
        if pos + HEADER_SIZE > seg.known_end and i == len(self._segs) - 1:
            try:
                file_size = os.stat(log_path(self.directory, seg.base)).st_size
            except FileNotFoundError:
                raise _Stale from None
            if pos + HEADER_SIZE > file_size:
                raise _Stale
        m = seg.log(pos + HEADER_SIZE)
        h = read_header(m, pos)
        size = h.batch_length + 12
        if h.magic != MAGIC or size < HEADER_SIZE or h.base_offset < seg.base:
            raise _Stale
        end = pos + size
        if 0 <= file_size < end:
            raise _Stale
        seg.log(end)
        if end > seg.known_end:
            seg.known_end = end
        return h

    def _from(self, i: int, pos: int, target: int, hw: int, *, after: bool = True
              ) -> tuple[int, int, BatchHeader] | None:
        """The first batch at (segment i, pos) or after it whose last offset is >= ``target``,
        or None when there is none below ``hw``. ``after``: everything before (i, pos) was
        read and ends just below ``target``, so the batch found must start at ``target`` or
        later; a batch that would straddle it belongs to another version of the log (stale)."""
        if target >= hw:
            return None
        bases = self._bases
        n = len(bases)
        while True:
            if i + 1 < n:
                # A sealed segment: past its end, or wholly below the offset looked for, the
                # batch is in a later one.
                if bases[i + 1] <= target or pos >= self._seg(i).sealed_end():
                    i, pos = i + 1, 0
                    continue
            elif pos == 0 and bases[i] >= hw:
                return None            # the active segment's first batch is not published
            h = self._header(i, pos)
            if h.last_offset >= target:
                if after and h.base_offset < target:
                    raise _Stale
                return i, pos, h
            pos += h.batch_length + 12

    def _locate(self, i: int, target: int, hw: int) -> tuple[int, int, BatchHeader] | None:
        """The batch in segment i (or later) whose last offset is >= target, or None when
        there is none below ``hw``. The offset index is a hint: the batch at the position of an
        entry must end at the entry's offset (the index files and the log of a cleaner swap may
        be seen mixed for a moment), else the segment is walked from its start."""
        if target >= hw:
            return None
        seg = self._seg(i)
        oidx = seg.offset_index()
        if oidx is not None:
            off, pos = oidx.lookup(target)
            if pos:
                try:
                    h = self._header(i, pos)
                except _Stale:
                    h = None
                if h is not None and h.last_offset == off:
                    if off >= target:
                        return i, pos, h
                    return self._from(i, pos + h.batch_length + 12, target, hw, after=False)
        return self._from(i, 0, target, hw, after=False)

    def _retrying(self, fn, after_refresh=None):
        """``fn()``, listing the segments again each time it finds them stale (STALE_RETRIES
        times); ``after_refresh`` checks each new listing. Still stale: CORRUPT_MESSAGE."""
        for _ in range(STALE_RETRIES):
            try:
                return fn()
            except _Stale:
                self.refresh()
            if after_refresh is not None:
                after_refresh()
        try:
            return fn()
        except _Stale:
            raise CorruptRecord(f"log of {self.directory} does not match its segment list") from None

    def max_timestamp(self, high_watermark: int, *, log_start_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp below the high
        watermark (ListOffsets MAX_TIMESTAMP, v7+); None for an empty log."""
        return self._retrying(lambda: _max_timestamp_impl(self, high_watermark, log_start_offset))

    # -- fetch -------------------------------------------------------------------------------
    def read(self, fetch_offset: int, max_bytes: int, *, high_watermark: int, log_start_offset: int,
             min_one_batch: bool, max_offset: int | None = None, through: int = -1,
             ahead: int = 0) -> ReadResult:
        """Whole batches from the one containing ``fetch_offset``, up to ``max_bytes`` (but at
        least one batch when ``min_one_batch``, Kafka's progress rule), never reaching
        ``max_offset`` (default: the high watermark; read_committed: the last stable offset);
        may span segments. Consecutive batches of a segment form one Slice.

        The fetch offset must lie in [log start, high watermark] (else OFFSET_OUT_OF_RANGE); one
        at or above ``max_offset`` but within that range gets nothing and no error, as Kafka's
        LocalLog.read checks the range against the log end and answers an empty read past its
        ``maxOffsetMetadata`` (a read_committed consumer positioned between the LSO and the
        high watermark waits; it must not be reset).

        ``through`` (>= 0, a ShareFetch's read): end with the batch holding that offset and at
        most ``ahead`` batches after it, whatever ``max_bytes`` allows: a share member is sent
        only what it acquired, and a read bounded by bytes alone walked every batch header up
        to the client's fetch.max.bytes (50 MB) on each ShareFetch."""
        hw = high_watermark
        if fetch_offset < log_start_offset or fetch_offset > hw:
            raise _out_of_range(fetch_offset, log_start_offset, hw)
        if max_offset is not None and max_offset < hw:
            hw = max_offset
        if fetch_offset >= hw:
            return ReadResult([], 0, -1, fetch_offset)

        def below_the_log() -> None:
            if not self._bases or fetch_offset < self._bases[0]:
                # The caller's log start offset is older than a retention delete.
                raise _out_of_range(fetch_offset, self._bases[0] if self._bases else hw, hw)
        return self._retrying(
            lambda: self._read(fetch_offset, max_bytes, hw, log_start_offset, min_one_batch,
                               through, ahead),
            below_the_log)

    def _read(self, fetch_offset: int, max_bytes: int, hw: int, lso: int, min_one: bool,
              through: int = -1, ahead: int = 0) -> ReadResult:
        i = bisect.bisect_right(self._bases, fetch_offset) - 1
        if i < 0:
            raise _Stale
        slices: list[Slice] = []
        total = 0
        first = -1
        nxt = fetch_offset
        got = self._locate(i, fetch_offset, hw)
        now = time.monotonic() if self.verify_crc else 0.0
        past = -1 if through >= 0 else -2       # batches taken after the one holding ``through``
        while got is not None:
            i, pos, h = got
            size = h.batch_length + 12
            if h.last_offset >= hw:
                break
            if past >= ahead:
                break
            if past >= 0 or (past == -1 and h.last_offset >= through):
                past += 1
            if total + size > max_bytes and not (total == 0 and min_one):
                break
            seg = self._segs[i]
            if self.verify_crc and not seg.crc_ok(pos, size, h.crc, now, self.crc_trust_s):
                if slices:
                    break              # serve the good batches before it; the next read fails
                raise CorruptBatch(log_path(self.directory, seg.base), pos, h.base_offset,
                                   h.last_offset)
            ino = seg.ino
            if slices and slices[-1].segment_base == self._bases[i] and \
                    slices[-1].position + slices[-1].length == pos and slices[-1].inode == ino:
                s = slices[-1]
                slices[-1] = Slice(s.segment_base, s.position, s.length + size, ino)
            else:
                slices.append(Slice(self._bases[i], pos, size, ino))
            if first < 0:
                first = h.base_offset
            total += size
            nxt = h.last_offset + 1
            if total >= max_bytes:
                break
            got = self._from(i, pos + size, nxt, hw)
        return ReadResult(slices, total, first, nxt)

    # -- aborted transactions (read_committed) ------------------------------------------------
    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int,
                        high_watermark: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of every aborted transaction intersecting
        ``[fetch_offset, upper_bound_offset)`` - Kafka's LocalLog.collectAbortedTransactions:
        the ``.txnindex`` of the segment holding ``fetch_offset``, then each later one, until an
        entry's stored LSO reaches the upper bound. Only entries whose marker is below
        ``high_watermark`` count. Call with the ``next_offset`` of the read that produced the
        data as the upper bound, after a ``refresh()`` if the segments changed."""
        bases = self._bases
        i = bisect.bisect_right(bases, fetch_offset) - 1
        if i < 0:
            i = 0
        out: list[tuple[int, int]] = []
        n = len(bases)
        for j in range(i, n):
            if bases[j] >= high_watermark:
                break              # every entry there has its marker at or past the HW
            seg = self._segs[j]
            entries = seg.txn_cache
            if entries is None:
                try:
                    entries = read_entries(txnindex_path(self.directory, seg.base))
                except ValueError as e:
                    raise KafkaError(ErrorCode.unknown_server_error,
                                     f"aborted-transaction index of segment {seg.base} in "
                                     f"{self.directory}: {e}") from None
                if j < n - 1:
                    seg.txn_cache = entries
            found, complete = collect_entries(entries, fetch_offset, upper_bound_offset, high_watermark)
            out.extend((e.producer_id, e.first_offset) for e in found)
            if complete:
                break
        return out

    # -- timestamps --------------------------------------------------------------------------
    def offset_for_timestamp(self, timestamp: int, high_watermark: int, *,
                             log_start_offset: int = 0) -> tuple[int, int] | None:
        """Kafka's lookup by timestamp: (offset, timestamp) of the first record at or after
        ``log_start_offset`` and below the high watermark whose timestamp is >= ``timestamp``
        (time index floor, offset index floor, then batch headers, then the records of the first
        batch whose max timestamp qualifies)."""
        return self._retrying(lambda: self._offset_for_timestamp(timestamp, high_watermark,
                                                                 log_start_offset))

    def _offset_for_timestamp(self, target: int, hw: int, lso: int) -> tuple[int, int] | None:
        n = len(self._segs)
        for i in range(n):
            base = self._bases[i]
            next_base = self._bases[i + 1] if i + 1 < n else None
            if base >= hw:
                break
            if next_base is not None and next_base <= lso:
                continue
            start = max(lso, base)
            if start >= hw:
                return None
            if next_base is not None and _sealed_max_timestamp(self.directory, base) < target:
                continue            # Kafka picks the first segment whose largest timestamp >= target
            seg = self._seg(i)
            tidx = seg.time_index()
            t_off = tidx.lookup(target)[1] if tidx is not None else base
            # An index entry may already describe a batch past the HW: never walk from there.
            got = self._locate(i, min(max(t_off, start), hw - 1), hw)
            while got is not None and got[0] == i:     # else the next iteration covers it
                _, pos, h = got
                if h.last_offset >= hw:
                    return None
                if h.max_timestamp >= target and h.last_offset >= start:
                    size = h.batch_length + 12
                    for off, ts in offsets_and_timestamps(seg.log(pos + size)[pos:pos + size],
                                                          max_bytes=self.max_decompressed_bytes):
                        if ts >= target and start <= off < hw:
                            return off, ts
                expected = h.last_offset + 1
                if next_base is not None and expected >= next_base:
                    break
                got = self._from(i, pos + h.batch_length + 12, expected, hw)
        return None


def _max_timestamp_impl(reader: "LogReader", hw: int, lso: int) -> tuple[int, int] | None:
    """Kafka's MAX_TIMESTAMP lookup (UnifiedLog.fetchOffsetByTimestamp): the segment with the
    largest timestamp (the first such), then the first batch there whose max timestamp is it,
    then the first record of that batch carrying it (RecordBatch.offsetOfMaxTimestamp)."""
    best: tuple[int, int] | None = None          # (max timestamp, segment index)
    n = len(reader._segs)
    for i in range(n):
        base = reader._bases[i]
        if base >= hw:
            break
        next_base = reader._bases[i + 1] if i + 1 < n else None
        if next_base is not None and next_base <= lso:
            continue
        if next_base is not None and next_base <= hw:
            ts = _sealed_max_timestamp(reader.directory, base)
            if ts < (1 << 62):
                if best is None or ts > best[0]:
                    best = (ts, i)
                continue
        ts = -1                                  # active (or unknown): walk its headers
        for h in _headers_below(reader, i, max(lso, base), hw):
            ts = max(ts, h[2].max_timestamp)
        if best is None or ts > best[0]:
            best = (ts, i)
    if best is None or best[0] < 0:
        return None
    target, i = best
    for _, pos, h in _headers_below(reader, i, max(lso, reader._bases[i]), hw):
        if h.max_timestamp == target:
            size = h.batch_length + 12
            seg = reader._seg(i)
            for off, ts in offsets_and_timestamps(seg.log(pos + size)[pos:pos + size],
                                                  max_bytes=reader.max_decompressed_bytes):
                if ts == target and lso <= off < hw:
                    return off, ts
    return None


def _headers_below(reader: "LogReader", i: int, start: int, hw: int):
    """(segment index, position, header) of the batches of segment i from ``start`` below hw."""
    next_base = reader._bases[i + 1] if i + 1 < len(reader._bases) else None
    if start >= hw or (next_base is not None and start >= next_base):
        return
    got = reader._locate(i, start, hw)
    while got is not None and got[0] == i:
        _, pos, h = got
        if h.last_offset >= hw:
            return
        yield i, pos, h
        expected = h.last_offset + 1
        if next_base is not None and expected >= next_base:
            return
        got = reader._from(i, pos + h.batch_length + 12, expected, hw)


class SegmentViews:
    """Per-process cache of read-only maps of segment files, handing out memoryviews.

    A frontend copies Fetch answers from these views into the response. Maps are keyed by
    (partition dir, segment base) and remember the inode they map: a slice names the inode the
    fetcher read, and a cleaner swap puts another file under the same name, so a map of another
    inode is replaced by the file now under the name or, when the slice was read from the
    replaced file, by that file under its retired name (``files.retired_log_path``, kept by the
    writer for ``log.segment_delete_delay_ms``). ``forget`` drops those of deleted segments, and
    at most ``max_maps`` stay cached (least recently used go first). Dropping only forgets our
    reference: a view handed out earlier keeps its map (and an unlinked file) alive until it is
    released.
    """

    def __init__(self, *, max_maps: int = 1024) -> None:
        self._maps: OrderedDict[tuple[str, int], tuple[memoryview, int]] = OrderedDict()
        self._max_maps = max(1, max_maps)
        self._round: list[tuple[str, list[int]]] = []     # the sweep's directories still to look at

    def view(self, partition_dir: str, segment_base: int, position: int, length: int,
             inode: int = 0) -> memoryview:
        """``inode``: of the file the range was read from (0: whichever is under the name)."""
        key = (partition_dir, segment_base)
        maps = self._maps
        got = maps.get(key)
        end = position + length
        if got is None or end > got[0].nbytes or (inode and got[1] != inode):
            got = self._open(partition_dir, segment_base, end, inode)
            maps[key] = got
            while len(maps) > self._max_maps:
                maps.popitem(last=False)
        maps.move_to_end(key)
        return got[0][position:end]

    @staticmethod
    def _open(partition_dir: str, segment_base: int, end: int, inode: int) -> tuple[memoryview, int]:
        paths = [log_path(partition_dir, segment_base)]
        if inode:
            paths.append(retired_log_path(partition_dir, segment_base, inode))
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    m, st = _map_whole(fd)
                except _Stale:
                    continue                # empty, or cut again and again under us
                if inode and st.st_ino != inode:
                    m.close()
                    continue
                if st.st_size < end:
                    m.close()
                    raise ValueError(f"range end {end} is past the end ({st.st_size}) of segment "
                                     f"{segment_base} of {partition_dir}")
                return memoryview(m), st.st_ino
            finally:
                os.close(fd)
        raise KafkaError(ErrorCode.offset_out_of_range,
                         f"segment {segment_base} of {partition_dir} was deleted or replaced")

    def forget(self, partition_dir: str, keep: Iterable[int] | None = None) -> None:
        """Drop the maps of ``partition_dir`` whose segment base is not in ``keep`` (default:
        the segments that still exist on disk). Call it when segments_version changes."""
        if keep is None:
            try:
                keep = list_segment_bases(partition_dir)
            except FileNotFoundError:
                keep = ()
        keep_set = set(keep)
        for key in [k for k in self._maps if k[0] == partition_dir and k[1] not in keep_set]:
            del self._maps[key]

    def forget_prefix(self, prefix: str) -> None:
        """Drop every map whose partition dir starts with ``prefix`` (a deleted topic)."""
        for key in [k for k in self._maps if k[0].startswith(prefix)]:
            del self._maps[key]

    def sweep(self, budget: int | None = None) -> bool:
        """Forget the maps of segments that no longer exist, in every cached directory: a map
        keeps an unlinked file's disk space, so retention frees nothing until this runs.

        A round lists each directory that has maps once. With ``budget`` a call looks at most
        that many directories, the round going on where the last call stopped (the directories
        and their maps as the round began; later maps wait for the next round): a frontend with
        the maps of 1,024 partitions did the whole round in one tick, every directory's listing
        and a walk over every map for each, a stall of its event loop every 5 s that was its
        produce latency's tail (issue 32 goal 5). True when the round is done."""
        if not self._round:
            by_dir: dict[str, list[int]] = {}
            for d, base in self._maps:
                by_dir.setdefault(d, []).append(base)
            self._round = list(by_dir.items())
        n = len(self._round) if budget is None else min(budget, len(self._round))
        for _ in range(n):
            d, bases = self._round.pop()
            try:
                keep = set(list_segment_bases(d))
            except FileNotFoundError:
                keep = set()
            for base in bases:
                if base not in keep:
                    self._maps.pop((d, base), None)
        return not self._round

    def close(self) -> None:
        self._maps.clear()
