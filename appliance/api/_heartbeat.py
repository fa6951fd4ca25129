"""What ConsumerGroupHeartbeat (KIP-848) and ShareGroupHeartbeat (KIP-932) share in the frontend:
their error answer and the topic DESCRIBE check of a subscription.

Runs in frontends; owns nothing.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def error_response(ctx, code: ErrorCode, message: str | None = None):
    """The heartbeat answer carrying only an error (no member, no assignment)."""
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=code,
                 error_message=message, member_id=None, member_epoch=0,
                 heartbeat_interval=datetime.timedelta(0), assignment=None)


def unauthorized_topics(ctx, names):
    """TOPIC_AUTHORIZATION_FAILED naming every subscribed topic the member may not Describe, as
    Kafka's GroupCoordinatorService checks a heartbeat's subscription; None when all may be."""
    if not names:
        return None
    denied = sorted({t for t in names
                     if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, t)})
    if not denied:
        return None
    return error_response(ctx, ErrorCode.topic_authorization_failed,
                          "The following topics are unauthorized: " + ", ".join(denied) + ".")
