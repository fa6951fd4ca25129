"""AlterPartitionReassignments (key 45), versions 0-1: answered as Kafka's controller answers on a
single node.

Runs in frontends, from the catalog. The only replica set a partition can have is this node: a
reassignment to exactly that completes at once (there is nothing to move), one naming any other
broker is INVALID_REPLICA_ASSIGNMENT (no such broker is registered), and cancelling (null
replicas) is NO_REASSIGNMENT_IN_PROGRESS, since none ever is. v1 (KIP-860) carries
AllowReplicationFactorChange: when false, a target whose size differs from the partition's one
replica is INVALID_REPLICATION_FACTOR, before the brokers are looked at; the answer echoes it.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def _check(node: int, info, topic: str, p, allow_rf_change: bool = True) -> tuple[ErrorCode, str | None]:
    if info is None or not 0 <= p.partition_index < info.partitions:
        return ErrorCode.unknown_topic_or_partition, None
    if p.replicas is None:
        return ErrorCode.no_reassignment_in_progress, None
    replicas = list(p.replicas)
    if not allow_rf_change and len(replicas) != 1:
        return (ErrorCode.invalid_replication_factor,
                f"The replication factor is changed from 1 to {len(replicas)}")
    if not replicas:
        return ErrorCode.invalid_replica_assignment, "The manual partition assignment includes an empty replica list."
    if len(set(replicas)) != len(replicas):
        return (ErrorCode.invalid_replica_assignment,
                f"The manual partition assignment includes the broker {replicas[0]} more than once.")
    for b in replicas:
        if b != node:
            return (ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes broker {b}, but no such broker is registered.")
    return ErrorCode.none, None


@handles(45, "AlterPartitionReassignments", 0, 1)
def handle(ctx, req):
    catalog = ctx.broker.catalog
    node = ctx.broker.node_id
    if not ctx.authorize_cluster(AclOperation.ALTER):
        # Kafka's controller: Alter on the Cluster, else the request's error response.
        denied = ErrorCode.cluster_authorization_failed
        out = tuple(dict(name=t.name, partitions=tuple(
            dict(partition_index=p.partition_index, error_code=denied, error_message=None)
            for p in t.partitions)) for t in req.topics)
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=denied,
                     error_message=None, responses=out,
                     allow_replication_factor_change=getattr(req, "allow_replication_factor_change", True))
    allow = getattr(req, "allow_replication_factor_change", True)
    out = []
    for t in req.topics:
        info = catalog.topics.get(t.name)
        parts = []
        for p in t.partitions:
            err, msg = _check(node, info, t.name, p, allow)
            parts.append(dict(partition_index=p.partition_index, error_code=err, error_message=msg))
        out.append(dict(name=t.name, partitions=tuple(parts)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 error_message=None, responses=tuple(out), allow_replication_factor_change=allow)
