"""Shared by the offset handlers (OffsetCommit, TxnOffsetCommit, OffsetDelete): request topics to
``ipc.OffsetEntry`` lists and answers back to the per-topic response shape. Runs in frontends."""

from __future__ import annotations

from appliance import ipc
from appliance.errors import ErrorCode


def entries(ctx, topics, *, with_offsets: bool = True) -> tuple[list[ipc.OffsetEntry], list[ipc.OffsetEntry]]:
    """(entries to send to the coordinator, entries answered here). A partition of a topic this
    broker does not have gets UNKNOWN_TOPIC_OR_PARTITION without a trip to the coordinator, as
    Kafka's KafkaApis does for OffsetCommit and TxnOffsetCommit."""
    catalog = ctx.broker.catalog
    send, local = [], []
    for t in topics:
        info = catalog.topics.get(t.name)
        for p in t.partitions:
            if info is None or not 0 <= p.partition_index < info.partitions:
                local.append(ipc.OffsetEntry(t.name, p.partition_index,
                                             error_code=int(ErrorCode.unknown_topic_or_partition)))
            elif with_offsets:
                send.append(ipc.OffsetEntry(t.name, p.partition_index, p.committed_offset,
                                            getattr(p, "committed_leader_epoch", -1),
                                            p.committed_metadata))
            else:
                send.append(ipc.OffsetEntry(t.name, p.partition_index))
    return send, local


def all_failed(send: list[ipc.OffsetEntry], code: ErrorCode) -> list[ipc.OffsetEntry]:
    return [ipc.OffsetEntry(e.topic, e.partition, error_code=int(code)) for e in send]


def topics_out(results: list[ipc.OffsetEntry]) -> tuple:
    """Per-partition errors grouped by topic, in first-seen order."""
    by_topic: dict[str, list] = {}
    for e in results:
        by_topic.setdefault(e.topic, []).append(
            dict(partition_index=e.partition, error_code=ErrorCode(e.error_code)))
    return tuple(dict(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())
