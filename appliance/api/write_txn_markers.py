"""WriteTxnMarkers (key 27), versions 1-2: write COMMIT/ABORT markers straight to partitions.

Runs in frontends. Kafka's coordinator sends this to partition leaders; on a single node the
coordinator hands markers to writers through its rings, so this API serves the admin path
(`kafka-transactions.sh abort`, Admin.abortTransaction) for hanging transactions: each listed
partition's writer checks the marker (producer epoch, coordinator epoch) and appends it.

Authorization (Kafka's KafkaApis.handleWriteTxnMarkersRequest): Alter on the Cluster (KIP-664:
what an administrator's abort needs) or else ClusterAction on it (what brokers have); without
either, every partition of every marker gets CLUSTER_AUTHORIZATION_FAILED.

A marker whose coordinator epoch is above the coordinator's current one is refused with
INVALID_REQUEST before any writer sees it (ours; Kafka has no such check, it relies on
ClusterAction, which with the authorizer off nobody needs). In Kafka a higher coordinator epoch means a newer coordinator (KIP-98: markers
fence zombie coordinators); on one node the current epoch is known (bumped at every coordinator
start and published on the coordinator's state page), so a higher one can only be forged. Stored by the writer, it would
fence the real coordinator for that producer: each restart adds one to its epoch and is fenced
again, a crash loop that stops the appliance. The admin path sends the epoch it read from
DescribeProducers, which is never above the current one.
"""

from __future__ import annotations

import asyncio

from appliance import ipc
from appliance.acl.model import AclOperation
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


@handles(27, "WriteTxnMarkers", 1, 2)
async def handle(ctx, req):
    broker = ctx.broker
    if not ctx.authorize_cluster(AclOperation.ALTER) and \
            not ctx.authorize_cluster(AclOperation.CLUSTER_ACTION):
        denied = ErrorCode.cluster_authorization_failed
        return build(ctx.response_class(), markers=tuple(
            dict(producer_id=mk.producer_id, topics=tuple(
                dict(name=t.name, partitions=tuple(dict(partition_index=p, error_code=denied)
                                                   for p in t.partition_indexes))
                for t in mk.topics)) for mk in req.markers))
    catalog = broker.catalog
    markers = []
    current_epoch = broker.coordinator_epoch()
    for mk in req.markers:
        calls, keys = [], []
        forged = mk.coordinator_epoch > current_epoch
        for t in mk.topics:
            info = catalog.topics.get(t.name)
            for p in t.partition_indexes:
                keys.append((t.name, p))
                if forged or info is None or not 0 <= p < info.partitions:
                    calls.append(None)
                else:
                    calls.append(broker.call_writer(info, p, ipc.WriteMarkerRequest(
                        mk.producer_id, mk.producer_epoch, mk.transaction_result, mk.coordinator_epoch)))
        answers = await asyncio.gather(*[c for c in calls if c is not None], return_exceptions=True)
        it = iter(answers)
        errors = {}
        for key, c in zip(keys, calls):
            if c is None:
                errors[key] = ErrorCode.invalid_request if forged else ErrorCode.unknown_topic_or_partition
                continue
            a = next(it)
            if a is None:
                errors[key] = ErrorCode.unknown_topic_or_partition
            elif isinstance(a, BaseException):
                errors[key] = ErrorCode.not_leader_or_follower
            else:
                errors[key] = a.error
        markers.append(dict(producer_id=mk.producer_id, topics=tuple(
            dict(name=t.name, partitions=tuple(dict(partition_index=p, error_code=errors[(t.name, p)])
                                               for p in t.partition_indexes)) for t in mk.topics)))
    return build(ctx.response_class(), markers=tuple(markers))
