"""Producer state of one partition: sequence windows of idempotent producers (KIP-98).

Owned by the partition writer process alone (single-threaded). For every producer id that wrote
to the partition it keeps the epoch and the metadata of its last five batches (first and last
sequence, first and last offset, timestamp), which is how Kafka recognises a retried batch
(``NUM_BATCHES_TO_RETAIN = 5``: real clients pipeline up to five requests per partition).

Validation of an idempotent batch, per batch, in Kafka's order (UnifiedLog's duplicate check, then
ProducerAppendInfo.checkProducerEpoch and checkSequence):

==========================================================  ==================================
condition                                                   result
==========================================================  ==================================
same epoch, (first, last) sequence equals a cached batch    duplicate: answer NONE with the
                                                            original base offset, append nothing
epoch < the producer's epoch                                INVALID_PRODUCER_EPOCH
epoch > the producer's epoch, first sequence != 0           OUT_OF_ORDER_SEQUENCE_NUMBER
epoch > the producer's epoch, first sequence == 0           append (new epoch, window restarts)
same epoch, first sequence == last + 1 (mod 2^31)           append
same epoch, the batch lies wholly before last + 1           DUPLICATE_SEQUENCE_NUMBER (older than
                                                            the cached window; clients treat it
                                                            as already written)
same epoch, any other first sequence                        OUT_OF_ORDER_SEQUENCE_NUMBER
unknown producer, first sequence == 0                       append (new entry)
unknown producer, first sequence != 0                       UNKNOWN_PRODUCER_ID
==========================================================  ==================================

The last row follows the seed (KIP-98 §PID Expiration: a write from a forgotten producer with a
non-zero sequence cannot be proven not to be a duplicate) and issue 3; upstream Kafka since
KIP-360 accepts any sequence there. Sequences wrap from 2^31-1 to 0.

Durability: the log is the source of truth. Snapshots (``{offset:020d}.snapshot``: the state of
every producer after all batches below ``offset``) are written when a segment rolls and on clean
shutdown; the two newest are kept. Opening loads the newest valid snapshot at or below the log
end and replays the batch headers after it, so a retry of a batch written before a crash is still
recognised. Snapshot layout (little endian), versioned and CRC-32C checked::

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
import os
import struct
from typing import Iterable, NamedTuple

import crc32c

from appliance.errors import ErrorCode, KafkaError
from appliance.log.files import atomic_write
from appliance.protocol.records import BatchHeader

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


class ProducerStateManager:
    def __init__(self, directory: str, expiration_ms: int) -> None:
        self.directory = directory
        self.expiration_ms = expiration_ms
        self.entries: dict[int, ProducerEntry] = {}

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
                raise KafkaError(ErrorCode.unknown_producer_id,
                                 f"No state for producer {pid} on this partition and sequence "
                                 f"{first} is not 0: it cannot be told apart from a duplicate")
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
            return None
        expected = (entry.last_seq + 1) % SEQ_MOD if entry.batches else first
        if first == expected:
            return None
        # Distance, modulo 2^31, from the expected sequence back to this batch's last sequence:
        # small means the whole batch was written before (a retry older than the cached window).
        behind = (expected - 1 - last) % SEQ_MOD
        if behind < SEQ_MOD // 2 and (expected - first) % SEQ_MOD <= SEQ_MOD // 2:
            raise KafkaError(ErrorCode.duplicate_sequence_number,
                             f"Sequences {first}..{last} of producer {pid} were written already "
                             f"(next expected {expected})")
        raise KafkaError(ErrorCode.out_of_order_sequence_number,
                         f"Out of order sequence number for producer {pid}: {first} (incoming), "
                         f"{expected} (expected)")

    def update(self, h: BatchHeader, base_offset: int, now_ms: int, max_timestamp: int | None = None) -> None:
        """Record an appended (or replayed) batch of a producer (producer id >= 0).
        ``max_timestamp``: the batch's as stored (LogAppendTime topics restamp it)."""
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

    # -- expiration -----------------------------------------------------------------------------
    def expire(self, now_ms: int) -> int:
        """Forget producers idle for producer_id_expiration_ms, never one with an open
        transaction (KIP-98 §PID Expiration; Kafka's producer.id.expiration.ms)."""
        gone = [pid for pid, e in self.entries.items()
                if e.txn_first_offset < 0 and now_ms - e.last_append_ms >= self.expiration_ms]
        for pid in gone:
            del self.entries[pid]
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

    def take_snapshot(self, offset: int) -> None:
        """Write the state after every batch below ``offset`` and keep the newest two."""
        atomic_write(snapshot_path(self.directory, offset), self.encode(offset))
        for old in list_snapshots(self.directory)[:-SNAPSHOTS_KEPT]:
            _unlink(snapshot_path(self.directory, old))

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

    def load(self, log_end_offset: int, headers_from, now_ms: int) -> int:
        """Rebuild the state after opening the log: the newest valid snapshot at or below the log
        end (newer ones describe batches recovery cut off, and go), then a replay of the batch
        headers from its offset. ``headers_from(offset)`` yields (base offset, header) of every
        batch from that offset to the log end. Returns the offset replay started at."""
        start = 0
        self.entries = {}
        for off in reversed(list_snapshots(self.directory)):
            path = snapshot_path(self.directory, off)
            if off > log_end_offset:
                _unlink(path)
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
        for base, h in headers_from(start):
            if h.producer_id >= 0 and not h.is_control:
                self.update(h, base, now_ms)
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
