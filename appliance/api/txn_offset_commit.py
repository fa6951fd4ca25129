"""TxnOffsetCommit (key 28), versions 0-5: offsets committed inside a transaction (KIP-98, KIP-447).

Runs in frontends; the coordinator worker checks the producer against the transaction (its id and
epoch current, the group's offsets partition added by AddOffsetsToTxn: KIP-890 part 1), from v3 the
group generation, member and instance (KIP-447 zombie fencing), and stores the offsets as pending
until the transaction's marker. v0-2 (aiokafka) carry no group metadata: no group checks. v5
(KIP-890 part 2, transaction version 2) adds the offsets partition to the transaction itself,
where older clients sent AddOffsetsToTxn first.

Authorization (Kafka's KafkaApis.handleTxnOffsetCommitRequest): Write on the transactional id
(else every partition gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED), Read on the group (else
GROUP_AUTHORIZATION_FAILED), Read on each topic (``_offsets``).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import _offsets, handles
from appliance.errors import ErrorCode
from appliance.group.messages import TxnOffsetCommitRequest
from appliance.protocol.messages import build


@handles(28, "TxnOffsetCommit", 0, 5)
async def handle(ctx, req):
    denied = None
    if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        denied = ErrorCode.transactional_id_authorization_failed
    elif not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        denied = ErrorCode.group_authorization_failed
    if denied is not None:
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     topics=_offsets.all_failed(req.topics, denied))
    send, local = _offsets.entries(ctx, req.topics)
    results = list(local)
    if send:
        r = await ctx.broker.call_coordinator(TxnOffsetCommitRequest(
            req.transactional_id, req.group_id, req.producer_id, req.producer_epoch,
            getattr(req, "generation_id", -1), getattr(req, "member_id", ""),
            getattr(req, "group_instance_id", None), send, ctx.version))
        results += _offsets.committed(send, r)
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 topics=_offsets.topics_out(results))
