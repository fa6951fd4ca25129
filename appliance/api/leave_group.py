"""LeaveGroup (key 13), versions 0-5: members leave (v0-2 one member id, v3+ a batch, KIP-345).

Runs in frontends; the group coordinator removes the members and starts a rebalance. Needs Read
on the group (else GROUP_AUTHORIZATION_FAILED and no members).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import LeaveGroupRequest, LeaveMember
from appliance.protocol.messages import build


@handles(13, "LeaveGroup", 0, 5)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed, members=())
    if ctx.version < 3:
        members = [LeaveMember(req.member_id)]
    else:
        members = [LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None))
                   for m in req.members]
    r = await ctx.broker.call_coordinator(LeaveGroupRequest(req.group_id, members))
    # v0-2 carry one error: the request's, else the single member's own
    err = r.legacy_error if ctx.version < 3 else r.error
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                    error_code=m.error) for m in r.members))
