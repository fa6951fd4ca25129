"""Metadata (key 3), versions 0-13: the one broker, the topics, their partitions, topic ids.

Runs in frontends. The broker is described with the advertised endpoint of the listener the
request came through, as Kafka does. This node leads every partition, with itself as the only
replica and ISR and a leader epoch of 0 (``LEADER_EPOCH``, the epoch every stored batch carries).
A topic that does not exist is created on the spot when the request allows it (v4+ flag; always
for v0-3) and ``topics.auto_create`` is on, with ``topics.default_partitions`` partitions; we
wait for its writers, so the same answer already lists it (Kafka answers
LEADER_NOT_AVAILABLE first and lets the client retry; a ready answer saves that round trip).

Authorization (Kafka's KafkaApis.handleTopicMetadataRequest): only topics the principal may
Describe are answered. Asked for all topics, the others are left out; asked by name, they get
TOPIC_AUTHORIZATION_FAILED (and a zero id, whether they exist or not); asked by id, the id and
TOPIC_AUTHORIZATION_FAILED without the name. Auto-creation needs Create on the Cluster or on the
topic, else TOPIC_AUTHORIZATION_FAILED. The ``*_authorized_operations`` fields are filled in when
asked for (v8+; the cluster's in v8-10 only, 0 without Describe on the Cluster), else Kafka's
-2147483648.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import CLUSTER_NAME, AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.messages import build
from appliance.catalog.messages import CreateTopicsRequest, NewTopic
from appliance.catalog.model import check_topic_name
from appliance.protocol.records import LEADER_EPOCH
from appliance.errors import ErrorCode, KafkaError

ZERO_UUID = uuid.UUID(int=0)
NO_OPS = -2147483648          # Kafka's "not requested" for the *_authorized_operations fields
O, R = AclOperation, ResourceType


@handles(3, "Metadata", 0, 13)
async def handle(ctx, req):
    broker = ctx.broker
    m = ctx.response_module()
    v = ctx.version
    catalog = broker.catalog
    requested = req.topics
    if v == 0 and not requested:
        requested = None        # v0: an empty list means all topics
    all_topics = requested is None
    allow_create = getattr(req, "allow_auto_topic_creation", True) and broker.cfg.topics.auto_create

    names: list[str | None] = []
    unknown_ids: list[uuid.UUID] = []
    by_id: set[str] = set()                 # names the request gave as topic ids
    if all_topics:
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
                    by_id.add(info.name)
            else:
                names.append(name)
    # Kafka answers a topic named twice once (it reads the request's topics into a set).
    names = list(dict.fromkeys(names))
    unknown_ids = list(dict.fromkeys(unknown_ids))
    denied = {n for n in names if n is not None and not ctx.authorize(O.DESCRIBE, R.TOPIC, n)}
    if all_topics:
        names = [n for n in names if n not in denied]

    errors: dict[str, ErrorCode] = {}
    missing = [n for n in names if n is not None and n not in catalog.topics and n not in denied]
    if missing and allow_create and not ctx.authorize_cluster(O.CREATE):
        for n in missing:
            if not ctx.authorize(O.CREATE, R.TOPIC, n):
                errors[n] = ErrorCode.topic_authorization_failed
    creatable = []
    for n in missing:
        if n in errors:
            continue
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
    include_ops = v >= 8 and getattr(req, "include_topic_authorized_operations", False)
    topics = []
    for n in names:
        if n in denied:
            info = catalog.topics.get(n) if n in by_id else None
            # Ids are not secret, names are: asked by id, the id comes back without the name.
            topics.append(dict(error_code=ErrorCode.topic_authorization_failed,
                               name=None if info is not None else n,
                               topic_id=uuid.UUID(bytes=info.topic_id) if info is not None else ZERO_UUID,
                               is_internal=False, partitions=(), topic_authorized_operations=NO_OPS))
            continue
        info = catalog.topics.get(n) if n is not None else None
        ops = ctx.authorized_operations(R.TOPIC, n) if include_ops and n is not None else NO_OPS
        if info is None:
            err = errors.get(n, ErrorCode.unknown_topic_or_partition)
            topics.append(dict(error_code=err, name=n, topic_id=ZERO_UUID,
                               is_internal=False, partitions=(),
                               topic_authorized_operations=NO_OPS
                               if err == ErrorCode.topic_authorization_failed else ops))
            continue
        partitions = tuple(
            dict(error_code=ErrorCode.none, partition_index=p,
                 leader_id=broker.node_id, leader_epoch=LEADER_EPOCH, replica_nodes=(broker.node_id,),
                 isr_nodes=(broker.node_id,), offline_replicas=())
            for p in range(info.partitions))
        topics.append(dict(error_code=ErrorCode.none, name=info.name,
                           topic_id=uuid.UUID(bytes=info.topic_id), is_internal=False,
                           partitions=partitions, topic_authorized_operations=ops))
    for tid in unknown_ids:
        topics.append(dict(error_code=ErrorCode.unknown_topic_id, name=None,
                           topic_id=tid, is_internal=False, partitions=(),
                           topic_authorized_operations=NO_OPS))
    cluster_ops = NO_OPS
    if 8 <= v <= 10 and getattr(req, "include_cluster_authorized_operations", False):
        cluster_ops = (ctx.authorized_operations(R.CLUSTER, CLUSTER_NAME)
                       if ctx.authorize_cluster(O.DESCRIBE) else 0)
    return build(m.MetadataResponse, throttle_time=datetime.timedelta(0),
                brokers=(dict(node_id=broker.node_id, host=host, port=port,
                              rack=None),),
                cluster_id=broker.cluster_id, controller_id=broker.node_id, topics=tuple(topics),
                cluster_authorized_operations=cluster_ops, error_code=ErrorCode.none)
