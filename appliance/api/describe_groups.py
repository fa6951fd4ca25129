"""DescribeGroups (key 15), versions 0-5: state, protocol and members of groups.

Runs in frontends; the group coordinator answers. An unknown group is described as Dead with no
members and no error, as Kafka does. Authorized operations (v3+) are not computed: there is no
authorizer, so the field carries Kafka's "not requested" value.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build

NOT_REQUESTED = -2147483648


@handles(15, "DescribeGroups", 0, 5)
async def handle(ctx, req):
    ids = list(req.groups)
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.DescribeGroupsReq(rid, ids))
        groups = r.groups
    except TimeoutError:
        groups = [ipc.DescribedGroup(int(ErrorCode.coordinator_not_available), g) for g in ids]
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(
        dict(error_code=ErrorCode(g.error_code), group_id=g.group_id, group_state=g.state,
             protocol_type=g.protocol_type, protocol_data=g.protocol,
             authorized_operations=NOT_REQUESTED,
             members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                client_id=m.client_id, client_host=m.client_host,
                                member_metadata=m.metadata, member_assignment=m.assignment)
                           for m in g.members))
        for g in groups))
