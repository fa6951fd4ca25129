"""FindCoordinator (key 10), versions 0-6: this node coordinates every group and transaction.

Runs in frontends. v0-3 ask for one key, v4+ for a batch (``coordinator_keys``). Key type 0 is a
consumer group (classic, consumer or share), 1 a transactional id, 2 (v6+, KIP-932) a share
partition's state, keyed ``group:topicId:partition`` (Kafka's brokers ask it of the share
coordinator; Cluster ClusterAction, else CLUSTER_AUTHORIZATION_FAILED; a malformed key
INVALID_REQUEST); anything else is INVALID_REQUEST, as Kafka's CoordinatorType.forId rejects it.

Authorization (Kafka's KafkaApis.getCoordinator): Describe on the group (else
GROUP_AUTHORIZATION_FAILED) or on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
answered with no node (-1, "", -1).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import uuid

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.messages import build
from appliance.errors import ErrorCode

GROUP, TRANSACTION, SHARE = 0, 1, 2


def _share_key_ok(key: str) -> bool:
    group, sep, rest = key.rpartition(":")
    group, sep2, topic_id = group.rpartition(":")
    if not (sep and sep2 and group and rest.lstrip("-").isdigit()):
        return False
    try:
        uuid.UUID(topic_id) if "-" in topic_id else base64.urlsafe_b64decode(topic_id + "==")
    except (ValueError, binascii.Error):
        return False
    return True


def _answer(ctx, key_type: int, key: str):
    if key_type == SHARE and ctx.version >= 6:
        if not ctx.authorize_cluster(AclOperation.CLUSTER_ACTION):
            return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
        if not _share_key_ok(key):
            return ErrorCode.invalid_request, "Invalid coordinator key: " + key
        return ErrorCode.none, None
    if key_type not in (GROUP, TRANSACTION):
        return ErrorCode.invalid_request, f"Unknown coordinator type {key_type}"
    if key_type == GROUP and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, key):
        return ErrorCode.group_authorization_failed, "Group authorization failed."
    if key_type == TRANSACTION and not ctx.authorize(AclOperation.DESCRIBE,
                                                     ResourceType.TRANSACTIONAL_ID, key):
        return ErrorCode.transactional_id_authorization_failed, "Transactional Id authorization failed."
    if key_type == TRANSACTION and not key:
        return ErrorCode.invalid_request, "Transactional id must not be empty"
    return ErrorCode.none, None


@handles(10, "FindCoordinator", 0, 6)
def handle(ctx, req):
    m = ctx.response_module()
    broker = ctx.broker
    host, port = ctx.advertised
    key_type = getattr(req, "key_type", GROUP)
    if ctx.version >= 4:
        coords = []
        for key in req.coordinator_keys:
            err, msg = _answer(ctx, key_type, key)
            ok = err == ErrorCode.none
            coords.append(dict(key=key, node_id=broker.node_id if ok else -1,
                               host=host if ok else "", port=port if ok else -1, error_code=err,
                               error_message=msg))
        return build(m.FindCoordinatorResponse, throttle_time=datetime.timedelta(0),
                    coordinators=tuple(coords))
    err, msg = _answer(ctx, key_type, req.key)
    ok = err == ErrorCode.none
    return build(m.FindCoordinatorResponse, throttle_time=datetime.timedelta(0), error_code=err,
                error_message=msg, node_id=broker.node_id if ok else -1, host=host if ok else "",
                port=port if ok else -1)
