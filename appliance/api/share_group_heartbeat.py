"""ShareGroupHeartbeat (key 76), version 1: a member of a KIP-932 share group joins, heartbeats,
gets its assignment and leaves.

Runs in frontends; the share coordinator in the coordinator worker decides at once
(``appliance.group.share_group``). The member id is the client's (a UUID it generated).
Authorization (Kafka's KafkaApis.handleShareGroupHeartbeat): Read on the group, else
GROUP_AUTHORIZATION_FAILED; Describe on every subscribed topic, else TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.api._heartbeat import error_response, unauthorized_topics
from appliance.errors import ErrorCode
from appliance.group.messages import ShareGroupHeartbeatRequest
from appliance.protocol.messages import build


@handles(76, "ShareGroupHeartbeat", 1, 1)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return error_response(ctx, ErrorCode.group_authorization_failed)
    names = req.subscribed_topic_names
    denied = unauthorized_topics(ctx, names)
    if denied is not None:
        return denied
    host = ctx.connection.peer.rsplit(":", 1)[0]
    r = await ctx.broker.call_coordinator(ShareGroupHeartbeatRequest(
        req.group_id, req.member_id, req.member_epoch, req.rack_id,
        None if names is None else list(names), ctx.header.client_id or "", "/" + host))
    if r.error != ErrorCode.none:
        return error_response(ctx, r.error, r.error_message)
    assignment = None
    if r.assignment is not None:
        assignment = dict(topic_partitions=tuple(
            dict(topic_id=uuid.UUID(bytes=bytes(t.topic_id)), partitions=tuple(t.partitions))
            for t in r.assignment))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, error_message=None, member_id=r.member_id,
                 member_epoch=r.member_epoch,
                 heartbeat_interval=datetime.timedelta(milliseconds=r.heartbeat_interval_ms),
                 assignment=assignment)
