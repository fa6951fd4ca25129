"""AddOffsetsToTxn (key 25), versions 0-4: put the group's offsets partition into the transaction.

Runs in frontends; the coordinator adds ``__consumer_offsets[partitionFor(group)]`` to the
transaction (starting one if none is open, as Kafka does: clients may send offsets first).
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.protocol.messages import build
from appliance.txn.messages import AddOffsetsToTxnRequest


@handles(25, "AddOffsetsToTxn", 0, 4)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(AddOffsetsToTxnRequest(
        req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, ctx.version))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=r.error)
