"""Heartbeat (key 12), versions 0-4: a member says it is alive and learns of rebalances.

Runs in frontends; the group coordinator answers at once (REBALANCE_IN_PROGRESS tells the member
to rejoin). Needs Read on the group (else GROUP_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import HeartbeatRequest
from appliance.protocol.messages import build


@handles(12, "Heartbeat", 0, 4)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed)
    r = await ctx.broker.call_coordinator(HeartbeatRequest(
        req.group_id, req.generation_id, req.member_id, getattr(req, "group_instance_id", None)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=r.error)
