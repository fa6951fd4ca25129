"""SyncGroup (key 14), versions 0-5: the leader hands out assignments, every member gets its own.

Runs in frontends; the coordinator answers a follower once the leader's SyncGroup arrived and the
group was persisted, so the call may wait up to the group's rebalance timeout (Kafka's clients
allow the same). Needs Read on the group (else GROUP_AUTHORIZATION_FAILED), checked after v5's
mandatory protocol type and name, as Kafka's KafkaApis.handleSyncGroupRequest does.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import SyncGroupRequest
from appliance.protocol.messages import build

WAIT_S = 330.0     # at most Kafka's default max.poll.interval.ms (300 s) plus margin


@handles(14, "SyncGroup", 0, 5)
async def handle(ctx, req):
    mandatory_missing = ctx.version >= 5 and (req.protocol_type is None or req.protocol_name is None)
    if not mandatory_missing and not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed, protocol_type=None,
                     protocol_name=None, assignment=b"")
    r = await ctx.broker.call_coordinator(SyncGroupRequest(
        req.group_id, req.generation_id, req.member_id,
        [(a.member_id, bytes(a.assignment)) for a in req.assignments],
        getattr(req, "group_instance_id", None), getattr(req, "protocol_type", None),
        getattr(req, "protocol_name", None), ctx.version), WAIT_S)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=r.error, protocol_type=r.protocol_type,
                 protocol_name=r.protocol_name, assignment=r.assignment)
