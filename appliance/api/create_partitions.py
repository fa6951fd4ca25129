"""CreatePartitions (key 37), versions 0-3: grow topics.

Runs in frontends. What only the request can tell is checked here (a manual assignment must name
this node, once, for each added partition); the supervisor, which owns the catalog, checks the
counts (Kafka's errors: a count that is not an increase is INVALID_PARTITIONS), commits, forks a
writer per new partition (numbered after the existing ones) and answers once they are READY.
Every worker follows the catalog: frontends open the new writers' rings, the coordinator links
them for markers, fetchers serve them.

KIP-599 controller_mutation_rate: a topic takes the partitions it adds from the client's bucket;
from v3 one asked while the bucket is below zero gets THROTTLING_QUOTA_EXCEEDED (strict), below
v3 the answer is only throttled (permissive); a refused growth gives its tokens back.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog.messages import CreatePartitionsRequest, TopicResult
from appliance.errors import ErrorCode
from appliance.protocol.messages import build


def _check_assignments(node: int, t, current: int | None) -> tuple[ErrorCode, str] | None:
    if t.assignments is None or current is None:
        return None
    added = t.count - current
    if added > 0 and len(t.assignments) != added:
        return (ErrorCode.invalid_replica_assignment,
                f"Attempted to add {added} additional partition(s), but only "
                f"{len(t.assignments)} assignment(s) were specified.")
    for a in t.assignments:
        ids = list(a.broker_ids)
        if not ids:
            return ErrorCode.invalid_replica_assignment, "The manual partition assignment includes an empty replica list."
        for b in ids:
            if b != node:
                return (ErrorCode.invalid_replica_assignment,
                        f"The manual partition assignment includes broker {b}, but no such broker is registered.")
        if len(ids) != 1:
            return (ErrorCode.invalid_replica_assignment,
                    f"The manual partition assignment includes a partition with {len(ids)} replica(s), but "
                    "this is not consistent with previous partitions, which have 1 replica(s).")
    return None


@handles(37, "CreatePartitions", 0, 3)
async def handle(ctx, req):
    broker = ctx.broker
    catalog = broker.catalog
    results: dict[int, TopicResult] = {}
    asks: list[tuple[int, str, int]] = []
    taken: dict[int, int] = {}            # KIP-599 permits taken, by topic index
    throttle = 0
    for i, t in enumerate(req.topics):
        if not ctx.authorize(AclOperation.ALTER, ResourceType.TOPIC, t.name):
            # Kafka's KafkaApis: Alter on the topic, checked before anything else is looked at.
            results[i] = TopicResult(t.name, int(ErrorCode.topic_authorization_failed), None)
            continue
        info = catalog.topics.get(t.name)
        bad = _check_assignments(broker.node_id, t, info.partitions if info else None)
        if bad is not None:
            results[i] = TopicResult(t.name, int(bad[0]), bad[1])
        else:
            added = t.count - info.partitions if info is not None else 0
            if added > 0 and not req.validate_only:
                admitted, t_ms = ctx.mutation(added, 3)
                throttle = max(throttle, t_ms)
                if not admitted:
                    results[i] = TopicResult(t.name, int(ErrorCode.throttling_quota_exceeded),
                                             "The throttling quota has been exceeded.")
                    continue
                taken[i] = added
            asks.append((i, t.name, t.count))
    if asks:
        resp = await broker.call_supervisor(
            CreatePartitionsRequest([(n, c) for _, n, c in asks], req.validate_only), 70.0)
        for (i, _, _), r in zip(asks, resp.results):
            results[i] = r
            if r.error_code and i in taken:
                ctx.unmutate(taken[i])
    out = tuple(dict(name=t.name, error_code=ErrorCode(results[i].error_code),
                     error_message=results[i].error_message)
                for i, t in enumerate(req.topics))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(milliseconds=throttle),
                 results=out)
