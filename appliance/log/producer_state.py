"""Producer state of one partition: idempotent sequence windows (KIP-98) and open transactions.

Owned by the partition writer process alone (single-threaded). For every producer id that wrote
to the partition it keeps the epoch and the metadata of its last five batches (first and last
sequence, first and last offset, timestamp), which is how Kafka recognises a retried batch
(``NUM_BATCHES_TO_RETAIN = 5``: real clients pipeline up to five requests per partition), the
coordinator epoch of its last marker, and the first offset of its open transaction here.

Validation of an idempotent batch, per batch, in Kafka's order (UnifiedLog's duplicate check, then
ProducerAppendInfo.checkProducerEpoch, checkSequence and appendDataBatch):

==========================================================  ==================================
condition                                                   result
==========================================================  ==================================
same epoch, (first, last) sequence equals a cached batch    duplicate: answer NONE with the
                                                            original base offset, append nothing
epoch < the producer's epoch                                INVALID_PRODUCER_EPOCH
epoch > the producer's epoch, first sequence != 0           OUT_OF_ORDER_SEQUENCE_NUMBER
epoch > the producer's epoch, first sequence == 0           append (new epoch, window restarts)
same epoch, first sequence == last + 1 (mod 2^31)           append
same epoch, no batch known yet (entry made by a marker),    OUT_OF_ORDER_SEQUENCE_NUMBER
first sequence != 0
same epoch, the batch lies wholly before last + 1           DUPLICATE_SEQUENCE_NUMBER (older than
                                                            the cached window; clients treat it
                                                            as already written)
same epoch, any other first sequence                        OUT_OF_ORDER_SEQUENCE_NUMBER
unknown producer, first sequence == 0                       append (new entry)
unknown producer, transactional, first sequence != 0        OUT_OF_ORDER_SEQUENCE_NUMBER
unknown producer, not transactional, first sequence != 0    append (Kafka's rule, see below)
any append above: non-transactional batch while the         INVALID_TXN_STATE
producer has a transaction open here
==========================================================  ==================================

The unknown-producer rows follow current Kafka: a plain idempotent producer whose state is gone
(expired, or lost to retention) may continue with any sequence, as Kafka has accepted since
KIP-360 - librdkafka and the Java client count on it after a long idle period. KIP-98's design
rejected such a write (a non-zero sequence from an expired producer id); we do not, see README.
Transactional batches keep the strict rule of KIP-890: their first batch on a partition starts
at sequence 0, else the retriable OUT_OF_ORDER_SEQUENCE_NUMBER. Sequences wrap from 2^31-1 to 0.

Transactions (KIP-98, KIP-890), per partition:

* A transactional data batch of a producer without an open transaction here opens one at its
  base offset (``txn_first_offset``); the writer first asks the coordinator whether the
  partition is in the transaction (``needs_verification``), and also for a batch of a newer
  epoch than the open transaction's (a TV2 producer's next transaction ahead of the marker). ``start_verification`` hands out a
  token that a marker for the producer, a newer verification or the append itself invalidates:
  the KIP-890 race guard (Kafka's VerificationGuard), so a verification answered before an
  abort marker cannot let a late batch open a transaction nobody will ever end.
* A marker is checked (``check_marker``: Kafka's appendEndTxnMarker - producer epoch not below
  the stored one, coordinator epoch not below the stored one; an unknown producer passes and
  gets an entry) and then ends the transaction (``complete_txn``).
* Open transactions are kept by first offset (a dict plus a heap with lazy deletion); the
  first unstable offset is the smallest, the last stable offset (LSO) is it or, with none open,
  the high watermark.

Durability: the log is the source of truth. Snapshots (``{offset:020d}.snapshot``: the state of
every producer after all batches below ``offset``) are written when a segment rolls and on clean
shutdown; the two newest are kept. Opening loads the newest valid snapshot at or below the log
end (and at or below the point the aborted-transaction index must be rebuilt from) and replays
the batches after it - data batches update sequences and open transactions, markers end them
and are reported to a callback that rebuilds the aborted-transaction index. Snapshot layout
(little endian), versioned and CRC-32C checked::

    0  4s   magic b"APSN"
    4  u16  version (1)
    6  u16  reserved
    8  u32  CRC-32C of everything after this field
    12 i64  offset the snapshot was taken at
    20 u32  number of producer entries
    24 ...  entries:
            i64 producer id, i16 epoch, i32 coordinator epoch, i64 first offset of the open
            transaction (-1 none), i64 last append time (ms, writer clock), u8 batch count,
            then per batch: i32 first seq, i32 last seq, i64 first offset, i64 last offset,
            i64 max timestamp
"""

from __future__ import annotations

import collections
import heapq
import os
import struct
from typing import Callable, Iterable, Iterator, NamedTuple

import crc32c

from appliance.errors import ErrorCode, KafkaError
from appliance.durable import atomic_write
from appliance.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, BatchHeader

NUM_BATCHES_TO_RETAIN = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_KEPT = 2
SEQ_MOD = 1 << 31

_HEAD = struct.Struct("<4sHHIqI")
_ENTRY = struct.Struct("<qhiqqB")
_BATCH = struct.Struct("<iiqqq")
_MAGIC = b"APSN"
_VERSION = 1


class BatchMeta(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker on this partition (Kafka's CompletedTxn). ``first_offset``
    is the transaction's first offset here, or the marker's own offset when the producer had
    nothing open (then ``first_offset == last_offset``); ``last_offset`` is the marker's."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


class VerificationToken:
    """Identity of one KIP-890 verification (Kafka's VerificationGuard): compared by identity."""

    __slots__ = ("producer_id", "producer_epoch", "created_ms")

    def __init__(self, producer_id: int, producer_epoch: int, created_ms: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.created_ms = created_ms

    def __repr__(self) -> str:
        return f"VerificationToken(pid={self.producer_id}, epoch={self.producer_epoch})"


class ProducerEntry:
    __slots__ = ("producer_id", "epoch", "batches", "coordinator_epoch", "txn_first_offset",
                 "last_append_ms")

    def __init__(self, producer_id: int, epoch: int, coordinator_epoch: int = -1,
                 txn_first_offset: int = -1, last_append_ms: int = 0) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: collections.deque[BatchMeta] = collections.deque(maxlen=NUM_BATCHES_TO_RETAIN)
        self.coordinator_epoch = coordinator_epoch
        self.txn_first_offset = txn_first_offset
        self.last_append_ms = last_append_ms

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_timestamp(self) -> int:
        return self.batches[-1].timestamp if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMeta | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def last_sequence(first_seq: int, delta: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap at 2^31."""
    return (first_seq + delta) % SEQ_MOD


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


# (base offset, header, control) as PartitionLog.headers_from yields them; control is None for a
# data batch, (control type, coordinator epoch) for a control batch.
ReplayItem = tuple[int, BatchHeader, "tuple[int, int] | None"]


class ProducerStateManager:
    def __init__(self, directory: str, expiration_ms: int) -> None:
        self.directory = directory
        self.expiration_ms = expiration_ms
        self.entries: dict[int, ProducerEntry] = {}
        # Open transactions: producer id -> first offset, and a min-heap of (first offset,
        # producer id) whose stale items (transaction ended) are dropped when they surface.
        self._open: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._verifying: dict[int, VerificationToken] = {}
        self._now_ms = 0           # last clock value seen (verification tokens' age)

    # -- validation and updates (hot path: a few dict and tuple operations per batch) -----------
    def check(self, h: BatchHeader) -> BatchMeta | None:
        """Validate an idempotent batch before it is appended.

        Returns the metadata of the batch it duplicates (answer with its offsets, append
        nothing) or None (append it); raises KafkaError for the errors in the module table."""
        pid = h.producer_id
        first = h.base_sequence
        last = last_sequence(first, h.last_offset_delta)
        entry = self.entries.get(pid)
        if entry is None:
            if first != 0:
                if h.is_transactional:
                    # KIP-890: a transactional producer's first batch on a
                    # partition starts at sequence 0; retriable for the client.
                    raise KafkaError(ErrorCode.out_of_order_sequence_number,
                                     f"No state for transactional producer {pid} on this "
                                     f"partition and its first sequence {first} is not 0")
            return None
        dup = entry.find_duplicate(h.producer_epoch, first, last)
        if dup is not None:
            return dup
        if h.producer_epoch < entry.epoch:
            raise KafkaError(ErrorCode.invalid_producer_epoch,
                             f"Epoch {h.producer_epoch} of producer {pid} is smaller than the last "
                             f"seen epoch {entry.epoch}")
        if h.producer_epoch > entry.epoch:
            if first != 0:
                raise KafkaError(ErrorCode.out_of_order_sequence_number,
                                 f"Invalid sequence number {first} for new epoch {h.producer_epoch} "
                                 f"of producer {pid} (must be 0)")
        else:
            # No batch known in this epoch (the entry came from a marker, which may have bumped
            # the epoch): Kafka's inSequence(NO_SEQUENCE, first) - the window starts at 0.
            expected = (entry.last_seq + 1) % SEQ_MOD if entry.batches else 0
            if first != expected:
                # Distance, modulo 2^31, from the expected sequence back to this batch's last
                # sequence: small means the whole batch was written before (a retry older than
                # the cached window).
                behind = (expected - 1 - last) % SEQ_MOD
                if entry.batches and behind < SEQ_MOD // 2 and \
                        (expected - first) % SEQ_MOD <= SEQ_MOD // 2:
                    raise KafkaError(ErrorCode.duplicate_sequence_number,
                                     f"Sequences {first}..{last} of producer {pid} were written "
                                     f"already (next expected {expected})")
                raise KafkaError(ErrorCode.out_of_order_sequence_number,
                                 f"Out of order sequence number for producer {pid}: {first} "
                                 f"(incoming), {expected} (expected)")
        if entry.txn_first_offset >= 0 and not h.is_transactional:
            # ProducerAppendInfo.appendDataBatch: plain writes inside an open transaction.
            raise KafkaError(ErrorCode.invalid_txn_state,
                             f"Expected a transactional write from producer {pid}, which has a "
                             f"transaction open on this partition")
        return None

    def update(self, h: BatchHeader, base_offset: int, now_ms: int, max_timestamp: int | None = None) -> None:
        """Record an appended (or replayed) data batch of a producer (producer id >= 0).
        ``max_timestamp``: the batch's as stored (LogAppendTime topics restamp it). A
        transactional batch opens the producer's transaction here if none is open, and ends
        its verification (Kafka clears the VerificationGuard on any transactional append)."""
        pid = h.producer_id
        entry = self.entries.get(pid)
        if entry is None:
            entry = self.entries[pid] = ProducerEntry(pid, h.producer_epoch)
        elif h.producer_epoch != entry.epoch:
            entry.epoch = h.producer_epoch
            entry.batches.clear()
        if h.base_sequence >= 0:
            entry.batches.append(BatchMeta(h.base_sequence, last_sequence(h.base_sequence, h.last_offset_delta),
                                           base_offset, base_offset + h.last_offset_delta,
                                           h.max_timestamp if max_timestamp is None else max_timestamp))
        entry.last_append_ms = now_ms
        self._now_ms = now_ms
        if h.attributes & 0x10:                    # is_transactional, without the call
            if entry.txn_first_offset < 0:
                entry.txn_first_offset = base_offset
                self._open[pid] = base_offset
                heapq.heappush(self._heap, (base_offset, pid))
            if self._verifying:
                self._verifying.pop(pid, None)

    # -- transactions -----------------------------------------------------------------------------
    def needs_verification(self, h: BatchHeader) -> bool:
        """A transactional data batch of a producer with no open transaction on this partition,
        or with one of an older epoch: the coordinator must confirm the partition is in its
        transaction first (KIP-890; Kafka's hasOngoingTransaction(producerId, epoch)). The
        second case is a transaction-version-2 producer whose next transaction (epoch + 1 after
        EndTxn) overtakes the marker of the previous one on this partition: appended without
        verification it would join the previous transaction and share its outcome."""
        if not h.is_transactional or h.is_control:
            return False
        entry = self.entries.get(h.producer_id)
        return entry is None or entry.txn_first_offset < 0 or h.producer_epoch > entry.epoch

    def start_verification(self, producer_id: int, producer_epoch: int,
                           now_ms: int | None = None) -> VerificationToken:
        """Begin a verification; the token stays valid until a marker for the producer, a newer
        verification, or the producer's next transactional append."""
        token = VerificationToken(producer_id, producer_epoch,
                                  self._now_ms if now_ms is None else now_ms)
        self._verifying[producer_id] = token
        return token

    def verification_valid(self, producer_id: int, token: object) -> bool:
        """Whether ``token`` is still the producer's current verification (KIP-890 race guard)."""
        return self._verifying.get(producer_id) is token

    def has_open_txn(self, producer_id: int) -> bool:
        return producer_id in self._open

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Kafka's appendEndTxnMarker checks: INVALID_PRODUCER_EPOCH when the marker's epoch is
        below the producer's, TRANSACTION_COORDINATOR_FENCED when its coordinator epoch is below
        the one of the producer's last marker. An unknown producer passes (its stored epoch and
        coordinator epoch are Kafka's NO_PRODUCER_EPOCH / -1)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise KafkaError(ErrorCode.invalid_producer_epoch,
                             f"Marker epoch {producer_epoch} of producer {producer_id} is smaller "
                             f"than the last seen epoch {entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(ErrorCode.transaction_coordinator_fenced,
                             f"Invalid coordinator epoch for producer {producer_id}: "
                             f"{coordinator_epoch} (zombie), {entry.coordinator_epoch} (current)")

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     marker_offset: int, aborted: bool, now_ms: int) -> CompletedTxn:
        """Apply a marker written at ``marker_offset`` (checked before by ``check_marker``, or
        replayed): Kafka's ProducerStateEntry.update - a different epoch replaces the stored
        one and empties the sequence window, the coordinator epoch is stored, the open
        transaction (if any) ends, and so does any verification of the producer."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerEntry(producer_id, producer_epoch)
        elif producer_epoch != entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_append_ms = now_ms
        self._now_ms = now_ms
        first = entry.txn_first_offset
        if first >= 0:
            entry.txn_first_offset = -1
            self._open.pop(producer_id, None)
            self._maybe_compact()
        else:
            first = marker_offset
        if self._verifying:
            self._verifying.pop(producer_id, None)
        return CompletedTxn(producer_id, first, marker_offset, aborted)

    def preview_completion(self, producer_id: int, marker_offset: int,
                           high_watermark: int) -> tuple[int, int]:
        """(first offset of the transaction a marker at ``marker_offset`` ends, the LSO once it
        has ended) - what ``complete_txn`` and ``last_stable_offset`` will say, without changing
        anything: the writer indexes an aborted transaction before it applies the marker, so a
        failed index write leaves the producer's state as it was."""
        entry = self.entries.get(producer_id)
        first = entry.txn_first_offset if entry is not None and entry.txn_first_offset >= 0 \
            else marker_offset
        others = [off for pid, off in self._open.items() if pid != producer_id]
        fu = min(others) if others else -1
        return first, (fu if 0 <= fu < high_watermark else high_watermark)

    def first_unstable_offset(self) -> int:
        """The smallest first offset of an open transaction, -1 when none is open."""
        heap, live = self._heap, self._open
        while heap:
            off, pid = heap[0]
            if live.get(pid) == off:
                return off
            heapq.heappop(heap)
        return -1

    def last_stable_offset(self, high_watermark: int, log_start_offset: int = -1) -> int:
        """The LSO: the first unstable offset (raised to the log start offset, as Kafka's
        maybeIncrementFirstUnstableOffset does) when it is below the high watermark, else the
        high watermark."""
        fu = self.first_unstable_offset()
        if fu < 0:
            return high_watermark
        if fu < log_start_offset:
            fu = log_start_offset
        return fu if fu < high_watermark else high_watermark

    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of every open transaction (a copy)."""
        return dict(self._open)

    def _maybe_compact(self) -> None:
        # Stale heap items pile up under a long-open transaction; rebuild past a bound.
        if len(self._heap) > 2 * len(self._open) + 64:
            self._rebuild_open()

    def _rebuild_open(self) -> None:
        self._open = {pid: e.txn_first_offset for pid, e in self.entries.items() if e.txn_first_offset >= 0}
        self._heap = [(off, pid) for pid, off in self._open.items()]
        heapq.heapify(self._heap)

    # -- expiration -----------------------------------------------------------------------------
    def expire(self, now_ms: int) -> int:
        """Forget producers idle for producer_id_expiration_ms, never one with an open
        transaction (KIP-98's PID expiration; Kafka's producer.id.expiration.ms), and
        verifications that lingered as long (Kafka's removeExpiredProducers)."""
        self._now_ms = now_ms
        gone = [pid for pid, e in self.entries.items()
                if e.txn_first_offset < 0 and now_ms - e.last_append_ms >= self.expiration_ms]
        for pid in gone:
            del self.entries[pid]
        if self._verifying:
            for pid in [p for p, t in self._verifying.items()
                        if now_ms - t.created_ms >= self.expiration_ms]:
                del self._verifying[pid]
        return len(gone)

    # -- snapshots ------------------------------------------------------------------------------
    def encode(self, offset: int) -> bytes:
        body = bytearray(struct.pack("<qI", offset, len(self.entries)))
        for e in self.entries.values():
            body += _ENTRY.pack(e.producer_id, e.epoch, e.coordinator_epoch, e.txn_first_offset,
                                e.last_append_ms, len(e.batches))
            for b in e.batches:
                body += _BATCH.pack(*b)
        return struct.pack("<4sHHI", _MAGIC, _VERSION, 0, crc32c.crc32c(bytes(body))) + bytes(body)

    def take_snapshot(self, offset: int, sync_dir: bool = True, *, unless_present: bool = False,
                      sync: bool = True) -> bool:
        """Write the state after every batch below ``offset`` and keep the newest two.
        ``sync_dir=False`` when the caller fsyncs the directory next (a roll: the recovery
        point's checkpoint; a clean close: the seal); a snapshot lost to a crash before that only
        means a longer replay. ``unless_present``: none is written if one at ``offset`` exists
        (Kafka's takeSnapshot skips an offset already snapshotted): the state at an offset is
        that of the log below it, but for producers expired since, which expire again after a
        load. A clean stop of an idle partition (ten thousand of them) writes nothing here.
        ``sync=False``: no fsync at all (a ``DeferredSync`` of the caller's makes it durable).
        Returns whether a snapshot was written."""
        path = snapshot_path(self.directory, offset)
        if unless_present and os.path.exists(path):
            return False
        atomic_write(path, self.encode(offset), sync=sync, sync_dir=sync_dir)
        for old in list_snapshots(self.directory)[:-SNAPSHOTS_KEPT]:
            _unlink(snapshot_path(self.directory, old))
        return True

    @staticmethod
    def decode(data: bytes) -> tuple[int, dict[int, ProducerEntry]]:
        """Parse a snapshot; ValueError if it is not a valid one (bad magic, version, CRC)."""
        if len(data) < 24:
            raise ValueError("snapshot too short")
        magic, version, _, crc = struct.unpack_from("<4sHHI", data, 0)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"not a producer snapshot (magic {magic!r}, version {version})")
        if crc32c.crc32c(data[12:]) != crc:
            raise ValueError("snapshot CRC mismatch")
        offset, count = struct.unpack_from("<qI", data, 12)
        pos = 24
        entries: dict[int, ProducerEntry] = {}
        for _ in range(count):
            pid, epoch, coord, txn_first, last_ms, nb = _ENTRY.unpack_from(data, pos)
            pos += _ENTRY.size
            e = ProducerEntry(pid, epoch, coord, txn_first, last_ms)
            for _ in range(nb):
                e.batches.append(BatchMeta(*_BATCH.unpack_from(data, pos)))
                pos += _BATCH.size
            entries[pid] = e
        if pos != len(data):
            raise ValueError("trailing bytes after the last snapshot entry")
        return offset, entries

    def load(self, log_end_offset: int, headers_from: Callable[[int], Iterator[ReplayItem]],
             now_ms: int, on_completed: Callable[[CompletedTxn, int], None] | None = None,
             max_start_offset: int | None = None) -> int:
        """Rebuild the state after opening the log: the newest valid snapshot at or below the log
        end (newer ones describe batches recovery cut off, and go) and at or below
        ``max_start_offset`` (newer ones are kept but not used), then a replay of the batches
        from its offset. ``headers_from(offset)`` yields (base offset, header, control) of every
        batch from that offset to the log end (``PartitionLog.headers_from``).

        Replay applies data batches as appends (sequences, epochs, opening transactions) and
        markers as ``complete_txn`` (no checks: what is in the log was accepted), and calls
        ``on_completed(completed, lso)`` for each marker, with the LSO right after it - what the
        writer stamped into the aborted-index entry (Kafka's lastStableOffset(completedTxn)).
        The partition writer passes ``max_start_offset=PartitionLog.txn_index_rebuild_from``, so
        that every marker whose index entry recovery deleted is replayed (a snapshot taken later,
        e.g. at the last clean shutdown, would skip them). Returns the offset replay started at."""
        start = 0
        self.entries = {}
        self._verifying = {}
        self._now_ms = now_ms
        for off in reversed(list_snapshots(self.directory)):
            path = snapshot_path(self.directory, off)
            if off > log_end_offset:
                _unlink(path)
                continue
            if max_start_offset is not None and off > max_start_offset:
                continue
            try:
                with open(path, "rb") as f:
                    got, entries = self.decode(f.read())
            except (OSError, ValueError, struct.error):
                _unlink(path)
                continue
            if got != off:
                _unlink(path)
                continue
            self.entries, start = entries, off
            break
        self._rebuild_open()
        for base, h, ctrl in headers_from(start):
            pid = h.producer_id
            if pid < 0:
                continue
            if not h.is_control:
                self.update(h, base, now_ms)
            elif ctrl is not None and ctrl[0] in (CONTROL_ABORT, CONTROL_COMMIT):
                done = self.complete_txn(pid, h.producer_epoch, ctrl[1], base,
                                         ctrl[0] == CONTROL_ABORT, now_ms)
                if on_completed is not None:
                    on_completed(done, self.last_stable_offset(base + 1))
        return start

    # -- inspection (DescribeProducers) ---------------------------------------------------------
    def active(self) -> Iterable[ProducerEntry]:
        return self.entries.values()


def list_snapshots(directory: str) -> list[int]:
    out = []
    for name in os.listdir(directory):
        if name.endswith(SNAPSHOT_SUFFIX):
            stem = name[:-len(SNAPSHOT_SUFFIX)]
            if len(stem) == 20 and stem.isdigit():
                out.append(int(stem))
    return sorted(out)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
