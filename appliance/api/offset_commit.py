"""OffsetCommit (key 8), versions 2-10: store a group's consumed positions.

Runs in frontends; the group coordinator checks generation and member (a "simple" commit with
generation -1 and no member only to a group without members) and answers once the offsets are in
the group log. The v2-4 retention time is ignored: offsets expire by ``groups.offsets_retention_ms``
(KIP-211, as Kafka since 2.1 does for v5+). Needs Read on the group (else every partition gets
GROUP_AUTHORIZATION_FAILED) and Read on each topic (``_offsets``).

v9 (KIP-848) sends the member epoch in place of the generation: to a consumer group, a member's
commit must carry its current epoch (STALE_MEMBER_EPOCH otherwise, UNKNOWN_MEMBER_ID for a
member the group does not have), and a consumer-protocol member must commit with v9+.

v10 (Kafka 4.1, KIP-848) names topics by topic id: an id this broker does not have gets
UNKNOWN_TOPIC_ID for its partitions, without a trip to the coordinator (ids are not secret, so
before the topic Read check); the answer names topics by id too. The offsets are stored by
name, as for every version (a topic deleted and re-created under the same name is Kafka's case
too: the offsets are removed with the topic).
"""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import _offsets, handles
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetCommitRequest
from appliance.protocol.messages import build


@handles(8, "OffsetCommit", 2, 10)
async def handle(ctx, req):
    topics, unknown_ids, ids = req.topics, [], None
    if ctx.version >= 10:
        topics, unknown_ids, ids = _by_id(ctx, req.topics)
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        if ids is not None:
            return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                         topics=tuple(dict(topic_id=t.topic_id, partitions=tuple(
                             dict(partition_index=p.partition_index,
                                  error_code=ErrorCode.group_authorization_failed)
                             for p in t.partitions)) for t in req.topics))
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     topics=_offsets.all_failed(req.topics, ErrorCode.group_authorization_failed))
    send, local = _offsets.entries(ctx, topics)
    results = list(local)
    if send:
        generation = getattr(req, "generation_id_or_member_epoch", None)
        if generation is None:
            generation = getattr(req, "generation_id", -1)
        r = await ctx.broker.call_coordinator(OffsetCommitRequest(
            req.group_id, generation, req.member_id, getattr(req, "group_instance_id", None),
            send, ctx.version))
        results += _offsets.committed(send, r)
    out = _offsets.topics_out(results)
    if ids is not None:
        out = tuple(dict(topic_id=ids[t["name"]], partitions=t["partitions"]) for t in out)
        out += tuple(dict(topic_id=tid, partitions=tuple(
            dict(partition_index=p.partition_index, error_code=ErrorCode.unknown_topic_id)
            for p in parts)) for tid, parts in unknown_ids)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), topics=out)


def _by_id(ctx, topics) -> tuple[list, list, dict[str, uuid.UUID]]:
    """v10's topics by id: (the known ones under their names, for ``_offsets.entries``;
    (id, partitions) of the unknown ones; name -> id for the answer)."""
    catalog = ctx.broker.catalog
    named, unknown, ids = [], [], {}
    for t in topics:
        info = catalog.by_id(t.topic_id.bytes) if t.topic_id is not None else None
        if info is None:
            unknown.append((t.topic_id or uuid.UUID(int=0), t.partitions))
            continue
        ids[info.name] = t.topic_id
        named.append(SimpleNamespace(name=info.name, partitions=t.partitions))
    return named, unknown, ids
