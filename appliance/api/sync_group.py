"""SyncGroup (key 14), versions 0-5: the leader hands out assignments, every member gets its own.

Runs in frontends; the coordinator answers a follower once the leader's SyncGroup arrived and the
group was persisted, so the call may wait up to the group's rebalance timeout (Kafka's clients
allow the same).
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.group.messages import SyncGroupRequest
from appliance.protocol.messages import build

WAIT_S = 330.0     # at most Kafka's default max.poll.interval.ms (300 s) plus margin


@handles(14, "SyncGroup", 0, 5)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(SyncGroupRequest(
        req.group_id, req.generation_id, req.member_id,
        [(a.member_id, bytes(a.assignment)) for a in req.assignments],
        getattr(req, "group_instance_id", None), getattr(req, "protocol_type", None),
        getattr(req, "protocol_name", None), ctx.version), WAIT_S)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=r.error, protocol_type=r.protocol_type,
                 protocol_name=r.protocol_name, assignment=r.assignment)
