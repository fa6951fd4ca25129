"""OffsetDelete (key 47), version 0: drop a group's committed offsets for some partitions (KIP-496).

Runs in frontends; the coordinator refuses partitions the group's members are subscribed to
(GROUP_SUBSCRIBED_TO_TOPIC) and groups that do not exist (GROUP_ID_NOT_FOUND). Needs Delete on
the group (else GROUP_AUTHORIZATION_FAILED for the request) and Read on each topic (``_offsets``).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import _offsets, handles
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetDeleteRequest
from appliance.protocol.messages import build


@handles(47, "OffsetDelete", 0, 0)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.DELETE, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed, topics=())
    send, local = _offsets.entries(ctx, req.topics, with_offsets=False)
    results = list(local)
    err = ErrorCode.none
    if send:
        r = await ctx.broker.call_coordinator(OffsetDeleteRequest(req.group_id, send))
        err = r.error
        results += r.offsets
    if err != ErrorCode.none:
        results = []
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 topics=_offsets.topics_out(results))
