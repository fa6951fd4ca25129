"""GetTelemetrySubscriptions (key 71), version 0: KIP-714's subscription handed to a client.

Runs in frontends; the state is the frontend's ``ClientTelemetry`` (``appliance.metrics.
client_telemetry``: the subscription of ``[telemetry]``, Kafka's deterministic subscription id,
the "too early" rule). Served together with PushTelemetry (72), never one without the other:
a client that gets a subscription pushes.
"""

from __future__ import annotations

import datetime
import time

from appliance.api import handles
from appliance.metrics.client_telemetry import ClientMeta
from appliance.protocol.messages import build


def client_meta(ctx) -> ClientMeta:
    conn = ctx.connection
    name, version = getattr(conn, "software", ("", ""))
    port = conn.peer.rpartition(":")[2] if isinstance(getattr(conn, "peer", None), str) else ""
    return ClientMeta(ctx.header.client_id or "", name, version, ctx.principal, ctx.client_host,
                      port)


def _ms(v: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=v)


@handles(71, "GetTelemetrySubscriptions", 0, 0)
def handle(ctx, req):
    f = ctx.broker.telemetry.get_subscriptions(req.client_instance_id, client_meta(ctx),
                                               int(time.time() * 1000))
    f["push_interval"] = _ms(f["push_interval"])
    return build(ctx.response_module().GetTelemetrySubscriptionsResponse,
                 throttle_time=datetime.timedelta(0), **f)
