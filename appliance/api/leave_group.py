"""LeaveGroup (key 13), versions 0-5: members leave (v0-2 one member id, v3+ a batch, KIP-345).

Runs in frontends; the group coordinator removes the members and starts a rebalance.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(13, "LeaveGroup", 0, 5)
async def handle(ctx, req):
    if ctx.version < 3:
        members = [ipc.LeavingMember(req.member_id)]
    else:
        members = [ipc.LeavingMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in req.members]
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.LeaveGroupReq(rid, req.group_id, members))
    except TimeoutError:
        r = ipc.LeaveGroupResp(0, int(ErrorCode.coordinator_not_available))
    err = ErrorCode(r.error_code)
    if ctx.version < 3 and err == ErrorCode.none and r.members:
        err = ErrorCode(r.members[0].error_code)      # the single member's own error
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                    error_code=ErrorCode(m.error_code)) for m in r.members))
