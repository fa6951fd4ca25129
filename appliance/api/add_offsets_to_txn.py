"""AddOffsetsToTxn (key 25), versions 0-4: put the group's offsets partition into the transaction.

Runs in frontends; the coordinator adds ``__consumer_offsets[partitionFor(group)]`` to the
transaction (starting one if none is open, as Kafka does: clients may send offsets first).
Needs Write on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and Read on the
group (else GROUP_AUTHORIZATION_FAILED).

TRANSACTION_ABORTABLE (v4+, KIP-890): understood by v4 clients, never written here by Kafka 4.3
(the request adds a partition, it verifies none); ``abortable_for`` keeps it from v0-3.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import AddOffsetsToTxnRequest, abortable_for


@handles(25, "AddOffsetsToTxn", 0, 4)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.transactional_id_authorization_failed)
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.group_authorization_failed)
    r = await ctx.broker.call_coordinator(AddOffsetsToTxnRequest(
        req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, ctx.version))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=abortable_for(25, ctx.version, r.error))
