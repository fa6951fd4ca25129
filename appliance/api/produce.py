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

Authorization (Kafka's KafkaApis.handleProduceRequest): a request holding a transactional batch
needs Write on its TransactionalId, else every partition gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
each topic needs Write (one check per topic, not per batch), else its partitions get
TOPIC_AUTHORIZATION_FAILED, before any other check, so that an unauthorized client learns
nothing about the topic. An idempotent producer needs nothing more here: Kafka 3.x checks
IdempotentWrite (or Write on some topic) at InitProducerId only.
"""

from __future__ import annotations

import asyncio
import time

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import CloseConnection, handles
from appliance.catalog import INTERNAL_TOPICS
from appliance.errors import ErrorCode, KafkaError
from appliance.ipc import ProduceResult
from appliance.protocol.fetch_response import ProducePartition, ProduceTopic, encode_produce_response
from appliance.protocol.record_contents import (NO_TIMESTAMP_LIMIT, RecordValidationError,
                                                validate_records)
from appliance.protocol.records import ATTRIBUTES_OFFSET, validate_batch


WRITE = AclOperation.WRITE
TOPIC, TRANSACTIONAL_ID = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID


def _flagged_transactional(records) -> bool:
    """The transactional bit of a (not yet validated) batch's attributes."""
    return (records is not None and len(records) > ATTRIBUTES_OFFSET + 1
            and bool(records[ATTRIBUTES_OFFSET + 1] & 0x10))


def _max_bytes(cfg, info) -> int:
    v = info.configs.get("max.message.bytes")
    return int(v) if v is not None else cfg.log.message_max_bytes


def _validate_records(cfg, info, topic: str, pd, header, max_bytes: int, now_ms: int) -> None:
    """Kafka's LogValidator per-record rules (``record_contents``): framing, offset deltas,
    timestamps, compressed data inflated within ``decompressed_batch_max_factor`` times the
    topic's max.message.bytes. Raises the KafkaError the partition answers."""
    log = cfg.log
    timestamp_type = info.configs.get("message.timestamp.type", log.message_timestamp_type)
    # On a LogAppendTime topic the writer stamps the broker's clock: the producer's timestamps
    # are never checked (Kafka's validateTimestamp only looks at CreateTime).
    limit = log.message_timestamp_before_max_ms if timestamp_type == "CreateTime" else NO_TIMESTAMP_LIMIT
    after = log.message_timestamp_after_max_ms if timestamp_type == "CreateTime" else NO_TIMESTAMP_LIMIT
    validate_records(pd.records, header, max_bytes=max_bytes * log.decompressed_batch_max_factor,
                     now_ms=now_ms, before_ms=limit, after_ms=after,
                     compacted="compact" in info.configs.get("cleanup.policy", ""),
                     topic_partition=f"{topic}-{pd.index}")


@handles(0, "Produce", 3, 12)
async def handle(ctx, req):
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
    authz = broker.authorizer          # the hot path: decided once per request for a super user
    authorize = None if not authz.enabled or ctx.principal in authz.super_users else ctx.authorize
    for td in req.topic_data:
        info = catalog.topics.get(td.name)
        allowed = authorize is None or authorize(WRITE, TOPIC, td.name)
        for pd in td.partition_data:
            if not allowed:
                what = ProduceResult(int(ErrorCode.topic_authorization_failed))
                # Kafka looks at every batch for the transactional flag, authorized or not.
                transactional = transactional or _flagged_transactional(pd.records)
            elif acks not in (0, 1, -1):
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
                    max_bytes = _max_bytes(broker.cfg, info)
                    what = validate_batch(pd.records or b"", max_bytes, produce_version=ctx.version)
                    _validate_records(broker.cfg, info, td.name, pd, what, max_bytes, now_ms)
                    transactional = transactional or what.is_transactional
                except KafkaError as e:
                    what = ProduceResult(int(e.code), error_message=e.message)
                    if isinstance(e, RecordValidationError):
                        record_errors[(td.name, pd.index)] = e.record_errors
            checked.append((td.name, info, pd, what))
    refuse_txn = transactional and (
        not txn_id or (authorize is not None and not authorize(WRITE, TRANSACTIONAL_ID, txn_id)))
    pending: list[tuple[str, int, object]] = []   # (topic, partition, result or future)
    any_error = False
    for name, info, pd, what in checked:
        if refuse_txn:
            res = ProduceResult(int(ErrorCode.transactional_id_authorization_failed),
                                error_message="transactional records need a transactional id"
                                if not txn_id else None)
        elif isinstance(what, ProduceResult):
            res = what
        else:
            res = broker.produce(info, pd.index, acks, pd.records, timeout_s, ctx.version, txn_id)
        if isinstance(res, ProduceResult) and res.error_code:
            any_error = True
        pending.append((name, pd.index, res))
    if acks == 0:
        return CloseConnection("error in a produce request with acks=0") if any_error else None
    futures = [r for _, _, r in pending if isinstance(r, asyncio.Future)]
    if futures:
        await asyncio.gather(*futures)
    by_topic: dict[str, ProduceTopic] = {}
    for name, index, r in pending:
        if isinstance(r, asyncio.Future):
            r = r.result()
        topic = by_topic.get(name)
        if topic is None:
            topic = by_topic[name] = ProduceTopic(name, None)
        topic.partitions.append(ProducePartition(index, r.error_code, r.base_offset, r.log_append_time,
                                                 r.log_start_offset, record_errors.get((name, index), ()),
                                                 r.error_message))
    return encode_produce_response(ctx.version, list(by_topic.values()))
