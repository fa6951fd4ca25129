"""AlterShareGroupOffsets (key 91), version 0: set the start offset of a share group's share
partitions (KIP-932; ``kafka-share-groups.sh --reset-offsets``).

Runs in frontends; the share coordinator in the coordinator worker answers
(``appliance.group.share_admin``): GROUP_ID_NOT_FOUND for an unknown group or one of another
type, NON_EMPTY_GROUP while it has members. Authorization as Kafka's
KafkaApis.handleAlterShareGroupOffsetsRequest: Read on the group (else GROUP_AUTHORIZATION_FAILED
for the request), Read on each topic (else its partitions answer TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import AlterShareOffsetsRequest
from appliance.protocol.messages import build

E = ErrorCode


def _answer(ctx, err, msg=None, topics=()):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 error_message=msg, responses=tuple(topics))


def _partition(p: int, err: ErrorCode = E.none, msg: str | None = None) -> dict:
    return dict(partition_index=p, error_code=err, error_message=msg)


@handles(91, "AlterShareGroupOffsets", 0, 0)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _answer(ctx, E.group_authorization_failed)
    allowed, denied = [], []
    for t in req.topics:
        if ctx.authorize(AclOperation.READ, ResourceType.TOPIC, t.topic_name):
            allowed.append((t.topic_name, [(p.partition_index, p.start_offset)
                                           for p in t.partitions]))
        else:
            denied.append(dict(topic_name=t.topic_name, topic_id=uuid.UUID(int=0),
                               partitions=tuple(_partition(p.partition_index,
                                                           E.topic_authorization_failed)
                                                for p in t.partitions)))
    r = await ctx.broker.call_coordinator(AlterShareOffsetsRequest(req.group_id, allowed))
    if r.error != E.none:
        return _answer(ctx, r.error, r.error_message)
    topics = [dict(topic_name=t.topic, topic_id=uuid.UUID(bytes=bytes(t.topic_id)),
                   partitions=tuple(_partition(p.partition, p.error, p.error_message)
                                    for p in t.partitions)) for t in r.topics]
    return _answer(ctx, E.none, None, topics + denied)
