"""ListGroups (key 16), versions 0-5: the groups this coordinator knows, filtered by state (v4+,
KIP-518) and type (v5+, KIP-848: only "classic" groups exist here).

Runs in frontends; the group coordinator answers. With Describe on the Cluster every group is
listed, else only those the principal may Describe (Kafka's KafkaApis.handleListGroupsRequest).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.group.messages import ListGroupsRequest
from appliance.protocol.messages import build


@handles(16, "ListGroups", 0, 5)
async def handle(ctx, req):
    states = list(getattr(req, "states_filter", ()) or ())
    types = list(getattr(req, "types_filter", ()) or ())
    every = ctx.authorize_cluster(AclOperation.DESCRIBE)
    r = await ctx.broker.call_coordinator(ListGroupsRequest(states, types))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=r.error, groups=tuple(
                     dict(group_id=g.group_id, protocol_type=g.protocol_type,
                          group_state=g.group_state, group_type=g.group_type) for g in r.groups
                     if every or ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id)))
