"""PartitionLog: one partition's log, owned by its partition writer process (and nobody else).

The writer opens it (running recovery), appends the batches frontends send it (assigning offsets
and, for LogAppendTime topics, the timestamp), rolls segments, applies the flush policy and
retention, and publishes ``log_end_offset`` / ``log_start_offset`` / ``active_segment_base`` /
``active_end_position`` / ``segments_version`` on its state page. Other processes read the same
files through ``appliance.log.reader``.

Append path, per batch: one header unpack, the 8-byte base-offset patch (outside the CRC), the
LogAppendTime stamp if configured (the only CRC pass), a roll check, one pwrite at the end of the
active segment, and an index entry every ``index_interval_bytes``. Never a loop over records.

Opening and recovery (Kafka's LogLoader): ``appliance.log.log_loader``.

Aborted-transaction index (``.txnindex``, see ``txn_index.py``): the writer appends an entry with
``append_aborted`` right after the ABORT marker it belongs to (``append_control``) and before it
publishes a high watermark or LSO past that marker; a roll fsyncs and closes the old segment's
file; retention deletes it with its segment. At open, every segment that recovery scans (and a
loaded segment whose ``.txnindex`` fails the sanity check, which is then recovered too) loses
its ``.txnindex``, and so does every segment after the first such one; ``txn_index_rebuild_from``
is that first segment's base offset (the log end when none). The caller replays producer state
(``ProducerStateManager.load``, which starts at a snapshot at or below that offset) and appends an
entry for every aborted transaction whose marker is at or above it. That is exactly the set of
entries that was deleted: segments below the offset were loaded with their files intact (sealed
and fsynced at their roll, or at a clean close), segments from it on have none left, and an
entry always lives in the file of its marker's segment - so nothing is lost and nothing is
written twice. Entries for sealed segments are fsynced before the recovery point passes those
segments again (``finish_txn_index_rebuild``; until then the recovery point stays at the first
rebuilt segment, so a crash in between rebuilds again).

A crash at any instant leaves a state this recovers from: an append is torn at worst (scan cuts
it); a roll seals the old segment completely (trimmed and fsynced) before it creates the new
files and then advances the recovery point, so at most the last two segments need a scan; a
retention delete persists the new log start offset before unlinking anything.

A full disk changes nothing that was appended and stops nothing: an append, or a roll, that finds
no room raises KAFKA_STORAGE_ERROR with the log as it was (``segment.py``), and is tried again by
the next append, so produce resumes by itself once space is freed. What only saves work at the
next recovery is skipped on a full disk (the producer snapshot of a roll, the recovery-point and
log-start checkpoints: stale, they err on the safe side), and retention deletes anyway, since it
is what frees the disk. A marker whose aborted-transaction entry cannot be written is taken back
(``undo_control``).
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import random
import time
from typing import Callable, Iterator, NamedTuple

from appliance.protocol.records import LEADER_EPOCH
from appliance.errors import CorruptRecord, ErrorCode, KafkaError
from appliance.log.files import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE,
                                 RECOVERY_POINT_FILE, index_path, log_path, timeindex_path,
                                 retired_log_path, txnindex_path)
from appliance.durable import (DeferredSync, fsync_dir, is_no_space, write_checkpoint)
from appliance.log import log_loader, swap
from appliance.log.segment import (LogDirFailure, LogSegment, SegmentInfo, SegmentMark,
                                   delete_segment_files)
from appliance.topic_config import LogSettings
from appliance.log.txn_index import AbortedTxn, TransactionIndex
from appliance.protocol.records import (HEADER_SIZE, BatchHeader, build_control_batch,
                                        iter_batch_headers, parse_control_record, read_header,
                                        set_base_offset, set_partition_leader_epoch,
                                        stamp_log_append_time)

__all__ = ["LogSettings", "AppendInfo", "PartitionLog", "AbortedTxn"]

log = logging.getLogger("appliance.log")


def _entries_in(path: str, entry_size: int) -> int:
    try:
        return os.path.getsize(path) // entry_size
    except OSError:
        return 0


class AppendInfo(NamedTuple):
    base_offset: int
    last_offset: int
    log_append_time: int      # -1 for CreateTime topics
    position: int             # where the batch starts in its segment
    segment_base: int


class PartitionLog:
    """The writer's view of one partition directory. Not thread-safe; one process only."""

    def __init__(self, directory: str, settings: LogSettings, sealed: list[SegmentInfo],
                 active: LogSegment, log_start_offset: int, txn_index_rebuild_from: int | None = None,
                 rebuild_pending: bool = False) -> None:
        self.directory = directory
        self.settings = settings
        self._sealed = sealed
        self._active = active
        # segment.jitter.ms: a random draw per active segment; the jitter is it modulo
        # min(segment.jitter.ms, the roll time), as Kafka's LogSegment.rollJitterMs.
        self._jitter_draw = random.getrandbits(31)
        self._log_start_offset = log_start_offset
        # Starts at the wall clock so that a restarted writer never republishes a version its
        # predecessor used for a different segment list.
        self.segments_version = time.time_ns()
        self._reader = None
        self._reader_version = -1
        self._closed = False
        # Called with the new segment's base offset when a segment rolls, before the batch that
        # caused the roll is appended: the partition writer snapshots its producer state there.
        self.roll_listener: Callable[[int], None] | None = None
        # Aborted-index entries for markers at or above this offset must be re-appended by the
        # caller after open (see the module docstring); = log end when nothing was rebuilt.
        self.txn_index_rebuild_from = (active.next_offset if txn_index_rebuild_from is None
                                       else txn_index_rebuild_from)
        self._rebuild_pending = rebuild_pending     # recovery point held back for the rebuild
        self._rebuild_ix: TransactionIndex | None = None   # a sealed segment's, during rebuild
        # Files a cleaner swap replaced, kept for readers until their time (monotonic s).
        self._retired: list[tuple[float, str]] = []
        # Tests only: called with each step of a swap (appliance.log.swap), to crash there.
        self.crash_hook: Callable[[str], None] | None = None
        self._control_mark: tuple[AppendInfo, SegmentMark] | None = None
        self._unsaved_start = False     # log-start-offset checkpoint not written (full disk)
        # Whether the names (the segment files, the partition directory in the data dir) may
        # not be durable: the first flush_target syncs them before any batch can be (see there).
        self._names_unsynced = True

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str, settings: LogSettings, now_ms: int,
             progress: Callable[[int], None] | None = None) -> "PartitionLog":
        """Open (recovering as needed: ``appliance.log.log_loader``, Kafka's LogLoader);
        ``progress`` gets the bytes of each segment once it is loaded or recovered (for the
        operator's view of a long recovery)."""
        got = log_loader.load(directory, settings, now_ms, progress)
        return cls(directory, settings, got.sealed, got.active, got.log_start_offset,
                   txn_index_rebuild_from=got.rebuild_from, rebuild_pending=got.rebuild_pending)

    # -- state -------------------------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return self._active.next_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def active_segment_base(self) -> int:
        return self._active.base_offset

    @property
    def active_end_position(self) -> int:
        return self._active.size

    def update_settings(self, settings: LogSettings) -> None:
        """Apply changed topic configs: segment size and index interval to the active segment
        now, index size to the next segment, retention and timestamp type to what follows."""
        self.settings = settings
        self._active.update_limits(segment_bytes=settings.segment_bytes,
                                   interval=settings.index_interval_bytes,
                                   preallocate=settings.preallocate)

    def segment_bases(self) -> list[int]:
        return [s.base_offset for s in self._sealed] + [self._active.base_offset]

    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._sealed) + self._active.size

    # -- appending ---------------------------------------------------------------------------
    def append(self, batch, now_ms: int) -> AppendInfo:
        """Append one validated batch (a writable buffer holding exactly that batch): assign its
        offsets, stamp LogAppendTime if the topic uses it, roll first if needed, copy it in."""
        n = batch.nbytes if isinstance(batch, memoryview) else len(batch)
        if n < HEADER_SIZE:
            raise CorruptRecord(f"{n} bytes cannot hold a record batch")
        h = read_header(batch, 0)
        size = h.batch_length + 12
        if size != n:
            raise CorruptRecord(f"batch length field says {size} bytes, buffer holds {n}")
        if size > self.settings.segment_bytes:
            # Kafka's RecordBatchTooLargeException: the batch could never fit a segment.
            raise KafkaError(ErrorCode.record_list_too_large,
                             f"record batch of {size} bytes is larger than the segment size "
                             f"{self.settings.segment_bytes}")
        active = self._active
        base = active.next_offset
        last = base + h.last_offset_delta
        if self.settings.log_append_time:
            max_ts = log_append_time = now_ms
        else:
            max_ts, log_append_time = h.max_timestamp, -1
        try:
            if active.size and (not active.has_room(size, last)
                                or self._time_to_roll(active, now_ms, max_ts)):
                active = self._roll(now_ms)
            set_base_offset(batch, base)
            set_partition_leader_epoch(batch, LEADER_EPOCH)
            if log_append_time >= 0:
                stamp_log_append_time(batch, now_ms)
            pos = active.append(batch, size, last, max_ts)
        except OSError as e:
            # Nothing counts as appended: the room is taken before the batch is written (the
            # segment's size does not move, bytes of a short write are zeroed again), and a
            # roll that cannot get its room leaves the old segment active. Kafka answers
            # KAFKA_STORAGE_ERROR when a log dir cannot take a write; here the writer lives on
            # and the next append tries again, so produce resumes once there is space.
            raise KafkaError(ErrorCode.kafka_storage_error, f"cannot append to {self.directory}: {e}") from None
        return AppendInfo(base, last, log_append_time, pos, active.base_offset)

    def append_control(self, producer_id: int, producer_epoch: int, commit: bool,
                       coordinator_epoch: int, now_ms: int, *,
                       partition_leader_epoch: int = LEADER_EPOCH) -> AppendInfo:
        """Append a COMMIT or ABORT marker of ``producer_id``: the batch Kafka's leader writes for
        WriteTxnMarkers (MemoryRecords.withEndTransactionMarker: CreateTime with the broker's
        clock, transactional + control attributes, base sequence -1, one control record; the
        leader's append stamps the partition leader epoch, 0 on this single node as Metadata
        reports it). Offsets, roll and LogAppendTime are those of any append."""
        batch = bytearray(build_control_batch(
            commit=commit, producer_id=producer_id, producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch, timestamp_ms=now_ms,
            partition_leader_epoch=partition_leader_epoch))
        before = self._active
        mark = before.mark()
        info = self.append(batch, now_ms)
        # What undo_control needs: the marker went to position 0 of a new segment if it rolled.
        self._control_mark = (info, mark if self._active is before else
                              SegmentMark(0, info.base_offset, -1, -1, -1, 0))
        return info

    def undo_control(self, info: AppendInfo) -> None:
        """Take back the marker ``append_control`` just appended (nothing published since): its
        bytes are zeroed and its index entries removed, so that neither readers nor a recovery
        after a crash see it. For a marker whose aborted-transaction entry could not be
        written: the coordinator then gets KAFKA_STORAGE_ERROR and sends it again.
        LogDirFailure if the bytes cannot be overwritten."""
        got = self._control_mark
        if got is None or got[0] is not info or self._active.next_offset != info.last_offset + 1:
            raise ValueError(f"{info} is not the last append of {self.directory}")
        self._control_mark = None
        self._active.rewind(got[1])

    def append_aborted(self, txn: AbortedTxn) -> None:
        """Add an aborted-transaction entry to the ``.txnindex`` of the segment holding its marker
        (``txn.last_offset``): the active segment's when called right after ``append_control``;
        a sealed segment's only while rebuilding after recovery (entries arrive in marker order).
        Raises ValueError for an entry out of order; OSError if the file cannot be written (the
        marker is in the log then: the writer should stop, and recovery rebuilds the file)."""
        active = self._active
        if txn.last_offset >= active.base_offset:
            if txn.last_offset >= active.next_offset:
                raise ValueError(f"aborted transaction {txn} ends past the log end {active.next_offset}")
            active.txn_index.append(txn)
            return
        i = bisect.bisect_right([s.base_offset for s in self._sealed], txn.last_offset) - 1
        if i < 0:
            raise ValueError(f"aborted transaction {txn} ends before the log start")
        base = self._sealed[i].base_offset
        if base < self.txn_index_rebuild_from:
            raise ValueError(f"aborted transaction {txn} belongs to segment {base}, whose index "
                             f"was not rebuilt (rebuild from {self.txn_index_rebuild_from})")
        ix = self._rebuild_ix
        if ix is None or ix.base_offset != base:
            self._close_rebuild_ix(sync=True)
            ix = self._rebuild_ix = TransactionIndex(txnindex_path(self.directory, base), base,
                                                     writable=True)
        ix.append(txn)

    def finish_txn_index_rebuild(self) -> None:
        """Make the rebuilt ``.txnindex`` files of sealed segments durable and let the recovery
        point pass them. Call after the post-open rebuild (it also runs at the first flush,
        roll, retention delete or clean close)."""
        self._close_rebuild_ix(sync=True)
        if self._rebuild_pending:
            fsync_dir(self.directory)
            if self._checkpoint(RECOVERY_POINT_FILE, self._active.base_offset):
                self._rebuild_pending = False

    def finish_txn_index_rebuild_if_pending(self) -> None:
        """``finish_txn_index_rebuild`` when a post-open rebuild is still pending (at a flush, or
        at the clean close of a partition recovered at its open and not flushed since)."""
        if self._rebuild_pending or self._rebuild_ix is not None:
            self.finish_txn_index_rebuild()

    def _close_rebuild_ix(self, *, sync: bool) -> None:
        ix = self._rebuild_ix
        if ix is not None:
            self._rebuild_ix = None
            if sync:
                ix.fsync()
            ix.close()

    def aborted_entries(self) -> list[AbortedTxn]:
        """Every aborted-transaction entry of every segment, in log order (tests, tools)."""
        from appliance.log.txn_index import read_entries
        out: list[AbortedTxn] = []
        for base in self.segment_bases():
            out += read_entries(txnindex_path(self.directory, base))
        return out

    def _time_to_roll(self, seg: LogSegment, now_ms: int, batch_max_ts: int) -> bool:
        # Kafka's timeWaitedForRoll: the new batch's timestamp minus the first batch's, or the
        # segment's age when the first batch had no timestamp; only non-empty segments roll.
        if seg.size == 0:
            return False
        first = seg.rolling_base_timestamp()
        waited = batch_max_ts - first if first >= 0 else now_ms - seg.created_ms
        return waited > self.settings.roll_ms - self.roll_jitter_ms

    @property
    def roll_jitter_ms(self) -> int:
        """How much earlier than the roll time the active segment rolls (Kafka's rollJitterMs:
        segment.jitter.ms spreads the rolls of a topic's partitions)."""
        jitter, roll = self.settings.segment_jitter_ms, self.settings.roll_ms
        return self._jitter_draw % min(jitter, roll) if jitter > 0 and roll > 0 else 0

    def maybe_roll(self, now_ms: int) -> bool:
        """Periodic time-based roll (no batch at hand: the clock stands in for its timestamp)."""
        if not self._time_to_roll(self._active, now_ms, now_ms):
            return False
        self._roll(now_ms)
        return True

    def _roll(self, now_ms: int) -> LogSegment:
        """Seal the active segment and start the next one. On a full disk (OSError) the old
        segment stays the active one, whole, and the roll is tried again by the next append:
        the seal fails before it changes anything, and a new segment that cannot be created
        has the sealed one reopened. What follows the swap (the producer snapshot, the recovery
        point) only saves work at the next recovery, so a full disk skips it."""
        old = self._active
        bytes_since = old.counts()[2]
        info = old.seal(sync_dir=False)          # the recovery point's checkpoint fsyncs it
        s = self.settings
        seg_kw = dict(segment_bytes=s.segment_bytes, index_bytes=s.segment_index_bytes,
                      interval=s.index_interval_bytes, preallocate=s.preallocate, now_ms=now_ms)
        try:
            new = LogSegment.create(self.directory, info.next_offset, **seg_kw)
        except OSError:
            delete_segment_files(self.directory, info.next_offset)
            d, b = self.directory, info.base_offset
            try:
                self._active = LogSegment(d, info, offset_entries=_entries_in(index_path(d, b), 8),
                                          time_entries=_entries_in(timeindex_path(d, b), 12),
                                          bytes_since_last_entry=bytes_since, **seg_kw)
            except OSError as e:
                raise LogDirFailure(f"cannot reopen segment {b} of {d}: {e}") from e
            raise
        self._sealed.append(info)
        self._active = new
        self._jitter_draw = random.getrandbits(31)
        if self.roll_listener is not None:
            try:
                self.roll_listener(new.base_offset)
            except OSError as e:
                if not is_no_space(e):
                    raise
                log.warning("%s: no producer snapshot at %d (file system full); the next "
                            "recovery replays from an earlier one", self.directory, new.base_offset)
        self._close_rebuild_ix(sync=True)      # the recovery point passes rebuilt segments now
        self._rebuild_pending = False
        # The dir fsync inside write_checkpoint also makes the new files' names durable.
        self._checkpoint(RECOVERY_POINT_FILE, new.base_offset)
        self.segments_version += 1
        return new

    def _checkpoint(self, name: str, offset: int) -> bool:
        """Write a checkpoint; on a full disk leave the old one (both checkpoints only ever
        err on the safe side when stale: recovery scans more, or open derives the log start
        from the first segment) and say so."""
        try:
            write_checkpoint(os.path.join(self.directory, name), offset)
            return True
        except OSError as e:
            if not is_no_space(e):
                raise
            log.warning("%s: %s not updated to %d (file system full)", self.directory, name, offset)
            return False

    def flush(self) -> None:
        """msync everything appended since the last flush (group commit point)."""
        self.finish_txn_index_rebuild_if_pending()
        self._active.flush()

    def flush_target(self) -> tuple[int, int]:
        """(a new descriptor of the active segment's file, the log end offset now): an
        fdatasync of that descriptor makes every batch below that offset durable (segments
        before the active one were fsynced when they rolled). The caller closes the fd."""
        self._sync_names()
        return self._active.dup_fd(), self.log_end_offset

    def _sync_names(self) -> None:
        # An fdatasync of the segment makes its bytes durable, not its name nor the partition
        # directory's. Nothing at open syncs them all: a fresh partition's first open syncs no
        # directory (CreateTopics of ten thousand), the supervisor makes the directory unsynced,
        # and an open after a kill -9 before any flush finds the files and syncs nothing. After
        # a power loss an acknowledged batch (flush policy batch or interval) was then gone with
        # the whole directory. Kafka's LocalLog.flush fsyncs the partition directory when a
        # flush covers a new segment ("for crash consistency"); here, once per open, on the
        # first flush that can make a batch durable, with the parent (the directory's own name).
        # A clean close needs neither: what it makes durable no ack waited for.
        if self._names_unsynced:
            fsync_dir(self.directory)
            fsync_dir(os.path.dirname(os.path.abspath(self.directory)))
            self._names_unsynced = False

    # -- retention ---------------------------------------------------------------------------
    def enforce_retention(self, now_ms: int) -> bool:
        """Delete the oldest sealed segments past retention.ms (by their largest timestamp) or
        retention.bytes (whole-log size), never the active one; returns whether any went."""
        s = self.settings
        if not s.delete:
            return False          # cleanup.policy=compact: segments go only by compaction
        n_time = n_size = 0
        if s.retention_ms >= 0:
            for seg in self._sealed:
                if now_ms - seg.largest_timestamp() > s.retention_ms:
                    n_time += 1
                else:
                    break
        if s.retention_bytes >= 0:
            diff = self.size_in_bytes() - s.retention_bytes
            for seg in self._sealed:
                if diff - seg.size >= 0:
                    diff -= seg.size
                    n_size += 1
                else:
                    break
        n = max(n_time, n_size)
        if not n:
            return False
        if self._rebuild_ix is not None:
            self.finish_txn_index_rebuild()
        doomed = self._sealed[:n]
        remaining = self._sealed[n:]
        new_lso = max(self._log_start_offset,
                      remaining[0].base_offset if remaining else self._active.base_offset)
        # Persist the new start before unlinking: a crash in between is finished at open. On a
        # full disk the deletes go ahead anyway (they are what frees it): oldest first, so a
        # crash leaves a suffix of the segments, and open takes the log start from the first.
        saved = self._checkpoint(LOG_START_OFFSET_FILE, new_lso)
        self._log_start_offset = new_lso
        self._sealed = remaining
        self.segments_version += 1
        # On a full disk (the checkpoint could not be written) the files go at once: freeing
        # the space is the point.
        self._delete_segments(doomed, delay=saved)
        if not saved:
            self._checkpoint(LOG_START_OFFSET_FILE, new_lso)
        return True

    def _delete_segments(self, doomed: list, delay: bool = True) -> None:
        """Kafka's asyncDeleteSegment: a segment that retention or DeleteRecords removes is
        renamed ``.deleted`` and its file removed ``file.delete.delay.ms`` later (0: at once).
        Here the indexes go at once (only the writer reads them by name; readers have theirs
        mapped) and the ``.log`` is kept under its retired name, the name a compaction swap
        gives the files it replaces, so the same timer and the same clean-up at open remove
        it. A crash meanwhile loses nothing: the log start offset was persisted first."""
        delay_s = self.settings.file_delete_delay_ms / 1000 if delay else 0.0
        until = time.monotonic() + delay_s
        for seg in doomed:
            if delay_s > 0:
                src = log_path(self.directory, seg.base_offset)
                try:
                    dst = retired_log_path(self.directory, seg.base_offset, os.stat(src).st_ino)
                    os.rename(src, dst)
                except OSError:
                    pass                  # gone already, or no room for the name: deleted below
                else:
                    self._retired.append((until, dst))
            delete_segment_files(self.directory, seg.base_offset)

    def delete_records(self, offset: int) -> bool:
        """Kafka's DeleteRecords (UnifiedLog.maybeIncrementLogStartOffset, ClientRecordDeletion):
        move the log start offset up to ``offset`` (at most the log end; never backwards),
        persisted before any file goes, then delete the sealed segments that lie wholly below
        it; the active segment stays, even when the whole log is below the new start. Reads
        below the new start answer OFFSET_OUT_OF_RANGE (the reader checks the published log
        start). Returns whether the log start moved."""
        if offset > self.log_end_offset:
            raise ValueError(f"log start {offset} past the log end {self.log_end_offset}")
        if offset <= self._log_start_offset:
            return False
        if self._rebuild_ix is not None:
            self.finish_txn_index_rebuild()
        write_checkpoint(os.path.join(self.directory, LOG_START_OFFSET_FILE), offset)
        self._log_start_offset = offset
        bases = [s.base_offset for s in self._sealed] + [self._active.base_offset]
        n = 0
        while n < len(self._sealed) and bases[n + 1] <= offset:
            n += 1
        if n:
            doomed, self._sealed = self._sealed[:n], self._sealed[n:]
            self.segments_version += 1
            self._delete_segments(doomed)
        return True

    # -- compaction (appliance.log.swap) ----------------------------------------------------
    def replace_segments(self, groups: list[tuple[int, list[tuple[int, int, int]]]],
                         checkpoint: int, retire_s: float) -> list[SegmentInfo]:
        """Swap the cleaner's copies in, one commit for all: each group is (base, old), the
        copy ``<base>.*.cleaned`` replacing the consecutive sealed segments ``old`` ((base,
        inode, size) as the cleaner read them, the first named ``base``). Writes the cleaner
        checkpoint when ``checkpoint`` >= 0. The replaced .log files stay readable under their
        retired names for ``retire_s`` seconds. Raises swap.SwapRefused (the copies are
        removed, nothing changed; swap.SwapNoSpace when the commit found the disk full);
        OSError after the commit (the writer must stop: the next open finishes the swap)."""
        bases = [s.base_offset for s in self._sealed]
        step = self.crash_hook or (lambda name: None)
        plan: list[tuple[int, int, SegmentInfo]] = []
        try:
            prev_end = -1
            for base, old in groups:
                i = bases.index(base)
                if [b for b, _, _ in old] != bases[i:i + len(old)] or i < prev_end:
                    raise swap.SwapRefused(f"segments {[b for b, _, _ in old]} are not consecutive "
                                           f"sealed segments of {self.directory}, in order")
                j = prev_end = i + len(old)
                next_base = bases[j] if j < len(bases) else self._active.base_offset
                plan.append((i, j, swap.check_copy(self.directory, base, old, next_base)[0]))
        except (ValueError, swap.SwapRefused) as e:
            swap.remove_cleaned(self.directory)
            raise swap.SwapRefused(str(e)) from None
        step("checked")
        if self._rebuild_ix is not None:
            self.finish_txn_index_rebuild()
        m = swap.SwapManifest([(base, [b for b, _, _ in old]) for base, old in groups], checkpoint)
        swap.write_manifest(self.directory, m)
        step("committed")
        retired = swap.roll_forward(self.directory, m, retire=True, step=step)
        for i, j, info in reversed(plan):
            self._sealed[i:j] = [info]
        self.segments_version += 1
        until = time.monotonic() + retire_s
        self._retired += [(until, p) for p in retired]
        return [info for _, _, info in plan]

    @property
    def has_retired(self) -> bool:
        return bool(self._retired)

    def delete_retired(self, now: float | None = None) -> int:
        """Remove the retired files whose time has come; returns how many went."""
        now = time.monotonic() if now is None else now
        due = [p for t, p in self._retired if t <= now]
        if due:
            self._retired = [(t, p) for t, p in self._retired if t > now]
            for p in due:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        return len(due)

    # -- lookups -----------------------------------------------------------------------------
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets by timestamp: (offset, timestamp) of the first record whose
        timestamp is >= ``timestamp``, or None."""
        from appliance.log.reader import LogReader
        if self._reader is None:
            self._reader = LogReader(self.directory,
                                     max_decompressed_bytes=self.settings.max_decompressed_bytes)
        if self._reader_version != self.segments_version:
            self._reader.refresh()
            self._reader_version = self.segments_version
        return self._reader.offset_for_timestamp(timestamp, self.log_end_offset,
                                                 log_start_offset=self._log_start_offset)

    def headers_from(self, offset: int) -> Iterator[tuple[int, BatchHeader, tuple[int, int] | None]]:
        """(base offset, header, control) of every batch whose last offset is >= ``offset``, in
        log order, read through a private read-only map of each segment (used to replay producer
        state after a snapshot). ``control`` is None for data batches and ``(type, coordinator
        epoch)`` for a control batch (type ABORT = 0, COMMIT = 1 as on the wire; coordinator epoch
        -1 for other control types): its one record is decoded, the only per-record work here
        and once per marker. No CRC pass."""
        segs = [(s.base_offset, s.size) for s in self._sealed] + [(self._active.base_offset, self._active.size)]
        for i, (base, size) in enumerate(segs):
            nxt = segs[i + 1][0] if i + 1 < len(segs) else None
            if nxt is not None and nxt <= offset or size == 0:
                continue
            fd = os.open(log_path(self.directory, base), os.O_RDONLY)
            try:
                m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
            finally:
                os.close(fd)
            try:
                for pos, h in iter_batch_headers(m, 0, size):
                    if h.base_offset + h.last_offset_delta >= offset:
                        ctrl = None
                        if h.is_control:
                            try:
                                ctrl = parse_control_record(m[pos:pos + h.batch_length + 12])
                            except KafkaError:
                                ctrl = (-1, -1)     # unreadable: no transaction marker
                        yield h.base_offset, h, ctrl
            finally:
                m.close()

    # -- closing -----------------------------------------------------------------------------
    def close(self, clean: bool = True, deferred: DeferredSync | None = None) -> None:
        """Clean: seal the active segment (trimmed files, fsynced) and leave the clean-shutdown
        marker, so the next open skips the scan. Not clean: just let go, as a crash would.
        ``deferred``: the fsyncs and the marker are left to it (a writer host's stop makes
        those of all its partitions at once, ``DeferredSync``)."""
        if self._closed:
            return
        self._closed = True
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if not clean:
            self._close_rebuild_ix(sync=False)
            self._active.abandon()
            return
        if deferred is not None:
            ix = self._rebuild_ix
            if ix is not None and ix.has_file():
                deferred.file(ix.path)
            self._close_rebuild_ix(sync=False)
            self._active.seal(deferred=deferred)
            deferred.marker(self.directory)
            return
        self._close_rebuild_ix(sync=True)
        self._active.seal()
        # The marker is an empty file: only its name must be durable, which the directory's
        # fsync makes it (no fsync of the file: one of the few a clean stop costs per partition).
        marker = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        fsync_dir(self.directory)

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close(clean=exc[0] is None)

