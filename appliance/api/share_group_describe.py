"""ShareGroupDescribe (key 77), version 1: KIP-932 share groups with their epochs, members and
assignments.

Runs in frontends; the share coordinator in the coordinator worker answers
(``appliance.group.share_group``). A classic or consumer group, or an unknown id, answers
GROUP_ID_NOT_FOUND. Authorization (Kafka's KafkaApis.handleShareGroupDescribe): Describe on the
group, else GROUP_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import ShareGroupDescribeRequest
from appliance.protocol.messages import build

NOT_REQUESTED = -2147483648
ASSIGNOR = "simple"


def _failed(gid: str, code: ErrorCode, message: str | None = None) -> dict:
    return dict(error_code=code, error_message=message, group_id=gid, group_state="",
                group_epoch=0, assignment_epoch=0, assignor_name="", members=(),
                authorized_operations=NOT_REQUESTED)


@handles(77, "ShareGroupDescribe", 1, 1)
async def handle(ctx, req):
    allowed = [g for g in req.group_ids
               if ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, g)]
    described = {}
    if allowed:
        r = await ctx.broker.call_coordinator(ShareGroupDescribeRequest(allowed))
        described = {g.group_id: g for g in r.groups}
    cat = ctx.broker.catalog

    def name(tid: bytes) -> str:
        t = cat.by_id(bytes(tid))
        return "" if t is None else t.name

    out = []
    for gid in req.group_ids:
        g = described.get(gid)
        if g is None:
            out.append(_failed(gid, ErrorCode.group_authorization_failed))
            continue
        if g.error != ErrorCode.none:
            out.append(_failed(gid, g.error, g.error_message))
            continue
        ops = NOT_REQUESTED
        if req.include_authorized_operations:
            ops = ctx.authorized_operations(ResourceType.GROUP, gid)
        out.append(dict(
            error_code=ErrorCode.none, error_message=None, group_id=gid, group_state=g.state,
            group_epoch=g.group_epoch, assignment_epoch=g.assignment_epoch,
            assignor_name=ASSIGNOR, authorized_operations=ops,
            members=tuple(dict(member_id=m.member_id, rack_id=m.rack_id,
                               member_epoch=m.member_epoch, client_id=m.client_id,
                               client_host=m.client_host,
                               subscribed_topic_names=tuple(m.subscribed_topic_names),
                               assignment=dict(topic_partitions=tuple(
                                   dict(topic_id=uuid.UUID(bytes=bytes(t.topic_id)),
                                        topic_name=name(t.topic_id), partitions=tuple(t.partitions))
                                   for t in m.assignment)))
                          for m in g.members)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(out))
