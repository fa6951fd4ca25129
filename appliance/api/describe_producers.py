"""DescribeProducers (key 61), version 0: the active producers of each partition.

Runs in frontends; each partition's writer answers from its ProducerStateManager (producer id,
epoch, last sequence, last timestamp, coordinator epoch, first offset of its open transaction). Each topic needs a legal name (else INVALID_TOPIC_EXCEPTION)
and Read on it (else TOPIC_AUTHORIZATION_FAILED), both before its existence (Kafka's
KafkaApis.handleDescribeProducersRequest).
"""

from __future__ import annotations

import asyncio
import datetime

from appliance import ipc
from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog import check_topic_name
from appliance.errors import ErrorCode, KafkaError
from appliance.protocol.messages import build


@handles(61, "DescribeProducers", 0, 0)
async def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    topics = []
    for t in req.topics:
        refused = None
        try:
            check_topic_name(t.name)
            if not ctx.authorize(AclOperation.READ, ResourceType.TOPIC, t.name):
                refused = (ErrorCode.topic_authorization_failed, None)
        except KafkaError as e:
            refused = (e.code, e.message)
        if refused is not None:
            topics.append(dict(name=t.name, partitions=tuple(
                dict(partition_index=p, error_code=refused[0], error_message=refused[1],
                     active_producers=()) for p in t.partition_indexes)))
            continue
        info = catalog.topics.get(t.name)
        calls = []
        for p in t.partition_indexes:
            if info is None or not 0 <= p < info.partitions:
                calls.append(None)
            else:
                calls.append(broker.call_writer(info, p, ipc.DescribeProducersRequest()))
        answers = await asyncio.gather(*[c for c in calls if c is not None], return_exceptions=True)
        it = iter(answers)
        partitions = []
        for p, c in zip(t.partition_indexes, calls):
            a = next(it) if c is not None else None
            if c is None or a is None:
                partitions.append(dict(partition_index=p, error_code=ErrorCode.unknown_topic_or_partition,
                                       error_message=None, active_producers=()))
            elif isinstance(a, BaseException):
                partitions.append(dict(partition_index=p, error_code=ErrorCode.not_leader_or_follower,
                                       error_message=str(a) or None, active_producers=()))
            else:
                partitions.append(dict(partition_index=p, error_code=a.error, error_message=None,
                                       active_producers=tuple(
                                           dict(producer_id=x.producer_id, producer_epoch=x.producer_epoch,
                                                last_sequence=x.last_sequence, last_timestamp=x.last_timestamp,
                                                coordinator_epoch=x.coordinator_epoch,
                                                current_txn_start_offset=x.current_txn_start_offset)
                                           for x in a.producers)))
        topics.append(dict(name=t.name, partitions=tuple(partitions)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), topics=tuple(topics))
