"""LogLoader: opening one partition's log directory, recovering what a crash left.

Runs in the partition's writer process (``PartitionLog.open`` calls ``load``), the only process
that writes the directory. Owns nothing between calls: it reads the files, repairs them, and
hands ``PartitionLog`` its sealed segments, its active segment and its log start offset.

Opening (Kafka's LogLoader semantics):
  1. remove ``*.tmp`` (interrupted atomic replacements); finish a committed cleaner swap, remove
     cleaned copies and retired files (``appliance.log.swap``); remove index files without a
     ``.log``;
  2. read the ``log-start-offset`` and ``recovery-point`` checkpoints and the clean-shutdown
     marker;
  3. finish an interrupted retention delete: segments that end at or below the log start offset
     are deleted;
  4. without the marker, scan every segment whose base offset is >= the recovery point (CRC,
     offset continuity, and records a consumer can read: ``record_contents.records_ok``, the
     compressed ones inflated within ``max_decompressed_bytes``), truncating after the last
     valid batch; if a segment that is not the last one turns out corrupt there, it is
     truncated and every later segment deleted (as Kafka does: the unflushed tail). Segments
     below the recovery point, and all segments after a clean shutdown, are loaded with index
     sanity checks and a header walk of their tail, and recovered if that fails; one of those
     found damaged (bit rot, issue 34) is cut after its last valid batch and the later
     segments, acknowledged and intact, are kept (Kafka recovers only the failing segment);
  5. if the log end is below the log start offset (files lost), start over empty at the log start
     offset; with no segment at all, create one there;
  6. remove the marker, give the active segment's files their blocks again, and go.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

from appliance.durable import TMP_SUFFIX, fsync_dir, read_checkpoint, write_checkpoint
from appliance.log import swap
from appliance.log.files import (CLEAN_SHUTDOWN_FILE, INDEX_SUFFIX, LOG_START_OFFSET_FILE,
                                 RECOVERY_POINT_FILE, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX,
                                 index_path, list_segment_bases, txnindex_path)
from appliance.log.index import OffsetIndex
from appliance.log.segment import (LogSegment, SegmentInfo, aborted_index_matches,
                                   delete_segment_files, load_segment, recover_segment)
from appliance.log.txn_index import sane as txn_index_sane
from appliance.topic_config import LogSettings

__all__ = ["LoadedLog", "load"]

log = logging.getLogger("appliance.log")


@dataclass(slots=True)
class _Loaded:
    info: SegmentInfo
    offset_entries: int = 0
    time_entries: int = 0
    bytes_since: int = 0


class LoadedLog(NamedTuple):
    """What an open found: ``PartitionLog``'s constructor arguments."""
    sealed: list[SegmentInfo]
    active: LogSegment
    log_start_offset: int
    rebuild_from: int | None        # the first segment whose aborted index is rebuilt
    rebuild_pending: bool           # the recovery point held back for that rebuild


def load(directory: str, settings: LogSettings, now_ms: int,
         progress: Callable[[int], None] | None = None) -> LoadedLog:
    """Open ``directory`` (recovering as needed); ``progress`` gets the bytes of each segment
    once it is loaded or recovered (for the operator's view of a long recovery)."""
    os.makedirs(directory, exist_ok=True)
    s = settings
    seg_kw = dict(segment_bytes=s.segment_bytes, index_bytes=s.segment_index_bytes,
                  interval=s.index_interval_bytes)
    for name in os.listdir(directory):
        if name.endswith(TMP_SUFFIX):
            os.unlink(os.path.join(directory, name))
    # 0. a cleaner swap: finished if it was committed, else its copy goes.
    swap.recover(directory)
    bases = list_segment_bases(directory)
    known = set(bases)
    for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX):
        for b in list_segment_bases(directory, suffix):
            if b not in known:
                os.unlink(os.path.join(directory, f"{b:020d}{suffix}"))
    clean_path = os.path.join(directory, CLEAN_SHUTDOWN_FILE)
    clean = os.path.exists(clean_path)
    lso_path = os.path.join(directory, LOG_START_OFFSET_FILE)
    lso = read_checkpoint(lso_path)
    recovery_point = read_checkpoint(os.path.join(directory, RECOVERY_POINT_FILE)) or 0
    lso_missing = lso is None
    if lso is None:
        lso = bases[0] if bases else 0
    lso_default = lso
    # Whether what this open changes in the directory must be made durable (its fsync): a
    # recovered sealed segment, deleted files, a clean-shutdown marker removed, a new
    # partition's segment made. The active segment's recovery need not be (recover_segment).
    names_changed = clean
    # 3. an interrupted retention delete: segments wholly below the log start offset go.
    while len(bases) > 1 and bases[1] <= lso:
        delete_segment_files(directory, bases.pop(0))
        names_changed = True

    loaded: list[_Loaded] = []
    rebuild_from: int | None = None      # base of the first segment recovered
    i = 0
    while i < len(bases):
        base = bases[i]
        last = i == len(bases) - 1
        next_base = None if last else bases[i + 1]
        got = None
        if clean or base < recovery_point:
            got = load_segment(directory, base, next_base=next_base, allow_empty=last,
                               rebuild_interval=s.index_interval_bytes)
            if got is not None and not (
                    txn_index_sane(txnindex_path(directory, base), base, got[0].next_offset)
                    and aborted_index_matches(directory, base, compacted=s.compact)):
                # Kafka's LogLoader: a failed index check -> recover (which drops the file,
                # and the producer-state replay writes it again from the log's markers).
                log.warning("%s: the aborted-transaction index of segment %d does not match "
                            "its log; recovering the segment", directory, base)
                got = None
        if got is not None:
            info, n_off, n_time = got
            loaded.append(_Loaded(info, n_off, n_time, 0))
            if progress is not None:
                progress(info.size)
        else:
            if rebuild_from is None:
                rebuild_from = base
            info, corrupt, build = recover_segment(
                directory, base, next_base=next_base,
                max_decompressed_bytes=s.max_decompressed_bytes, durable=not last, **seg_kw)
            names_changed = names_changed or not last
            loaded.append(_Loaded(info, len(build.offsets), len(build.times),
                                  build.bytes_since_last_entry))
            if progress is not None:
                progress(info.size)
            if corrupt and not last and (clean or base < recovery_point):
                # A sealed segment that failed its load (bit rot in a length field, issue
                # 34) is not the log's tail: the later segments are acknowledged and intact,
                # so only this one is cut (Kafka's LogLoader recovers just the segment whose
                # sanity check failed); a gap is left, as compaction leaves them.
                log.error("%s: sealed segment %d is damaged: truncated after its last valid "
                          "batch (offset %d); the later segments are kept",
                          directory, base, info.next_offset)
            elif corrupt and not last:
                for b in bases[i + 1:]:
                    delete_segment_files(directory, b)
                del bases[i + 1:]
                names_changed = True
        i += 1
    log_end = loaded[-1].info.next_offset if loaded else lso
    if loaded and log_end < lso:
        # Kafka's deleteSegmentsIfLogStartGreaterThanLogEnd: files were lost; start over.
        for item in loaded:
            delete_segment_files(directory, item.info.base_offset)
        loaded = []
        rebuild_from = None
        names_changed = True
    if rebuild_from is not None:
        # Every aborted-index file from the first recovered segment on is rebuilt from the
        # log by the caller; one kept there would get its entries a second time.
        for item in loaded:
            if item.info.base_offset >= rebuild_from:
                try:
                    os.unlink(txnindex_path(directory, item.info.base_offset))
                except FileNotFoundError:
                    pass
    # A partition with nothing on disk yet (its first open): what it writes now, lost in a
    # crash, the next open makes again the same.
    fresh = not loaded and not clean and lso_missing and lso == 0
    if not loaded:
        names_changed = True
        active = LogSegment.create(directory, lso, now_ms=now_ms, preallocate=s.preallocate,
                                    **seg_kw)
        # A checkpoint whose loss would read back as the same value (missing: the first
        # segment's base, or 0) is written without an fsync: five fsyncs a new partition
        # were most of the time of a CreateTopics of ten thousand.
        write_checkpoint(lso_path, lso, sync=not (lso_missing and lso == 0))
    else:
        lso = max(lso, loaded[0].info.base_offset)
        last = loaded[-1]
        # Reopen the last segment for writing: the sealed files get blocks ahead again.
        # A loaded-but-unscanned segment needs its bytes-since-last-entry counter.
        if last.offset_entries and not last.bytes_since:
            with OffsetIndex(index_path(directory, last.info.base_offset),
                             last.info.base_offset) as ix:
                last.bytes_since = last.info.size - ix.entry(ix.entries - 1)[1]
        elif not last.offset_entries:
            last.bytes_since = last.info.size
        active = LogSegment(directory, last.info, now_ms=now_ms,
                            offset_entries=last.offset_entries, time_entries=last.time_entries,
                            bytes_since_last_entry=last.bytes_since,
                            preallocate=s.preallocate, **seg_kw)
        loaded.pop()
    if clean:
        os.unlink(clean_path)
    if names_changed and not fresh:
        fsync_dir(directory)
    if read_checkpoint(lso_path) != lso:
        write_checkpoint(lso_path, lso, sync=not (lso_missing and lso == lso_default))
    # Everything below the active segment is now sealed and fsynced (loaded as such, or just
    # recovered); the active one must always lie at or above the recovery point.
    # Sealed segments whose .txnindex is to be rebuilt keep the recovery point at the first
    # of them until finish_txn_index_rebuild has fsynced the rebuilt files.
    pending = rebuild_from is not None and rebuild_from < active.base_offset
    rp = rebuild_from if pending else active.base_offset
    rp_path = os.path.join(directory, RECOVERY_POINT_FILE)
    have = read_checkpoint(rp_path)
    if have != rp:
        write_checkpoint(rp_path, rp, sync=not (have is None and rp == 0))  # missing reads 0
    return LoadedLog([x.info for x in loaded], active, lso, rebuild_from, pending)
