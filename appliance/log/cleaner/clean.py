"""One cleaning round over one partition (Kafka's Cleaner: doClean, buildOffsetMap,
cleanSegments, cleanInto and MemoryRecords.filterTo).

Run by a cleaner process (``workers/cleaner.py``), or by a test, never by the partition's writer:
it reads sealed segments through read-only maps and writes ``<base>.log.cleaned`` with its
``.index.cleaned``, ``.timeindex.cleaned`` and ``.txnindex.cleaned`` beside them, then hands
each group to ``swap`` (the writer's CleanerSwapRequest), which is the only thing that changes
the partition's files. Single-threaded; ``check_done`` is called between batches (the worker
beats its heartbeat and raises ``CleaningAborted`` on SIGTERM there) and ``throttle`` with the
bytes read and written (log.cleaner.io.max.bytes.per.second).

A round:

1. the key map (``OffsetMap``) over the dirty segments: every key of a record at or after the
   first dirty offset, in a data batch that is not part of an aborted transaction, with the
   offset of its latest record; it stops when the map is full, and the round then cleans up to
   the last offset mapped (the end offset, the next round's first dirty offset);
2. the segments below the end offset, in groups (``plan.group_segments``), each rewritten batch
   by batch, in log order, with one ``CleanedTransactionMetadata`` for the whole round:

   =========================================  =================================================
   batch                                      what is kept
   =========================================  =================================================
   data of an aborted transaction             no record
   other data                                 each record whose offset is past the map's end,
                                              or whose key maps to this offset or an older one;
                                              a tombstone (null value) only while its batch has
                                              no delete horizon or it has not passed; a record
                                              without a key never (as Kafka)
   COMMIT/ABORT marker that may not go yet    the marker
   (data of its transaction was seen)
   marker that may go                         the marker until its delete horizon has passed
   =========================================  =================================================

   A batch that keeps every record and needs no delete horizon is copied as it is; one that
   keeps some is rebuilt (``records.build_retained_batch``: same base offset and last offset
   delta, so offsets of removed records stay gaps and a producer's last sequence stays
   readable); one that keeps none goes, except - kept as an empty batch, the header alone
   (``records.build_empty_batch``) - the last batch of a producer that has not expired (its id,
   epoch and last sequence: KIP-98's "PID Expiration for Compacted Topics", Kafka's
   lastRecordsOfActiveProducers: the batch holding its last data offset, or its last marker when
   it has no data since its epoch changed) and the last batch before the first uncleanable
   offset (so that the offset before it is still there after cleaning). A batch that keeps a
   tombstone, or a marker that may go, and has no delete horizon gets one: now plus
   ``delete.retention.ms`` (KIP-534; Kafka's two-pass removal of tombstones and markers).
"""

from __future__ import annotations

import mmap
import os
import time
from hashlib import md5
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from appliance.errors import KafkaError
from appliance.log.cleaner.offset_map import OffsetMap
from appliance.log.cleaner.plan import Cleanable, SegmentFile, dirty_segments, group_segments
from appliance.log.cleaner.txn_meta import CleanedTransactionMetadata
from appliance.log.files import (CLEANED_SUFFIX, index_path, list_segment_bases, log_path,
                                 timeindex_path, txnindex_path)
from appliance.durable import fsync_dir
from appliance.log.index import OffsetIndex, encode_offset_entries, encode_time_entries
from appliance.log.partition_log import LogSettings
from appliance.log.segment import build_index_entries
from appliance.log.txn_index import AbortedTxn, collect_entries, encode_entry, read_entries
from appliance.protocol.record_contents import stored_records
from appliance.protocol.records import (BatchHeader, build_empty_batch, build_retained_batch,
                                        iter_batch_headers, parse_control_record)

__all__ = ["LastRecord", "CleanedGroup", "RoundStats", "CleaningAborted", "Cleaner",
           "cleaned_paths"]


class CleaningAborted(Exception):
    """The round stops: the process is told to stop, a segment went away, or the writer
    refused a swap. Nothing of the partition changed beyond the groups already swapped."""


class LastRecord(NamedTuple):
    """What a producer that has not expired last wrote (Kafka's LastRecord): the last offset of
    its last data batch (-1 when it has written no data since its epoch changed) and its epoch."""
    last_data_offset: int
    producer_epoch: int


def cleaned_paths(directory: str, base: int) -> dict[str, str]:
    """The files a group cleaned into segment ``base`` is written to, by their live suffix."""
    return {".log": log_path(directory, base) + CLEANED_SUFFIX,
            ".index": index_path(directory, base) + CLEANED_SUFFIX,
            ".timeindex": timeindex_path(directory, base) + CLEANED_SUFFIX,
            ".txnindex": txnindex_path(directory, base) + CLEANED_SUFFIX}


@dataclass(frozen=True)
class CleanedGroup:
    """One group cleaned into ``<base>.*.cleaned``, to be swapped in for ``old``."""
    base: int
    old: list[SegmentFile]
    size: int


# Groups are handed over for the swap once the segments they replace hold this many bytes (and
# at the end of the round): one commit covers many small groups, while the copies waiting for it
# take at most about this much disk.
SWAP_BATCH_BYTES = 256 << 20


@dataclass
class RoundStats:
    """Kafka's CleanerStats."""
    bytes_read: int = 0
    bytes_written: int = 0
    messages_read: int = 0
    messages_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    buffer_utilization: float = 0.0
    invalid_messages: int = 0
    groups: int = 0
    end_offset: int = -1
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0

    @property
    def recopy_percent(self) -> float:
        return 100.0 * self.bytes_written / self.bytes_read if self.bytes_read else 0.0


# Batch retention (Kafka's RecordFilter.BatchRetention).
_DELETE, _RETAIN_EMPTY, _DELETE_EMPTY = range(3)


class _Mapped:
    """A sealed segment's .log, mapped read-only for the round."""

    def __init__(self, directory: str, seg: SegmentFile) -> None:
        path = log_path(directory, seg.base)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CleaningAborted(f"segment {seg.base} of {directory} went away") from None
        try:
            st = os.fstat(fd)
            if st.st_ino != seg.ino or st.st_size != seg.size:
                raise CleaningAborted(f"segment {seg.base} of {directory} changed")
            self.map = mmap.mmap(fd, seg.size, mmap.MAP_SHARED, mmap.PROT_READ) if seg.size else None
        finally:
            os.close(fd)
        self.size = seg.size

    def batches(self, start: int = 0):
        """(header, bytes) of each batch from position ``start``: copies, so that nothing of
        the round holds the map when it is closed."""
        m = self.map
        if m is None:
            return
        for pos, h in iter_batch_headers(m, start, self.size):
            yield h, m[pos:pos + h.batch_length + 12]

    def close(self) -> None:
        if self.map is not None:
            self.map.close()


def _control_type(h: BatchHeader, batch) -> int | None:
    if h.records_count == 0:
        return None
    try:
        return parse_control_record(batch)[0]
    except KafkaError:
        return -1                    # unreadable: not a transaction marker, kept as it is


class _CleanedWriter:
    """The ``.cleaned`` files of one group, written sequentially, then sealed like a rolled
    segment: trimmed indexes with the final time-index entry, everything fsynced."""

    def __init__(self, directory: str, base: int, interval: int) -> None:
        self.directory = directory
        self.base = base
        self.interval = interval
        self.paths = cleaned_paths(directory, base)
        for p in self.paths.values():
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self.f = open(self.paths[".log"], "wb")
        self.pos = 0
        self.headers: list[tuple[int, BatchHeader]] = []
        self.aborted: list[AbortedTxn] = []

    def append(self, h: BatchHeader, data) -> None:
        self.f.write(data)
        self.headers.append((self.pos, h))
        self.pos += len(data)

    def finish(self, mtime_ms: int) -> int:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        build = build_index_entries(self.headers, self.interval)
        if build.max_timestamp >= 0 and (not build.times or build.max_timestamp > build.times[-1][0]):
            build.times.append((build.max_timestamp, build.offset_of_max_timestamp))
        for suffix, data in ((".index", encode_offset_entries(self.base, build.offsets)),
                             (".timeindex", encode_time_entries(self.base, build.times)),
                             (".txnindex", b"".join(encode_entry(t) for t in self.aborted))):
            with open(self.paths[suffix], "wb") as f:
                if data:                 # an empty file has nothing to sync but its name
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
        # Kafka keeps the replaced segments' last-modified time (retention of compact,delete
        # topics without timestamps, and the legacy delete horizon, read it).
        os.utime(self.paths[".log"], ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
        return self.pos

    def abandon(self) -> None:
        if not self.f.closed:
            try:
                self.f.close()
            except OSError:
                pass            # the buffered rest could not be written (a full disk): closed anyway
        for p in self.paths.values():
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


class Cleaner:
    """Cleans one partition directory. ``now_ms``: the round's clock (tests pass one)."""

    def __init__(self, directory: str, settings: LogSettings, offset_map: OffsetMap, *,
                 check_done: Callable[[], None] = lambda: None,
                 throttle: Callable[[int], None] = lambda n: None) -> None:
        self.directory = directory
        self.settings = settings
        self.map = offset_map
        self.check_done = check_done
        self.throttle = throttle

    # -- aborted transactions -------------------------------------------------------------------
    def _aborted(self, bases: list[int], start: int, upper: int, hw: int) -> list[AbortedTxn]:
        """Kafka's collectAbortedTransactions(start, upper): the .txnindex entries of the
        segment holding ``start`` and the later ones, until an entry's LSO reaches ``upper``."""
        out: list[AbortedTxn] = []
        i = 0
        while i + 1 < len(bases) and bases[i + 1] <= start:
            i += 1
        for b in bases[i:]:
            if b >= hw:
                break
            found, complete = collect_entries(read_entries(txnindex_path(self.directory, b)),
                                              start, upper, hw)
            out += found
            if complete:
                break
        return out

    # -- the round ------------------------------------------------------------------------------
    def clean(self, segs: list[SegmentFile], c: Cleanable, *, hw: int,
              producers: dict[int, LastRecord],
              swap: Callable[[list[CleanedGroup], int], bool],
              now_ms: int | None = None) -> RoundStats:
        """Clean the sealed segments ``segs`` (``plan.sealed_segments``) as ``c`` plans;
        ``hw``: the high watermark read with the plan (aborted-transaction entries are trusted
        below it); ``producers``: the writer's non-expired producers; ``swap(groups,
        checkpoint)``: the writer's swap of cleaned groups (checkpoint -1 but with the last).
        Raises CleaningAborted."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        stats = RoundStats()
        bases = list_segment_bases(self.directory)
        self._build_map(segs, c, bases, hw, stats)
        end = self.map.latest_offset + 1
        stats.end_offset = end
        stats.buffer_utilization = self.map.utilization
        s = self.settings
        groups = group_segments([x for x in segs if x.base < end], s.segment_bytes,
                                s.segment_index_bytes, c.first_uncleanable)
        meta = CleanedTransactionMetadata()
        pending: list[CleanedGroup] = []
        for gi, group in enumerate(groups):
            last = gi == len(groups) - 1
            out = self._clean_group(group, segs, bases, meta, c.first_uncleanable, hw, producers,
                                    now, stats)
            stats.groups += 1
            pending.append(CleanedGroup(group[0].base, group, out))
            if last or sum(x.size for g in pending for x in g.old) >= SWAP_BATCH_BYTES:
                fsync_dir(self.directory)        # the copies' names, before the writer commits
                if not swap(pending, end if last else -1):
                    raise CleaningAborted(f"the writer refused the swap of segments "
                                          f"{[g.base for g in pending]}")
                pending = []
        stats.elapsed_s = time.monotonic() - stats.started
        return stats

    def _build_map(self, segs: list[SegmentFile], c: Cleanable, bases: list[int], hw: int,
                   stats: RoundStats) -> None:
        """Kafka's buildOffsetMap. Unlike Kafka, the first batch is always mapped whole, even
        past the map's size: a batch with more keys than the map holds would otherwise stop
        every round before it."""
        m = self.map
        m.clear()
        start, end = c.first_dirty, c.first_uncleanable
        dirty = dirty_segments(segs, c)
        meta = CleanedTransactionMetadata()
        meta.add_aborted(self._aborted(bases, start, end, hw))
        max_bytes = self.settings.max_decompressed_bytes
        for k, seg in enumerate(dirty):
            nxt = dirty[k + 1].base if k + 1 < len(dirty) else end
            seg_map = _Mapped(self.directory, seg)
            try:
                pos = 0
                if seg.base < start:
                    try:
                        with OffsetIndex(index_path(self.directory, seg.base), seg.base) as ix:
                            pos = ix.lookup(start)[1]
                    except FileNotFoundError:
                        pos = 0
                for h, batch in seg_map.batches(pos):
                    self.check_done()
                    self.throttle(len(batch))
                    stats.map_bytes_read += len(batch)
                    if h.is_control:
                        meta.on_control(h, _control_type(h, batch))
                    elif not meta.on_batch(h):
                        recs = stored_records(batch, h, max_bytes=max_bytes)
                        stats.map_messages_read += len(recs)
                        # The hot loop (every record of the dirty section): OffsetMap.put and
                        # its bound, inlined.
                        d, cap = m._map, m.max_entries
                        for rec in recs:
                            k = rec.key
                            if k is not None and rec.offset >= start:
                                if len(d) >= cap and m.latest_offset >= start:
                                    return          # full: clean up to the last batch mapped
                                d[k if len(k) < 16 else md5(k, usedforsecurity=False).digest()] = \
                                    rec.offset
                    if h.base_offset + h.last_offset_delta >= start:
                        m.update_latest_offset(h.base_offset + h.last_offset_delta)
            finally:
                seg_map.close()
            # Gaps (removed records) at the segment's end count as mapped.
            m.update_latest_offset(nxt - 1)

    def _clean_group(self, group: list[SegmentFile], segs: list[SegmentFile], bases: list[int],
                     meta: CleanedTransactionMetadata, upper: int, hw: int,
                     producers: dict[int, LastRecord], now: int, stats: RoundStats) -> int:
        """Kafka's cleanSegments: the group into one set of ``.cleaned`` files."""
        s = self.settings
        w = _CleanedWriter(self.directory, group[0].base, s.index_interval_bytes)
        meta.cleaned_index = w.aborted.append
        try:
            for seg in group:
                i = segs.index(seg)
                seg_upper = segs[i + 1].base if i + 1 < len(segs) else upper
                meta.add_aborted(self._aborted(bases, seg.base, seg_upper, hw))
                seg_map = _Mapped(self.directory, seg)
                try:
                    for h, batch in seg_map.batches():
                        self.check_done()
                        self.throttle(len(batch))
                        stats.bytes_read += len(batch)
                        out = self._filter(h, batch, meta, upper, producers, now, stats)
                        if out is not None:
                            self.throttle(len(out))
                            stats.bytes_written += len(out)
                            w.append(h, out)
                finally:
                    seg_map.close()
            return w.finish(group[-1].mtime_ms)
        except BaseException:
            w.abandon()
            raise
        finally:
            meta.cleaned_index = None

    def _filter(self, h: BatchHeader, batch, meta: CleanedTransactionMetadata, upper: int,
                producers: dict[int, LastRecord], now: int, stats: RoundStats):
        """Kafka's filterTo for one batch with the cleaner's RecordFilter: the bytes to write,
        or None."""
        control = h.is_control
        horizon = h.delete_horizon_ms
        if control:
            can_discard = meta.on_control(h, _control_type(h, batch))
            discard = can_discard and horizon is not None and horizon <= now
        else:
            can_discard = discard = meta.on_batch(h)
        last_offset = h.base_offset + h.last_offset_delta
        last = producers.get(h.producer_id) if h.producer_id >= 0 else None
        if last is not None and (last.last_data_offset == last_offset if last.last_data_offset >= 0
                                 else control and h.producer_epoch == last.producer_epoch):
            retention = _RETAIN_EMPTY
        elif last_offset + 1 == upper:
            retention = _RETAIN_EMPTY
        elif discard:
            retention = _DELETE
        else:
            retention = _DELETE_EMPTY
        stats.messages_read += h.records_count
        if retention == _DELETE:
            return None
        if discard or h.records_count == 0:
            kept = []
        else:
            recs = stored_records(batch, h, max_bytes=self.settings.max_decompressed_bytes)
            if control:
                kept = recs
            else:
                # The hot loop (every record of every segment cleaned): OffsetMap.get inlined.
                m = self.map
                latest = m.latest_offset
                get = m._map.get
                retain_deletes = horizon is None or now < horizon
                kept = []
                for r in recs:
                    off = r.offset
                    if off > latest:
                        kept.append(r)
                        continue
                    k = r.key
                    if k is None:
                        stats.invalid_messages += 1      # Kafka drops what it cannot key
                    elif off >= get(k if len(k) < 16 else md5(k, usedforsecurity=False).digest(), -1) \
                            and (retain_deletes or r.value is not None):
                        kept.append(r)
        if kept:
            stats.messages_written += len(kept)
            tombstones = not control and any(r.value is None for r in kept)
            need_horizon = (tombstones or (can_discard and control)) and horizon is None
            if len(kept) == h.records_count and not need_horizon:
                return batch
            return build_retained_batch(h, kept, now + self.settings.delete_retention_ms
                                        if need_horizon else horizon)
        if retention == _RETAIN_EMPTY:
            return build_empty_batch(h)
        return None
