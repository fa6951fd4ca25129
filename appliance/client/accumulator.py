"""The producer's buffers: records per partition until they are sent, batches with their producer
id, epoch and sequence, and the per-partition sequence numbers. Pure logic, no I/O.

Owns:

- ``Delivery``: what ``Producer.send`` returns; filled in (offset or error) when the record's
  batch is acknowledged or fails, then its callback runs.
- ``RecordAccumulator``: records waiting per partition. A partition is *ready* when its buffer
  holds ``batch_size`` bytes or its oldest record has waited ``linger_ms``; ``drain`` hands the
  records out as ``ProducerBatch`` es of at most ``batch_size`` bytes each (a larger record gets a
  batch of its own).
- ``ProducerBatch``: one record batch for one partition: ``Record`` s with a ``Delivery`` each, or
  records already encoded (``EncodedRecords``, the Spark sink's column-wise encoding) with one
  ``Delivery`` for them all. Its bytes are built once, when it is first sent (``seal``), with the
  producer id, epoch and base sequence of that moment; a retry sends the very same bytes, which
  is what lets the broker recognise a duplicate.
- ``SequenceTracker``: the next sequence number per partition for the current (producer id,
  epoch). ``allocate`` hands out a range; ``release`` gives back the range of a batch the broker
  refused (it was not written, and nothing after it was allocated: the producer sends one batch
  per partition at a time); ``rewind`` goes back to a refused batch's base once every batch after
  it is known not written; ``reset`` starts over at 0 for a new epoch. Sequences wrap at 2**31
  as Kafka's do.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from appliance.client.errors import IllegalStateError, KafkaError
from appliance.protocol.records import HEADER_SIZE, Record, build_batch_from_body

__all__ = ["Delivery", "EncodedRecords", "ProducerBatch", "RecordAccumulator", "SequenceTracker",
           "TopicPartition", "record_size", "next_sequence"]

TopicPartition = tuple[str, int]
SEQUENCE_MODULO = 1 << 31
# Bytes a record costs in a batch besides its key, value and headers (length, attributes,
# timestamp and offset deltas, key/value lengths, header count: varints, at most this much).
RECORD_OVERHEAD = 21
BATCH_OVERHEAD = 61
_TIMESTAMPS = struct.Struct(">qq")      # base and max timestamp, at byte 27 of a batch


def record_size(rec: Record) -> int:
    n = RECORD_OVERHEAD + len(rec.key or b"") + len(rec.value or b"")
    for k, v in rec.headers:
        n += 10 + len(k.encode()) + len(v or b"")
    return n


def records_section(records: Sequence[Record]) -> tuple[memoryview, int, int]:
    """(the records section of a batch of ``records``, its base timestamp, its max timestamp),
    encoded by aiokafka's compiled record builder (a dependency of the appliance already: the
    frontends validate with its parser), which writes Kafka's record layout byte for byte as
    ``appliance.protocol.records.build_batch`` does, four times faster. (Imported here: the
    ``aiokafka`` package imports its whole asyncio client, a quarter of a second that the
    commands which send no records, admin tools and consumers, need not wait for.)"""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 0x7FFFFFFF)
    append = builder.append
    for i, r in enumerate(records):
        append(i, timestamp=r.timestamp, key=r.key, value=r.value,
               headers=list(r.headers) if r.headers else [])
    raw = builder.build()
    base_ts, max_ts = _TIMESTAMPS.unpack_from(raw, 27)
    return memoryview(raw)[HEADER_SIZE:], base_ts, max_ts


def next_sequence(seq: int, count: int) -> int:
    """``seq + count`` with Kafka's wrap-around at 2**31 (DefaultRecordBatch.incrementSequence)."""
    return (seq + count) % SEQUENCE_MODULO


@dataclass(eq=False, slots=True)
class Delivery:
    """The outcome of one ``send``: ``offset`` once acknowledged (-1 when the broker answered
    DUPLICATE_SEQUENCE_NUMBER: the record was written by an earlier attempt), or ``error``.
    ``timestamp`` is the record's, or once acknowledged on a LogAppendTime topic the broker's."""

    topic: str
    partition: int
    timestamp: int
    callback: Callable[[KafkaError | None, "Delivery"], None] | None = None
    offset: int = -1
    error: KafkaError | None = None
    done: bool = False

    def _finish(self, offset: int = -1, error: KafkaError | None = None) -> None:
        if self.done:
            return
        self.offset, self.error, self.done = offset, error, True
        if self.callback is not None:
            self.callback(error, self)

    def get(self) -> "Delivery":
        """This delivery, once acknowledged; raises its error if it failed. Call after flush()."""
        if not self.done:
            raise IllegalStateError("the record has not been sent yet: call flush() first")
        if self.error is not None:
            raise self.error
        return self


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """``count`` records already encoded as a batch's records section (offset deltas from 0,
    timestamp deltas from ``base_timestamp``), uncompressed."""
    body: bytes | memoryview
    count: int
    base_timestamp: int
    max_timestamp: int


@dataclass(eq=False)
class ProducerBatch:
    tp: TopicPartition
    records: list[Record] | EncodedRecords
    deliveries: list[Delivery]
    created: float
    data: bytes | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attempts: int = 0
    size: int = 0           # bytes of keys, values and headers (what buffer_memory counts)
    order: int = 0          # the sender's enqueue order: a partition's sequence order

    @property
    def count(self) -> int:
        r = self.records
        return r.count if isinstance(r, EncodedRecords) else len(r)

    @property
    def done(self) -> bool:
        return self.deliveries[0].done

    @property
    def sealed(self) -> bool:
        return self.data is not None

    def seal(self, *, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool,
             compression: int) -> bytes:
        """Encode the batch once; later attempts reuse these bytes."""
        self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence
        r = self.records
        if isinstance(r, EncodedRecords):
            self.data = build_batch_from_body(r.body, r.count, base_timestamp=r.base_timestamp,
                                              max_timestamp=r.max_timestamp, producer_id=producer_id,
                                              producer_epoch=producer_epoch, base_sequence=base_sequence,
                                              transactional=transactional, compression=compression)
        else:
            body, base_ts, max_ts = records_section(r)
            self.data = build_batch_from_body(body, len(r), base_timestamp=base_ts, max_timestamp=max_ts,
                                              producer_id=producer_id, producer_epoch=producer_epoch,
                                              base_sequence=base_sequence, transactional=transactional,
                                              compression=compression)
        return self.data

    def unseal(self) -> None:
        """Forget the encoding (after a new producer id or epoch, the batch is built again)."""
        self.data = None
        self.producer_id = self.producer_epoch = self.base_sequence = -1

    def succeed(self, base_offset: int, log_append_time: int = -1) -> None:
        """Acknowledged at ``base_offset``; on a LogAppendTime topic the broker's timestamp
        replaces the record's. (Encoded records have one delivery, at the base offset.)"""
        for i, d in enumerate(self.deliveries):
            if log_append_time >= 0:
                d.timestamp = log_append_time
            d._finish(base_offset + i if base_offset >= 0 else -1)

    def fail(self, error: KafkaError) -> None:
        for d in self.deliveries:
            d._finish(-1, error)


@dataclass
class _Buffer:
    records: list[Record] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)      # record_size of each record
    size: int = 0
    first: float = 0.0


class RecordAccumulator:
    def __init__(self, batch_size: int = 16384, linger_ms: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.batch_size = batch_size
        self.linger = linger_ms / 1000.0
        self.clock = clock
        self._buffers: dict[TopicPartition, _Buffer] = {}
        # When the oldest buffered record's linger ends (inf: nothing buffered), so that the
        # per-record question "is anything due?" is one clock read and one comparison.
        self._due = float("inf")

    def append(self, tp: TopicPartition, record: Record, delivery: Delivery) -> bool:
        """Buffer one record; True when its partition now holds a full batch."""
        buf = self._buffers.get(tp)
        if buf is None:
            now = self.clock()
            buf = self._buffers[tp] = _Buffer(first=now)
            if now + self.linger < self._due:
                self._due = now + self.linger
        n = record_size(record)
        buf.records.append(record)
        buf.deliveries.append(delivery)
        buf.sizes.append(n)
        buf.size += n
        return buf.size + BATCH_OVERHEAD >= self.batch_size

    def due(self) -> bool:
        """Whether some partition's linger has ended (``ready()`` then names it)."""
        return self.clock() >= self._due

    @property
    def pending(self) -> int:
        """Records buffered and not yet drained."""
        return sum(len(b.records) for b in self._buffers.values())

    def partitions(self) -> list[TopicPartition]:
        return list(self._buffers)

    def ready(self, *, force: bool = False) -> list[TopicPartition]:
        """Partitions whose records should be sent now (all of them with ``force``)."""
        now = self.clock()
        return [tp for tp, b in self._buffers.items()
                if force or b.size + BATCH_OVERHEAD >= self.batch_size or now - b.first >= self.linger]

    def drain(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, deque[ProducerBatch]]:
        """Take the buffered records of ``tps`` out as batches of at most ``batch_size`` bytes."""
        out: dict[TopicPartition, deque[ProducerBatch]] = {}
        now = self.clock()
        for tp in tps:
            buf = self._buffers.pop(tp, None)
            if buf is None:
                continue
            q = out[tp] = deque()
            recs: list[Record] = []
            dels: list[Delivery] = []
            size = BATCH_OVERHEAD
            for rec, d, n in zip(buf.records, buf.deliveries, buf.sizes):
                if recs and size + n > self.batch_size:
                    q.append(ProducerBatch(tp, recs, dels, now, size=size))
                    recs, dels, size = [], [], BATCH_OVERHEAD
                recs.append(rec)
                dels.append(d)
                size += n
            if recs:
                q.append(ProducerBatch(tp, recs, dels, now, size=size))
        self._due = min((b.first for b in self._buffers.values()), default=float("inf")) + self.linger
        return out

    def abort(self, error: KafkaError) -> int:
        """Fail every buffered record with ``error`` (an aborted transaction); returns how many."""
        n = 0
        for buf in self._buffers.values():
            for d in buf.deliveries:
                d._finish(-1, error)
                n += 1
        self._buffers.clear()
        self._due = float("inf")
        return n


class SequenceTracker:
    def __init__(self) -> None:
        self._next: dict[TopicPartition, int] = {}

    def peek(self, tp: TopicPartition) -> int:
        return self._next.get(tp, 0)

    def allocate(self, tp: TopicPartition, count: int) -> int:
        """The base sequence for ``count`` records on ``tp``; advances the partition's counter."""
        base = self._next.get(tp, 0)
        self._next[tp] = next_sequence(base, count)
        return base

    def release(self, tp: TopicPartition, base: int, count: int) -> None:
        """Give back the range of the last allocated batch (the broker refused it)."""
        if self._next.get(tp) == next_sequence(base, count):
            self._next[tp] = base

    def rewind(self, tp: TopicPartition, base: int) -> None:
        """The broker refused the batch at ``base`` and none allocated after it was written:
        the next batch takes ``base`` again."""
        if tp in self._next:
            self._next[tp] = base

    def reset(self) -> None:
        """A new producer id or epoch: every partition starts at 0 again."""
        self._next.clear()

    def partitions(self) -> list[TopicPartition]:
        return list(self._next)
