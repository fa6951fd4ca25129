"""The transaction-state log and the coordinator epoch, on disk.

Owned by the coordinator worker (one process; not thread-safe). Kafka keeps this state in the
compacted topic ``__transaction_state``; a single node needs one partition of it, so the log is a
``PartitionLog`` in ``<directory>/txn-log/`` holding one-record batches (magic 2, no compression,
no producer id), key = TransactionLogKey v0, value = TransactionLogValue v1 or null (tombstone).
See ``appliance.txn.records`` for the record layouts.

Durability: ``append`` returns only after the record is in the log, and, unless
``log.flush.policy`` is ``os``, after an fdatasync of the active segment (earlier segments were
fsynced when they rolled). The coordinator answers the client after ``append`` returns, so
"persisted before the reply" holds for every policy against a process crash and, for ``batch``
and ``interval``, against a power loss.

Load (Kafka's TransactionStateManager.loadTransactionMetadata): replay from the start; the last
record per transactional id wins, a tombstone deletes it. Seeds-digest §4.12/C24 say a record with
a lower epoch than an earlier one for the same producer id means a corrupt log. Kafka performs no
such check (last record wins, whatever the epochs), and we follow Kafka: such a regression is
logged and kept in ``anomalies``, and the later record still wins. A key with an unknown version
is skipped (Kafka: "a left-over from an aborted upgrade"). A value that cannot be decoded raises
``TransactionLogCorrupt``: Kafka aborts the load of the partition at that record; we refuse to
start rather than run with a state that silently lacks the records after it.

Compaction by rewrite, when the log is larger than ``compact_bytes`` and more than twice the live
records: the live records (last per id, no tombstones) are written to ``txn-log.compacting/``,
which is sealed and fsynced; then ``appliance.log.compaction`` (shared with the group log) marks
it complete and swaps it in by two renames (txn-log -> txn-log.old, txn-log.compacting ->
txn-log). Opening repairs whatever a crash left, so a crash at any instant yields the old or the
new log, never a mix and never nothing. That module's docstring draws the swap and the repair.

Coordinator epoch (``bump_coordinator_epoch``): ``<directory>/coordinator-epoch`` holds the last
epoch as decimal text; each coordinator start reads it, adds one, and replaces the file atomically
(write, fsync, rename, fsync dir) before using the new value, so epochs only grow across restarts
(seeds-digest Appendix A; writers fence markers from a lower epoch).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterator

from appliance.errors import ErrorCode, KafkaError
from appliance.log.compaction import COMPLETE_MARKER, SwapDirs, rewrite_log_settings, rmtree
from appliance.log.files import atomic_write, log_path
from appliance.log.partition_log import PartitionLog
from appliance.protocol.records import Record, build_batch, decode_records, iter_batch_headers
from appliance.txn.metadata import TransactionMetadata, TransactionState
from appliance.txn.records import (RecordDecodeError, UnknownKeyVersion, decode_key, decode_value,
                                   encode_key, encode_value)

__all__ = [
    "TransactionStateManager", "TransactionLogCorrupt", "TxnLogWriteError",
    "bump_coordinator_epoch", "read_coordinator_epoch",
    "LOG_DIR", "COMPACTING_DIR", "OLD_DIR", "COMPLETE_MARKER", "EPOCH_FILE",
]

log = logging.getLogger("appliance.txn.state")

LOG_DIR = "txn-log"
COMPACTING_DIR = "txn-log.compacting"
OLD_DIR = "txn-log.old"
EPOCH_FILE = "coordinator-epoch"

DEFAULT_SEGMENT_BYTES = 104857600      # transaction.state.log.segment.bytes
DEFAULT_COMPACT_BYTES = 16 * 1024 * 1024
MAX_COORDINATOR_EPOCH = 2**31 - 1


class TransactionLogCorrupt(Exception):
    """A record of the transaction log cannot be decoded."""


class TxnLogWriteError(Exception):
    """An append failed. ``maybe_written``: the record may be in the log although the append
    reported failure (the fdatasync failed after the write), so memory and log may disagree."""

    def __init__(self, code: ErrorCode, message: str, *, maybe_written: bool) -> None:
        super().__init__(message)
        self.code = code
        self.maybe_written = maybe_written


def read_coordinator_epoch(directory: str) -> int:
    """The last coordinator epoch used in ``directory`` (0 when none)."""
    path = os.path.join(directory, EPOCH_FILE)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 0
    try:
        value = int(text)
    except ValueError:
        # The file is only ever replaced atomically: garbage means damage. Guessing a value
        # could hand out an epoch the writers already fence, so refuse.
        raise ValueError(f"{path}: not a coordinator epoch: {text[:40]!r}") from None
    if not 0 <= value <= MAX_COORDINATOR_EPOCH:
        raise ValueError(f"{path}: coordinator epoch {value} out of range")
    return value


def bump_coordinator_epoch(directory: str) -> int:
    """Read, increment and durably write the coordinator epoch; returns the new epoch."""
    os.makedirs(directory, exist_ok=True)
    new = read_coordinator_epoch(directory) + 1
    if new > MAX_COORDINATOR_EPOCH:
        raise ValueError("coordinator epoch exhausted")
    atomic_write(os.path.join(directory, EPOCH_FILE), f"{new}\n".encode("ascii"))
    return new


class TransactionStateManager:
    """The transaction-state log of one coordinator (``<directory>/txn-log/``)."""

    def __init__(self, directory: str, flush_policy: str = "os",
                 now_ms: int | Callable[[], int] | None = None, *,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 compact_bytes: int = DEFAULT_COMPACT_BYTES,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        """``now_ms``: a clock (callable) or the current time (int; later appends then use the
        wall clock). ``crash_hook``: tests only; called with the name of each compaction step
        boundary, raising there simulates a crash."""
        self.directory = directory
        self.flush_policy = flush_policy
        if callable(now_ms):
            self._clock: Callable[[], int] = now_ms
        else:
            self._clock = lambda: time.time_ns() // 1_000_000
        open_ms = now_ms if isinstance(now_ms, int) else self._clock()
        self.compact_bytes = compact_bytes
        self._settings = rewrite_log_settings(segment_bytes)
        self._crash_hook = crash_hook
        self.anomalies: list[str] = []
        # transactional id -> (encoded key, encoded value, batch size) of its last record
        self._live: dict[str, tuple[bytes, bytes, int]] = {}
        self._live_bytes = 0
        self._loaded = False
        self.compactions = 0
        self._swap = SwapDirs.under(directory, LOG_DIR, COMPACTING_DIR, OLD_DIR)
        os.makedirs(directory, exist_ok=True)
        self._repair_compaction()
        self._log = PartitionLog.open(self._path(LOG_DIR), self._settings, open_ms)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    # -- loading ----------------------------------------------------------------------------------
    def _records(self) -> Iterator[tuple[bytes | None, bytes | None, int]]:
        """(key, value, batch size) of every record in log order."""
        lg = self._log
        for base in lg.segment_bases():
            path = log_path(lg.directory, base)
            if base == lg.active_segment_base:
                size = lg.active_end_position
            else:
                size = os.path.getsize(path)
            if size == 0:
                continue
            with open(path, "rb") as f:
                data = f.read(size)
            for pos, h in iter_batch_headers(data, 0, len(data)):
                batch = memoryview(data)[pos:pos + h.size]
                for rec in decode_records(batch):
                    yield rec.key, rec.value, h.size

    def load(self) -> dict[str, TransactionMetadata]:
        """Replay the log: the metadata of every live transactional id."""
        out: dict[str, TransactionMetadata] = {}
        self._live.clear()
        self._live_bytes = 0
        for key, value, size in self._records():
            if key is None:
                self._anomaly("record without a key skipped")
                continue
            try:
                tid = decode_key(key)
            except UnknownKeyVersion as e:
                self._anomaly(f"{e}: record skipped")
                continue
            except (RecordDecodeError, UnicodeDecodeError) as e:
                raise TransactionLogCorrupt(f"undecodable transaction log key: {e}") from None
            self._forget(tid)
            if value is None:
                out.pop(tid, None)
                continue
            try:
                v = decode_value(value)
                md = TransactionMetadata.from_log_value(tid, v)
            except (RecordDecodeError, UnicodeDecodeError, ValueError) as e:
                raise TransactionLogCorrupt(f"transactional id {tid!r}: undecodable value: {e}") from None
            if md.state == TransactionState.Dead:
                # never written by us (expiration writes a tombstone); treat it as one
                self._anomaly(f"{tid!r}: Dead record treated as a tombstone")
                out.pop(tid, None)
                continue
            if md.state == TransactionState.PrepareEpochFence:
                # never written by us; the fence it stood for has not happened: still Ongoing
                self._anomaly(f"{tid!r}: PrepareEpochFence record loaded as Ongoing")
                md.state = TransactionState.Ongoing
            prev = out.get(tid)
            if prev is not None and prev.producer_id == md.producer_id and md.producer_epoch < prev.producer_epoch:
                # seeds-digest C24: corrupt by the seed's rule. Kafka does not check; last wins.
                self._anomaly(f"{tid!r}: producer {md.producer_id} epoch went down from "
                              f"{prev.producer_epoch} to {md.producer_epoch}; keeping the later record")
            out[tid] = md
            self._remember(tid, key, value, size)
        self._loaded = True
        return out

    def _anomaly(self, text: str) -> None:
        log.warning("transaction log: %s", text)
        self.anomalies.append(text)

    def _remember(self, tid: str, key: bytes, value: bytes, size: int) -> None:
        self._forget(tid)
        self._live[tid] = (key, value, size)
        self._live_bytes += size

    def _forget(self, tid: str) -> None:
        old = self._live.pop(tid, None)
        if old is not None:
            self._live_bytes -= old[2]

    # -- appending --------------------------------------------------------------------------------
    def append(self, md: TransactionMetadata) -> None:
        """Write ``md`` as the latest record of its transactional id, durably per the flush
        policy. Raises TxnLogWriteError."""
        key = encode_key(md.transactional_id)
        value = encode_value(md.to_log_value())
        size = self._write(key, value)
        self._remember(md.transactional_id, key, value, size)
        self._maybe_compact()

    def append_tombstone(self, transactional_id: str) -> None:
        """Write a tombstone (null value) for ``transactional_id``. Raises TxnLogWriteError."""
        self.append_tombstones([transactional_id])

    def append_tombstones(self, transactional_ids: list[str]) -> None:
        """Tombstones for several ids with one fdatasync (expiration of many idle ids).
        Raises TxnLogWriteError; then none of them counts as written."""
        for tid in transactional_ids:
            self._write(encode_key(tid), None, sync=False)
        self._sync()
        for tid in transactional_ids:
            self._forget(tid)
        self._maybe_compact()

    def _write(self, key: bytes, value: bytes | None, *, sync: bool = True) -> int:
        now = self._clock()
        batch = bytearray(build_batch([Record(key, value, (), now)], base_timestamp=now))
        try:
            self._log.append(batch, now)
        except KafkaError as e:
            raise TxnLogWriteError(e.code, str(e), maybe_written=False) from None
        except OSError as e:
            raise TxnLogWriteError(ErrorCode.kafka_storage_error, str(e), maybe_written=False) from None
        if sync:
            self._sync()
        return len(batch)

    def _sync(self) -> None:
        if self.flush_policy == "os":
            return
        try:
            fd, _ = self._log.flush_target()
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise TxnLogWriteError(ErrorCode.kafka_storage_error, f"fdatasync: {e}",
                                   maybe_written=True) from None

    # -- size and compaction ------------------------------------------------------------------------
    def size_in_bytes(self) -> int:
        return self._log.size_in_bytes()

    @property
    def live_bytes(self) -> int:
        return self._live_bytes

    def _maybe_compact(self) -> None:
        # Only after load(): before it, _live does not know every id yet.
        if not self._loaded:
            return
        size = self._log.size_in_bytes()
        if size > self.compact_bytes and size > 2 * self._live_bytes:
            try:
                self.compact()
            except Exception:
                # The record that triggered this is already written; compaction is retried on
                # the next append. A failure halfway is repaired like a crash.
                log.exception("transaction log compaction failed")
                if self._log is None:
                    self._repair_compaction()
                    self._log = PartitionLog.open(self._path(LOG_DIR), self._settings, self._clock())

    def _step(self, name: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(name)

    def compact(self) -> None:
        """Rewrite the live records into a fresh log and swap it in (see the module doc)."""
        if not self._loaded:
            raise RuntimeError("compact() before load()")
        dirs = self._swap
        rmtree(dirs.new)
        now = self._clock()
        self._step("begin")
        nlog = PartitionLog.open(dirs.new, self._settings, now)
        sizes: dict[str, int] = {}
        try:
            for tid, (key, value, _) in self._live.items():
                batch = bytearray(build_batch([Record(key, value, (), now)], base_timestamp=now))
                nlog.append(batch, now)
                sizes[tid] = len(batch)
                self._step("copying")
        except BaseException:
            nlog.close(clean=False)
            raise
        nlog.close(clean=True)                      # sealed: trimmed and fsynced
        self._step("written")
        dirs.swap_in(self._close_live, self._step)
        self._log = PartitionLog.open(dirs.live, self._settings, self._clock())
        for tid, size in sizes.items():
            key, value, _ = self._live[tid]
            self._live[tid] = (key, value, size)
        self._live_bytes = sum(sizes.values())
        self.compactions += 1

    def _close_live(self) -> None:
        assert self._log is not None
        self._log.close(clean=True)
        self._log = None                            # type: ignore[assignment]

    def _repair_compaction(self) -> None:
        self._swap.repair("transaction log", log)

    # -- closing ------------------------------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        if self._log is not None:
            self._log.close(clean=clean)
            self._log = None                        # type: ignore[assignment]
