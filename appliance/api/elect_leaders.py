"""ElectLeaders (key 43), versions 0-2: answered as Kafka's controller answers on a single node.

Runs in frontends, from the catalog. Every partition has its only replica, this node, as leader,
which is both its preferred leader and a live one: a preferred or an unclean election is never
needed, so each named partition gets ELECTION_NOT_NEEDED (an unknown one
UNKNOWN_TOPIC_OR_PARTITION), and a request for every partition (null) answers an empty list per
topic, since Kafka leaves out the partitions that already have the leader asked for.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build

PREFERRED, UNCLEAN = 0, 1


@handles(43, "ElectLeaders", 0, 2)
def handle(ctx, req):
    catalog = ctx.broker.catalog
    election = getattr(req, "election_type", PREFERRED)
    if election not in (PREFERRED, UNCLEAN):
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.invalid_request, replica_election_results=())
    if not ctx.authorize_cluster(AclOperation.ALTER):
        # Kafka's KafkaApis: Alter on the Cluster, else every partition asked is refused.
        denied = ErrorCode.cluster_authorization_failed
        results = tuple(dict(topic=t.topic, partition_result=tuple(
            dict(partition_id=p, error_code=denied, error_message=None) for p in t.partitions))
            for t in req.topic_partitions or ())
        return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=denied,
                     replica_election_results=results)
    results = []
    if req.topic_partitions is None:
        results = [dict(topic=name, partition_result=()) for name in sorted(catalog.topics)]
    else:
        for t in req.topic_partitions:
            info = catalog.topics.get(t.topic)
            parts = []
            for p in t.partitions:
                if info is None:
                    err, msg = ErrorCode.unknown_topic_or_partition, f"No such topic as {t.topic}"
                elif not 0 <= p < info.partitions:
                    err, msg = ErrorCode.unknown_topic_or_partition, f"No such partition as {t.topic}-{p}"
                else:
                    err, msg = ErrorCode.election_not_needed, None
                parts.append(dict(partition_id=p, error_code=err, error_message=msg))
            results.append(dict(topic=t.topic, partition_result=tuple(parts)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 replica_election_results=tuple(results))
