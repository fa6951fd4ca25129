"""Shared by the offset handlers (OffsetCommit, TxnOffsetCommit, OffsetDelete): request topics to
``OffsetPartition`` lists and answers back to the per-topic response shape. Runs in frontends.

Each of the three needs Read on every topic it names (Kafka's KafkaApis): the partitions of a
topic without it get TOPIC_AUTHORIZATION_FAILED, checked before the topic's existence."""

from __future__ import annotations

from appliance.acl.model import AclOperation, ResourceType
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetPartition, OffsetsResult


def entries(ctx, topics, *, with_offsets: bool = True) -> tuple[list[OffsetPartition], list[OffsetPartition]]:
    """(entries to send to the coordinator, entries answered here). A partition of a topic this
    broker does not have gets UNKNOWN_TOPIC_OR_PARTITION without a trip to the coordinator, as
    Kafka's KafkaApis does for OffsetCommit and TxnOffsetCommit."""
    catalog = ctx.broker.catalog
    send, local = [], []
    for t in topics:
        info = catalog.topics.get(t.name)
        allowed = ctx.authorize(AclOperation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            if not allowed:
                local.append(OffsetPartition(t.name, p.partition_index,
                                             error=ErrorCode.topic_authorization_failed))
            elif info is None or not 0 <= p.partition_index < info.partitions:
                local.append(OffsetPartition(t.name, p.partition_index,
                                             error=ErrorCode.unknown_topic_or_partition))
            elif with_offsets:
                send.append(OffsetPartition(t.name, p.partition_index, p.committed_offset,
                                            getattr(p, "committed_leader_epoch", -1),
                                            p.committed_metadata))
            else:
                send.append(OffsetPartition(t.name, p.partition_index))
    return send, local


def committed(send: list[OffsetPartition], r: OffsetsResult) -> list[OffsetPartition]:
    """The coordinator's per-partition answers, or its request error for every partition sent."""
    if r.error == ErrorCode.none:
        return r.offsets
    return [OffsetPartition(e.topic, e.partition, error=r.error) for e in send]


def topics_out(results: list[OffsetPartition]) -> tuple:
    """Per-partition errors grouped by topic, in first-seen order."""
    by_topic: dict[str, list] = {}
    for e in results:
        by_topic.setdefault(e.topic, []).append(
            dict(partition_index=e.partition, error_code=e.error))
    return tuple(dict(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())


def all_failed(topics, error: ErrorCode) -> tuple:
    """Every partition of the request with one error (the request's getErrorResponse)."""
    return tuple(dict(name=t.name, partitions=tuple(
        dict(partition_index=p.partition_index, error_code=error) for p in t.partitions))
        for t in topics)
