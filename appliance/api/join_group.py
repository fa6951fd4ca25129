"""JoinGroup (key 11), versions 0-9: join a classic consumer group (or start a rebalance).

Runs in frontends; the group coordinator in the coordinator worker answers once the rebalance
completes (every known member rejoined, or the rebalance timeout passed), so the call waits up to
the rebalance timeout plus a margin, as Kafka's clients do (v0 has no rebalance timeout: the
session timeout stands in for it). v4+ with an empty member id gets MEMBER_ID_REQUIRED and a member
id to rejoin with (KIP-394). Needs Read on the group (else GROUP_AUTHORIZATION_FAILED, Kafka's
KafkaApis.handleJoinGroupRequest).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import JoinGroupRequest
from appliance.protocol.messages import build

MARGIN_S = 5.0


def _ms(td) -> int:
    return int(td.total_seconds() * 1000) if isinstance(td, datetime.timedelta) else int(td)


@handles(11, "JoinGroup", 0, 9)
async def handle(ctx, req):
    session_ms = _ms(req.session_timeout)
    rebalance_ms = _ms(getattr(req, "rebalance_timeout", session_ms))
    if ctx.version == 0:
        rebalance_ms = session_ms
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        # JoinGroupRequest.getErrorResponse: no generation, member or leader; no protocol name
        # (null from v7, "" before).
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed, generation_id=-1,
                     protocol_type=None, protocol_name=None if ctx.version >= 7 else "",
                     leader="", skip_assignment=False, member_id="", members=())
    host = ctx.connection.peer.rsplit(":", 1)[0]
    r = await ctx.broker.call_coordinator(JoinGroupRequest(
        req.group_id, req.member_id, session_ms, rebalance_ms, req.protocol_type,
        [(p.name, bytes(p.metadata)) for p in req.protocols], getattr(req, "group_instance_id", None),
        ctx.header.client_id or "", "/" + host, ctx.version, getattr(req, "reason", None)),
        max(rebalance_ms / 1000, 1.0) + MARGIN_S)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=r.error, generation_id=r.generation_id,
                 protocol_type=r.protocol_type, protocol_name=r.protocol_name or "",
                 leader=r.leader, skip_assignment=r.skip_assignment, member_id=r.member_id,
                 members=tuple(dict(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                    metadata=m.metadata) for m in r.members))
