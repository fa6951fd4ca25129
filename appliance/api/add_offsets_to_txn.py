"""AddOffsetsToTxn (key 25), versions 0-4: put the group's offsets partition into the transaction.

Runs in frontends; the coordinator adds ``__consumer_offsets[partitionFor(group)]`` to the
transaction (starting one if none is open, as Kafka does: clients may send offsets first).
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(25, "AddOffsetsToTxn", 0, 4)
async def handle(ctx, req):
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.AddOffsetsToTxnReq(
            rid, req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, ctx.version))
        err = ErrorCode(r.error_code)
    except TimeoutError:
        err = ErrorCode.coordinator_not_available
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err)
