"""The producer's send loop: batches out to their partitions' leaders, several Produce requests in
flight per connection, the answers handled in order, retries that keep each partition's
sequence order.

Owns, for one producer, the batches between the accumulator and their answer: per partition the
batches waiting to be sent (in sequence order; a retry goes back to the front), the batches in
flight (in the order they were sent), those answered with a retriable error while later ones of
the same partition were still in flight, and per partition the time before which it is not
retried. Runs in the producer's thread; the connections (``BrokerConnection.send`` /
``complete_one``) hold the requests themselves.

Rules, as Kafka's producer keeps them:

- One batch per partition per Produce request; at most ``max_in_flight`` requests per connection:
  5 for an idempotent or transactional producer (the broker keeps the last 5 batches of each
  producer and partition, so any of them re-sent is recognised as a duplicate), 1 otherwise
  (retries could reorder).
- A batch's sequence numbers are given when it is first sent and its bytes are built then; a
  retry sends the same bytes.
- A retriable error on a batch (a lost connection, NOT_LEADER_OR_FOLLOWER, a timeout ...): the
  broker wrote neither it nor any later batch of the partition (those answer
  OUT_OF_ORDER_SEQUENCE_NUMBER, which is then retriable too). Once none of the partition is in
  flight, the failed batches go back to the front of its queue in sequence order, after a backoff.
- OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID with no earlier failure: an idempotent
  producer's state was lost by the broker; once nothing is in flight the producer takes a new
  producer id (KIP-360) and every unanswered batch is built again from sequence 0. For a
  transactional producer it is an error of the transaction.
- Any other error fails the batch and every later batch of the partition (they would be out of
  order); the partition's sequence goes back to the failed batch's base once they are answered.
- ``delivery_timeout_ms`` after a batch was made, its retries stop and it fails.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from appliance.client.accumulator import ProducerBatch, TopicPartition
from appliance.client.errors import (ErrorCode, KafkaConnectionError, KafkaError, KafkaTimeoutError,
                                     error_code, error_for)

__all__ = ["Sender", "PRODUCE"]

PRODUCE = 0
LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                           ErrorCode.leader_not_available, ErrorCode.fenced_leader_epoch,
                           ErrorCode.kafka_storage_error})
_SEQUENCE_LOST = (ErrorCode.out_of_order_sequence_number, ErrorCode.unknown_producer_id)


def log_append_time(p: Any) -> int:
    """LogAppendTimeMs of a partition's Produce answer (kio decodes it as a datetime or None)."""
    t = getattr(p, "log_append_time", None)
    if t is None:
        return -1
    return int(t.timestamp() * 1000) if hasattr(t, "timestamp") else int(t)


class Sender:
    """See the module docstring. ``producer`` gives the cluster, the transaction manager, the
    config and ``seal(batch)``."""

    def __init__(self, producer: Any) -> None:
        self.p = producer
        cfg = producer.config
        self.acks = producer.acks
        safe = producer.idempotent or producer.transactional
        self.max_in_flight = min(cfg["max_in_flight_requests_per_connection"], 5) if safe else 1
        self.delivery_timeout = cfg["delivery_timeout_ms"] / 1000.0
        self.backoff = cfg["retry_backoff_ms"] / 1000.0
        self.queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.inflight: dict[TopicPartition, deque[ProducerBatch]] = {}
        self.failed: dict[TopicPartition, list[ProducerBatch]] = {}
        self.doomed: dict[TopicPartition, KafkaError] = {}    # later batches fail with this
        self.retry_at: dict[TopicPartition, float] = {}
        self.requests: dict[int, int] = {}                    # node -> requests in flight
        self.answers: list[tuple[int, list[ProducerBatch], Any]] = []
        self.queued_bytes = 0
        self.need_reset = False
        self.first_error: KafkaError | None = None
        self.last_error: dict[TopicPartition, KafkaError] = {}
        self._order = 0                                       # enqueue order = sequence order

    # -- state -----------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """Nothing queued, in flight or waiting for a retry."""
        return not any(self.queues.values()) and not any(self.inflight.values()) and not self.failed

    def in_flight(self) -> bool:
        return any(self.requests.values())

    def enqueue(self, batches: dict[TopicPartition, deque[ProducerBatch]]) -> None:
        for tp, q in batches.items():
            if tp in self.doomed:
                for b in q:
                    self._finish_failed(b, self.doomed[tp])
                continue
            for b in q:
                self._order += 1
                b.order = self._order
            self.queues.setdefault(tp, deque()).extend(q)
            self.queued_bytes += sum(b.size for b in q)

    def take_error(self) -> KafkaError | None:
        err, self.first_error = self.first_error, None
        return err

    # -- the loop ----------------------------------------------------------------------------------
    def pump(self, *, wait: bool, buffer_bytes: int | None = None) -> None:
        """Send what may be sent and handle the answers that came. ``wait``: until nothing is
        queued or in flight. ``buffer_bytes``: at least until no more than that is queued."""
        while True:
            self._handle_answers()
            if self.need_reset and not self.in_flight():
                self._reset_producer_id()
            self._send_ready()
            self._read_answers(block=False)
            if self.answers:
                continue
            if self.idle:
                return
            if not wait and (buffer_bytes is None or self.queued_bytes <= buffer_bytes):
                return
            if self.in_flight():
                self._read_answers(block=True)
            else:
                # Everything left waits for a retry's backoff (or a leader).
                now = time.monotonic()
                wake = min([t for t in self.retry_at.values() if t > now], default=now + self.backoff)
                time.sleep(max(0.0, min(wake - now, 1.0)))

    def drain_in_flight(self) -> None:
        """Wait for every answer of what is in flight (before EndTxn: Kafka's producer never
        ends a transaction with a Produce of it unanswered)."""
        while self.in_flight():
            self._read_answers(block=True)
            self._handle_answers()

    def fail_all(self, error: KafkaError) -> None:
        """Fail everything queued or waiting for a retry (an aborted transaction); answers of
        what is in flight are still read, and ignored."""
        for tp in list(self.queues):
            for b in self.queues.pop(tp):
                self._finish_failed(b, error)
        for tp in list(self.failed):
            for b in self.failed.pop(tp):
                self._finish_failed(b, error)
        self.queued_bytes = 0
        self.retry_at.clear()

    # -- sending ---------------------------------------------------------------------------------
    def _send_ready(self) -> None:
        now = time.monotonic()
        by_leader: dict[int, list[TopicPartition]] = {}
        if self.need_reset:
            return
        for tp, q in self.queues.items():
            if not q or tp in self.failed or tp in self.doomed or self.retry_at.get(tp, 0.0) > now:
                continue
            try:
                leader = self.p.cluster.leader(*tp)
            except KafkaError as exc:
                if exc.retriable:
                    self.last_error[tp] = exc
                    self.retry_at[tp] = now + self.backoff
                    self._expire(tp, now)
                else:
                    self._doom(tp, error_for(exc.code, f"{tp[0]}-{tp[1]}",
                                             transactional=self.p.transactional))
                continue
            by_leader.setdefault(leader, []).append(tp)
        for leader, tps in by_leader.items():
            while self.requests.get(leader, 0) < self.max_in_flight:
                heads = [self.queues[tp][0] for tp in tps if self.queues[tp] and tp not in self.doomed]
                if not heads:
                    break
                if not self._send(leader, heads):
                    break

    def _send(self, leader: int, heads: list[ProducerBatch]) -> bool:
        """One Produce request with these batches; False if the connection failed."""
        p = self.p
        if p.idempotent or p.transactional:
            p.txn.ensure_producer_id()
        if p.transactional:
            p.txn.add_partitions([b.tp for b in heads])
        topics: dict[str, list[dict]] = {}
        for b in heads:
            p.seal(b)
            b.attempts += 1
            topics.setdefault(b.tp[0], []).append({"index": b.tp[1], "records": b.data})
        body = {"transactional_id": p.txn.transactional_id, "acks": self.acks,
                "timeout_ms": p.config["request_timeout_ms"],
                "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()]}
        try:
            conn = p.cluster.connection(leader)
            if self.acks == 0:
                conn.send(PRODUCE, body, None, expect_response=False)
            else:
                conn.send(PRODUCE, body, lambda answer: self.answers.append((leader, heads, answer)))
        except KafkaConnectionError as exc:
            # Not written: the batches stay at the heads of their queues, to be retried.
            for b in heads:
                self.last_error[b.tp] = exc
                self.retry_at[b.tp] = time.monotonic() + self.backoff
                self._expire(b.tp, time.monotonic())
            return False
        for b in heads:
            self.queues[b.tp].popleft()
            self.queued_bytes -= b.size
            if self.acks == 0:
                b.succeed(-1)                           # acks=0: no answer, no offsets
            else:
                self.inflight.setdefault(b.tp, deque()).append(b)
        if self.acks != 0:
            self.requests[leader] = self.requests.get(leader, 0) + 1
        return True

    # -- answers ---------------------------------------------------------------------------------
    def _read_answers(self, *, block: bool) -> None:
        for node, n in list(self.requests.items()):
            if not n:
                continue
            conn = self.p.cluster.conns.get(node)
            if conn is None or not conn.in_flight:
                continue
            if block:
                conn.complete_one()
                return
            while conn.in_flight and conn.complete_one(timeout=0):
                pass

    def _handle_answers(self) -> None:
        while self.answers:
            leader, batches, answer = self.answers.pop(0)
            self.requests[leader] = max(0, self.requests.get(leader, 0) - 1)
            if isinstance(answer, KafkaError):
                for b in batches:
                    self._retriable(b, answer)
                continue
            by_tp = {(t.name, p.index): p for t in answer.responses for p in t.partition_responses}
            for b in batches:
                self._answer(b, by_tp.get(b.tp))
        now = time.monotonic()
        for tp in list(self.failed):
            if not self.inflight.get(tp):
                self._requeue(tp, now)
        for tp in list(self.doomed):
            if not self.inflight.get(tp):
                del self.doomed[tp]

    def _answer(self, b: ProducerBatch, p: Any) -> None:
        code = error_code(p.error_code) if p is not None else ErrorCode.unknown_server_error
        tp = b.tp
        if tp in self.doomed:
            self._take_inflight(b)
            self._finish_failed(b, self.doomed[tp])
            return
        if code == ErrorCode.none:
            self._take_inflight(b)
            b.succeed(p.base_offset, log_append_time(p))
        elif code == ErrorCode.duplicate_sequence_number:
            self._take_inflight(b)
            b.succeed(-1)                               # an earlier attempt was written
        elif code in LEADER_ERRORS or code.retriable:
            if code in LEADER_ERRORS:
                self.p.cluster.invalidate(tp[0])
            self._retriable(b, KafkaError(code, f"produce to {tp[0]}-{tp[1]}"))
        elif code in _SEQUENCE_LOST and (tp in self.failed or not self.p.transactional):
            # After an earlier failure of the partition: the gap it left. Otherwise (idempotent
            # producer) the broker lost our state: a new producer id (KIP-360).
            if tp not in self.failed:
                self.need_reset = True
            self._retriable(b, KafkaError(code, f"produce to {tp[0]}-{tp[1]}"))
        else:
            msg = getattr(p, "error_message", None) if p is not None else "no answer for the partition"
            err = error_for(code, f"produce to {tp[0]}-{tp[1]}: {msg or code.name}",
                            transactional=self.p.transactional)
            self._take_inflight(b)
            self._finish_failed(b, err)
            self._doom(tp, err, rewind=b)

    def _take_inflight(self, b: ProducerBatch) -> None:
        q = self.inflight.get(b.tp)
        if q:
            try:
                q.remove(b)
            except ValueError:
                pass

    def _retriable(self, b: ProducerBatch, err: KafkaError) -> None:
        self._take_inflight(b)
        if b.done:
            return
        self.last_error[b.tp] = err
        self.failed.setdefault(b.tp, []).append(b)

    def _requeue(self, tp: TopicPartition, now: float) -> None:
        """Every batch of ``tp`` is answered: the failed ones go back, in sequence order."""
        batches = [b for b in self.failed.pop(tp) if not b.done]
        batches.sort(key=lambda b: b.order)
        q = self.queues.setdefault(tp, deque())
        q.extendleft(reversed(batches))
        self.queued_bytes += sum(b.size for b in batches)
        attempts = max((b.attempts for b in batches), default=1)
        self.retry_at[tp] = now + min(self.backoff * (2 ** min(attempts - 1, 10)), 1.0)
        self._expire(tp, now)

    def _expire(self, tp: TopicPartition, now: float) -> None:
        """Fail the partition's batches once the oldest is past ``delivery_timeout_ms``."""
        q = self.queues.get(tp)
        if q and now - q[0].created > self.delivery_timeout:
            err = KafkaTimeoutError(f"{len(q)} batches of {tp[0]}-{tp[1]} not acknowledged within "
                                    f"delivery_timeout_ms ({self.last_error.get(tp)})")
            self._doom(tp, err, rewind=q[0] if q[0].sealed else None)

    def _doom(self, tp: TopicPartition, err: KafkaError, rewind: ProducerBatch | None = None) -> None:
        """Fail every batch of ``tp`` not yet answered; those in flight fail on their answer.
        The partition's sequence goes back to ``rewind``'s base (none of it was written)."""
        for b in self.queues.pop(tp, deque()):
            self.queued_bytes -= b.size
            self._finish_failed(b, err)
        for b in self.failed.pop(tp, []):
            self._finish_failed(b, err)
        if self.inflight.get(tp):
            self.doomed[tp] = err
        if rewind is not None and rewind.base_sequence >= 0 and \
                rewind.producer_id == self.p.txn.producer_id and rewind.producer_epoch == self.p.txn.epoch:
            self.p.txn.sequences.rewind(tp, rewind.base_sequence)

    def _finish_failed(self, b: ProducerBatch, err: KafkaError) -> None:
        if b.done:
            return
        b.fail(err)
        if self.first_error is None:
            self.first_error = err

    def _reset_producer_id(self) -> None:
        """KIP-360 for an idempotent producer: a new producer id, and every unanswered batch
        built again from sequence 0."""
        self.need_reset = False
        self.p.txn.reset_idempotent()
        for tp in list(self.failed):
            self._requeue(tp, time.monotonic())
        for q in self.queues.values():
            for b in q:
                b.unseal()
        self.retry_at.clear()

