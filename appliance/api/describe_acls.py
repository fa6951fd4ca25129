"""DescribeAcls (key 29), versions 1-3: the ACLs a filter matches.

Runs in frontends, answered from the snapshot of the ACLs the frontend already holds (the
supervisor publishes it; ``appliance.acl.store``), as a Kafka broker answers from its
authorizer's cache. Needs Describe on the Cluster (else CLUSTER_AUTHORIZATION_FAILED, Kafka's
AclApis); with the authorizer off, SECURITY_DISABLED. A filter with an UNKNOWN element does not
parse in Kafka: the connection is closed. ACLs come back grouped by resource pattern.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclFilter, AclOperation, unknown_elements
from appliance.api import CloseConnection, handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def filter_of(f) -> AclFilter:
    """A request's filter (DescribeAcls' fields, or one DeleteAcls filter) as an AclFilter."""
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                     f.principal_filter, f.host_filter, f.operation, f.permission_type)


@handles(29, "DescribeAcls", 1, 3)
def handle(ctx, req):
    if unknown_elements(req.resource_type_filter, req.pattern_type_filter, req.operation,
                        req.permission_type):
        return CloseConnection("DescribeAcls with UNKNOWN elements")
    m = ctx.response_class()
    if not ctx.authorize_cluster(AclOperation.DESCRIBE):
        return build(m, throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.cluster_authorization_failed,
                     error_message="Request DescribeAcls is not authorized.", resources=())
    authorizer = ctx.broker.authorizer
    if not authorizer.enabled:
        return build(m, throttle_time=datetime.timedelta(0), error_code=ErrorCode.security_disabled,
                     error_message="No Authorizer is configured on the broker", resources=())
    by_pattern: dict[tuple[int, str, int], list] = {}
    for acl in authorizer.snapshot().matching(filter_of(req)):
        by_pattern.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            dict(principal=acl.principal, host=acl.host, operation=acl.operation,
                 permission_type=acl.permission_type))
    return build(m, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 error_message=None, resources=tuple(
                     dict(resource_type=t, resource_name=n, pattern_type=p, acls=tuple(acls))
                     for (t, n, p), acls in by_pattern.items()))
