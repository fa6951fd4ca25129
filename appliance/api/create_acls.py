"""CreateAcls (key 30), versions 1-3: add ACLs.

Runs in frontends; the supervisor owns the ACLs (``appliance.acl.store``): it checks each ACL
(Kafka's rules: a LITERAL or PREFIXED pattern, a known operation and permission, a non-empty
name, ``kafka-cluster`` as the only Cluster name: else INVALID_REQUEST for that ACL), commits
the valid ones, publishes them to every frontend and only then answers. Needs Alter on the
Cluster (else every ACL gets CLUSTER_AUTHORIZATION_FAILED, Kafka's AclApis); with the authorizer
off, SECURITY_DISABLED. An UNKNOWN code does not parse in Kafka: the connection is closed.
More than 10,000 ACLs in one request are refused whole (Kafka's controller limit); the rest go
to the supervisor in chunks of ``CREATE_CHUNK``, each its own commit.
"""

from __future__ import annotations

import datetime

from appliance.acl.messages import AclCreateResult, CreateAclsRequest
from appliance.acl.store import CREATE_CHUNK, MAX_ACLS_PER_OPERATION
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
    if n > MAX_ACLS_PER_OPERATION:
        return _response(ctx, [AclCreateResult(
            int(ErrorCode.unknown_server_error),
            f"Cannot create more than {MAX_ACLS_PER_OPERATION} acls in a single operation")] * n)
    acls = [AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                       c.host, c.operation, c.permission_type) for c in req.creations]
    budget = ctx.broker.supervisor.ring.max_payload // 2
    too_big = {i for i, a in enumerate(acls) if _size(a) > budget}
    results: list[AclCreateResult] = []
    for chunk in _chunks([a for i, a in enumerate(acls) if i not in too_big], budget):
        request = CreateAclsRequest(chunk)
        r = await ctx.broker.call_supervisor(
            request, ctx.broker.cfg.server.internal_request_timeout_ms / 1000)
        results += r.results
    if too_big:
        # Ours: an ACL that would not fit the ring to the supervisor (names of tens of KiB with a small ring).
        it = iter(results)
        results = [AclCreateResult(int(ErrorCode.invalid_request), "ACL too large")
                   if i in too_big else next(it) for i in range(n)]
    return _response(ctx, results)


def _size(acl: AclBinding) -> int:
    """About the ACL's encoded size (its strings' UTF-8 bytes plus the small fields)."""
    return (len(acl.resource_name.encode()) + len(acl.principal.encode())
            + len(acl.host.encode()) + 16)


def _chunks(acls: list[AclBinding], budget: int):
    """At most CREATE_CHUNK ACLs and about ``budget`` encoded bytes each."""
    chunk: list[AclBinding] = []
    size = 0
    for acl in acls:
        n = _size(acl)
        if chunk and (len(chunk) == CREATE_CHUNK or size + n > budget):
            yield chunk
            chunk, size = [], 0
        chunk.append(acl)
        size += n
    if chunk:
        yield chunk
