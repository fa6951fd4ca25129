"""The transaction-state log and the coordinator epoch, on disk.

Owned by the coordinator worker (``workers/coordinator.py``; one process, single-threaded, not
thread-safe). Kafka keeps this state in the compacted topic ``__transaction_state``; a single node
needs one partition of it, so the log is a ``CompactedLog`` (``appliance.log.compacted_log``,
which owns the directories, appending and syncing per ``log.flush.policy``, replay, compaction
by rewrite and its crash-safe swap, and draws them) in ``<directory>/txn-log/`` holding
one-record batches (magic 2, no compression, no producer id), key = TransactionLogKey v0, value =
TransactionLogValue v1 or null (tombstone). See ``appliance.txn.records`` for the record layouts.
This module holds the replay rules and which records are live.

Durability: ``append`` returns only after the record is in the log, and, unless
``log.flush.policy`` is ``os``, after an fdatasync of the active segment. The coordinator answers
the client after ``append`` returns, so "persisted before the reply" holds for every policy
against a process crash and, for ``batch`` and ``interval``, against a power loss.

Load (Kafka's TransactionStateManager.loadTransactionMetadata): replay from the start; the last
record per transactional id wins, a tombstone deletes it. KIP-98's coordinator startup calls a
record with a lower epoch than an earlier one a corrupt log (KIP-890 and KIP-939 narrow that to
the same producer id, since an epoch overflow moves to a new producer id with epoch 0). Kafka's
loader performs no such check (last record wins, whatever the epochs), and we follow Kafka: such a
regression is logged and kept in ``anomalies``, and the later record still wins. A key with an
unknown version is skipped (Kafka: "a left-over from an aborted upgrade"). A value that cannot be
decoded raises ``TransactionLogCorrupt``: Kafka aborts the load of the partition at that record;
we refuse to start rather than run with a state that silently lacks the records after it.

Live records (what a compaction rewrite keeps): the last record of each transactional id, no
tombstones, in log order.

Coordinator epoch (``bump_coordinator_epoch``): ``<directory>/coordinator-epoch`` holds the last
epoch as decimal text; each coordinator start reads it, adds one, and replaces the file atomically
(write, fsync, rename, fsync dir) before using the new value, so epochs only grow across restarts,
as Kafka's do (there the coordinator epoch is the leader epoch of the transaction-log partition).
Partitions fence WriteTxnMarkers from a lower coordinator epoch (TRANSACTION_COORDINATOR_FENCED).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterator

from appliance.config import FlushPolicy
from appliance.log.compacted_log import (COMPLETE_MARKER, CompactedLog, CompactedLogCorrupt,
                                         CompactedLogWriteError, LiveRecord, wall_clock_ms)
from appliance.durable import atomic_write
from appliance.protocol.records import BatchHeader
from appliance.txn.metadata import TransactionMetadata, TransactionState
from appliance.txn.records import RecordDecodeError, decode_key, decode_value, encode_key, encode_value

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


class TransactionLogCorrupt(CompactedLogCorrupt):
    """A record of the transaction log cannot be decoded."""


class TxnLogWriteError(CompactedLogWriteError):
    """An append to the transaction log failed (see CompactedLogWriteError: ``code``,
    ``maybe_written``)."""


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


class TransactionStateManager(CompactedLog):
    """The transaction-state log of one coordinator (``<directory>/txn-log/``)."""

    WHAT = "transaction log"
    DIRS = (LOG_DIR, COMPACTING_DIR, OLD_DIR)
    LOGGER = log
    Corrupt = TransactionLogCorrupt
    WriteError = TxnLogWriteError
    REWRITE_BATCH_RECORDS = 1                 # one record per batch, as every append writes it

    def __init__(self, directory: str, flush_policy: FlushPolicy | str = FlushPolicy.OS,
                 now_ms: int | Callable[[], int] | None = None, *,
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 compact_bytes: int = DEFAULT_COMPACT_BYTES,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        """``now_ms``: a clock (callable) or the current time (int; later appends then use the
        wall clock). ``crash_hook``: tests only; called with the name of each compaction step
        boundary, raising there simulates a crash."""
        clock = now_ms if callable(now_ms) else wall_clock_ms
        # transactional id -> (encoded key, encoded value, batch size) of its last record
        self._live: dict[str, tuple[bytes, bytes, int]] = {}
        super().__init__(directory, flush_policy, now_ms if isinstance(now_ms, int) else clock(),
                         segment_bytes=segment_bytes, compact_bytes=compact_bytes, clock=clock,
                         crash_hook=crash_hook)

    # -- loading ----------------------------------------------------------------------------------
    def load(self) -> dict[str, TransactionMetadata]:
        """Replay the log: the metadata of every live transactional id."""
        out: dict[str, TransactionMetadata] = {}
        self._live.clear()

        def apply(h: BatchHeader, batch: memoryview) -> None:
            for rec in self._decode(h, batch):
                self._apply(out, rec.key, rec.value, h.size)
        self._replay(apply)
        return out

    def _apply(self, out: dict[str, TransactionMetadata], key: bytes | None, value: bytes | None,
               size: int) -> None:
        """Replay one record into ``out`` (see the module docstring)."""
        tid = self._replay_key(key, decode_key)
        if tid is None:
            return
        self._forget(tid)
        if value is None:
            out.pop(tid, None)
            return
        try:
            v = decode_value(value)
            md = TransactionMetadata.from_log_value(tid, v)
        except (RecordDecodeError, UnicodeDecodeError, ValueError) as e:
            raise TransactionLogCorrupt(f"transactional id {tid!r}: undecodable value: {e}") from None
        if md.state == TransactionState.Dead:
            # never written by us (expiration writes a tombstone); treat it as one
            self._anomaly(f"{tid!r}: Dead record treated as a tombstone")
            out.pop(tid, None)
            return
        if md.state == TransactionState.PrepareEpochFence:
            # never written by us; the fence it stood for has not happened: still Ongoing
            self._anomaly(f"{tid!r}: PrepareEpochFence record loaded as Ongoing")
            md.state = TransactionState.Ongoing
        prev = out.get(tid)
        if prev is not None and prev.producer_id == md.producer_id and md.producer_epoch < prev.producer_epoch:
            # KIP-98's coordinator startup calls this a corrupt log; Kafka's loader does not
            # check and the last record wins.
            self._anomaly(f"{tid!r}: producer {md.producer_id} epoch went down from "
                          f"{prev.producer_epoch} to {md.producer_epoch}; keeping the later record")
        out[tid] = md
        self._remember(tid, key, value, size)

    def _remember(self, tid: str, key: bytes, value: bytes, size: int) -> None:
        self._forget(tid)
        self._live[tid] = (key, value, size)
        self._live_bytes += size

    def _forget(self, tid: str) -> None:
        old = self._live.pop(tid, None)
        if old is not None:
            self._live_bytes -= old[2]

    def live_records(self) -> Iterator[LiveRecord]:
        """The last record of every live id; ``_live`` keeps them in log order (a write moves its
        id to the end). A rewrite gives each the same one-record batch, of the same size."""
        for key, value, _ in self._live.values():
            yield LiveRecord(key, value)

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
        """Append one record as its own batch; its size in the log."""
        return self._append([(key, value)], self._clock(), sync=sync).size
