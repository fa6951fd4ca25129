"""DescribeShareGroupOffsets (key 90), versions 0-1: the start offset of a share group's share
partitions (KIP-932), and from v1 their lag (KIP-1226).

Runs in frontends; the share coordinator in the coordinator worker answers
(``appliance.group.share_admin``). Null topics (v1) ask for every partition with state.
Authorization as Kafka's KafkaApis.handleDescribeShareGroupOffsetsRequest: Describe on the group
(else GROUP_AUTHORIZATION_FAILED for it), Describe on each topic (else its partitions answer
TOPIC_AUTHORIZATION_FAILED; of null topics, the unauthorized ones are left out).
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import DescribeShareOffsetsRequest, ShareOffsetsAsk
from appliance.protocol.messages import build

E = ErrorCode


def _partition(p: int, start: int = -1, lag: int = -1, err: ErrorCode = E.none,
               msg: str | None = None) -> dict:
    return dict(partition_index=p, start_offset=start, leader_epoch=0 if start >= 0 else -1,
                lag=lag, error_code=err, error_message=msg)


@handles(90, "DescribeShareGroupOffsets", 0, 1)
async def handle(ctx, req):
    def topic_ok(name: str) -> bool:
        return ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name)

    groups: dict[str, dict] = {}
    asks, denied = [], {}
    for g in req.groups:
        gid = g.group_id
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, gid):
            groups[gid] = dict(group_id=gid, topics=(), error_code=E.group_authorization_failed,
                               error_message=None)
            continue
        if g.topics is None:
            asks.append(ShareOffsetsAsk(gid, None))
            continue
        allowed = [(t.topic_name, list(t.partitions)) for t in g.topics if topic_ok(t.topic_name)]
        denied[gid] = [t for t in g.topics if not topic_ok(t.topic_name)]
        asks.append(ShareOffsetsAsk(gid, allowed))
    if asks:
        r = await ctx.broker.call_coordinator(DescribeShareOffsetsRequest(asks))
        for g in r.groups:
            topics = [dict(topic_name=t.topic, topic_id=uuid.UUID(bytes=bytes(t.topic_id)),
                           partitions=tuple(_partition(p.partition, p.start_offset, p.lag,
                                                       p.error, p.error_message)
                                            for p in t.partitions))
                      for t in g.topics if g.error != E.none or topic_ok(t.topic)]
            topics += [dict(topic_name=t.topic_name, topic_id=uuid.UUID(int=0),
                            partitions=tuple(_partition(p, err=E.topic_authorization_failed)
                                             for p in t.partitions))
                       for t in denied.get(g.group_id, ())]
            groups[g.group_id] = dict(group_id=g.group_id, topics=tuple(topics),
                                      error_code=g.error, error_message=g.error_message)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 groups=tuple(groups[g.group_id] for g in req.groups))
