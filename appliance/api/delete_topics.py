"""DeleteTopics (key 20), versions 1-6 (v6 may name topics by id).

Runs in frontends; the supervisor commits the removal, stops the partition writers and deletes the
directories before it answers.

Authorization (Kafka's KafkaApis.handleDeleteTopicsRequest): Delete on each topic, else
TOPIC_AUTHORIZATION_FAILED, checked before its existence; a topic named by id that the principal
may not Describe is answered without its name.

KIP-599 controller_mutation_rate: a topic deleted takes its partition count from the client's
bucket; from v5 one asked while the bucket is below zero gets THROTTLING_QUOTA_EXCEEDED (strict),
below v5 the answer is only throttled (permissive); an unknown topic takes nothing.
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog.messages import DeleteTopicsRequest
from appliance.protocol.messages import build
from appliance.errors import ErrorCode

ZERO_UUID = uuid.UUID(int=0)


@handles(20, "DeleteTopics", 1, 6)
async def handle(ctx, req):
    m = ctx.response_module()
    catalog = ctx.broker.catalog
    entries: list[tuple[str | None, uuid.UUID | None, ErrorCode | None, str | None]] = []
    if ctx.version >= 6:
        for t in req.topics:
            if t.name is not None:
                entries.append((t.name, None, None, None))
            elif t.topic_id is not None and t.topic_id != ZERO_UUID:
                info = catalog.by_id(t.topic_id.bytes)
                if info is None:
                    entries.append((None, t.topic_id, ErrorCode.unknown_topic_id,
                                    "This server does not host this topic ID."))
                else:
                    entries.append((info.name, t.topic_id, None, None))
            else:
                entries.append((None, ZERO_UUID, ErrorCode.invalid_request,
                                "Neither topic name nor id were specified."))
    else:
        entries = [(n, None, None, None) for n in req.topic_names]
    checked = []
    for name, tid, err, msg in entries:
        if err is None:
            if tid is not None and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                name, err = None, ErrorCode.topic_authorization_failed
            elif not ctx.authorize(AclOperation.DELETE, ResourceType.TOPIC, name):
                err = ErrorCode.topic_authorization_failed
        checked.append((name, tid, err, msg))
    throttle = 0
    if ctx.broker.quotas.any:
        gated = []
        for name, tid, err, msg in checked:
            info = catalog.topics.get(name) if err is None else None
            if info is not None:
                admitted, t_ms = ctx.mutation(info.partitions, 5)
                throttle = max(throttle, t_ms)
                if not admitted:
                    err, msg = ErrorCode.throttling_quota_exceeded, "The throttling quota has been exceeded."
            gated.append((name, tid, err, msg))
        checked = gated
    entries = checked
    names = [e[0] for e in entries if e[2] is None]
    by_name = {}
    if names:
        resp = await ctx.broker.call_supervisor(DeleteTopicsRequest(names), 70.0)
        by_name = {r.name: r for r in resp.results}
    out = []
    for name, tid, err, msg in entries:
        if err is None:
            r = by_name[name]
            err, msg = ErrorCode(r.error_code), r.error_message
            if tid is None:
                tid = uuid.UUID(bytes=r.topic_id) if r.topic_id else ZERO_UUID
        out.append(dict(name=name, topic_id=tid or ZERO_UUID, error_code=err,
                        error_message=msg))
    return build(m.DeleteTopicsResponse, throttle_time=datetime.timedelta(milliseconds=throttle),
                 responses=tuple(out))
