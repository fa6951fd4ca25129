"""CreateAcls (key 30), versions 1-3: add ACLs.

Runs in frontends; the supervisor owns the ACLs (``appliance.acl.store``): it checks each ACL
(Kafka's rules: a LITERAL or PREFIXED pattern, a known operation and permission, a non-empty
name, ``kafka-cluster`` as the only Cluster name: else INVALID_REQUEST for that ACL), commits
the valid ones, publishes them to every frontend and only then answers. Needs Alter on the
Cluster (else every ACL gets CLUSTER_AUTHORIZATION_FAILED, Kafka's AclApis); with the authorizer
off, SECURITY_DISABLED. An UNKNOWN code does not parse in Kafka: the connection is closed.
"""

from __future__ import annotations

import datetime

from appliance.acl.messages import AclCreateResult, CreateAclsRequest
from appliance.acl.model import AclBinding, AclOperation, unknown_elements
from appliance.api import CloseConnection, handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def _response(ctx, results: list[AclCreateResult]):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), results=tuple(
        dict(error_code=ErrorCode(r.error_code), error_message=r.error_message) for r in results))


@handles(30, "CreateAcls", 1, 3)
async def handle(ctx, req):
    if any(unknown_elements(c.resource_type, c.resource_pattern_type, c.operation, c.permission_type)
           for c in req.creations):
        return CloseConnection("CreateAcls with UNKNOWN elements")
    n = len(req.creations)
    if not ctx.authorize_cluster(AclOperation.ALTER):
        return _response(ctx, [AclCreateResult(int(ErrorCode.cluster_authorization_failed),
                                               "Request CreateAcls is not authorized.")] * n)
    if not ctx.broker.authorizer.enabled:
        return _response(ctx, [AclCreateResult(int(ErrorCode.security_disabled),
                                               "No Authorizer is configured.")] * n)
    if not n:
        return _response(ctx, [])
    acls = [AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                       c.host, c.operation, c.permission_type) for c in req.creations]
    request = CreateAclsRequest(acls)
    try:
        r = await ctx.broker.call_supervisor(
            request, ctx.broker.cfg.server.internal_request_timeout_ms / 1000)
    except TimeoutError:
        r = request.error_reply(ErrorCode.request_timed_out)
    return _response(ctx, r.results)
