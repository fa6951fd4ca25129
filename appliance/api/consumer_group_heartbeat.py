"""ConsumerGroupHeartbeat (key 68), versions 0-1: a member of a KIP-848 consumer group joins,
heartbeats, reconciles its assignment and leaves (``group.protocol=consumer``).

Runs in frontends; the group coordinator in the coordinator worker decides at once
(``appliance.group.consumer_protocol``): no request waits for other members. v1 (KIP-1082)
requires a client-generated member id and adds SubscribedTopicRegex. Authorization (Kafka's
KafkaApis.handleConsumerGroupHeartbeat): Read on the group, else GROUP_AUTHORIZATION_FAILED;
Describe on every subscribed topic, else TOPIC_AUTHORIZATION_FAILED naming them. A regex's
matches are filtered by the member's topic Describe ACLs in the coordinator (KAFKA-18813), which
gets the connection's principal and address with the request.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.api._heartbeat import error_response, unauthorized_topics
from appliance.errors import ErrorCode
from appliance.group.messages import ConsumerGroupHeartbeatRequest, TopicPartitions
from appliance.protocol.messages import build

MARGIN_S = 5.0


def _ms(td) -> int:
    return int(td.total_seconds() * 1000) if isinstance(td, datetime.timedelta) else int(td)


@handles(68, "ConsumerGroupHeartbeat", 0, 1)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return error_response(ctx, ErrorCode.group_authorization_failed)
    names = req.subscribed_topic_names
    denied = unauthorized_topics(ctx, names)
    if denied is not None:
        return denied
    tps = None if req.topic_partitions is None else [
        TopicPartitions(t.topic_id.bytes if t.topic_id is not None else bytes(16), list(t.partitions))
        for t in req.topic_partitions]
    # v1's regex; "" means no regex (librdkafka sends it when it subscribes by names)
    regex = getattr(req, "subscribed_topic_regex", None)
    host = ctx.connection.peer.rsplit(":", 1)[0]
    r = await ctx.broker.call_coordinator(ConsumerGroupHeartbeatRequest(
        req.group_id, req.member_id, req.member_epoch, req.instance_id, req.rack_id,
        _ms(req.rebalance_timeout), None if names is None else list(names),
        regex, req.server_assignor, tps,
        ctx.header.client_id or "", "/" + host, ctx.version,
        ctx.connection.principal, ctx.connection.host))
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
