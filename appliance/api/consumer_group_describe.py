"""ConsumerGroupDescribe (key 69), versions 0-1: KIP-848 consumer groups with their epochs,
members, assignments and target assignments.

Runs in frontends; the group coordinator answers (``appliance.group.consumer_protocol``). A
classic group, or an unknown one, answers GROUP_ID_NOT_FOUND (so that Kafka's Java Admin falls
back to DescribeGroups for it). Authorization (Kafka's KafkaApis.handleConsumerGroupDescribe):
Describe on the group, else GROUP_AUTHORIZATION_FAILED; a group assigned topics the principal
may not Describe answers TOPIC_AUTHORIZATION_FAILED. Topic names come from the catalog the
frontend sees (a topic deleted meanwhile is shown with an empty name).
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import ConsumerGroupDescribeRequest
from appliance.protocol.messages import build

NOT_REQUESTED = -2147483648


@handles(69, "ConsumerGroupDescribe", 0, 1)
async def handle(ctx, req):
    allowed = [g for g in req.group_ids
               if ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, g)]
    described = {}
    if allowed:
        r = await ctx.broker.call_coordinator(ConsumerGroupDescribeRequest(allowed))
        described = {g.group_id: g for g in r.groups}
    cat = ctx.broker.catalog

    def name(tid: bytes) -> str:
        t = cat.by_id(bytes(tid))
        return "" if t is None else t.name

    def assignment(tps):
        return dict(topic_partitions=tuple(
            dict(topic_id=uuid.UUID(bytes=bytes(t.topic_id)), topic_name=name(t.topic_id),
                 partitions=tuple(t.partitions)) for t in tps))

    out = []
    for gid in req.group_ids:
        g = described.get(gid)
        if g is None:
            out.append(dict(error_code=ErrorCode.group_authorization_failed, error_message=None,
                            group_id=gid, group_state="", group_epoch=0, assignment_epoch=0,
                            assignor_name="", members=(), authorized_operations=NOT_REQUESTED))
            continue
        if g.error != ErrorCode.none:
            out.append(dict(error_code=g.error, error_message=g.error_message, group_id=gid,
                            group_state="", group_epoch=0, assignment_epoch=0, assignor_name="",
                            members=(), authorized_operations=NOT_REQUESTED))
            continue
        topics = {name(t.topic_id) for m in g.members
                  for t in list(m.assignment) + list(m.target_assignment)}
        if any(t and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, t)
               for t in topics):
            out.append(dict(error_code=ErrorCode.topic_authorization_failed,
                            error_message=None, group_id=gid, group_state="", group_epoch=0,
                            assignment_epoch=0, assignor_name="", members=(),
                            authorized_operations=NOT_REQUESTED))
            continue
        ops = NOT_REQUESTED
        if req.include_authorized_operations:
            ops = ctx.authorized_operations(ResourceType.GROUP, gid)
        out.append(dict(
            error_code=ErrorCode.none, error_message=None, group_id=gid,
            group_state=g.group_state, group_epoch=g.group_epoch,
            assignment_epoch=g.assignment_epoch, assignor_name=g.assignor_name,
            authorized_operations=ops,
            members=tuple(dict(member_id=m.member_id, instance_id=m.instance_id,
                               rack_id=m.rack_id, member_epoch=m.member_epoch,
                               client_id=m.client_id, client_host=m.client_host,
                               subscribed_topic_names=tuple(m.subscribed_topic_names),
                               subscribed_topic_regex=m.subscribed_topic_regex,
                               assignment=assignment(m.assignment),
                               target_assignment=assignment(m.target_assignment),
                               member_type=m.member_type)
                          for m in g.members)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(out))
