"""EndTxn (key 26), versions 0-5: commit or abort the producer's transaction.

Runs in frontends; the coordinator logs PrepareCommit/PrepareAbort, answers, then drives the
markers. From v5 (transaction version 2, KIP-890) the answer carries the producer id and epoch the
producer must use next (the epoch is bumped by every commit or abort). Needs Write on the
transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

TRANSACTION_ABORTABLE (v4+, KIP-890): the Java 4.x producer treats it as abortable, but Kafka
4.3's coordinator never answers EndTxn with it (a transaction aborted by its timeout is fenced:
PRODUCER_FENCED, as here); ``abortable_for`` keeps it from v0-3 should a path ever produce it.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import EndTxnRequest, abortable_for


@handles(26, "EndTxn", 0, 5)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.transactional_id_authorization_failed,
                     producer_id=-1, producer_epoch=-1)
    r = await ctx.broker.call_coordinator(EndTxnRequest(
        req.transactional_id, req.producer_id, req.producer_epoch, req.committed, ctx.version))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=abortable_for(26, ctx.version, r.error), producer_id=r.producer_id, producer_epoch=r.producer_epoch)
