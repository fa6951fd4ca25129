"""What AlterConfigs (33) and IncrementalAlterConfigs (44) share: hand the changes to the
supervisor (it owns the catalog: topic overrides and dynamic broker configs), build the answer.

Runs in frontends. Broker-logger resources (KIP-412 log levels) are refused as an unknown
resource type: the appliance's log levels are not set over the protocol.
"""

from __future__ import annotations

import datetime

from appliance.catalog import AlterConfigsRequest, ConfigChange
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


async def alter(ctx, req, incremental: bool):
    changes = []
    for r in req.resources:
        ops = [(c.config_operation if incremental else 0, c.name, c.value) for c in r.configs]
        changes.append(ConfigChange(int(r.resource_type), r.resource_name, ops))
    results = []
    if changes:
        resp = await ctx.broker.call_supervisor(
            AlterConfigsRequest(changes, incremental, req.validate_only), 30.0)
        results = resp.results
    out = tuple(dict(error_code=ErrorCode(res.error_code), error_message=res.error_message,
                     resource_type=r.resource_type, resource_name=r.resource_name)
                for r, res in zip(req.resources, results))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), responses=out)
