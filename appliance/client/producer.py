"""The producer: idempotent by default, transactional with a ``transactional_id``, with KIP-939's
two-phase commit API.

Owns the record accumulator (records buffered per partition), the partitioner, and the send
loop (``Sender``, ``sender.py``: the batches between the accumulator and their answers); the
producer id, epoch, sequences and transaction state belong to its ``TransactionManager``
(``transactions.py``), the connections and metadata to its ``Cluster`` (``metadata.py``).

Single-threaded, without a background thread: ``send`` buffers the record and returns a
``Delivery``; buffered records go out when a partition holds ``batch_size`` bytes, when the oldest
has waited ``linger_ms`` at the next ``send``/``poll``, and on ``flush`` (which
``commit_transaction`` and ``prepare_transaction`` call). ``send_encoded`` hands over a batch's
records already encoded (the Spark sink's column-wise encoder). Sending does not wait for the
answers: an idempotent or transactional producer keeps up to
``max_in_flight_requests_per_connection`` (5) Produce requests in flight per connection, each
with one batch per partition, and reads the answers as they come, at the next send and at
``flush``. ``buffer_memory`` bounds what waits to be sent: beyond it, ``send`` waits for answers.

Retries (``sender.py``): a batch's bytes are built once, with the next sequence number of its
partition, and a retry sends the same bytes, in the partition's sequence order, so the broker
writes it once however many answers are lost. Retriable errors (lost connection, timeout,
NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, CONCURRENT_TRANSACTIONS, ...) are retried with
backoff until ``delivery_timeout_ms``; DUPLICATE_SEQUENCE_NUMBER means an earlier attempt was
written. An idempotent producer answered OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID with
no earlier failure (the broker lost its state) takes a new producer id and re-sends its
unacknowledged batches from sequence 0 (KIP-360); in a transaction those errors, like every other
non-retriable one, make the transaction abortable. Fencing errors are fatal. (Limit of that
reset: a batch whose earlier attempt went unanswered and that is rebuilt under the new producer
id could be written twice, if that earlier attempt did land; the broker answers OUT_OF_ORDER only
after losing the producer's state, so this needs both failures at once.)
"""

from __future__ import annotations

import itertools
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from appliance.client.accumulator import (Delivery, EncodedRecords, ProducerBatch,
                                          RecordAccumulator, TopicPartition)
from appliance.client.config import producer_config
from appliance.client.errors import (ErrorCode, FatalProducerError, KafkaError,
                                     TransactionAbortableError)
from appliance.client.metadata import Cluster
from appliance.client.sender import Sender
from appliance.client.transactions import (PreparedTxnState, TransactionManager, TxnState)
from appliance.protocol.records import Record

__all__ = ["Producer", "murmur2", "default_partition"]

PRODUCE = 0
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

_U32LE = struct.Struct("<I")


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (Utils.murmur2, seed 0x9747b28c) as a signed 32-bit int, so that keys
    land on the partitions where the Java client and librdkafka's murmur2 partitioner put them."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for (k,) in _U32LE.iter_unpack(data[:4 * n4]):
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = data[4 * n4:]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def default_partition(key: bytes, partitions: int) -> int:
    """The Java client's partition for a keyed record: positive murmur2 modulo the count."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Producer:
    """A Kafka producer. Configuration: keyword arguments or a mapping (Kafka's dotted names are
    accepted too, e.g. ``{"bootstrap.servers": ..., "transactional.id": ...}``); see
    ``appliance.client.config.PRODUCER_DEFAULTS`` for every key."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        cfg = self.config = producer_config(config, kwargs)
        max_versions = dict(cfg["max_versions"] or {})
        if cfg["transaction_version"] == 1:
            # The plain (KIP-98) protocol: EndTxn without the epoch bump, explicit
            # AddPartitionsToTxn, Produce and TxnOffsetCommit without implicit adds.
            max_versions.update({26: min(4, max_versions.get(26, 4)), 0: min(11, max_versions.get(0, 11)),
                                 28: min(4, max_versions.get(28, 4))})
        self.cluster = Cluster(cfg["bootstrap_servers"], client_id=cfg["client_id"],
                               request_timeout_ms=cfg["request_timeout_ms"],
                               retry_backoff_ms=cfg["retry_backoff_ms"],
                               metadata_timeout_ms=cfg["max_block_ms"],
                               allow_auto_create_topics=cfg["allow_auto_create_topics"],
                               max_versions=max_versions, security=cfg["security"])
        self.txn = TransactionManager(self.cluster, transactional_id=cfg["transactional_id"],
                                      transaction_timeout_ms=cfg["transaction_timeout_ms"],
                                      enable_two_phase_commit=cfg["enable_two_phase_commit"],
                                      transaction_version=cfg["transaction_version"],
                                      max_block_ms=cfg["max_block_ms"],
                                      retry_backoff_ms=cfg["retry_backoff_ms"])
        self.acks = cfg["acks"]
        self.idempotent = cfg["enable_idempotence"]
        self.compression = CODECS[cfg["compression_type"]]
        self.accumulator = RecordAccumulator(cfg["batch_size"], cfg["linger_ms"])
        self.sender = Sender(self)
        self._round_robin = itertools.count()
        self._pending_error: KafkaError | None = None
        self._closed = False

    # -- context manager ------------------------------------------------------------------------
    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def transactional(self) -> bool:
        return self.txn.transactional

    @property
    def producer_id(self) -> int:
        return self.txn.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.txn.epoch

    @property
    def transaction_version(self) -> int:
        """1 or 2: the transaction protocol in use (known after ``init_transactions``)."""
        return 2 if self.txn.tv2 else 1

    # -- sending --------------------------------------------------------------------------------
    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
             partition: int | None = None, headers: Iterable[tuple[str, bytes | None]] | None = None,
             timestamp: int | None = None,
             on_delivery: Callable[[KafkaError | None, Delivery], None] | None = None) -> Delivery:
        """Buffer one record; returns its ``Delivery`` (filled in once its batch is answered).
        Inside a transaction the record belongs to the open transaction."""
        self._check_open()
        if self.transactional:
            self.txn.require_transaction("send")
        count = self.cluster.partitions_for(topic)     # waits for (or creates) the topic
        if partition is None:
            partition = (default_partition(key, count) if key is not None
                         else next(self._round_robin) % count)
        elif not 0 <= partition < count:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"topic {topic!r} has {count} partitions, not partition {partition}")
        ts = time.time_ns() // 1_000_000 if timestamp is None else int(timestamp)
        delivery = Delivery(topic, partition, ts, on_delivery)
        rec = Record(key, value, tuple(headers) if headers else (), ts)
        full = self.accumulator.append((topic, partition), rec, delivery)
        if full or self.accumulator.due():
            self._send_in_passing()
        return delivery

    def poll(self) -> None:
        """Send the batches whose linger time has passed (``send`` does this too)."""
        self._check_open()
        if self.accumulator.pending:
            self._send_in_passing()

    def send_encoded(self, topic: str, partition: int, records: EncodedRecords,
                     on_delivery: Callable[[KafkaError | None, Delivery], None] | None = None) -> Delivery:
        """Send records already encoded as one batch's records section (``EncodedRecords``: at
        most ``batch_size`` bytes, offset deltas from 0) to one partition, in order with this
        producer's other batches of the partition. Returns one ``Delivery`` for them all (its
        offset is the first record's)."""
        self._check_open()
        if self.transactional:
            self.txn.require_transaction("send_encoded")
        count = self.cluster.partitions_for(topic)
        if not 0 <= partition < count:
            raise KafkaError(ErrorCode.unknown_topic_or_partition,
                             f"topic {topic!r} has {count} partitions, not partition {partition}")
        tp = (topic, partition)
        delivery = Delivery(topic, partition, records.base_timestamp, on_delivery)
        batch = ProducerBatch(tp, records, [delivery], time.monotonic(), size=len(records.body))
        # Records of the partition buffered earlier go first: they were sent earlier.
        if tp in self.accumulator.partitions():
            self.sender.enqueue(self.accumulator.drain([tp]))
        self.sender.enqueue({tp: deque([batch])})
        self._pump(wait=False)
        return delivery

    def _send_in_passing(self) -> None:
        self._send_ready(force=False)

    def _pump(self, *, wait: bool) -> None:
        """Run the sender. Errors of records sent on the way are kept for flush() (and for their
        deliveries): send() reports on its own record, not on others. An error that ends the
        transaction (or is fatal) is raised at once."""
        try:
            self.sender.pump(wait=wait, buffer_bytes=None if wait else self.config["buffer_memory"])
        except KafkaError as exc:
            # A coordinator call of the send path failed (AddPartitionsToTxn, InitProducerId).
            self.sender.fail_all(exc)
            if self.transactional:
                self.accumulator.abort(exc)
                raise self.txn.abortable(exc) from None
            raise
        err = self.sender.take_error()
        if err is not None:
            if self.transactional:
                self.sender.drain_in_flight()
                self.sender.fail_all(err)
                self.accumulator.abort(err)
                err = self.txn.abortable(err)
                if isinstance(err, FatalProducerError):
                    raise err
            if self._pending_error is None:
                self._pending_error = err

    def flush(self) -> None:
        """Send every buffered record and wait for the answers. Raises the first error of a
        record that failed since the last flush (in a transaction: the transaction is then
        abortable, see ``abort_transaction``)."""
        self._check_open()
        try:
            self._send_ready(force=True)
            self._pump(wait=True)
        finally:
            err, self._pending_error = self._pending_error, None
        if err is not None:
            raise err

    def _send_ready(self, *, force: bool) -> None:
        ready = self.accumulator.ready(force=force)
        if ready:
            self.sender.enqueue(self.accumulator.drain(ready))
        if ready or self.sender.in_flight():
            self._pump(wait=False)

    def seal(self, batch: ProducerBatch) -> None:
        """Build the batch's bytes, with its sequence numbers, the first time it is sent."""
        if batch.sealed:
            return
        if self.idempotent or self.transactional:
            base = self.txn.sequences.allocate(batch.tp, batch.count)
            batch.seal(producer_id=self.txn.producer_id, producer_epoch=self.txn.epoch,
                       base_sequence=base, transactional=self.transactional,
                       compression=self.compression)
        else:
            batch.seal(producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False,
                       compression=self.compression)

    # -- transactions -------------------------------------------------------------------------
    def init_transactions(self, keep_prepared_txn: bool = False) -> None:
        """Get the producer id and epoch for the transactional id, fencing earlier instances.

        ``keep_prepared_txn=True`` (KIP-939) keeps a transaction the previous instance left open
        (typically prepared): the producer is then in the prepared state, ``prepared_state``
        holds its identity, and only ``commit_transaction``, ``abort_transaction`` and
        ``complete_transaction`` are allowed. Otherwise an open transaction is aborted."""
        self._check_open()
        self.txn.init_transactions(keep_prepared_txn)

    def begin_transaction(self) -> None:
        self._check_open()
        self.txn.begin()

    def prepare_transaction(self) -> PreparedTxnState:
        """KIP-939: flush every record of the transaction and return its identity, to be stored
        with the other participant's data; afterwards only commit, abort or complete are
        allowed. Needs ``enable_two_phase_commit``."""
        self._check_open()
        if not self.txn.enable_two_phase_commit:
            return self.txn.prepare()                   # raises INVALID_TXN_STATE
        self.txn.require_transaction("prepare_transaction")
        self.flush()
        return self.txn.prepare()

    @property
    def prepared_state(self) -> PreparedTxnState | None:
        """The identity of the prepared transaction, None when none is prepared."""
        return self.txn.prepared if self.txn.state == TxnState.PREPARED else None

    def commit_transaction(self) -> None:
        self._check_open()
        if self.txn.state == TxnState.IN_TRANSACTION:
            self.flush()
        self.txn.end(True)

    def abort_transaction(self) -> None:
        """Abort the open transaction; buffered records are dropped (their deliveries fail)."""
        self._check_open()
        if self.txn.state in (TxnState.IN_TRANSACTION, TxnState.PREPARED, TxnState.ABORTABLE_ERROR):
            self._drop_buffered()
        self.txn.end(False)

    def _drop_buffered(self) -> None:
        err = TransactionAbortableError(ErrorCode.transaction_abortable, "the transaction was aborted")
        self.accumulator.abort(err)
        # The markers must come after every Produce of the transaction: wait for their answers.
        self.sender.drain_in_flight()
        self.sender.fail_all(err)
        self.sender.take_error()
        self._pending_error = None

    def complete_transaction(self, state: PreparedTxnState | str | None) -> bool | None:
        """KIP-939: commit the prepared transaction if ``state`` identifies it, else abort the
        open transaction; nothing when none is open. Returns True (committed), False (aborted)
        or None (nothing to do)."""
        self._check_open()
        if not isinstance(state, PreparedTxnState):
            state = PreparedTxnState.from_string(state)
        if self.txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR):
            self._drop_buffered()
        return self.txn.complete(state)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        """Commit consumer offsets (the next offset to read, per partition) with the transaction."""
        self._check_open()
        self.txn.send_offsets(offsets, group_id)

    # Short names of the issue text (the KIP's begin/commit/abort).
    begin = begin_transaction
    commit = commit_transaction
    abort = abort_transaction

    # -- lifecycle ------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise KafkaError(ErrorCode.unknown_server_error, "the producer is closed")

    def close(self, flush: bool = True) -> None:
        """Send what is buffered (outside a transaction), then close the connections. Records of
        an open transaction are dropped: the coordinator aborts it after its timeout."""
        if self._closed:
            return
        try:
            if flush and not self.transactional and (self.accumulator.pending or not self.sender.idle) \
                    and self.txn.state != TxnState.FATAL_ERROR:
                self._send_ready(force=True)
                self._pump(wait=True)
        finally:
            self.accumulator.abort(KafkaError(ErrorCode.unknown_server_error, "the producer was closed"))
            self._closed = True
            self.cluster.close()
