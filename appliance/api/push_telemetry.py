"""PushTelemetry (key 72), version 0: a client's metrics (KIP-714), OTLP MetricsData compressed
as the client chose (none, gzip, snappy, lz4, zstd).

Runs in frontends; checked and decoded by the frontend's ``ClientTelemetry`` with Kafka's
errors in Kafka's order (INVALID_REQUEST after a terminating push, THROTTLING_QUOTA_EXCEEDED
before the push interval, UNKNOWN_SUBSCRIPTION_ID, UNSUPPORTED_COMPRESSION_TYPE,
TELEMETRY_TOO_LARGE, INVALID_RECORD for a payload that does not decode); the series go to
``/metrics`` through the frontend's published snapshot.
"""

from __future__ import annotations

import datetime
import time

from appliance.api import handles
from appliance.api.get_telemetry_subscriptions import client_meta
from appliance.protocol.messages import build


@handles(72, "PushTelemetry", 0, 0)
def handle(ctx, req):
    err = ctx.broker.telemetry.push(req.client_instance_id, req.subscription_id, req.terminating,
                                    req.compression_type, bytes(req.metrics), client_meta(ctx),
                                    int(time.time() * 1000))
    return build(ctx.response_module().PushTelemetryResponse,
                 throttle_time=datetime.timedelta(0), error_code=err)
