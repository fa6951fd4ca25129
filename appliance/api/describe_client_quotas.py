"""DescribeClientQuotas (key 48), versions 0-1: the quota entities a filter matches, with their
quota values.

Runs in frontends, from the client quotas the supervisor publishes (``QuotasView``; no round
trip), as a Kafka broker answers from its metadata image (ClientQuotasImage.describe, with its
errors: INVALID_REQUEST for a bad filter, UNSUPPORTED_VERSION for an entity type it does not
know, in the response's error code with no entries). Authorization: DescribeConfigs on the
Cluster, else CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.quota import model


@handles(48, "DescribeClientQuotas", 0, 1)
def handle(ctx, req):
    m = ctx.response_module()
    if not ctx.authorize_cluster(AclOperation.DESCRIBE_CONFIGS):
        return _error(m, ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    quotas = ctx.broker.client_quotas.current()
    try:
        found = model.describe(quotas, [(c.entity_type, int(c.match_type), c.match)
                                        for c in req.components], bool(req.strict))
    except model.QuotaError as e:
        return _error(m, e.code, e.message)
    return build(m.DescribeClientQuotasResponse, throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, error_message=None, entries=tuple(
                     dict(entity=tuple(dict(entity_type=t, entity_name=n) for t, n in entity),
                          values=tuple(dict(key=k, value=v) for k, v in sorted(values.items())))
                     for entity, values in found))


def _error(m, code, message):
    return build(m.DescribeClientQuotasResponse, throttle_time=datetime.timedelta(0),
                 error_code=code, error_message=message, entries=None)

