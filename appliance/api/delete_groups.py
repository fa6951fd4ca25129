"""DeleteGroups (key 42), versions 0-2: delete empty groups and their offsets.

Runs in frontends; the group coordinator refuses a group with members (NON_EMPTY_GROUP) and one
it does not know (GROUP_ID_NOT_FOUND), and writes tombstones for the rest. Needs Delete on each
group (else GROUP_AUTHORIZATION_FAILED for it, Kafka's KafkaApis.handleDeleteGroupsRequest).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import DeleteGroupsRequest
from appliance.protocol.messages import build


@handles(42, "DeleteGroups", 0, 2)
async def handle(ctx, req):
    names = list(dict.fromkeys(req.groups_names))
    allowed = [g for g in names if ctx.authorize(AclOperation.DELETE, ResourceType.GROUP, g)]
    results = []
    if allowed:
        r = await ctx.broker.call_coordinator(DeleteGroupsRequest(allowed))
        results = [dict(group_id=e.group_id, error_code=e.error) for e in r.results]
    results += [dict(group_id=g, error_code=ErrorCode.group_authorization_failed)
                for g in names if g not in set(allowed)]
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), results=tuple(results))
