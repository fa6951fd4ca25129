"""Produce (key 0), versions 3-12: validate each partition's batch, hand it to its writer.

Runs in frontends. ``validate_batch`` checks the batch header (size, magic, CRC-32C, the record
count against the last offset delta), then ``validate_records`` the records themselves, as
Kafka's LogValidator does (framing, offset deltas, timestamps, compressed data within a bound;
Produce v8+ gets per-record errors); the writer only assigns the base offset and appends.
With acks=0 no response is sent; if such a request has an error, the connection is closed instead
(as Kafka does, so that the producer notices).

Client writes to the internal topics (``__transaction_state``, ``__consumer_offsets``) are refused
with INVALID_TOPIC_EXCEPTION, as Kafka refuses them; those logs are the coordinator's own.

Produce 12 (KIP-890 part 2, transaction version 2) has v11's layout; it tells the writer to add
the partition to the producer's transaction at the coordinator before the first batch of a
transaction (implicit AddPartitionsToTxn) instead of only verifying it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from appliance.api import CloseConnection, handles
from appliance.catalog import INTERNAL_TOPICS
from appliance.errors import ErrorCode, KafkaError
from appliance.ipc import ProduceResult
from appliance.protocol.fetch_response import ProducePartition, ProduceTopic, encode_produce_response
from appliance.protocol.record_contents import (NO_TIMESTAMP_LIMIT, RecordValidationError,
                                                validate_records)
from appliance.protocol.records import validate_batch

log = logging.getLogger("appliance.produce")

FAILED_PRODUCE = "kafka_server_brokertopicmetrics_failedproducerequests"


class _Refusals:
    """Logs refused batches (too large, corrupt, invalid records) once per topic a minute, with
    how many more were refused meanwhile: an operator sees a misconfigured producer, a
    hostile one cannot flood the log."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        self.last: dict[str, tuple[float, int]] = {}     # topic -> (logged at, refused since)

    def note(self, topic: str, partition: int, e: KafkaError, host: str) -> None:
        now = time.monotonic()
        at, since = self.last.get(topic, (-self.EVERY_S, 0))
        if now - at < self.EVERY_S:
            self.last[topic] = (at, since + 1)
            return
        self.last[topic] = (now, 0)
        more = f" ({since} more refused in the last minute)" if since else ""
        log.info("refused a batch for %s-%d from %s: %s %s%s", topic, partition, host,
                 e.code.name.upper(), e.message or "", more)


_REFUSALS = _Refusals()


def _max_bytes(cfg, configs) -> int:
    v = configs.get("max.message.bytes")
    return int(v) if v is not None else cfg.log.message_max_bytes


def _validate_records(cfg, configs, topic: str, pd, header, max_bytes: int, now_ms: int) -> None:
    """Kafka's LogValidator per-record rules (``record_contents``): framing, offset deltas,
    timestamps, compressed data inflated within ``decompressed_batch_max_factor`` times the
    topic's max.message.bytes. Raises the KafkaError the partition answers."""
    log = cfg.log
    timestamp_type = configs.get("message.timestamp.type", log.message_timestamp_type)
    # On a LogAppendTime topic the writer stamps the broker's clock: the producer's timestamps
    # are never checked (Kafka's validateTimestamp only looks at CreateTime).
    limit = log.message_timestamp_before_max_ms if timestamp_type == "CreateTime" else NO_TIMESTAMP_LIMIT
    after = log.message_timestamp_after_max_ms if timestamp_type == "CreateTime" else NO_TIMESTAMP_LIMIT
    validate_records(pd.records, header, max_bytes=max_bytes * log.decompressed_batch_max_factor,
                     now_ms=now_ms, before_ms=limit, after_ms=after,
                     compacted="compact" in configs.get("cleanup.policy", ""),
                     topic_partition=f"{topic}-{pd.index}")


@handles(0, "Produce", 3, 12)
def handle(ctx, req):
    """Validates and hands every batch to its writer now, before returning (the batches may be
    views of the connection's receive buffer, reused once this returns: see
    ``appliance.protocol.produce_request``); returns the answer, or a coroutine that awaits the
    writers' acks and builds it, holding no batch."""
    broker = ctx.broker
    catalog = broker.catalog
    acks = req.acks
    timeout_s = max(req.timeout.total_seconds(), 0.001) if req.timeout is not None else 30.0
    txn_id = req.transactional_id
    # Validate every partition's batch first: a transactional batch anywhere in a request without
    # a transactional id fails the whole request (Kafka's KafkaApis.handleProduceRequest).
    checked: list[tuple[str, object, int, object]] = []   # (topic, info, index, header or error)
    record_errors: dict[tuple[str, int], list[tuple[int, str]]] = {}   # Produce v8+
    now_ms = int(time.time() * 1000)
    transactional = False
    for td in req.topic_data:
        info = catalog.topics.get(td.name)
        for pd in td.partition_data:
            if acks not in (0, 1, -1):
                what = ProduceResult(int(ErrorCode.invalid_required_acks))
            elif td.name in INTERNAL_TOPICS:
                # Kafka's ReplicaManager.appendToLocalLog refuses client appends to internal
                # topics (KIP-98: clients may not write __transaction_state): not retriable.
                what = ProduceResult(int(ErrorCode.invalid_topic_exception),
                                     error_message=f"Cannot append to internal topic {td.name}")
            elif info is None or not 0 <= pd.index < info.partitions:
                what = ProduceResult(int(ErrorCode.unknown_topic_or_partition))
            else:
                try:
                    # The topic's configs over the dynamic broker ones (live: AlterConfigs)
                    configs = catalog.overrides(info)
                    max_bytes = _max_bytes(broker.cfg, configs)
                    what = validate_batch(pd.records or b"", max_bytes, produce_version=ctx.version)
                    _validate_records(broker.cfg, configs, td.name, pd, what, max_bytes, now_ms)
                    transactional = transactional or what.is_transactional
                except KafkaError as e:
                    what = ProduceResult(int(e.code), error_message=e.message)
                    if isinstance(e, RecordValidationError):
                        record_errors[(td.name, pd.index)] = e.record_errors
                    _REFUSALS.note(td.name, pd.index, e, ctx.client_host)
            checked.append((td.name, info, pd, what))
    refuse_txn = transactional and not txn_id
    pending: list[tuple[str, int, object]] = []   # (topic, partition, result or future)
    any_error = False
    for name, info, pd, what in checked:
        if refuse_txn:
            res = ProduceResult(int(ErrorCode.transactional_id_authorization_failed),
                                error_message="transactional records need a transactional id")
        elif isinstance(what, ProduceResult):
            res = what
        else:
            res = broker.produce(info, pd.index, acks, pd.records, timeout_s, ctx.version, txn_id)
        if isinstance(res, ProduceResult) and res.error_code:
            any_error = True
        pending.append((name, pd.index, res))
    if acks == 0:
        _count(ctx, catalog, [(name, r) for name, _, r in pending if isinstance(r, ProduceResult)])
        return CloseConnection("error in a produce request with acks=0") if any_error else None
    futures = [r for _, _, r in pending if isinstance(r, asyncio.Future)]
    if futures:
        return _answer_after(ctx, catalog, pending, record_errors, futures)
    return _answer(ctx, catalog, pending, record_errors)


async def _answer_after(ctx, catalog, pending, record_errors, futures):
    await asyncio.gather(*futures)
    return _answer(ctx, catalog, pending, record_errors)


def _answer(ctx, catalog, pending, record_errors):
    by_topic: dict[str, ProduceTopic] = {}
    done: list[tuple[str, ProduceResult]] = []
    for name, index, r in pending:
        if isinstance(r, asyncio.Future):
            r = r.result()
        done.append((name, r))
        topic = by_topic.get(name)
        if topic is None:
            topic = by_topic[name] = ProduceTopic(name, None)
        topic.partitions.append(ProducePartition(index, r.error_code, r.base_offset, r.log_append_time,
                                                 r.log_start_offset, record_errors.get((name, index), ()),
                                                 r.error_message))
    _count(ctx, catalog, done)
    return encode_produce_response(ctx.version, list(by_topic.values()))


def _count(ctx, catalog, results: list[tuple[str, ProduceResult]]) -> None:
    """Metrics: the answer's error codes, and failed partitions of existing topics
    (FailedProduceRequestsPerSec; the topic label of an unknown topic would be the client's to
    choose)."""
    errors: Counter = Counter()
    counters = ctx.broker.counters
    for name, r in results:
        errors[r.error_code] += 1
        if r.error_code and name in catalog.topics:
            counters.topic(FAILED_PRODUCE, name)
    ctx.errors = errors
