"""What a cleaning round takes on (Kafka's LogCleanerManager and the grouping of its Cleaner).

Pure functions over a snapshot of one partition directory; run by the cleaner processes
(``workers/cleaner.py``), and by tests. The snapshot (``sealed_segments``) is read from the
files the partition's writer publishes, never from the writer itself: segment files below the
active segment are immutable until a swap or a retention delete replaces them, and the offsets
it is compared with come from the writer's state page.

Kafka's rules, per partition:

- first dirty offset: the cleaner checkpoint (``cleaner-offset-checkpoint``, written by the
  writer with the swap that ends a round), reset to the log start offset when it is below it or
  past the log end;
- first uncleanable offset: the smallest of the last stable offset (KIP-98: nothing an open
  transaction may still abort is cleaned), the active segment's base offset (the active segment
  is never cleaned) and, with ``min.compaction.lag.ms``, the base of the first dirty segment
  whose largest timestamp is newer than now minus the lag; then rounded down to a segment
  boundary (a round cleans whole segments);
- dirty ratio: bytes of the segments from the first dirty one to the first uncleanable one over
  those plus the clean bytes before; a partition is cleaned when the ratio is above
  ``min.cleanable.dirty.ratio``, or when ``max.compaction.lag.ms`` has passed for the first batch
  of a dirty segment (and something is dirty); the dirtiest goes first;
- groups: consecutive segments whose logs, offset indexes and time indexes each fit the topic's
  segment.bytes and segment.index.bytes, and whose offsets stay within 2^31 of the group's base,
  are cleaned into one segment named after the first.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from appliance.log.files import (index_path, list_segment_bases, log_path, timeindex_path)
from appliance.protocol.records import HEADER_SIZE, read_header

__all__ = ["SegmentFile", "Cleanable", "sealed_segments", "cleanable", "group_segments",
           "NoSuchSegment"]

_MAX_RELATIVE = 0x7FFFFFFF


class NoSuchSegment(Exception):
    """A segment went away while it was looked at (a retention delete): try again later."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    base: int
    size: int                 # bytes of the .log
    ino: int                  # its inode (the writer checks it has not changed at the swap)
    mtime_ms: int
    index_bytes: int
    timeindex_bytes: int
    largest_timestamp: int    # Kafka's LogSegment.largestTimestamp (max timestamp, else mtime)
    first_batch_timestamp: int   # max timestamp of its first batch, -1 when empty


def _pread_all(path: str, n: int, pos: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, pos)
    finally:
        os.close(fd)


def _segment_file(directory: str, base: int) -> SegmentFile:
    try:
        st = os.stat(log_path(directory, base))
        isz = os.stat(index_path(directory, base)).st_size
        tpath = timeindex_path(directory, base)
        tsz = os.stat(tpath).st_size
        mtime_ms = int(st.st_mtime * 1000)
        largest = -1
        if tsz >= 12 and tsz % 12 == 0:
            largest = struct.unpack(">q", _pread_all(tpath, 8, tsz - 12))[0]
        first_ts = -1
        if st.st_size >= HEADER_SIZE:
            first_ts = read_header(_pread_all(log_path(directory, base), HEADER_SIZE, 0)).max_timestamp
    except FileNotFoundError:
        raise NoSuchSegment(f"segment {base} of {directory} went away") from None
    return SegmentFile(base, st.st_size, st.st_ino, mtime_ms, isz, tsz,
                       largest if largest > 0 else mtime_ms, first_ts)


def sealed_segments(directory: str, active_base: int) -> list[SegmentFile]:
    """The segments below the active one, oldest first."""
    return [_segment_file(directory, b) for b in list_segment_bases(directory) if b < active_base]


@dataclass(frozen=True, slots=True)
class Cleanable:
    """Kafka's LogToClean: one partition's cleanable range and how dirty it is."""

    first_dirty: int
    first_uncleanable: int        # a segment boundary: rounds clean whole segments below it
    active_base: int
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int      # how far past max.compaction.lag.ms its oldest dirty batch is
    reset_checkpoint: bool        # the checkpoint was invalid: first_dirty is the log start

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    def due(self, min_cleanable_ratio: float) -> bool:
        """Kafka's grabFilthiestCompactedLog filter."""
        return ((self.compaction_delay_ms > 0 and self.cleanable_bytes > 0)
                or self.ratio > min_cleanable_ratio)


def _overlapping(segs: list[SegmentFile], start: int, end: int, active_base: int
                 ) -> list[SegmentFile]:
    """Kafka's logSegments(from, to) among the sealed segments: the segment holding ``start``
    and those after it with a base offset below ``end`` (the last sealed one ends where the
    active one begins)."""
    out = []
    for i, s in enumerate(segs):
        nxt = segs[i + 1].base if i + 1 < len(segs) else active_base
        if s.base < end and nxt > start:
            out.append(s)
    return out


def cleanable(segs: list[SegmentFile], *, log_start: int, log_end: int, last_stable: int,
              active_base: int, checkpoint: int | None, min_compaction_lag_ms: int,
              max_compaction_lag_ms: int, now_ms: int) -> Cleanable:
    """Kafka's cleanableOffsets, calculateCleanableBytes and maxCompactionDelay over the sealed
    segments ``segs`` of a partition whose writer published the other values."""
    reset = False
    first_dirty = log_start if checkpoint is None else checkpoint
    if first_dirty < log_start or first_dirty > log_end:
        first_dirty, reset = log_start, checkpoint is not None
    sealed_dirty = [s for i, s in enumerate(segs)
                    if i + 1 >= len(segs) or segs[i + 1].base > first_dirty]   # from first_dirty on
    uncleanable = min(last_stable, active_base)
    if min_compaction_lag_ms > 0:
        for s in sealed_dirty:
            if s.largest_timestamp > now_ms - min_compaction_lag_ms:
                uncleanable = min(uncleanable, s.base)
                break
    uncleanable = max(first_dirty, uncleanable)
    # Rounded down to the base of the segment holding it (the active one's when none does).
    first_uncleanable = active_base
    for i, s in enumerate(segs):
        nxt = segs[i + 1].base if i + 1 < len(segs) else active_base
        if nxt > uncleanable:
            first_uncleanable = s.base
            break
    clean = sum(s.size for s in segs if s.base < first_dirty)
    dirty = sum(s.size for s in _overlapping(segs, min(first_dirty, first_uncleanable),
                                             first_uncleanable, active_base))
    delay = 0
    stamps = [s.first_batch_timestamp for s in sealed_dirty if s.first_batch_timestamp > 0]
    if stamps and max_compaction_lag_ms < now_ms:
        until = now_ms - max(max_compaction_lag_ms, 0)
        if min(stamps) < until:
            delay = until - min(stamps)
    return Cleanable(first_dirty, first_uncleanable, active_base, clean, dirty, delay, reset)


def dirty_segments(segs: list[SegmentFile], c: Cleanable) -> list[SegmentFile]:
    """The segments whose records go into the key map: from the one holding the first dirty
    offset up to the first uncleanable one."""
    return _overlapping(segs, c.first_dirty, c.first_uncleanable, c.active_base)


def group_segments(segs: list[SegmentFile], max_size: int, max_index_size: int,
                   first_uncleanable: int) -> list[list[SegmentFile]]:
    """Kafka's groupSegmentsBySize: consecutive segments cleaned into one."""
    groups: list[list[SegmentFile]] = []
    i = 0
    while i < len(segs):
        group = [segs[i]]
        size, isize, tsize = segs[i].size, segs[i].index_bytes, segs[i].timeindex_bytes
        i += 1
        while i < len(segs):
            s = segs[i]
            # The last offset the next segment may hold, without reading it: the one below the
            # following segment's base (or below the first uncleanable offset).
            last = (segs[i + 1].base if i + 1 < len(segs) else first_uncleanable) - 1
            if (size + s.size > max_size or isize + s.index_bytes > max_index_size
                    or tsize + s.timeindex_bytes > max_index_size
                    or (s.size and last - group[0].base > _MAX_RELATIVE)):
                break
            group.append(s)
            size += s.size
            isize += s.index_bytes
            tsize += s.timeindex_bytes
            i += 1
        groups.append(group)
    return groups
