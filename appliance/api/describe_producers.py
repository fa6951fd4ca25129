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
from appliance.catalog.model import check_topic_name
from appliance.errors import ErrorCode, KafkaError
from appliance.protocol.messages import build


@handles(61, "DescribeProducers", 0, 0)
async def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    # One question per partition, all at once, however often the request names it (regression: a
    # request naming one partition 40,000 times asked its writer 40,000 times, one topic after
    # the other).
    asked: dict[tuple[str, int], tuple] = {}
    refused: dict[str, tuple] = {}          # topic -> (error code, message), Kafka's order of checks
    for t in req.topics:
        try:
            check_topic_name(t.name)
            if not ctx.authorize(AclOperation.READ, ResourceType.TOPIC, t.name):
                refused[t.name] = (ErrorCode.topic_authorization_failed, None)
                continue
        except KafkaError as e:
            refused[t.name] = (e.code, e.message)
            continue
        info = catalog.topics.get(t.name)
        if info is not None:
            for p in t.partition_indexes:
                if 0 <= p < info.partitions:
                    asked.setdefault((t.name, p), (info, p))
    answers = dict(zip(asked, await asyncio.gather(
        *[broker.call_writer(info, p, ipc.DescribeProducersRequest()) for info, p in asked.values()],
        return_exceptions=True)))
    topics = []
    for t in req.topics:
        if t.name in refused:
            code, message = refused[t.name]
            topics.append(dict(name=t.name, partitions=tuple(
                dict(partition_index=p, error_code=code, error_message=message,
                     active_producers=()) for p in t.partition_indexes)))
            continue
        partitions = []
        for p in t.partition_indexes:
            a = answers.get((t.name, p))
            if a is None:
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
