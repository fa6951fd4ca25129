"""IncrementalAlterConfigs (key 44), versions 0-1: SET, DELETE, APPEND and SUBTRACT single
configs of topics and of the broker.

Runs in frontends; the supervisor validates and applies against the current catalog
(``appliance.supervisor.topic_admin``), with Kafka's errors: INVALID_CONFIG for an unknown topic
config, a bad value, or APPEND/SUBTRACT on a config that is not a list; INVALID_REQUEST for
duplicate keys, a null value, and broker configs that cannot change live.
"""

from __future__ import annotations

from appliance.api import handles
from appliance.api._configs import alter


@handles(44, "IncrementalAlterConfigs", 0, 1)
async def handle(ctx, req):
    return await alter(ctx, req, incremental=True)
