"""InitProducerId (key 22), versions 0-5: a producer id and epoch for an idempotent producer.

Runs in frontends; the coordinator worker allocates (durably, never reusing an id). Without a
transactional id, Kafka hands out a fresh producer id with epoch 0, also to a v3+ client that
names its current id and epoch to have it bumped (KIP-360). Transactional ids are issue 4.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(22, "InitProducerId", 0, 5)
async def handle(ctx, req):
    pid = getattr(req, "producer_id", -1)
    epoch = getattr(req, "producer_epoch", -1)
    timeout_ms = int(req.transaction_timeout.total_seconds() * 1000)
    if (pid == -1) != (epoch == -1):
        # KafkaApis: a producer id without an epoch, or an epoch without an id.
        return _response(ctx, ErrorCode.invalid_request)
    try:
        r = await ctx.broker.call_coordinator(lambda rid: ipc.InitProducerIdReq(
            rid, req.transactional_id, timeout_ms, pid, epoch, ctx.version))
    except TimeoutError:
        return _response(ctx, ErrorCode.coordinator_not_available)
    return _response(ctx, ErrorCode(r.error_code), r.producer_id, r.producer_epoch)


def _response(ctx, error: ErrorCode, producer_id: int = -1, producer_epoch: int = -1):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=error,
                 producer_id=producer_id if error == ErrorCode.none else -1,
                 producer_epoch=producer_epoch if error == ErrorCode.none else -1)
