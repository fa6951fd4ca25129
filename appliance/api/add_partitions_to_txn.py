"""AddPartitionsToTxn (key 24), versions 0-5.

Runs in frontends; the coordinator decides. v0-3 is the client's form (one transaction). v4-5 is
the broker's batched form (KIP-890): several transactions, each either VerifyOnly (is every
partition already in the Ongoing transaction? state unchanged) or an add. On a single node nothing
else sends v4+ to us, but the API is served as Kafka serves it. Partitions of unknown topics get
UNKNOWN_TOPIC_OR_PARTITION and the other partitions of that transaction OPERATION_NOT_ATTEMPTED,
as Kafka answers. A VerifyOnly gets the coordinator's own codes, as Kafka's KafkaApis passes them
through at v4 and v5 (KIP-890): TRANSACTION_ABORTABLE for a partition not in the transaction,
PRODUCER_FENCED for a stale epoch (a partition writer gets them as Kafka's
AddPartitionsToTxnManager maps them: INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH).

TRANSACTION_ABORTABLE (KIP-890, KIP-1050) by version: only the VerifyOnly form ever carries it
(Kafka's coordinator writes it nowhere else); ``abortable_for`` keeps it from v0-3.

Authorization (Kafka's KafkaApis.handleAddPartitionsToTxnRequest): v4+ (from brokers) needs
ClusterAction on the Cluster, else CLUSTER_AUTHORIZATION_FAILED for the request (KIP-890). v0-3
(from clients) need Write on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
every partition) and Write on each topic (else TOPIC_AUTHORIZATION_FAILED, and the rest are not
attempted); a client may never add an internal topic's partition this way
(TOPIC_AUTHORIZATION_FAILED, authorizer or not, as in Kafka: offsets go through AddOffsetsToTxn).
"""

from __future__ import annotations

import asyncio
import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.catalog.model import INTERNAL_TOPICS
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import AddPartitionsToTxnRequest, VerifyPartitionRequest, abortable_for


def _refused(ctx, topics, from_client: bool) -> dict[tuple[str, int], ErrorCode]:
    bad = {}
    catalog = ctx.broker.catalog
    for t in topics:
        info = catalog.topics.get(t.name)
        allowed = not from_client or (t.name not in INTERNAL_TOPICS and ctx.authorize(
            AclOperation.WRITE, ResourceType.TOPIC, t.name))
        for p in t.partitions:
            if not allowed:
                bad[(t.name, p)] = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= p < info.partitions:
                bad[(t.name, p)] = ErrorCode.unknown_topic_or_partition
    return bad


def _topic_results(topics, errors: dict[tuple[str, int], int]):
    return tuple(dict(name=t.name, results_by_partition=tuple(
        dict(partition_index=p, partition_error_code=ErrorCode(errors.get((t.name, p), 0)))
        for p in t.partitions)) for t in topics)


async def _add(ctx, txn_id, pid, epoch, topics, version) -> dict[tuple[str, int], int]:
    bad = _refused(ctx, topics, version <= 3)
    if bad:
        return {(t.name, p): int(bad.get((t.name, p), ErrorCode.operation_not_attempted))
                for t in topics for p in t.partitions}
    r = await ctx.broker.call_coordinator(AddPartitionsToTxnRequest(
        txn_id, pid, epoch, [(t.name, p) for t in topics for p in t.partitions], version))
    return {(e.topic, e.partition): abortable_for(24, version, e.error) for e in r.results}


async def _verify(ctx, txn_id, pid, epoch, topics) -> dict[tuple[str, int], int]:
    async def one(topic, p):
        r = await ctx.broker.call_coordinator(VerifyPartitionRequest(txn_id, pid, epoch, topic, p, False,
                                                                     raw=True))
        return r.error
    keys = [(t.name, p) for t in topics for p in t.partitions]
    codes = await asyncio.gather(*(one(t, p) for t, p in keys))
    return dict(zip(keys, codes))


@handles(24, "AddPartitionsToTxn", 0, 5)
async def handle(ctx, req):
    m = ctx.response_class()
    if ctx.version <= 3:
        topics = req.v3_and_below_topics
        tid = req.v3_and_below_transactional_id
        if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            denied = int(ErrorCode.transactional_id_authorization_failed)
            errors = {(t.name, p): denied for t in topics for p in t.partitions}
        else:
            errors = await _add(ctx, tid, req.v3_and_below_producer_id,
                                req.v3_and_below_producer_epoch, topics, ctx.version)
        return build(m, throttle_time=datetime.timedelta(0),
                     results_by_topic_v3_and_below=_topic_results(topics, errors))
    if not ctx.authorize_cluster(AclOperation.CLUSTER_ACTION):
        return build(m, throttle_time=datetime.timedelta(0),
                     error_code=ErrorCode.cluster_authorization_failed, results_by_transaction=())
    results = []
    for txn in req.transactions:
        if txn.verify_only:
            errors = await _verify(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics)
        else:
            errors = await _add(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch,
                                txn.topics, ctx.version)
        results.append(dict(transactional_id=txn.transactional_id, topic_results=_topic_results(txn.topics, errors)))
    return build(m, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 results_by_transaction=tuple(results))
