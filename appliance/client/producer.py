"""The producer: idempotent by default, transactional with a ``transactional_id``, with KIP-939's
two-phase commit API.

Owns the record accumulator (records buffered per partition), the partitioner, and the send
loop; the producer id, epoch, sequences and transaction state belong to its
``TransactionManager`` (``transactions.py``), the connections and metadata to its ``Cluster``
(``metadata.py``).

Synchronous and single-threaded: ``send`` buffers the record and returns a ``Delivery``; buffered
records go out when a partition holds ``batch_size`` bytes, when the oldest has waited
``linger_ms`` at the next ``send``/``poll``, and on ``flush`` (which ``commit_transaction`` and
``prepare_transaction`` call). One Produce request per leader carries one batch per partition;
the call returns once every batch has its answer.

Send loop (``_send_batches``): a batch's bytes are built once, with the next sequence number of
its partition, and a retry sends the same bytes, so the broker writes it once however many
answers are lost. Retriable errors (lost connection, timeout, NOT_LEADER_OR_FOLLOWER,
UNKNOWN_TOPIC_OR_PARTITION, CONCURRENT_TRANSACTIONS, ...) are retried with backoff until
``delivery_timeout_ms``; DUPLICATE_SEQUENCE_NUMBER means an earlier attempt was written. An
idempotent producer answered OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID (the broker lost
its state) takes a new producer id and re-sends its unacknowledged batches from sequence 0
(KIP-360); in a transaction those errors, like every other non-retriable one, make the
transaction abortable. Fencing errors are fatal. (Limit of that reset: a batch whose earlier
attempt went unanswered and that is rebuilt under the new producer id could be written twice, if
that earlier attempt did land; the broker answers OUT_OF_ORDER only after losing the producer's
state, so this needs both failures at once.)
"""

from __future__ import annotations

import itertools
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from appliance.client.accumulator import (Delivery, ProducerBatch, RecordAccumulator,
                                          TopicPartition)
from appliance.client.config import producer_config
from appliance.client.errors import (FENCED, ErrorCode, FatalProducerError, KafkaConnectionError,
                                     KafkaError, KafkaTimeoutError, TransactionAbortableError,
                                     error_code, error_for)
from appliance.client.metadata import Cluster, Deadline
from appliance.client.transactions import (PreparedTxnState, TransactionManager, TxnState)
from appliance.protocol.records import Record

__all__ = ["Producer", "murmur2", "default_partition"]

PRODUCE = 0
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                            ErrorCode.leader_not_available, ErrorCode.fenced_leader_epoch,
                            ErrorCode.kafka_storage_error})


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

    def _send_in_passing(self) -> None:
        # Errors of records sent on the way are kept for flush() (and for their deliveries):
        # send() reports on its own record, not on others. Fatal errors are raised at once.
        try:
            self._send_ready(force=False)
        except FatalProducerError:
            raise
        except KafkaError as exc:
            if self._pending_error is None:
                self._pending_error = exc

    def flush(self) -> None:
        """Send every buffered record and wait for the answers. Raises the first error of a
        record that failed since the last flush (in a transaction: the transaction is then
        abortable, see ``abort_transaction``)."""
        self._check_open()
        try:
            self._send_ready(force=True)
        finally:
            err, self._pending_error = self._pending_error, None
        if err is not None:
            raise err

    def _send_ready(self, *, force: bool) -> None:
        ready = self.accumulator.ready(force=force)
        if not ready:
            return
        queues = self.accumulator.drain(ready)
        self._send_batches(queues)

    def _send_batches(self, queues: dict[TopicPartition, deque[ProducerBatch]]) -> None:
        """Send the batches (one per partition per request, in order) until each is answered."""
        if self.idempotent or self.transactional:
            self.txn.ensure_producer_id()
        first_error: KafkaError | None = None
        try:
            while queues:
                heads = {tp: q[0] for tp, q in queues.items()}
                if self.transactional:
                    self.txn.add_partitions(heads)
                self._deliver(list(heads.values()))
                for tp in list(queues):
                    q = queues[tp]
                    batch = q[0]
                    if batch.deliveries[0].done:
                        q.popleft()
                        err = batch.deliveries[0].error
                        if err is not None:
                            first_error = first_error or err
                            # The rest of this partition would be out of order: fail it too.
                            for later in q:
                                later.fail(err)
                            q.clear()
                    if not q:
                        del queues[tp]
        except KafkaError as exc:
            for q in queues.values():
                for batch in q:
                    batch.fail(exc)
            if self.transactional:
                self.accumulator.abort(exc)
                raise self.txn.abortable(exc) from None
            raise
        if first_error is not None:
            if self.transactional:
                self.accumulator.abort(first_error)
                raise self.txn.abortable(first_error)
            raise first_error

    def _seal(self, batch: ProducerBatch) -> None:
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

    def _release(self, batch: ProducerBatch) -> None:
        """The broker refused the batch (it was not written): give its sequences back."""
        if batch.base_sequence >= 0 and batch.producer_id == self.txn.producer_id \
                and batch.producer_epoch == self.txn.epoch:
            self.txn.sequences.release(batch.tp, batch.base_sequence, batch.count)

    def _deliver(self, batches: list[ProducerBatch]) -> None:
        """Send one batch per partition until each has a final answer (success or error)."""
        deadline = Deadline(self.config["delivery_timeout_ms"], self.config["retry_backoff_ms"])
        pending = list(batches)
        last: KafkaError | None = None
        for _ in deadline:
            for b in pending:
                self._seal(b)
            by_leader: dict[int, list[ProducerBatch]] = {}
            retry: list[ProducerBatch] = []
            for b in pending:
                try:
                    by_leader.setdefault(self.cluster.leader(*b.tp), []).append(b)
                except KafkaError as exc:
                    if not exc.retriable:
                        self._release(b)
                        b.fail(error_for(exc.code, f"{b.tp[0]}-{b.tp[1]}", transactional=self.transactional))
                        continue
                    last = exc
                    retry.append(b)
            for leader, group in by_leader.items():
                try:
                    retry.extend(self._produce(leader, group))
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    last = exc
                    retry.extend(group)
                except KafkaError as exc:
                    if exc.code in FENCED or not exc.retriable:
                        raise
                    last = exc
                    retry.extend(group)
            pending = [b for b in retry if not b.deliveries[0].done]
            if not pending:
                return
            if self.acks == 0:
                return
        err = KafkaTimeoutError(f"{len(pending)} batches not acknowledged within delivery_timeout_ms "
                                f"({last})")
        for b in pending:
            b.fail(err)

    def _produce(self, leader: int, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """One Produce request; returns the batches to retry, finishes the others."""
        conn = self.cluster.connection(leader)
        topics: dict[str, list[dict]] = {}
        for b in batches:
            b.attempts += 1
            topics.setdefault(b.tp[0], []).append({"index": b.tp[1], "records": b.data})
        body = {"transactional_id": self.txn.transactional_id, "acks": self.acks,
                "timeout_ms": self.config["request_timeout_ms"],
                "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()]}
        resp = conn.request(PRODUCE, body, expect_response=self.acks != 0)
        if resp is None:                                # acks=0: no answer, no offsets
            for b in batches:
                b.succeed(-1)
            return []
        by_tp = {(t.name, p.index): p for t in resp.responses for p in t.partition_responses}
        retry = []
        new_producer_id = False
        for b in batches:
            p = by_tp.get(b.tp)
            code = error_code(p.error_code) if p is not None else ErrorCode.unknown_server_error
            if code == ErrorCode.none:
                b.succeed(p.base_offset)
            elif code == ErrorCode.duplicate_sequence_number:
                b.succeed(-1)                           # an earlier attempt was written
            elif code in _LEADER_ERRORS or code.retriable:
                if code in _LEADER_ERRORS:
                    self.cluster.invalidate(b.tp[0])
                retry.append(b)
            elif code in (ErrorCode.out_of_order_sequence_number, ErrorCode.unknown_producer_id) \
                    and not self.transactional:
                # KIP-360 for idempotent producers: the broker lost our state. A new producer id,
                # sequences from 0, and this batch (not written) built again.
                new_producer_id = True
                retry.append(b)
            else:
                msg = getattr(p, "error_message", None) if p is not None else "no answer for the partition"
                self._release(b)
                b.fail(error_for(code, f"produce to {b.tp[0]}-{b.tp[1]}: {msg or code.name}",
                                 transactional=self.transactional))
        if new_producer_id:
            self.txn.reset_idempotent()
            for b in retry:
                b.unseal()
        return retry

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
        self.accumulator.abort(TransactionAbortableError(ErrorCode.transaction_abortable,
                                                         "the transaction was aborted"))
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
            if flush and not self.transactional and self.accumulator.pending \
                    and self.txn.state != TxnState.FATAL_ERROR:
                self._send_ready(force=True)
        finally:
            self.accumulator.abort(KafkaError(ErrorCode.unknown_server_error, "the producer was closed"))
            self._closed = True
            self.cluster.close()
