"""What AlterConfigs (33) and IncrementalAlterConfigs (44) share: hand the changes to the
supervisor (it owns the catalog: topic overrides and dynamic broker configs), build the answer.

Runs in frontends. Broker-logger resources (KIP-412 log levels) are refused as an unknown
resource type: the appliance's log levels are not set over the protocol.

Authorization (Kafka's KafkaApis): AlterConfigs on the topic (else TOPIC_AUTHORIZATION_FAILED), on
the group for a GROUP resource (KIP-848 group configs; else GROUP_AUTHORIZATION_FAILED) or, for
broker and CLIENT_METRICS resources (KIP-714 subscriptions), on the Cluster (else
CLUSTER_AUTHORIZATION_FAILED); a refused resource is
never sent to the supervisor, the others are applied as usual.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.catalog.messages import RESOURCE_GROUP, RESOURCE_TOPIC, AlterConfigsRequest, ConfigChange
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def refusal(ctx, resource_type: int, name: str) -> ErrorCode | None:
    """The authorization error of changing this resource's configs, or None."""
    if resource_type == RESOURCE_TOPIC:
        if not ctx.authorize(AclOperation.ALTER_CONFIGS, ResourceType.TOPIC, name):
            return ErrorCode.topic_authorization_failed
    elif resource_type == RESOURCE_GROUP:
        if not ctx.authorize(AclOperation.ALTER_CONFIGS, ResourceType.GROUP, name):
            return ErrorCode.group_authorization_failed
    elif not ctx.authorize_cluster(AclOperation.ALTER_CONFIGS):
        return ErrorCode.cluster_authorization_failed
    return None


async def alter(ctx, req, incremental: bool):
    refused = [refusal(ctx, int(r.resource_type), r.resource_name) for r in req.resources]
    changes = []
    for r, denied in zip(req.resources, refused):
        if denied is None:
            ops = [(c.config_operation if incremental else 0, c.name, c.value) for c in r.configs]
            changes.append(ConfigChange(int(r.resource_type), r.resource_name, ops))
    results = []
    if changes:
        resp = await ctx.broker.call_supervisor(
            AlterConfigsRequest(changes, incremental, req.validate_only), 30.0)
        results = resp.results
    applied = iter(results)
    out = []
    for r, denied in zip(req.resources, refused):
        if denied is not None:
            out.append(dict(error_code=denied, error_message=None,
                            resource_type=r.resource_type, resource_name=r.resource_name))
            continue
        res = next(applied)
        out.append(dict(error_code=ErrorCode(res.error_code), error_message=res.error_message,
                        resource_type=r.resource_type, resource_name=r.resource_name))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), responses=tuple(out))
