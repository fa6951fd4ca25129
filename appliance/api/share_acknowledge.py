"""ShareAcknowledge (key 79), versions 1-2: a share-group member acknowledges records it was
delivered (ACCEPT 1, RELEASE 2, REJECT 3, GAP 0) without fetching more (KIP-932).

Runs in frontends; the share coordinator in the coordinator worker applies them
(``appliance.group.share_group``) and answers once they are in the share-state log. The session
epoch must be the session's next one; 0 is INVALID_SHARE_SESSION_EPOCH (only a ShareFetch opens
a session), -1 closes the session after the acknowledgements. v2 (KIP-1222): with
``is_renew_ack`` the batches may RENEW (4) records the member holds, restarting their locks for
the group's record lock duration (answered in ``acquisition_lock_timeout``); RENEW without the
flag is INVALID_REQUEST on the partition. Authorization as ShareFetch: Read on the group and the
topics.
"""

from __future__ import annotations

import datetime

from appliance.api import handles
from appliance.api._share import partitions, refused
from appliance.errors import ErrorCode
from appliance.group.messages import ShareFetchRequest
from appliance.protocol.messages import build
from appliance.protocol.records import LEADER_EPOCH


def _error(ctx, code: ErrorCode, message: str | None = None):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=code,
                 error_message=message, acquisition_lock_timeout=datetime.timedelta(0),
                 responses=(), node_endpoints=())


@handles(79, "ShareAcknowledge", 1, 2)
async def handle(ctx, req):
    no = refused(ctx, req, _error)
    if no is not None:
        return no
    asks, errors = partitions(ctx, req.topics, lambda t: t.partitions,
                              lambda p: p.acknowledgement_batches)
    r = await ctx.broker.call_coordinator(ShareFetchRequest(
        req.group_id, req.member_id, req.share_session_epoch, asks, [], False, 0,
        renew=bool(getattr(req, "is_renew_ack", False))))
    if r.error != ErrorCode.none:
        return _error(ctx, r.error, r.error_message)
    codes = dict(errors)
    for p in r.parts:
        tp = (bytes(p.topic_id), p.partition)
        codes.setdefault(tp, p.error if p.error != ErrorCode.none else p.ack_error)
    by_topic: dict[bytes, list] = {}
    leader = dict(leader_id=ctx.broker.node_id, leader_epoch=LEADER_EPOCH)
    for (tid, part), code in codes.items():
        by_topic.setdefault(tid, []).append(dict(partition_index=part, error_code=code,
                                                 error_message=None, current_leader=leader))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, error_message=None,
                 acquisition_lock_timeout=datetime.timedelta(milliseconds=r.lock_ms),
                 responses=tuple(dict(topic_id=tid, partitions=tuple(ps))
                                 for tid, ps in by_topic.items()),
                 node_endpoints=())
