"""ListGroups (key 16), versions 0-5: the groups this coordinator knows, filtered by state (v4+,
KIP-518) and type (v5+, KIP-848: only "classic" groups exist here).

Runs in frontends; the group coordinator answers.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(16, "ListGroups", 0, 5)
async def handle(ctx, req):
    states = list(getattr(req, "states_filter", ()) or ())
    types = list(getattr(req, "types_filter", ()) or ())
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.ListGroupsReq(rid, states, types))
    except TimeoutError:
        r = ipc.ListGroupsResp(0, int(ErrorCode.coordinator_not_available))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode(r.error_code), groups=tuple(
                     dict(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
                          group_type=g.group_type) for g in r.groups))
