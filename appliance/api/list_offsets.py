"""ListOffsets (key 2), versions 1-11: earliest, latest (HW, or LSO for read_committed), by time.

Runs in frontends; the lookups run in a fetcher (it owns the read side: state pages and read-only
index maps). Special timestamps: -2 earliest, -1 latest, -3 max timestamp (v7+), -4 earliest local
(v8+), -5 latest tiered (v9+; no tiered storage, so -1). With IsolationLevel READ_COMMITTED (v2+)
"latest" is the last stable offset (the wire form since KIP-98's implementation: not KIP-98's
-3 sentinel).

Authorization (Kafka's KafkaApis.handleListOffsetRequest): Describe on each topic, else every
partition asked of it gets TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import collections
import datetime

from appliance import ipc
from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.records import LEADER_EPOCH
from appliance.protocol.messages import build
from appliance.errors import ErrorCode


@handles(2, "ListOffsets", 1, 11)
async def handle(ctx, req):
    m = ctx.response_module()
    catalog = ctx.broker.catalog
    isolation = getattr(req, "isolation_level", 0)
    asks: list[ipc.ListOffsetsPart] = []
    plan = []   # per topic: (name, [(partition, error or index into asks)])
    for t in req.topics:
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, t.name):
            plan.append((t.name, [(p.partition_index, ErrorCode.topic_authorization_failed)
                                  for p in t.partitions]))
            continue
        info = catalog.topics.get(t.name)
        seen: set[int] = set()
        # Linear (regression: counted per partition, a request repeating one partition 40,000
        # times took the frontend minutes).
        dup = {i for i, n in collections.Counter(p.partition_index for p in t.partitions).items() if n > 1}
        rows = []
        for p in t.partitions:
            if p.partition_index in dup:
                if p.partition_index not in seen:
                    rows.append((p.partition_index, ErrorCode.invalid_request))
                    seen.add(p.partition_index)
                continue
            if info is None or not 0 <= p.partition_index < info.partitions:
                rows.append((p.partition_index, ErrorCode.unknown_topic_or_partition))
                continue
            rows.append((p.partition_index, len(asks)))
            asks.append(ipc.ListOffsetsPart(info.topic_id, p.partition_index, p.timestamp))
        plan.append((t.name, rows))
    answers = []
    if asks:
        resp = await ctx.broker.call_fetcher(ipc.ListOffsetsRequest(isolation, asks),
                                             ctx.connection.fetcher, 30.0, ErrorCode.request_timed_out)
        answers = resp.parts
    topics = []
    for name, rows in plan:
        parts = []
        for index, what in rows:
            if isinstance(what, ErrorCode):
                parts.append(dict(partition_index=index, error_code=what,
                                  timestamp=-1, offset=-1, leader_epoch=-1))
                continue
            a = answers[what]
            parts.append(dict(partition_index=index,
                              error_code=ErrorCode(a.error_code), timestamp=a.timestamp, offset=a.offset,
                              leader_epoch=LEADER_EPOCH if a.offset >= 0 else -1))
        topics.append(dict(name=name, partitions=tuple(parts)))
    return build(m.ListOffsetsResponse, throttle_time=datetime.timedelta(0), topics=tuple(topics))
