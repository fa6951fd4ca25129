"""A log compacted by rewrite: the engine under the coordinator worker's two logs.

Run by the coordinator worker (``workers/coordinator.py``; one process, single-threaded, not
thread-safe). Kafka keeps coordinator state in compacted topics (``__transaction_state``,
``__consumer_offsets``); a single node needs one partition of each, and each is a
``CompactedLog`` subclass: the transaction-state log (``appliance.txn.state_manager``) and the
group log (``appliance.group.store``).

``CompactedLog`` owns what both logs do alike: the directories, opening with crash repair,
appending batches with the fdatasync the flush policy asks for, replaying every batch in log
order, live-bytes accounting, the compaction trigger, the rewrite and the swap, anomaly
reporting, closing, and the one pair of errors (``CompactedLogCorrupt``,
``CompactedLogWriteError``). A store adds its record codec, the code that applies a replayed
batch to its in-memory state (the same code its live writes use), and ``live_records()``: what a
rewrite keeps, in log order.

Durability: an append returns only after its batch is in the log (page cache: survives a
kill -9) and, when the flush policy makes acks wait for a sync (``batch``, ``interval``), after
an fdatasync of the active segment (earlier segments were fsynced when they rolled). The stores'
callers answer the client after the append returns: persisted before the reply, as Kafka's
coordinators answer only once their append to the internal topic completed.

Compaction: Kafka's LogCleaner keeps the last record per key of a compacted topic. Here the
store knows its live records in memory, so compaction is a rewrite: when the log is larger than
``compact_bytes`` and more than twice the live bytes, the live records are written to a fresh
``PartitionLog`` in ``<live>.compacting``, which is sealed (trimmed, fsynced) and swapped in.
Nothing else shrinks these logs (``rewrite_log_settings``: no time roll, no retention).

A log ``<live>`` is compacted through ``<live>.compacting`` (the new log) and ``<live>.old``
(the previous log during the swap)::

    write the live records into .compacting; seal it        steps "begin", "copying"..., "written"
    write the complete marker into .compacting (fsynced); fsync parent          step "marked"
    close the live log                                                          step "closed"
    rename <live> -> <live>.old;           fsync parent                         step "old-moved"
    rename <live>.compacting -> <live>;    fsync parent                         step "new-moved"
    remove <live>.old and the marker;      fsync parent                         step "cleaned"

Opening repairs whatever a crash left, so a crash at any instant yields the old or the new log,
never a mix and never nothing::

    <live> present                       -> it is current; remove .compacting and .old
    <live> absent, .compacting complete  -> the crash fell between the two renames: finish them
    <live> absent, only .old             -> (cannot happen: .old exists only once .compacting
                                            is complete) put .old back

The ``crash_hook`` (tests only) is called with each step name above; the crash tests raise from
it to stop the swap at every point. A compaction that fails while the process lives is repaired
the same way and retried on a later append; the append that triggered it has succeeded.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Callable, ClassVar, Iterable, Iterator, NamedTuple, Protocol, Sequence, TypeVar

from appliance.config import FlushPolicy
from appliance.errors import ErrorCode, KafkaError
from appliance.log.files import log_path
from appliance.durable import atomic_write, fsync_dir, make_dirs
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.protocol.internal_records import RecordDecodeError, UnknownKeyVersion
from appliance.protocol.records import (BatchHeader, Record, batch_crc_ok, build_batch,
                                        decode_records, iter_batch_headers)

__all__ = [
    "CompactedLog", "CompactedLogCorrupt", "CompactedLogDamaged", "CompactedLogWriteError", "LiveRecord", "Appended",
    "SwapDirs", "COMPLETE_MARKER", "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH", "rewrite_log_settings",
    "wall_clock_ms",
]

log = logging.getLogger("appliance.log.compacted_log")

K = TypeVar("K")

COMPLETE_MARKER = "compaction-complete"
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

# A rewrite's batches hold at most this many bytes of keys and values (and at most the store's
# REWRITE_BATCH_RECORDS records).
REWRITE_BATCH_BYTES = 1024 * 1024


class CompactedLogCorrupt(Exception):
    """A record of the log cannot be decoded: the store refuses to load (Kafka aborts the load of
    the partition at that record) rather than run with a state that lacks what follows it."""


class CompactedLogDamaged(CompactedLogCorrupt):
    """A sealed segment holds a batch that fails its CRC or bytes that frame no batch (bit rot,
    issue 34). ``path`` and ``offset`` name the file and where the damage starts; the message
    says what to do about it."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        super().__init__(f"{what}; the state that follows cannot be loaded without it: restore "
                         f"{path} from a backup (the coordinator refuses to start until then)")
        self.path = path
        self.offset = offset


class CompactedLogWriteError(Exception):
    """An append failed. ``maybe_written``: the batch may be in the log although the append
    reported failure (the fdatasync failed after the write), so memory and log may disagree."""

    def __init__(self, code: ErrorCode, message: str, *, maybe_written: bool) -> None:
        super().__init__(message)
        self.code = code
        self.maybe_written = maybe_written


class HasRecordOffset(Protocol):
    record_offset: int


class LiveRecord(NamedTuple):
    """One record a rewrite keeps. Consecutive records of the same producer id and epoch share a
    batch (a transactional one when the producer id is not -1). ``entry``, if given, gets the
    record's new offset once the new log is in place."""

    key: bytes
    value: bytes
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    entry: HasRecordOffset | None = None


class Appended(NamedTuple):
    base_offset: int
    size: int                       # bytes of the batch in the log


def rewrite_log_settings(segment_bytes: int) -> LogSettings:
    """Settings for a log compacted only by rewrite: nothing rolls by time, nothing goes by
    retention."""
    return LogSettings(segment_bytes=segment_bytes, segment_ms=2**62,
                       retention_bytes=-1, retention_ms=-1,
                       segment_index_bytes=1048576,
                       max_message_bytes=segment_bytes)


def rmtree(path: str) -> None:
    """Remove a directory tree (or a stray file or link) if it is there."""
    if os.path.lexists(path):
        shutil.rmtree(path)


class SwapDirs(NamedTuple):
    """The three directories of one compacted log, under ``parent`` (see the module docstring)."""

    parent: str
    live: str
    new: str
    old: str

    @classmethod
    def under(cls, parent: str, live: str, new: str, old: str) -> "SwapDirs":
        j = os.path.join
        return cls(parent, j(parent, live), j(parent, new), j(parent, old))

    def swap_in(self, close_live: Callable[[], None], step: Callable[[str], None]) -> None:
        """Make the sealed log in ``new`` the live one. ``close_live`` closes the caller's live
        log; the caller opens ``live`` again afterwards."""
        atomic_write(os.path.join(self.new, COMPLETE_MARKER), b"")   # fsyncs the file and `new`
        fsync_dir(self.parent)
        step("marked")
        close_live()
        step("closed")
        os.rename(self.live, self.old)
        fsync_dir(self.parent)
        step("old-moved")
        os.rename(self.new, self.live)
        fsync_dir(self.parent)
        step("new-moved")
        rmtree(self.old)
        os.unlink(os.path.join(self.live, COMPLETE_MARKER))
        fsync_dir(self.parent)
        step("cleaned")

    def repair(self, what: str, logger: logging.Logger = log) -> bool:
        """Finish or undo a swap a crash interrupted; True if anything had to change. ``what``
        names the log in the message; ``logger`` is the store's, so the message comes from the
        module that owns the log."""
        changed = False
        if not os.path.isdir(self.live):
            if os.path.exists(os.path.join(self.new, COMPLETE_MARKER)):
                os.rename(self.new, self.live)
                changed = True
            elif os.path.isdir(self.old):
                os.rename(self.old, self.live)
                changed = True
        for leftover in (self.new, self.old):
            if os.path.lexists(leftover):
                rmtree(leftover)
                changed = True
        marker = os.path.join(self.live, COMPLETE_MARKER)
        if os.path.exists(marker):
            os.unlink(marker)
            changed = True
        if changed:
            fsync_dir(self.parent)
            logger.info("%s: finished an interrupted compaction", what)
        return changed


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class CompactedLog:
    """One compacted log under ``directory``; subclassed by each store, which sets the class
    attributes below, implements ``live_records``, and loads by passing ``_replay`` the function
    that applies one batch to its in-memory state.

    The store keeps ``_live_bytes`` current (what its live records take in the log, exactly or
    estimated) as it applies records; ``_replay`` starts it from 0.
    """

    WHAT: ClassVar[str]                           # names the log in messages
    DIRS: ClassVar[tuple[str, str, str]]          # live, compacting, old (names under directory)
    LOGGER: ClassVar[logging.Logger] = log
    Corrupt: ClassVar[type[CompactedLogCorrupt]] = CompactedLogCorrupt
    Damaged: ClassVar[type[CompactedLogDamaged]] = CompactedLogDamaged
    WriteError: ClassVar[type[CompactedLogWriteError]] = CompactedLogWriteError
    REWRITE_BATCH_RECORDS: ClassVar[int] = 1000

    def __init__(self, directory: str, flush_policy: FlushPolicy | str, open_ms: int, *,
                 segment_bytes: int, compact_bytes: int,
                 clock: Callable[[], int] = wall_clock_ms,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        """``open_ms``: the time of opening (segment creation). ``clock``: the time of an
        operation whose caller gives none. ``flush_policy``: a FlushPolicy or its config value
        (ValueError for anything else)."""
        self.directory = directory
        self.flush_policy = FlushPolicy(flush_policy)
        self.compact_bytes = compact_bytes
        self._settings = rewrite_log_settings(segment_bytes)
        self._clock = clock
        self._crash_hook = crash_hook
        self.anomalies: list[str] = []
        self.compactions = 0
        self._live_bytes = 0
        self._loaded = False
        self._swap = SwapDirs.under(directory, *self.DIRS)
        make_dirs(directory)    # its name durable: the first sync makes only the live dir's
        self._repair()
        self._log: PartitionLog | None = PartitionLog.open(self._swap.live, self._settings, open_ms)

    # -- what the store supplies ------------------------------------------------------------------
    def live_records(self) -> Iterable[LiveRecord]:
        """Every record a rewrite keeps, in log order (replaying them rebuilds the same state)."""
        raise NotImplementedError

    # -- replay -----------------------------------------------------------------------------------
    def _batches(self) -> Iterator[tuple[BatchHeader, memoryview]]:
        """(header, batch bytes) of every batch in log order.

        Sealed segments and a cleanly closed active one are loaded without a scan, so bit rot
        (issue 34) is found here, by each batch's CRC and by bytes that frame no batch. Kafka's
        rule for any log, its internal topics included: a bad batch in the tail is truncated
        (LogLoader's recovery of the active segment), so a damaged batch in the active segment
        ends the log there (``_truncate_tail``; the state replayed so far is exactly the
        truncated log's). A damaged sealed segment is ``Damaged``: the coordinator refuses to
        start naming the file and the offset (exit 3) instead of running without the state that
        follows, or crash-looping on it."""
        lg = self._log
        assert lg is not None
        for base in lg.segment_bases():
            path = log_path(lg.directory, base)
            active = base == lg.active_segment_base
            size = lg.active_end_position if active else os.path.getsize(path)
            if size == 0:
                continue
            with open(path, "rb") as f:
                data = f.read(size)
            mv = memoryview(data)
            end, offset, why = 0, base, ""
            for pos, h in iter_batch_headers(data, 0, len(data)):
                if not batch_crc_ok(data, pos, h.size, h.crc):
                    why = "fails its CRC"
                    break
                yield h, mv[pos:pos + h.size]
                end, offset = pos + h.size, h.base_offset + h.last_offset_delta + 1
            else:
                if any(mv[end:]):
                    why = "is torn (its length frames no batch)"
            if not why:
                continue
            where = f"the batch at offset {offset} (position {end} of {path})"
            if not active:
                raise self.Damaged(path, offset, f"{self.WHAT}: {where} {why}")
            self._truncate_tail(path, offset, f"{where} {why}")
            return

    def _truncate_tail(self, path: str, offset: int, what: str) -> None:
        """Cut the log before a damaged batch of its active segment: the reopen after an unclean
        close recovers the active segment, which truncates after its last valid batch."""
        self._anomaly(f"{what}: the log is truncated there (what followed it is lost)")
        assert self._log is not None
        self._log.close(clean=False)
        self._log = None
        self._log = PartitionLog.open(self._swap.live, self._settings, self._clock())
        if self._log.log_end_offset != offset:
            # Recovery judged an earlier batch bad: what was replayed is no longer the log.
            raise self.Damaged(path, offset, f"{self.WHAT}: {what}; recovery truncated the log "
                                             f"at offset {self._log.log_end_offset} instead")

    # Called every PROGRESS_BATCHES batches of a replay (the coordinator beats its heartbeat
    # there: a load longer than the supervisor's heartbeat timeout, a big log on a slow
    # machine, would have every incarnation killed until the crash-loop rule stops the appliance).
    progress: Callable[[], None] | None = None
    PROGRESS_BATCHES: ClassVar[int] = 256

    def _replay(self, apply: Callable[[BatchHeader, memoryview], None]) -> None:
        """Hand every batch of the log to ``apply``, in log order; the store has cleared its
        state. Afterwards the store knows every live record, so compaction may run."""
        self._live_bytes = 0
        progress, every = self.progress, self.PROGRESS_BATCHES
        for n, (h, batch) in enumerate(self._batches(), 1):
            apply(h, batch)
            if progress is not None and n % every == 0:
                progress()
        self._loaded = True

    def _decode(self, h: BatchHeader, batch: memoryview) -> list[Record]:
        """The records of a (CRC-valid) batch; ``Corrupt`` if they cannot be decoded."""
        try:
            return decode_records(batch)
        except KafkaError as e:
            raise self.Corrupt(f"undecodable batch at offset {h.base_offset}: {e}") from None

    def _replay_key(self, key: bytes | None, decode: Callable[[bytes], K], where: str = "") -> K | None:
        """A replayed record's decoded key, or None for a record to skip, by the rule Kafka's
        loaders of both logs follow: a record without a key or with a key version the log does
        not know is logged and skipped; a key that cannot be decoded is ``Corrupt``. ``where``
        places the record in the messages (e.g. " at offset 7")."""
        if key is None:
            self._anomaly(f"record without a key{where} skipped")
            return None
        try:
            return decode(key)
        except UnknownKeyVersion as e:
            self._anomaly(f"{e}{where}: record skipped")
            return None
        except (RecordDecodeError, UnicodeDecodeError) as e:
            raise self.Corrupt(f"undecodable {self.WHAT} key{where}: {e}") from None

    def _anomaly(self, text: str) -> None:
        """Something replay skipped or tolerated (Kafka logs and goes on there too)."""
        self.LOGGER.warning("%s: %s", self.WHAT, text)
        self.anomalies.append(text)

    # -- appending --------------------------------------------------------------------------------
    def _append(self, records: Sequence[tuple[bytes, bytes | None]], now_ms: int,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH, *,
                sync: bool = True) -> Appended:
        """Append ``records`` as one batch (transactional when ``producer_id`` is not -1), then
        sync unless ``sync`` is False (the caller syncs once after several). ``WriteError``."""
        batch = _build(records, now_ms, producer_id, producer_epoch)
        assert self._log is not None
        base = self._append_to(self._log, batch, now_ms)
        if sync:
            self._sync()
        return Appended(base, len(batch))

    def _append_control(self, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int, now_ms: int) -> None:
        """Append and sync a COMMIT or ABORT control batch of ``producer_id``. ``WriteError``."""
        assert self._log is not None
        try:
            self._log.append_control(producer_id, producer_epoch, commit, coordinator_epoch, now_ms)
        except (KafkaError, OSError) as e:
            raise self._write_error(e) from None
        self._sync()

    def _append_to(self, lg: PartitionLog, batch: bytearray, now_ms: int) -> int:
        try:
            return lg.append(batch, now_ms).base_offset
        except (KafkaError, OSError) as e:
            raise self._write_error(e) from None

    def _write_error(self, e: KafkaError | OSError) -> CompactedLogWriteError:
        code = e.code if isinstance(e, KafkaError) else ErrorCode.kafka_storage_error
        return self.WriteError(code, str(e), maybe_written=False)

    def _sync(self) -> None:
        """fdatasync the active segment if the flush policy makes an ack wait for it."""
        if not self.flush_policy.ack_waits_for_sync:
            return
        assert self._log is not None
        try:
            fd, _ = self._log.flush_target()
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise self.WriteError(ErrorCode.kafka_storage_error, f"fdatasync: {e}",
                                  maybe_written=True) from None

    # -- size and compaction ----------------------------------------------------------------------
    def size_in_bytes(self) -> int:
        assert self._log is not None
        return self._log.size_in_bytes()

    @property
    def live_bytes(self) -> int:
        return self._live_bytes

    def _maybe_compact(self, now_ms: int | None = None) -> None:
        """Compact if the log outgrew ``compact_bytes`` and twice its live bytes. Only after the
        replay: before it, memory does not know every live record yet."""
        if not self._loaded:
            return
        size = self.size_in_bytes()
        if size > self.compact_bytes and size > 2 * self._live_bytes:
            try:
                self.compact(now_ms)
            except Exception as e:
                # The write that triggered this is already done; compaction is retried on the
                # next write. A failure halfway is repaired like a crash; a rewrite that did not
                # get as far as the swap is removed at once (on a full disk it holds blocks).
                if isinstance(e, (OSError, KafkaError, CompactedLogWriteError)) \
                        and self._log is not None:
                    self.LOGGER.warning("%s compaction failed: %s", self.WHAT, e)
                else:
                    self.LOGGER.exception("%s compaction failed", self.WHAT)
                if self._log is None:
                    self._repair()
                    self._log = PartitionLog.open(self._swap.live, self._settings, self._now(now_ms))
                elif not os.path.exists(os.path.join(self._swap.new, COMPLETE_MARKER)):
                    rmtree(self._swap.new)

    def _step(self, name: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(name)

    def _now(self, now_ms: int | None) -> int:
        return self._clock() if now_ms is None else now_ms

    def compact(self, now_ms: int | None = None) -> None:
        """Rewrite the live records into a fresh log and swap it in (see the module docstring)."""
        if not self._loaded:
            raise RuntimeError("compact() before load()")
        now = self._now(now_ms)
        dirs = self._swap
        rmtree(dirs.new)
        self._step("begin")
        live = list(self.live_records())
        nlog = PartitionLog.open(dirs.new, self._settings, now)
        offsets: list[int] = []
        try:
            for chunk in self._rewrite_batches(live):
                first = chunk[0]
                batch = _build([(r.key, r.value) for r in chunk], now, first.producer_id,
                               first.producer_epoch)
                base = self._append_to(nlog, batch, now)
                offsets += range(base, base + len(chunk))
                self._step("copying")
        except BaseException:
            nlog.close(clean=False)
            raise
        nlog.close(clean=True)                      # sealed: trimmed and fsynced
        self._step("written")
        reached: list[str] = []

        def step(name: str) -> None:
            reached.append(name)
            self._step(name)
        try:
            dirs.swap_in(self._close_live, step)
        except Exception:
            # The process lives on and opening repairs: towards the new log once the first
            # rename happened, so memory must then carry the new log's offsets.
            if "old-moved" in reached or not os.path.isdir(dirs.live):
                _renumber(live, offsets)
            raise
        _renumber(live, offsets)
        self.compactions += 1
        self._log = PartitionLog.open(dirs.live, self._settings, now)

    def _rewrite_batches(self, live: list[LiveRecord]) -> Iterator[list[LiveRecord]]:
        """Consecutive records of one producer id and epoch, at most REWRITE_BATCH_RECORDS
        records and about REWRITE_BATCH_BYTES bytes a batch."""
        i = 0
        while i < len(live):
            kind = live[i][2:4]
            j, nbytes = i, 0
            while (j < len(live) and live[j][2:4] == kind and j - i < self.REWRITE_BATCH_RECORDS
                   and nbytes < REWRITE_BATCH_BYTES):
                nbytes += len(live[j].key) + len(live[j].value)
                j += 1
            yield live[i:j]
            i = j

    def _close_live(self) -> None:
        assert self._log is not None
        self._log.close(clean=True)
        self._log = None

    def _repair(self) -> None:
        self._swap.repair(self.WHAT, self.LOGGER)

    # -- closing ----------------------------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        if self._log is not None:
            self._log.close(clean=clean)
            self._log = None


def _renumber(live: list[LiveRecord], offsets: list[int]) -> None:
    """Give each rewritten record's entry its offset in the new log."""
    for rec, offset in zip(live, offsets):
        if rec.entry is not None:
            rec.entry.record_offset = offset


def _build(records: Sequence[tuple[bytes, bytes | None]], now_ms: int, producer_id: int,
           producer_epoch: int) -> bytearray:
    """One batch (magic 2, no compression, CreateTime ``now_ms``); transactional, with base
    sequence 0 as Kafka's generateOffsetRecords writes it, when ``producer_id`` is not -1."""
    txn = producer_id != NO_PRODUCER_ID
    return bytearray(build_batch([Record(k, v, (), now_ms) for k, v in records],
                                 base_timestamp=now_ms, producer_id=producer_id,
                                 producer_epoch=producer_epoch,
                                 base_sequence=0 if txn else -1, transactional=txn))
