"""DeleteRecords (key 21), versions 0-2: move partitions' log start offsets up.

Runs in frontends; each partition's writer moves its log start offset (-1: the high watermark),
persists it (Kafka's log-start-offset checkpoint, so it holds across a restart), deletes the
segments wholly below it, and answers the new low watermark. Fetching below it is then
OFFSET_OUT_OF_RANGE and ListOffsets EARLIEST answers it.
"""

from __future__ import annotations

import asyncio
import datetime

from appliance import ipc
from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(21, "DeleteRecords", 0, 2)
async def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    # Kafka applies the delete on the leader whatever the request's timeout, which only bounds
    # its wait for the followers to move their low watermarks (DelayedDeleteRecords): with the
    # one replica here every partition gets its real result, even at a timeout of 0 (librdkafka's
    # test 0081). The wait for a writer is the internal bound, as for any call to a writer.
    timeout_s = broker.cfg.server.internal_request_timeout_ms / 1000
    topics = []
    for t in req.topics:
        if not ctx.authorize(AclOperation.DELETE, ResourceType.TOPIC, t.name):
            # Kafka's KafkaApis: Delete on the topic.
            topics.append(dict(name=t.name, partitions=tuple(
                dict(partition_index=p.partition_index, low_watermark=-1,
                     error_code=ErrorCode.topic_authorization_failed) for p in t.partitions)))
            continue
        info = catalog.topics.get(t.name)
        calls = []
        for p in t.partitions:
            if info is None or not 0 <= p.partition_index < info.partitions:
                calls.append(None)
            else:
                calls.append(broker.call_writer(info, p.partition_index,
                                                ipc.DeleteRecordsRequest(p.offset), timeout_s))
        answers = iter(await asyncio.gather(*[c for c in calls if c is not None], return_exceptions=True))
        parts = []
        for p, c in zip(t.partitions, calls):
            a = next(answers) if c is not None else None
            if a is None:
                err, low = ErrorCode.unknown_topic_or_partition, -1
            elif isinstance(a, TimeoutError):
                err, low = ErrorCode.request_timed_out, -1
            elif isinstance(a, BaseException):
                raise a
            else:
                err, low = a.error, a.low_watermark
            parts.append(dict(partition_index=p.partition_index, low_watermark=low, error_code=err))
        topics.append(dict(name=t.name, partitions=tuple(parts)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), topics=tuple(topics))
