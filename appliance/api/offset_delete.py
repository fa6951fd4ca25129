"""OffsetDelete (key 47), version 0: drop a group's committed offsets for some partitions (KIP-496).

Runs in frontends; the coordinator refuses partitions the group's members are subscribed to
(GROUP_SUBSCRIBED_TO_TOPIC) and groups that do not exist (GROUP_ID_NOT_FOUND).
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import _offsets, handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(47, "OffsetDelete", 0, 0)
async def handle(ctx, req):
    send, local = _offsets.entries(ctx, req.topics, with_offsets=False)
    results = list(local)
    err = ErrorCode.none
    if send:
        try:
            r = await ctx.broker.call_coordinator(lambda rid: ipc.OffsetDeleteReq(rid, req.group_id, send))
            err = ErrorCode(r.error_code)
            results += r.offsets
        except TimeoutError:
            err = ErrorCode.coordinator_not_available
    if err != ErrorCode.none:
        results = []
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 topics=_offsets.topics_out(results))
