"""DeleteAcls (key 31), versions 1-3: remove the ACLs each filter matches.

Runs in frontends; the supervisor owns the ACLs (``appliance.acl.store``): it removes every ACL
any filter matches in one commit, publishes the rest to every frontend and answers each filter
with the ACLs it matched. Needs Alter on the Cluster (else CLUSTER_AUTHORIZATION_FAILED for
every filter, Kafka's AclApis); with the authorizer off, SECURITY_DISABLED. A filter with an
UNKNOWN element does not parse in Kafka: the connection is closed.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.acl.messages import AclDeleteResult, DeleteAclsRequest
from appliance.acl.model import AclOperation, unknown_elements
from appliance.api import CloseConnection, handles
from appliance.api.describe_acls import filter_of
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def _response(ctx, results: list[AclDeleteResult]):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), filter_results=tuple(
        dict(error_code=ErrorCode(r.error_code), error_message=r.error_message,
             matching_acls=tuple(
                 dict(error_code=ErrorCode.none, error_message=None,
                      resource_type=a.resource_type, resource_name=a.resource_name,
                      pattern_type=a.pattern_type, principal=a.principal, host=a.host,
                      operation=a.operation, permission_type=a.permission_type)
                 for a in r.deleted))
        for r in results))


@handles(31, "DeleteAcls", 1, 3)
async def handle(ctx, req):
    if any(unknown_elements(f.resource_type_filter, f.pattern_type_filter, f.operation,
                            f.permission_type) for f in req.filters):
        return CloseConnection("DeleteAcls with UNKNOWN elements")
    n = len(req.filters)
    if not ctx.authorize_cluster(AclOperation.ALTER):
        return _response(ctx, [AclDeleteResult(int(ErrorCode.cluster_authorization_failed),
                                               "Request DeleteAcls is not authorized.")] * n)
    if not ctx.broker.authorizer.enabled:
        return _response(ctx, [AclDeleteResult(int(ErrorCode.security_disabled),
                                               "No Authorizer is configured.")] * n)
    if not n:
        return _response(ctx, [])
    request = DeleteAclsRequest([filter_of(f) for f in req.filters])
    if len(ipc.encode(0, request)) > ctx.broker.supervisor.ring.max_payload // 2:
        # Ours: filters that would not fit the ring to the supervisor (names of hundreds of KiB).
        return _response(ctx, [AclDeleteResult(int(ErrorCode.invalid_request),
                                               "filters too large")] * n)
    r = await ctx.broker.call_supervisor(
        request, ctx.broker.cfg.server.internal_request_timeout_ms / 1000)
    return _response(ctx, r.results)
