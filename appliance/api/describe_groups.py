"""DescribeGroups (key 15), versions 0-6: state, protocol and members of groups.

Runs in frontends; the group coordinator answers. As Kafka's GroupMetadataManager.describeGroups,
which looks only for a classic group: an unknown group, or one of another type (a KIP-848
consumer group, described by ConsumerGroupDescribe), is described as Dead with no members; below
v6 with no error, from v6 (KIP-1043) with GROUP_ID_NOT_FOUND and the message "Group X not found."
or "Group X is not a classic group.". Needs Describe on each group (else GROUP_AUTHORIZATION_FAILED
with empty state, protocol and members; the coordinator is not asked for it). Authorized
operations (v3+) are filled in for the groups answered without error when asked for, else
Kafka's "not requested" value.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import DescribeGroupsRequest
from appliance.protocol.messages import build

NOT_REQUESTED = -2147483648


@handles(15, "DescribeGroups", 0, 6)
async def handle(ctx, req):
    allowed = [g for g in req.groups if ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, g)]
    described = {}
    if allowed:
        r = await ctx.broker.call_coordinator(DescribeGroupsRequest(allowed))
        described = {g.group_id: g for g in r.groups}
    with_ops = ctx.version >= 3 and req.include_authorized_operations
    out = []
    for group_id in req.groups:
        g = described.get(group_id)
        if g is None:
            out.append(dict(error_code=ErrorCode.group_authorization_failed, group_id=group_id,
                            group_state="", protocol_type="", protocol_data="",
                            authorized_operations=NOT_REQUESTED, members=()))
            continue
        not_found = _not_found(g)
        if not_found is not None:
            v6 = ctx.version >= 6
            out.append(dict(error_code=ErrorCode.group_id_not_found if v6 else ErrorCode.none,
                            error_message=not_found if v6 else None, group_id=group_id,
                            group_state="Dead", protocol_type="", protocol_data="",
                            authorized_operations=NOT_REQUESTED, members=()))
            continue
        ops = NOT_REQUESTED
        if with_ops and g.error == ErrorCode.none:
            ops = ctx.authorized_operations(ResourceType.GROUP, group_id)
        out.append(dict(
            error_code=g.error, group_id=g.group_id, group_state=g.group_state,
            protocol_type=g.protocol_type, protocol_data=g.protocol_data,
            authorized_operations=ops,
            members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                               client_id=m.client_id, client_host=m.client_host,
                               member_metadata=m.member_metadata,
                               member_assignment=m.member_assignment)
                          for m in g.members)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), groups=tuple(out))


def _not_found(g) -> str | None:
    """Kafka's GroupIdNotFoundException message when ``g`` is no classic group, else None: the
    coordinator answers an unknown group as Dead with nothing in it (a classic group that died
    is gone from its table), a consumer group with GROUP_ID_NOT_FOUND."""
    if g.error == ErrorCode.group_id_not_found:
        return f"Group {g.group_id} is not a classic group."
    if (g.error == ErrorCode.none and g.group_state == "Dead" and not g.members
            and not g.protocol_type):
        return f"Group {g.group_id} not found."
    return None
