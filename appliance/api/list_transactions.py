"""ListTransactions (key 66), versions 0-2: transactions known to the coordinator, filtered.

Runs in frontends; the coordinator filters by state names (unknown names are echoed back in
UnknownStateFilters), producer ids, (v1) minimum running time and (v2) a transactional-id pattern.
Only the transactional ids the principal may Describe are listed (Kafka's
KafkaApis.handleListTransactionsRequest).
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.protocol.messages import build
from appliance.txn.messages import ListTransactionsRequest


@handles(66, "ListTransactions", 0, 2)
async def handle(ctx, req):
    r = await ctx.broker.call_coordinator(ListTransactionsRequest(
        list(req.state_filters), list(req.producer_id_filters),
        getattr(req, "duration_filter", -1), getattr(req, "transactional_id_pattern", None)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=r.error,
                 unknown_state_filters=tuple(r.unknown_state_filters),
                 transaction_states=tuple(dict(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                               transaction_state=t.state) for t in r.transactions
                                          if ctx.authorize(AclOperation.DESCRIBE,
                                                           ResourceType.TRANSACTIONAL_ID,
                                                           t.transactional_id)))
