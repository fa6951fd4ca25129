"""What ShareFetch and ShareAcknowledge share: the checks of the request's group and member, and
the request's partitions and acknowledgements turned into the coordinator's ``ShareFetchPart``s,
with the per-partition errors a frontend decides itself (unknown topic id, topic authorization).

Runs in frontends; owns nothing.
"""

from __future__ import annotations

from appliance.acl.model import AclOperation, ResourceType
from appliance.errors import ErrorCode
from appliance.group.messages import ShareAckBatch, ShareFetchPart


def partitions(ctx, topics, parts_of, batches_of):
    """(ShareFetchParts to ask for, {(topic id, partition): error} decided here) for the
    request's topics; ``parts_of(topic)`` and ``batches_of(partition)`` read the two schemas."""
    catalog = ctx.broker.catalog
    asks: list[ShareFetchPart] = []
    errors: dict[tuple[bytes, int], ErrorCode] = {}
    for t in topics:
        tid = t.topic_id.bytes if t.topic_id is not None else bytes(16)
        info = catalog.by_id(tid)
        err = ErrorCode.none
        if info is None:
            err = ErrorCode.unknown_topic_id
        elif not ctx.authorize(AclOperation.READ, ResourceType.TOPIC, info.name):
            err = ErrorCode.topic_authorization_failed
        for p in parts_of(t):
            if err == ErrorCode.none and not 0 <= p.partition_index < info.partitions:
                errors[(tid, p.partition_index)] = ErrorCode.unknown_topic_or_partition
            elif err != ErrorCode.none:
                errors[(tid, p.partition_index)] = err
            else:
                asks.append(ShareFetchPart(tid, p.partition_index, [
                    ShareAckBatch(b.first_offset, b.last_offset, list(b.acknowledge_types))
                    for b in batches_of(p)]))
    return asks, errors


def refused(ctx, req, error):
    """The answer, built by ``error(ctx, code, message)``, to a request naming no group or member
    or whose group the principal may not Read; None when it may go on."""
    if not req.group_id or not req.member_id:
        return error(ctx, ErrorCode.invalid_request, "Group id and member id must be set.")
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, req.group_id):
        return error(ctx, ErrorCode.group_authorization_failed)
    return None
