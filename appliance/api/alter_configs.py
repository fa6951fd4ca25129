"""AlterConfigs (key 33), versions 0-2: replace the whole config set of topics and of the broker.

Runs in frontends; the supervisor validates and applies (``appliance.supervisor.topic_admin``).
Topic configs: Kafka's checks (INVALID_CONFIG for an unknown name or a bad value), persisted in the
catalog, applied live by the writers. Broker resources (this node's id, or empty for the
cluster-wide default) take the dynamic broker configs the writers apply live; the rest are
refused with Kafka's INVALID_REQUEST "Cannot update these configs dynamically".
"""

from __future__ import annotations

from appliance.api import handles
from appliance.api._configs import alter


@handles(33, "AlterConfigs", 0, 2)
async def handle(ctx, req):
    return await alter(ctx, req, incremental=False)
