"""DescribeCluster (key 60), versions 0-2: one broker, which is also the controller.

Runs in frontends. v1 adds the endpoint type (1 = brokers; 2 = controllers, which a single node
answers the same way), v2 the fenced flag (never fenced). ClusterAuthorizedOperations is filled
in when asked for (Kafka's AuthHelper: 0 without Describe on the Cluster), else -2147483648.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import CLUSTER_NAME, AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.messages import build
from appliance.errors import ErrorCode

NO_OPS = -2147483648


@handles(60, "DescribeCluster", 0, 2)
def handle(ctx, req):
    m = ctx.response_module()
    b = ctx.broker
    host, port = ctx.advertised
    endpoint_type = getattr(req, "endpoint_type", 1)
    if endpoint_type not in (1, 2):
        return build(m.DescribeClusterResponse, throttle_time=datetime.timedelta(0),
                    error_code=ErrorCode.unsupported_endpoint_type,
                    error_message=f"Unsupported endpoint type {endpoint_type}",
                    endpoint_type=endpoint_type, cluster_id=b.cluster_id, controller_id=-1,
                    brokers=(), cluster_authorized_operations=NO_OPS)
    ops = NO_OPS
    if req.include_cluster_authorized_operations:
        ops = (ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
               if ctx.authorize_cluster(AclOperation.DESCRIBE) else 0)
    return build(m.DescribeClusterResponse, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                error_message=None, endpoint_type=endpoint_type, cluster_id=b.cluster_id,
                controller_id=b.node_id,
                brokers=(dict(broker_id=b.node_id, host=host, port=port,
                              rack=None, is_fenced=False),),
                cluster_authorized_operations=ops)
