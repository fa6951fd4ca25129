"""OffsetFetch (key 9), versions 1-9: a group's committed offsets.

Runs in frontends. v1-7 ask for one group, v8+ for a batch. ``topics`` null (v2+) means every
partition the group has an offset for. With ``require_stable`` (v7+, KIP-447) a partition that
has transactional offsets pending gets UNSTABLE_OFFSET_COMMIT, so that a consumer taking over a
partition waits for the transaction to finish instead of reprocessing. An unknown partition
answers offset -1 and empty metadata, without error, as in Kafka.
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetFetchGroup, OffsetFetchRequest, OffsetPartition
from appliance.protocol.messages import build


def _wanted(topics) -> list[OffsetPartition] | None:
    if topics is None:
        return None
    return [OffsetPartition(t.name, p) for t in topics for p in t.partition_indexes]


def _topics(parts: list[OffsetPartition], group_error: int) -> tuple:
    by_topic: dict[str, list] = {}
    for e in parts:
        by_topic.setdefault(e.topic, []).append(dict(
            partition_index=e.partition, committed_offset=e.offset,
            committed_leader_epoch=e.leader_epoch, metadata=e.metadata,
            error_code=ErrorCode(e.error or group_error)))
    return tuple(dict(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())


@handles(9, "OffsetFetch", 1, 9)
async def handle(ctx, req):
    if ctx.version >= 8:
        asked = [OffsetFetchGroup(g.group_id, _wanted(g.topics)) for g in req.groups]
    else:
        asked = [OffsetFetchGroup(req.group_id, _wanted(req.topics))]
    require_stable = bool(getattr(req, "require_stable", False))
    r = await ctx.broker.call_coordinator(OffsetFetchRequest(asked, require_stable))
    if ctx.version >= 8:
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(
            dict(group_id=g.group_id, error_code=g.error,
                 topics=_topics(g.partitions or [], 0)) for g in r.groups))
    g = r.groups[0]
    parts = g.partitions or []
    if ctx.version < 2 and g.error:
        # v1 has no group-level error: each asked partition carries it (Kafka's OffsetFetchResponse).
        parts = [OffsetPartition(e.topic, e.partition, -1, -1, "", g.error)
                 for e in (asked[0].partitions or [])]
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=g.error, topics=_topics(parts, 0))
