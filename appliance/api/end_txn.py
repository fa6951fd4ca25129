"""EndTxn (key 26), versions 0-5: commit or abort the producer's transaction.

Runs in frontends; the coordinator logs PrepareCommit/PrepareAbort, answers, then drives the
markers. From v5 (transaction version 2, KIP-890) the answer carries the producer id and epoch the
producer must use next (the epoch is bumped by every commit or abort).
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(26, "EndTxn", 0, 5)
async def handle(ctx, req):
    pid, epoch = -1, -1
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.EndTxnReq(
            rid, req.transactional_id, req.producer_id, req.producer_epoch, req.committed, ctx.version))
        err, pid, epoch = ErrorCode(r.error_code), r.producer_id, r.producer_epoch
    except TimeoutError:
        err = ErrorCode.coordinator_not_available
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 producer_id=pid, producer_epoch=epoch)
