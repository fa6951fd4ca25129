"""DescribeGroups (key 15), versions 0-5: state, protocol and members of groups.

Runs in frontends; the group coordinator answers. An unknown group is described as Dead with no
members and no error, as Kafka does. Authorized operations (v3+) are not computed: there is no
authorizer, so the field carries Kafka's "not requested" value.
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.group.messages import DescribeGroupsRequest
from appliance.protocol.messages import build

NOT_REQUESTED = -2147483648


@handles(15, "DescribeGroups", 0, 5)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(DescribeGroupsRequest(list(req.groups)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(
        dict(error_code=g.error, group_id=g.group_id, group_state=g.group_state,
             protocol_type=g.protocol_type, protocol_data=g.protocol_data,
             authorized_operations=NOT_REQUESTED,
             members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                client_id=m.client_id, client_host=m.client_host,
                                member_metadata=m.member_metadata,
                                member_assignment=m.member_assignment)
                           for m in g.members))
        for g in r.groups))
