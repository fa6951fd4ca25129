"""DescribeTopicPartitions (key 75), version 0 (KIP-966): topics and their partitions, paged by a
cursor, as the Java Admin's ``describeTopics`` (and ``kafka-topics.sh --describe``) of a 4.x
client ask before falling back to Metadata.

Runs in frontends, on the catalog the frontend follows. As Kafka's
DescribeTopicPartitionsRequestHandler and KRaftMetadataCache.describeTopicResponse: no topics
asked means every topic; the topics are answered in name order from the cursor's topic (a named
list must contain the cursor's topic, and a cursor's partition must not be negative: else
INVALID_REQUEST for every topic asked); at most ``ResponsePartitionLimit`` partitions (capped by
Kafka's max.request.partition.size.limit, 2000; at least 1) are answered, and when that cuts a
topic, or stops before the next one, NextCursor says where to go on. Topics the principal may
not Describe are left out of an all-topics answer and TOPIC_AUTHORIZATION_FAILED (zero id, after
the others) when named; a named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION
(INVALID_TOPIC_EXCEPTION for an invalid name). This node leads every partition (the one replica
and ISR, leader epoch 0, empty eligible-leader lists: one node has no ELR, KIP-966).
TopicAuthorizedOperations is always filled in, as Kafka does for this API.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog.model import check_topic_name
from appliance.errors import ErrorCode, KafkaError
from appliance.protocol.messages import build, response_class
from appliance.protocol.records import LEADER_EPOCH

ZERO_UUID = uuid.UUID(int=0)
MAX_PARTITIONS = 2000          # Kafka's max.request.partition.size.limit default
ZERO = datetime.timedelta(0)


@handles(75, "DescribeTopicPartitions", 0, 0)
def handle(ctx, req):
    cls = ctx.response_class()
    catalog = ctx.broker.catalog
    node = ctx.broker.node_id
    cursor = req.cursor
    start_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = not req.topics
    if fetch_all:
        names = {n for n in catalog.topics if n >= start_topic}
    else:
        names = {t.name for t in req.topics if t.name >= start_topic}
        if cursor is not None and cursor.topic_name not in names:
            raise KafkaError(ErrorCode.invalid_request,
                             f"DescribeTopicPartitionsRequest topic list should contain the "
                             f"cursor topic: {cursor.topic_name}")
    if cursor is not None and cursor.partition_index < 0:
        raise KafkaError(ErrorCode.invalid_request,
                         "DescribeTopicPartitionsRequest cursor partition must be valid")
    denied = []
    allowed = []
    for n in sorted(names):
        if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, n):
            allowed.append(n)
        elif not fetch_all:
            denied.append(dict(error_code=ErrorCode.topic_authorization_failed, name=n,
                               topic_id=ZERO_UUID, is_internal=False, partitions=(),
                               topic_authorized_operations=-2147483648))
    remaining = max(min(MAX_PARTITIONS, req.response_partition_limit), 1)
    topics, next_cursor = [], None
    for n in allowed:
        if remaining == 0:
            # Every partition of the previous topic fitted: go on at this one.
            next_cursor = dict(topic_name=n, partition_index=0)
            break
        info = catalog.topics.get(n)
        if info is None:
            if not fetch_all:
                try:
                    check_topic_name(n)
                    err = ErrorCode.unknown_topic_or_partition
                except KafkaError:
                    err = ErrorCode.invalid_topic_exception
                topics.append(dict(error_code=err, name=n, topic_id=ZERO_UUID, is_internal=False,
                                   partitions=(), topic_authorized_operations=_ops(ctx, n)))
            continue
        first = cursor.partition_index if cursor is not None and n == start_topic else 0
        last = min(info.partitions, first + remaining)
        partitions = tuple(
            dict(error_code=ErrorCode.none, partition_index=p, leader_id=node,
                 leader_epoch=LEADER_EPOCH, replica_nodes=(node,), isr_nodes=(node,),
                 eligible_leader_replicas=(), last_known_elr=(), offline_replicas=())
            for p in range(first, last))
        topics.append(dict(error_code=ErrorCode.none, name=n,
                           topic_id=uuid.UUID(bytes=info.topic_id), is_internal=False,
                           partitions=partitions, topic_authorized_operations=_ops(ctx, n)))
        if last < info.partitions:
            next_cursor = dict(topic_name=n, partition_index=last)
            break
        remaining -= len(partitions)
    return build(cls, throttle_time=ZERO, topics=tuple(topics + denied), next_cursor=next_cursor)


def _ops(ctx, name: str) -> int:
    return ctx.authorized_operations(ResourceType.TOPIC, name)


@handle.on_error
def error_response(version, req, err):
    """Kafka's getErrorResponse: every topic asked, with the error."""
    return build(response_class(75, version), throttle_time=ZERO, next_cursor=None,
                 topics=tuple(dict(error_code=err.code, name=t.name, topic_id=ZERO_UUID,
                                   is_internal=False, partitions=(),
                                   topic_authorized_operations=-2147483648)
                              for t in req.topics))
