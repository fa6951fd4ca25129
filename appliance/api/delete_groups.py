"""DeleteGroups (key 42), versions 0-2: delete empty groups and their offsets.

Runs in frontends; the group coordinator refuses a group with members (NON_EMPTY_GROUP) and one
it does not know (GROUP_ID_NOT_FOUND), and writes tombstones for the rest.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(42, "DeleteGroups", 0, 2)
async def handle(ctx, req):
    ids = list(req.groups_names)
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.DeleteGroupsReq(rid, ids))
        results = r.results
    except TimeoutError:
        results = [ipc.GroupError(g, int(ErrorCode.coordinator_not_available)) for g in ids]
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), results=tuple(
        dict(group_id=e.group_id, error_code=ErrorCode(e.error_code)) for e in results))
