"""DescribeTransactions (key 65), version 0: state, timeout, start time, producer and partitions.

Runs in frontends; the coordinator answers per transactional id (TRANSACTIONAL_ID_NOT_FOUND for
one it does not know). An entry with an error carries only its error code and id, the other fields
at the schema defaults (0, "", empty), as Kafka's KafkaApis.handleDescribeTransactionsRequest
leaves them; a found transaction that has not started (Empty) has start time -1, as in Kafka.
Needs Describe on each transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the
coordinator not asked); only the partitions of topics the principal may Describe are listed
(Kafka's KafkaApis.handleDescribeTransactionsRequest).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import DescribeTransactionsRequest

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@handles(65, "DescribeTransactions", 0, 0)
async def handle(ctx, req):
    ids = list(req.transactional_ids)
    allowed = [t for t in ids if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, t)]
    found = iter([])
    if allowed:
        r = await ctx.broker.call_coordinator(DescribeTransactionsRequest(allowed))
        found = iter(r.transactions)
    allowed_set = set(allowed)
    states = []
    for tid in ids:
        if tid not in allowed_set:
            states.append(dict(error_code=ErrorCode.transactional_id_authorization_failed,
                               transactional_id=tid, transaction_start_time=_EPOCH))
            continue
        d = next(found)
        if d.error:
            states.append(dict(error_code=d.error, transactional_id=d.transactional_id,
                               transaction_start_time=_EPOCH))
            continue
        parts = [(t, p) for t, p in d.partitions
                 if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, t)]
        states.append(dict(
            error_code=ErrorCode.none, transactional_id=d.transactional_id,
            transaction_state=d.state, transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
            transaction_start_time=_EPOCH + datetime.timedelta(milliseconds=max(d.start_time_ms, -1)),
            producer_id=d.producer_id, producer_epoch=d.producer_epoch, topics=_topics(parts)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 transaction_states=tuple(states))


def _topics(partitions: list[tuple[str, int]]) -> tuple:
    """(topic, partition) pairs, sorted, as the response's per-topic lists."""
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    return tuple(dict(topic=t, partitions=tuple(ps)) for t, ps in topics.items())
