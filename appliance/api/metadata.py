"""Metadata (key 3), versions 0-13: the one broker, the topics, their partitions, topic ids.

Runs in frontends. The broker is described with the advertised endpoint of the listener the
request came through, as Kafka does. This node leads every partition, with itself as the only
replica and ISR and a leader epoch of 0 (``LEADER_EPOCH``, the epoch every stored batch carries).
A topic that does not exist is created on the spot when the request allows it (v4+ flag; always
for v0-3) and ``topics.auto_create`` is on, with ``topics.default_partitions`` partitions; we
wait for its writers, so the same answer already lists it (Kafka answers
LEADER_NOT_AVAILABLE first and lets the client retry; a ready answer saves that round trip).
"""

from __future__ import annotations

import datetime
import uuid

from appliance.api import handles
from appliance.protocol.messages import build
from appliance.catalog import LEADER_EPOCH, CreateTopicsRequest, NewTopic, check_topic_name
from appliance.errors import ErrorCode, KafkaError

ZERO_UUID = uuid.UUID(int=0)
NO_OPS = -2147483648
# Every operation bit a topic supports (READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE,
# DESCRIBE_CONFIGS, ALTER_CONFIGS): there is no authorizer yet.
TOPIC_OPS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))


@handles(3, "Metadata", 0, 13)
async def handle(ctx, req):
    broker = ctx.broker
    m = ctx.response_module()
    v = ctx.version
    catalog = broker.catalog
    requested = req.topics
    if v == 0 and not requested:
        requested = None        # v0: an empty list means all topics
    allow_create = getattr(req, "allow_auto_topic_creation", True) and broker.cfg.topics.auto_create

    names: list[str | None] = []
    unknown_ids: list[uuid.UUID] = []
    if requested is None:
        names = sorted(catalog.topics)
    else:
        for t in requested:
            name = getattr(t, "name", None)
            tid = getattr(t, "topic_id", None)
            if name is None and tid is not None and tid != ZERO_UUID:
                info = catalog.by_id(tid.bytes)
                if info is None:
                    unknown_ids.append(tid)
                else:
                    names.append(info.name)
            else:
                names.append(name)
        # Kafka answers a topic named twice once (it reads the request's topics into a set).
        names = list(dict.fromkeys(names))
        unknown_ids = list(dict.fromkeys(unknown_ids))

    errors: dict[str, ErrorCode] = {}
    missing = [n for n in names if n is not None and n not in catalog.topics]
    creatable = []
    for n in dict.fromkeys(missing):
        try:
            check_topic_name(n)
        except KafkaError:
            errors[n] = ErrorCode.invalid_topic_exception
            continue
        if allow_create:
            creatable.append(n)
        else:
            errors[n] = ErrorCode.unknown_topic_or_partition
    if creatable:
        parts = broker.cfg.topics.default_partitions
        resp = await broker.call_supervisor(
            CreateTopicsRequest([NewTopic(n, parts) for n in creatable]), 70.0)
        for r in resp.results:
            if r.error_code not in (0, int(ErrorCode.topic_already_exists)):
                errors[r.name] = ErrorCode.leader_not_available
        catalog = broker.catalog

    host, port = ctx.advertised
    include_ops = getattr(req, "include_topic_authorized_operations", False)
    topics = []
    for n in dict.fromkeys(names):
        info = catalog.topics.get(n) if n is not None else None
        if info is None:
            topics.append(dict(error_code=errors.get(n, ErrorCode.unknown_topic_or_partition),
                               name=n, topic_id=ZERO_UUID, is_internal=False, partitions=(),
                               topic_authorized_operations=NO_OPS))
            continue
        partitions = tuple(
            dict(error_code=ErrorCode.none, partition_index=p,
                 leader_id=broker.node_id, leader_epoch=LEADER_EPOCH, replica_nodes=(broker.node_id,),
                 isr_nodes=(broker.node_id,), offline_replicas=())
            for p in range(info.partitions))
        topics.append(dict(error_code=ErrorCode.none, name=info.name,
                           topic_id=uuid.UUID(bytes=info.topic_id), is_internal=False,
                           partitions=partitions,
                           topic_authorized_operations=TOPIC_OPS if include_ops else NO_OPS))
    for tid in unknown_ids:
        topics.append(dict(error_code=ErrorCode.unknown_topic_id, name=None,
                           topic_id=tid, is_internal=False, partitions=(),
                           topic_authorized_operations=NO_OPS))
    return build(m.MetadataResponse, throttle_time=datetime.timedelta(0),
                brokers=(dict(node_id=broker.node_id, host=host, port=port,
                              rack=None),),
                cluster_id=broker.cluster_id, controller_id=broker.node_id, topics=tuple(topics),
                cluster_authorized_operations=NO_OPS, error_code=ErrorCode.none)
