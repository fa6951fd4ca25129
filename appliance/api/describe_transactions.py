"""DescribeTransactions (key 65), version 0: state, timeout, start time, producer and partitions.

Runs in frontends; the coordinator answers per transactional id (TRANSACTIONAL_ID_NOT_FOUND for
one it does not know). An entry with an error carries only its error code and id, the other fields
at the schema defaults (0, "", empty), as Kafka's KafkaApis.handleDescribeTransactionsRequest
leaves them; a found transaction that has not started (Empty) has start time -1, as in Kafka.
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import DescribeTransactionsRequest

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


@handles(65, "DescribeTransactions", 0, 0)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(DescribeTransactionsRequest(list(req.transactional_ids)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), transaction_states=tuple(
        dict(error_code=d.error, transactional_id=d.transactional_id, transaction_start_time=_EPOCH)
        if d.error else
        dict(error_code=ErrorCode.none, transactional_id=d.transactional_id,
             transaction_state=d.state, transaction_timeout=datetime.timedelta(milliseconds=d.timeout_ms),
             transaction_start_time=_EPOCH + datetime.timedelta(milliseconds=max(d.start_time_ms, -1)),
             producer_id=d.producer_id, producer_epoch=d.producer_epoch, topics=_topics(d.partitions))
        for d in r.transactions))


def _topics(partitions: list[tuple[str, int]]) -> tuple:
    """(topic, partition) pairs, sorted, as the response's per-topic lists."""
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    return tuple(dict(topic=t, partitions=tuple(ps)) for t, ps in topics.items())
