"""AlterClientQuotas (key 49), versions 0-1: set or remove quota values of quota entities.

Runs in frontends; the supervisor owns the quota store and applies the request
(``AlterClientQuotasRequest``, ``appliance.quota.supervisor``) with the checks of Kafka's
controller (ClientQuotaControlManager: INVALID_REQUEST for an unknown entity type or key, a bad
combination, a value that is not positive or not whole where the key is an integer, with
Kafka's messages), then publishes the new quotas before it answers, so that every frontend holds
the clients to them from the next request. ``validate_only`` checks and answers, changing
nothing. Authorization: AlterConfigs on the Cluster, else every entry CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.quota.messages import AlterClientQuotasRequest, QuotaEntry, QuotaOp


@handles(49, "AlterClientQuotas", 0, 1)
async def handle(ctx, req):
    m = ctx.response_module()
    if not ctx.authorize_cluster(AclOperation.ALTER_CONFIGS):
        return _response(m, req, [(int(ErrorCode.cluster_authorization_failed),
                                   "Cluster authorization failed.")] * len(req.entries))
    request = AlterClientQuotasRequest(
        entries=[QuotaEntry([(e.entity_type, e.entity_name) for e in entry.entity],
                            [QuotaOp(o.key, float(o.value), bool(o.remove)) for o in entry.ops])
                 for entry in req.entries],
        validate_only=bool(req.validate_only))
    r = await ctx.broker.call_supervisor(
        request, ctx.broker.cfg.server.internal_request_timeout_ms / 1000)
    return _response(m, req, [(x.error_code, x.error_message) for x in r.results])


def _response(m, req, results):
    return build(m.AlterClientQuotasResponse, throttle_time=datetime.timedelta(0), entries=tuple(
        dict(error_code=code, error_message=msg,
             entity=tuple(dict(entity_type=e.entity_type, entity_name=e.entity_name)
                          for e in entry.entity))
        for entry, (code, msg) in zip(req.entries, results)))
