"""DeleteGroups (key 42), versions 0-2: delete empty groups and their offsets.

Runs in frontends; the group coordinator refuses a group with members (NON_EMPTY_GROUP) and one
it does not know (GROUP_ID_NOT_FOUND), and writes tombstones for the rest.
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.group.messages import DeleteGroupsRequest
from appliance.protocol.messages import build


@handles(42, "DeleteGroups", 0, 2)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(DeleteGroupsRequest(list(req.groups_names)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), results=tuple(
        dict(group_id=e.group_id, error_code=e.error) for e in r.results))
