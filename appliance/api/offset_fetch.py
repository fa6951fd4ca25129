"""OffsetFetch (key 9), versions 1-10: a group's committed offsets.

Runs in frontends. v1-7 ask for one group, v8+ for a batch. ``topics`` null (v2+) means every
partition the group has an offset for. With ``require_stable`` (v7+, KIP-447) a partition that
has transactional offsets pending gets UNSTABLE_OFFSET_COMMIT, so that a consumer taking over a
partition waits for the transaction to finish instead of reprocessing. An unknown partition
answers offset -1 and empty metadata, without error, as in Kafka.

Authorization (Kafka's KafkaApis.handleOffsetFetchRequest): Describe on each group (else
GROUP_AUTHORIZATION_FAILED for it) and Describe on each topic: asked by name, a topic without it
gets offset -1 and TOPIC_AUTHORIZATION_FAILED for its partitions (the coordinator is not asked);
asked for everything, such topics are left out of the answer.

v9 (KIP-848) carries the member id and epoch: for a consumer group the member must exist
(UNKNOWN_MEMBER_ID) and the epoch be its current one (STALE_MEMBER_EPOCH), the group's error;
an admin client's fetch (no member id, epoch -1) is not checked.

v10 (Kafka 4.1, KIP-848) names topics by topic id, asked and answered: an id this broker does not
have gets UNKNOWN_TOPIC_ID for its partitions (offset -1); asked for everything, the group's
topics that no longer exist (no id to name them by) are left out.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetFetchGroup, OffsetFetchRequest, OffsetPartition
from appliance.protocol.messages import build


def _wanted(topics, catalog=None, unknown=None) -> list[OffsetPartition] | None:
    """The asked partitions by topic name; v10 (``catalog`` given) resolves each topic id, an
    unknown one's partitions go to ``unknown`` as (id, partition)."""
    if topics is None:
        return None
    if catalog is None:
        return [OffsetPartition(t.name, p) for t in topics for p in t.partition_indexes]
    out = []
    for t in topics:
        info = catalog.by_id(t.topic_id.bytes) if t.topic_id is not None else None
        for p in t.partition_indexes:
            if info is None:
                unknown.append((t.topic_id or uuid.UUID(int=0), p))
            else:
                out.append(OffsetPartition(info.name, p))
    return out


def _topics(parts: list[OffsetPartition], group_error: int, catalog=None) -> tuple:
    by_topic: dict[str, list] = {}
    for e in parts:
        by_topic.setdefault(e.topic, []).append(dict(
            partition_index=e.partition, committed_offset=e.offset,
            committed_leader_epoch=e.leader_epoch, metadata=e.metadata,
            error_code=ErrorCode(e.error or group_error)))
    if catalog is None:
        return tuple(dict(name=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    out = []
    for t, ps in by_topic.items():
        info = catalog.topics.get(t)
        if info is not None:
            out.append(dict(topic_id=uuid.UUID(bytes=info.topic_id), partitions=tuple(ps)))
    return tuple(out)


def _unknown_ids(unknown: list) -> tuple:
    by_id: dict[uuid.UUID, list] = {}
    for tid, p in unknown:
        by_id.setdefault(tid, []).append(dict(
            partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="",
            error_code=ErrorCode.unknown_topic_id))
    return tuple(dict(topic_id=t, partitions=tuple(ps)) for t, ps in by_id.items())


@handles(9, "OffsetFetch", 1, 10)
async def handle(ctx, req):
    catalog = ctx.broker.catalog if ctx.version >= 10 else None
    unknown: list[list] = [[] for _ in getattr(req, "groups", ())]
    if ctx.version >= 8:
        asked = [OffsetFetchGroup(g.group_id, _wanted(g.topics, catalog, unknown[i]),
                                  member_id=getattr(g, "member_id", None),
                                  member_epoch=getattr(g, "member_epoch", -1))
                 for i, g in enumerate(req.groups)]
    else:
        asked = [OffsetFetchGroup(req.group_id, _wanted(req.topics))]
    require_stable = bool(getattr(req, "require_stable", False))
    # Per group: its error (GROUP_AUTHORIZATION_FAILED) or its authorized request, and the
    # partitions of topics it may not Describe.
    denied_groups: set[int] = set()
    denied_parts: dict[int, list[OffsetPartition]] = {}
    send: list[OffsetFetchGroup] = []
    for i, g in enumerate(asked):
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id):
            denied_groups.add(i)
            continue
        if g.partitions is not None:
            ok, no = [], []
            for e in g.partitions:
                (ok if _describable(ctx, e.topic) else no).append(e)
            denied_parts[i] = [OffsetPartition(e.topic, e.partition, -1, -1, "",
                                               ErrorCode.topic_authorization_failed) for e in no]
            g = OffsetFetchGroup(g.group_id, ok, member_id=g.member_id,
                                 member_epoch=g.member_epoch)
        send.append(g)
    answered = iter([])
    if send:
        r = await ctx.broker.call_coordinator(OffsetFetchRequest(send, require_stable))
        answered = iter(r.groups)
    groups = []
    for i, g in enumerate(asked):
        if i in denied_groups:
            groups.append(OffsetFetchGroup(g.group_id, [], ErrorCode.group_authorization_failed))
            continue
        a = next(answered)
        parts = a.partitions or []
        if not a.error:
            if g.partitions is None:
                parts = [e for e in parts if _describable(ctx, e.topic)]
            else:
                parts = parts + denied_parts.get(i, [])
        groups.append(OffsetFetchGroup(a.group_id, parts, a.error))
    if ctx.version >= 10:
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(
            dict(group_id=g.group_id, error_code=g.error,
                 topics=_topics(g.partitions, 0, catalog)
                 + (_unknown_ids(unknown[i]) if not g.error else ()))
            for i, g in enumerate(groups)))
    if ctx.version >= 8:
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(
            dict(group_id=g.group_id, error_code=g.error,
                 topics=_topics(g.partitions, 0)) for g in groups))
    g = groups[0]
    parts = g.partitions
    if ctx.version < 2 and g.error:
        # v1 has no group-level error: each asked partition carries it (Kafka's OffsetFetchResponse).
        parts = [OffsetPartition(e.topic, e.partition, -1, -1, "", g.error)
                 for e in (asked[0].partitions or [])]
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=g.error, topics=_topics(parts, 0))


def _describable(ctx, topic: str) -> bool:
    return ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, topic)
