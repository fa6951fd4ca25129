"""DeleteShareGroupOffsets (key 92), version 0: delete the state of a share group's share
partitions, topic by topic (KIP-932; ``kafka-share-groups.sh --delete-offsets``).

Runs in frontends; the share coordinator in the coordinator worker answers
(``appliance.group.share_admin``): GROUP_ID_NOT_FOUND for an unknown group or one of another
type, NON_EMPTY_GROUP while it has members, per topic UNKNOWN_TOPIC_OR_PARTITION for a topic not
in the catalog or without state. Authorization as Kafka's
KafkaApis.handleDeleteShareGroupOffsetsRequest: Delete on the group (else
GROUP_AUTHORIZATION_FAILED for the request), Read on each topic (else TOPIC_AUTHORIZATION_FAILED
for it).
"""

from __future__ import annotations

import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.group.messages import DeleteShareOffsetsRequest
from appliance.protocol.messages import build

E = ErrorCode


def _answer(ctx, err, msg=None, topics=()):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=err,
                 error_message=msg, responses=tuple(topics))


@handles(92, "DeleteShareGroupOffsets", 0, 0)
async def handle(ctx, req):
    if not ctx.authorize(AclOperation.DELETE, ResourceType.GROUP, req.group_id):
        return _answer(ctx, E.group_authorization_failed)
    names = list(dict.fromkeys(t.topic_name for t in req.topics))
    allowed = [n for n in names if ctx.authorize(AclOperation.READ, ResourceType.TOPIC, n)]
    r = await ctx.broker.call_coordinator(DeleteShareOffsetsRequest(req.group_id, allowed))
    if r.error != E.none:
        return _answer(ctx, r.error, r.error_message)
    topics = [dict(topic_name=t.topic, topic_id=uuid.UUID(bytes=bytes(t.topic_id)),
                   error_code=t.error, error_message=t.error_message) for t in r.topics]
    topics += [dict(topic_name=n, topic_id=uuid.UUID(int=0),
                    error_code=E.topic_authorization_failed, error_message=None)
               for n in names if n not in set(allowed)]
    return _answer(ctx, E.none, None, topics)
