"""OffsetForLeaderEpoch (key 23), versions 2-4: the end offset of a leader epoch (KIP-101,
KIP-320).

Runs in frontends, from the partitions' state pages. This node leads every partition in one
epoch (``LEADER_EPOCH``, 0: what Metadata and ListOffsets answer and what every stored batch
carries), which starts at the beginning of the log, so the answer is Kafka's
LeaderEpochFileCache.endOffsetFor with a single entry: the current epoch ends at the log end
offset; a later epoch is unknown (-1, -1). The consumers that validate their position after a
restart or a metadata change (KIP-320: the Java consumer, librdkafka, kafka-python) ask for the
epoch of their last fetched batch, 0, and keep their position. A current leader epoch other
than ours is fenced (lower) or unknown (higher), as Kafka's leader answers.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.records import LEADER_EPOCH
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.runtime import READY

UNDEFINED = -1


@handles(23, "OffsetForLeaderEpoch", 2, 4)
def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    # Kafka's KafkaApis: a follower (replica id >= 0, v3+) needs ClusterAction on the Cluster, a
    # consumer Describe on each topic.
    follower = getattr(req, "replica_id", -1) >= 0
    cluster_denied = follower and not ctx.authorize_cluster(AclOperation.CLUSTER_ACTION)
    topics = []
    for t in req.topics:
        info = catalog.topics.get(t.topic)
        denied = (ErrorCode.cluster_authorization_failed if cluster_denied else
                  ErrorCode.topic_authorization_failed if not follower and not ctx.authorize(
                      AclOperation.DESCRIBE, ResourceType.TOPIC, t.topic) else None)
        parts = []
        for p in t.partitions:
            err, epoch, end = ErrorCode.none, UNDEFINED, UNDEFINED
            st = None
            if denied is not None:
                err = denied
            elif info is None or not 0 <= p.partition < info.partitions:
                err = ErrorCode.unknown_topic_or_partition
            elif p.current_leader_epoch > LEADER_EPOCH:
                err = ErrorCode.unknown_leader_epoch
            elif 0 <= p.current_leader_epoch < LEADER_EPOCH:
                err = ErrorCode.fenced_leader_epoch
            else:
                st = broker.partition_state(info, p.partition)
                if st is None:
                    err = ErrorCode.unknown_topic_or_partition
                elif st.status != READY:
                    err = ErrorCode.not_leader_or_follower     # recovering: retriable
                elif p.leader_epoch == LEADER_EPOCH:
                    epoch, end = LEADER_EPOCH, st.high_watermark
            parts.append(dict(error_code=err, partition=p.partition, leader_epoch=epoch, end_offset=end))
        topics.append(dict(topic=t.topic, partitions=tuple(parts)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), topics=tuple(topics))
