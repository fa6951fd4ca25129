"""ListPartitionReassignments (key 46), version 0: none, ever (single node: nothing can move).

Runs in frontends; an empty list answers every request, as Kafka's controller lists only the
partitions with a reassignment in progress (unknown ones are left out too).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(46, "ListPartitionReassignments", 0, 0)
def handle(ctx, req):
    if not ctx.authorize_cluster(AclOperation.DESCRIBE):     # Kafka's controller: Describe on the Cluster
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.cluster_authorization_failed, error_message=None, topics=())
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 error_message=None, topics=())
