"""Produce (key 0), versions 3-13: validate each partition's batch, hand it to its writer.

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
transaction (implicit AddPartitionsToTxn) instead of only verifying it. Produce 13 (KIP-516) names
topics by id, request and response: an id the appliance does not know answers UNKNOWN_TOPIC_ID
for its partitions before any other check (Kafka's handleProduceRequest: ids are not secret).

Authorization (Kafka's KafkaApis.handleProduceRequest): a request holding a transactional batch
needs Write on its TransactionalId, else every partition gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
each topic needs Write (one check per topic, not per batch), else its partitions get
TOPIC_AUTHORIZATION_FAILED, before any other check, so that an unauthorized client learns
nothing about the topic. An idempotent producer needs nothing more here: Kafka 3.x checks
IdempotentWrite (or Write on some topic) at InitProducerId only.

The request comes from ``appliance.protocol.produce_request``: its batches are views of the
connection's receive buffer, never copied before the writer's ring. They are valid only until the
connection reads again, so a request is sent before ``handle`` returns, unless it gives the event
loop back: a request behind an earlier one of the connection still unsent copies its batches
before it waits, and one that paces itself (thousands of partitions) copies those it still holds
at its first rest, then goes on in a task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import CloseConnection, handles
from appliance.catalog.model import INTERNAL_TOPICS
from appliance.errors import ErrorCode, KafkaError
from appliance.ipc import ProduceResult
from appliance.log.verification import VERIFY_FAILED
from appliance.protocol.produce_request import PartitionData, ProduceRequestView, TopicData
from appliance.protocol.fetch_response import ProducePartition, ProduceTopic, encode_produce_response
from appliance.quota.rates import PRODUCE as PRODUCE_QUOTA
from appliance.protocol.record_contents import (NO_TIMESTAMP_LIMIT, RecordValidationError,
                                                validate_records)
from appliance.protocol.recompress import level_for, recompress, target_codec
from appliance.protocol.records import ATTRIBUTES_OFFSET, validate_batch


WRITE = AclOperation.WRITE
TOPIC, TRANSACTIONAL_ID = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID


def _flagged_transactional(records) -> bool:
    """The transactional bit of a (not yet validated) batch's attributes."""
    return (records is not None and len(records) > ATTRIBUTES_OFFSET + 1
            and bool(records[ATTRIBUTES_OFFSET + 1] & 0x10))

log = logging.getLogger("appliance.produce")

FAILED_PRODUCE = "kafka_server_brokertopicmetrics_failedproducerequests"
# FailedProduceRequestsPerSec counts unexpected failures only (Kafka's
# ReplicaManager.appendToLocalLog: "not incremented for known exceptions"): not its known append
# errors (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, MESSAGE_TOO_LARGE,
# RECORD_LIST_TOO_LARGE, CORRUPT_MESSAGE, KAFKA_STORAGE_ERROR, UNKNOWN_TOPIC_ID), nor what is
# decided before the log is asked (KafkaApis: authorization, internal or unknown topics, acks;
# DelayedProduce: REQUEST_TIMED_OUT), nor a KIP-890 verification's refusal (``VERIFY_FAILED``).
# Counted: record validation (INVALID_RECORD, INVALID_TIMESTAMP), sequence and epoch checks,
# NOT_ENOUGH_REPLICAS of min.insync.replicas, anything unexpected.
EXPECTED_PRODUCE_ERRORS = frozenset(int(e) for e in (
    ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower,
    ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.corrupt_message,
    ErrorCode.kafka_storage_error, ErrorCode.unknown_topic_id,
    ErrorCode.topic_authorization_failed, ErrorCode.transactional_id_authorization_failed,
    ErrorCode.cluster_authorization_failed, ErrorCode.invalid_topic_exception,
    ErrorCode.invalid_required_acks, ErrorCode.request_timed_out))


def failed_produce(r: ProduceResult) -> bool:
    """Whether a partition's answer counts in FailedProduceRequestsPerSec (as Kafka counts)."""
    return bool(r.error_code) and r.error_code not in EXPECTED_PRODUCE_ERRORS and not (
        r.error_message and r.error_message.startswith(VERIFY_FAILED))

# A request gives the event loop back after this long, looked at every YIELD_EVERY partitions
# (validating and sending a batch cost a few µs: a usual request never yields).
YIELD_EVERY = 64
YIELD_AFTER_S = 0.05


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


def _validate_records(cfg, settings, topic: str, pd, header, now_ms: int) -> None:
    """Kafka's LogValidator per-record rules (``record_contents``): framing, offset deltas,
    timestamps, compressed data inflated within ``decompressed_batch_max_factor`` times the
    topic's max.message.bytes. Raises the KafkaError the partition answers."""
    # On a LogAppendTime topic the writer stamps the broker's clock: the producer's timestamps
    # are never checked (Kafka's validateTimestamp only looks at CreateTime). The limits are the
    # topic's message.timestamp.before/after.max.ms (KIP-937) over the broker's.
    create_time = not settings.log_append_time
    limit = settings.message_timestamp_before_max_ms if create_time else NO_TIMESTAMP_LIMIT
    after = settings.message_timestamp_after_max_ms if create_time else NO_TIMESTAMP_LIMIT
    validate_records(pd.records, header, max_bytes=settings.max_decompressed_bytes,
                     now_ms=now_ms, before_ms=limit, after_ms=after, compacted=settings.compact,
                     topic_partition=f"{topic}-{pd.index}")


def _not_enough_replicas(settings, topic: str, index: int, node_id: int) -> None:
    """Kafka's Partition.appendRecordsToLeader on a one-broker cluster: acks=-1 to a topic whose
    min.insync.replicas is above the one in-sync replica is refused, nothing appended."""
    raise KafkaError(ErrorCode.not_enough_replicas,
                     f"The size of the current ISR : 1 is insufficient to satisfy the min.isr "
                     f"requirement of {settings.min_insync_replicas} for partition {topic}-{index}, "
                     f"live replica(s) broker.id are : Set({node_id})")


@handles(0, "Produce", 3, 13)
def handle(ctx, req):
    """The batches may be views of the connection's receive buffer, which is reused once the
    frame's read is handled (``appliance.protocol.produce_request``). So a request is validated
    and handed to its writers here, before returning, with no copy: it returns the answer, or a
    coroutine that awaits the writers' acks holding no batch. A request behind an earlier one of
    the connection that is still unsent owns a copy of its batches first, then takes the same
    steps in a coroutine; one that paces itself (``_Pace``) copies the batches at its first rest
    and goes on in a coroutine.

    Regression: every request of 64 partitions or more used to copy its batches up front, in
    case it paced itself, which a usual one never does; at 256 partitions and 1 KiB records that
    copy was a tenth of the frontend's CPU."""
    order = _SendOrder(ctx.connection)
    if order.waits():
        # Later requests of the connection must wait for this one from now on, not from the
        # coroutine's first step: they could otherwise be sent first, synchronously.
        order.yielding()
        return _handle_later(ctx, _owned(req), order)
    send = _send(ctx, req, order)
    try:
        send.send(None)
    except StopIteration as e:
        return _answer(ctx, req.acks, *e.value)
    # It rested (asyncio.sleep(0)), owning its batches by then: the rest of it in a coroutine.
    return _resume(ctx, req.acks, send)


async def _handle_later(ctx, req, order: "_SendOrder"):
    result = _answer(ctx, req.acks, *await _send(ctx, req, order))
    if asyncio.iscoroutine(result):
        result = await result
    return result


async def _resume(ctx, acks: int, send):
    result = _answer(ctx, acks, *await _Resumed(send))
    if asyncio.iscoroutine(result):
        result = await result
    return result


class _Resumed:
    """Awaits a coroutine already run to a bare yield (``asyncio.sleep(0)``): ``yield from``
    resumes it with None, as the event loop would have, and passes on what it awaits next."""

    __slots__ = ("coro",)

    def __init__(self, coro) -> None:
        self.coro = coro

    def __await__(self):
        return (yield from self.coro.__await__())


def _owned(req):
    """``req`` with every batch that is a view copied into its own bytes."""
    topics = []
    for td in req.topic_data:
        topics.append(TopicData(td.name, [
            PartitionData(pd.index, bytes(pd.records) if type(pd.records) is memoryview
                          else pd.records) for pd in td.partition_data], td.topic_id))
    return ProduceRequestView(req.transactional_id, req.acks, req.timeout, topics)


def _own_in_place(req, checked: list) -> None:
    """Before a rest: every batch of ``req`` that is still a view, and of the partitions
    ``_validate`` has checked, replaced by its own bytes (in the lists the loops index)."""
    copies: dict[int, PartitionData] = {}
    for td in req.topic_data:
        parts = td.partition_data
        for i, pd in enumerate(parts):
            if type(pd.records) is memoryview:
                parts[i] = copies[id(pd)] = PartitionData(pd.index, bytes(pd.records))
    for i, (name, info, pd, what, tid) in enumerate(checked):
        own = copies.get(id(pd))
        if own is not None:
            checked[i] = (name, info, own, what, tid)


async def _send(ctx, req, order: "_SendOrder"):
    """Validate every partition's batch, then hand each valid one to its writer, in the order
    of the connection's requests. Returns (per partition: topic, index, result or future of
    it; the per-record errors; whether any partition failed)."""
    broker = ctx.broker
    acks = req.acks
    timeout_s = max(req.timeout.total_seconds(), 0.001) if req.timeout is not None else 30.0
    txn_id = req.transactional_id
    # (topic, partition, result or future, the topic id the request named it by: v13)
    pending: list[tuple[str, int, object, bytes | None]] = []
    any_error = False
    checked: list[tuple[str, object, PartitionData, object, bytes | None]] = []
    pace = _Pace(order, lambda: _own_in_place(req, checked))
    try:
        # Validate every partition's batch first: a transactional batch anywhere in a request
        # without a transactional id fails the whole request (Kafka's handleProduceRequest).
        record_errors, transactional, authorize = await _validate(ctx, req, pace, checked)
        await order.my_turn()
        refuse_txn = transactional and (
            not txn_id or (authorize is not None and not authorize(WRITE, TRANSACTIONAL_ID, txn_id)))
        pace.count = 0
        for k in range(len(checked)):
            if pace.due():
                await pace.rest()
            name, info, pd, what, tid = checked[k]     # after the rest: its own copy
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
            pending.append((name, pd.index, res, tid))
    finally:
        order.sent()
    return pending, record_errors, any_error


def _answer(ctx, acks: int, pending, record_errors, any_error):
    """The answer, or a coroutine that awaits the writers' acks and builds it."""
    catalog = ctx.broker.catalog
    if acks == 0:
        # Kafka records an acks=0 request too and mutes the connection when it is over.
        ctx.throttle(PRODUCE_QUOTA, ctx.slot.size if ctx.slot is not None else 0)
        _count(ctx, catalog, [(name, r) for name, _, r, _ in pending if isinstance(r, ProduceResult)])
        return CloseConnection("error in a produce request with acks=0") if any_error else None
    futures = [r for _, _, r, _ in pending if isinstance(r, asyncio.Future)]
    if futures:
        return _answer_after(ctx, catalog, pending, record_errors, futures)
    return _response(ctx, catalog, pending, record_errors)


async def _answer_after(ctx, catalog, pending, record_errors, futures):
    await asyncio.gather(*futures)
    return _response(ctx, catalog, pending, record_errors)


def _response(ctx, catalog, pending, record_errors):
    by_topic: dict[object, ProduceTopic] = {}
    done: list[tuple[str, ProduceResult]] = []
    for name, index, r, tid in pending:
        if isinstance(r, asyncio.Future):
            r = r.result()
        done.append((name, r))
        key = name if tid is None else tid
        topic = by_topic.get(key)
        if topic is None:
            topic = by_topic[key] = ProduceTopic(name, tid)
        topic.partitions.append(ProducePartition(index, r.error_code, r.base_offset, r.log_append_time,
                                                 r.log_start_offset, record_errors.get((name, index), ()),
                                                 r.error_message))
    _count(ctx, catalog, done)
    # KIP-13: the request's bytes against producer_byte_rate once it is appended, as Kafka's
    # handleProduceRequest records them in its response callback.
    throttle = ctx.throttle(PRODUCE_QUOTA, ctx.slot.size if ctx.slot is not None else 0)
    return encode_produce_response(ctx.version, list(by_topic.values()), throttle)


def _count(ctx, catalog, results: list[tuple[str, ProduceResult]]) -> None:
    """Metrics: the answer's error codes, and failed partitions of existing topics
    (FailedProduceRequestsPerSec, ``failed_produce``; the topic label of an unknown topic would
    be the client's to choose)."""
    errors: Counter = Counter()
    counters = ctx.broker.counters
    for name, r in results:
        errors[r.error_code] += 1
        if failed_produce(r) and name in catalog.topics:
            counters.topic(FAILED_PRODUCE, name)
    ctx.errors = errors


async def _validate(ctx, req, pace: "_Pace", checked: list):
    """Per partition, appended to ``checked``: (topic, info, partition data, the batch header
    (``validate_batch``) or the ProduceResult that refuses it). Returns the per-record errors
    (v8+); whether any batch is transactional; the request's authorize function (None: every
    write allowed, the authorizer off or a super user)."""
    broker = ctx.broker
    catalog = broker.catalog
    acks = req.acks
    record_errors: dict[tuple[str, int], list[tuple[int, str]]] = {}
    now_ms = int(time.time() * 1000)
    transactional = False
    authz = broker.authorizer          # the hot path: decided once per request for a super user
    authorize = None if not authz.enabled or ctx.principal in authz.super_users else ctx.authorize
    for td in req.topic_data:
        tid = td.topic_id
        if tid is None:
            name = td.name
            info = catalog.topics.get(name)
        else:                                   # v13: named by id (KIP-516)
            info = catalog.by_id(tid)
            name = info.name if info is not None else ""
        allowed = info is None and tid is not None or authorize is None or \
            authorize(WRITE, TOPIC, name)
        parts = td.partition_data
        for j in range(len(parts)):
            if pace.due():
                await pace.rest()
            pd = parts[j]                       # after the rest: its own copy
            if info is None and tid is not None:
                # Kafka answers an unknown id before authorizing (ids are not secret)
                what = ProduceResult(int(ErrorCode.unknown_topic_id))
                transactional = transactional or _flagged_transactional(pd.records)
            elif not allowed:
                what = ProduceResult(int(ErrorCode.topic_authorization_failed))
                # Kafka looks at every batch for the transactional flag, authorized or not.
                transactional = transactional or _flagged_transactional(pd.records)
            elif acks not in (0, 1, -1):
                what = ProduceResult(int(ErrorCode.invalid_required_acks))
            elif name in INTERNAL_TOPICS:
                # Kafka's ReplicaManager.appendToLocalLog refuses client appends to internal
                # topics (KIP-98: clients may not write __transaction_state): not retriable.
                what = ProduceResult(int(ErrorCode.invalid_topic_exception),
                                     error_message=f"Cannot append to internal topic {name}")
            elif info is None or not 0 <= pd.index < info.partitions:
                what = ProduceResult(int(ErrorCode.unknown_topic_or_partition))
            else:
                try:
                    # The topic's configs over the dynamic broker ones (live: AlterConfigs)
                    settings = catalog.settings(info, broker.cfg.log)
                    what = validate_batch(pd.records or b"", settings.max_message_bytes,
                                          produce_version=ctx.version)
                    _validate_records(broker.cfg, settings, name, pd, what, now_ms)
                    if acks == -1 and settings.min_insync_replicas > 1:
                        _not_enough_replicas(settings, name, pd.index, broker.node_id)
                    codec = target_codec(settings)
                    if codec is not None and codec != what.compression:
                        # compression.type other than producer: the writer gets the batch in
                        # the topic's codec, checked again against max.message.bytes.
                        pd = parts[j] = PartitionData(pd.index, recompress(
                            pd.records, what, codec, level_for(settings, codec),
                            settings.max_decompressed_bytes))
                        # (no produce version: zstd from the topic is no client's choice)
                        what = validate_batch(pd.records, settings.max_message_bytes)
                    transactional = transactional or what.is_transactional
                except KafkaError as e:
                    what = ProduceResult(int(e.code), error_message=e.message)
                    if isinstance(e, RecordValidationError):
                        record_errors[(name, pd.index)] = e.record_errors
                    _REFUSALS.note(name, pd.index, e, ctx.client_host)
            checked.append((name, info, pd, what, tid))
    return record_errors, transactional, authorize


class _Pace:
    """Gives the event loop back after YIELD_AFTER_S of work, looked at every YIELD_EVERY
    partitions: a request of thousands of partitions (inflated, hostile) must not hold the
    frontend's other connections and its heartbeat. A usual request never yields. Before the
    first rest ``own`` copies the batches the request still holds as views of the receive
    buffer, which the connection reuses once the event loop has it."""

    __slots__ = ("order", "own", "count", "since")

    def __init__(self, order: "_SendOrder", own) -> None:
        self.order = order
        self.own = own
        self.count = 0
        self.since = time.monotonic()

    def due(self) -> bool:
        self.count += 1
        if self.count < YIELD_EVERY:
            return False
        self.count = 0
        return time.monotonic() - self.since > YIELD_AFTER_S

    async def rest(self) -> None:
        self.order.yielding()
        if self.own is not None:
            self.own()
            self.own = None
        await asyncio.sleep(0)
        self.since = time.monotonic()


class _SendOrder:
    """Produce requests of one connection reach the writers in the order they came, as in Kafka
    (one request of a connection at a time), also when one of them gave the event loop back
    while validating and a later one finished first. Costs nothing unless a request yields:
    the connection's ``produce_order`` is the future of its latest request not yet sent, set
    only while some request of the connection waits or yields."""

    __slots__ = ("conn", "before", "mine")

    def __init__(self, conn) -> None:
        self.conn = conn
        self.before = conn.produce_order          # an earlier request not sent yet, or None
        self.mine = None
        if self.before is not None:
            self._register()

    def _register(self) -> None:
        self.mine = asyncio.get_running_loop().create_future()
        self.conn.produce_order = self.mine

    def yielding(self) -> None:
        if self.mine is None:
            self._register()

    def waits(self) -> bool:
        """Whether an earlier request of the connection is still to be sent."""
        return self.before is not None and not self.before.done()

    async def my_turn(self) -> None:
        if self.before is not None and not self.before.done():
            await self.before

    def sent(self) -> None:
        if self.mine is not None:
            if not self.mine.done():
                self.mine.set_result(None)
            if self.conn.produce_order is self.mine:
                self.conn.produce_order = None
