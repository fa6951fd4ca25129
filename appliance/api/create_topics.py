"""CreateTopics (key 19), versions 2-7.

Runs in frontends; the supervisor owns the catalog, so the request is checked here for what only
the request can tell (replication factor, manual assignments) and handed to the supervisor, which
validates names and configs, commits the catalog, forks the new writers and answers once they have
started.

Authorization (Kafka's KafkaApis.handleCreateTopicsRequest): Create on the Cluster, or else on
each topic (TOPIC_AUTHORIZATION_FAILED, "Authorization failed."). A created topic's configs,
partition count and replication factor come back only with DescribeConfigs on it; without,
TopicConfigErrorCode is TOPIC_AUTHORIZATION_FAILED (as Kafka's controller answers).

KIP-599 controller_mutation_rate: each topic to create takes its partition count from the
client's bucket (``ClientContext.mutation``); from v6 a topic asked while the bucket is below zero
gets THROTTLING_QUOTA_EXCEEDED (strict), below v6 every one is created and the answer only
throttled (permissive), as Kafka's ControllerMutationQuotaManager; the tokens of a topic that is
not created are given back; validate_only takes none.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog.messages import CreateTopicsRequest, NewTopic, TopicResult
from appliance.protocol.messages import build
from appliance.errors import ErrorCode
from appliance.topic_config import describe_topic_configs

ZERO_UUID = uuid.UUID(int=0)
STRICT_SINCE = 6                  # KIP-599: THROTTLING_QUOTA_EXCEEDED from CreateTopics v6
THROTTLED = "The throttling quota has been exceeded."


def _precheck(ctx, t) -> tuple[ErrorCode, str] | None:
    node = ctx.broker.node_id
    if t.assignments:
        if t.num_partitions != -1 or t.replication_factor != -1:
            return (ErrorCode.invalid_request,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. "
                    "Both cannot be used at the same time.")
        indexes = sorted(a.partition_index for a in t.assignments)
        if indexes != list(range(len(indexes))):
            return ErrorCode.invalid_replica_assignment, "Partitions should be consecutive and start from 0"
        for a in t.assignments:
            if tuple(a.broker_ids) != (node,):
                return (ErrorCode.invalid_replica_assignment,
                        f"Replica assignment {list(a.broker_ids)} must be exactly [{node}] on a single node")
        return None
    if t.replication_factor not in (-1, 1):
        if t.replication_factor <= 0:
            return ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0, or -1 to use the default value."
        return (ErrorCode.invalid_replication_factor,
                f"Unable to replicate the partition {t.replication_factor} time(s): The target "
                f"replication factor of {t.replication_factor} cannot be reached because only 1 "
                "broker(s) are registered.")
    if t.num_partitions == 0 or t.num_partitions < -1:
        return ErrorCode.invalid_partitions, "Number of partitions was set to an invalid non-positive value."
    return None


@handles(19, "CreateTopics", 2, 7)
async def handle(ctx, req):
    m = ctx.response_module()
    results: dict[int, object] = {}
    to_create: list[tuple[int, NewTopic]] = []
    taken: dict[int, int] = {}            # KIP-599 permits taken, by topic index
    throttle = 0
    cluster_create = ctx.authorize_cluster(AclOperation.CREATE)
    for i, t in enumerate(req.topics):
        if not cluster_create and not ctx.authorize(AclOperation.CREATE, ResourceType.TOPIC, t.name):
            results[i] = TopicResult(name=t.name, error_code=int(ErrorCode.topic_authorization_failed),
                                     error_message="Authorization failed.")
            continue
        bad = _precheck(ctx, t)
        if bad is not None:
            results[i] = TopicResult(name=t.name, error_code=int(bad[0]), error_message=bad[1])
            continue
        parts = len(t.assignments) if t.assignments else t.num_partitions
        if not req.validate_only:
            # -1: the broker's default count, which the supervisor applies
            permits = parts if parts > 0 else ctx.broker.cfg.topics.default_partitions
            admitted, t_ms = ctx.mutation(permits, STRICT_SINCE)
            throttle = max(throttle, t_ms)
            if not admitted:
                results[i] = TopicResult(name=t.name, error_code=int(ErrorCode.throttling_quota_exceeded),
                                         error_message=THROTTLED)
                continue
            taken[i] = permits
        configs = {c.name: c.value for c in t.configs if c.value is not None}
        to_create.append((i, NewTopic(t.name, parts, configs)))
    if to_create:
        resp = await ctx.broker.call_supervisor(
            CreateTopicsRequest([nt for _, nt in to_create], req.validate_only), 70.0)
        for (i, _), r in zip(to_create, resp.results):
            results[i] = r
            if r.error_code and i in taken:
                ctx.unmutate(taken[i])
    out = []
    cfg = ctx.broker.cfg
    catalog = ctx.broker.catalog
    for i, t in enumerate(req.topics):
        r = results[i]
        ok = r.error_code == 0
        configs = None
        if ok and not ctx.authorize(AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, t.name):
            out.append(dict(name=t.name, topic_id=uuid.UUID(bytes=r.topic_id) if r.topic_id else ZERO_UUID,
                            error_code=ErrorCode.none, error_message=None,
                            topic_config_error_code=ErrorCode.topic_authorization_failed,
                            num_partitions=-1, replication_factor=-1, configs=()))
            continue
        if ok:
            configs = tuple(
                dict(name=name, value=value, read_only=False, config_source=source, is_sensitive=False)
                for name, (value, source, _) in describe_topic_configs(cfg, catalog, r.configs).items())
        out.append(dict(name=t.name,
                        topic_id=uuid.UUID(bytes=r.topic_id) if ok and r.topic_id else ZERO_UUID,
                        error_code=ErrorCode(r.error_code), error_message=r.error_message,
                        topic_config_error_code=0, num_partitions=r.num_partitions if ok else -1,
                        replication_factor=1 if ok else -1, configs=configs))
    return build(m.CreateTopicsResponse, throttle_time=datetime.timedelta(milliseconds=throttle),
                 topics=tuple(out))
