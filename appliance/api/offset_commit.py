"""OffsetCommit (key 8), versions 2-9: store a group's consumed positions.

Runs in frontends; the group coordinator checks generation and member (a "simple" commit with
generation -1 and no member only to a group without members) and answers once the offsets are in
the group log. The v2-4 retention time is ignored: offsets expire by ``groups.offsets_retention_ms``
(KIP-211, as Kafka since 2.1 does for v5+). Needs Read on the group (else every partition gets
GROUP_AUTHORIZATION_FAILED) and Read on each topic (``_offsets``).

v9 (KIP-848) sends the member epoch in place of the generation: to a consumer group, a member's
commit must carry its current epoch (STALE_MEMBER_EPOCH otherwise, UNKNOWN_MEMBER_ID for a
member the group does not have), and a consumer-protocol member must commit with v9+.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import _offsets, handles
from appliance.errors import ErrorCode
from appliance.group.messages import OffsetCommitRequest
from appliance.protocol.messages import build


@handles(8, "OffsetCommit", 2, 9)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     topics=_offsets.all_failed(req.topics, ErrorCode.group_authorization_failed))
    send, local = _offsets.entries(ctx, req.topics)
    results = list(local)
    if send:
        generation = getattr(req, "generation_id_or_member_epoch", None)
        if generation is None:
            generation = getattr(req, "generation_id", -1)
        r = await ctx.broker.call_coordinator(OffsetCommitRequest(
            req.group_id, generation, req.member_id, getattr(req, "group_instance_id", None),
            send, ctx.version))
        results += _offsets.committed(send, r)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 topics=_offsets.topics_out(results))
