"""InitProducerId (key 22), versions 0-6: a producer id and epoch for a producer.

Runs in frontends; the coordinator worker allocates (durably, never reusing an id) and, with a
transactional id, fences earlier incarnations (appliance/txn/coordinator.py). Without a
transactional id, Kafka hands out a fresh producer id with epoch 0, also to a v3+ client that
names its current id and epoch to have it bumped (KIP-360).

v6 (KIP-939, two-phase commit): Enable2Pc asks for a transaction that never times out (refused
with TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless ``transactions.two_phase_commit_enable``);
KeepPreparedTxn keeps an open transaction for the caller to commit or abort, and the answer
carries its pair in OngoingTxnProducerId/OngoingTxnEpoch (-1 when none is open).

Authorization (Kafka's KafkaApis.handleInitProducerIdRequest), before anything else: with a
transactional id, Write on it, and for Enable2Pc also TwoPhaseCommit on it (KIP-939), else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED; without one (an idempotent producer), IdempotentWrite on
the Cluster or Write on at least one topic (Kafka 3.x, KIP-679), else CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import datetime

from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.errors import ErrorCode
from appliance.protocol.messages import build
from appliance.txn.messages import InitProducerIdRequest, abortable_for


@handles(22, "InitProducerId", 0, 6)
async def handle(ctx, req):
    pid = getattr(req, "producer_id", -1)
    epoch = getattr(req, "producer_epoch", -1)
    timeout_ms = int(req.transaction_timeout.total_seconds() * 1000)
    enable_2pc = bool(getattr(req, "enable2_pc", False))
    tid = req.transactional_id
    if tid is not None:
        if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid) or (
                enable_2pc and not ctx.authorize(AclOperation.TWO_PHASE_COMMIT,
                                                 ResourceType.TRANSACTIONAL_ID, tid)):
            return _response(ctx, ErrorCode.transactional_id_authorization_failed)
    elif not ctx.authorize_cluster(AclOperation.IDEMPOTENT_WRITE) and \
            not ctx.authorize_by_resource_type(AclOperation.WRITE, ResourceType.TOPIC):
        return _response(ctx, ErrorCode.cluster_authorization_failed)
    if (pid == -1) != (epoch == -1):
        # KafkaApis: a producer id without an epoch, or an epoch without an id.
        return _response(ctx, ErrorCode.invalid_request)
    keep_prepared = bool(getattr(req, "keep_prepared_txn", False))
    r = await ctx.broker.call_coordinator(InitProducerIdRequest(
        req.transactional_id, timeout_ms, pid, epoch, ctx.version, enable_2pc, keep_prepared))
    return _response(ctx, abortable_for(22, ctx.version, r.error), r.producer_id, r.producer_epoch, r.ongoing_producer_id,
                     r.ongoing_producer_epoch)


def _response(ctx, error: ErrorCode, producer_id: int = -1, producer_epoch: int = -1,
              ongoing_id: int = -1, ongoing_epoch: int = -1):
    ok = error == ErrorCode.none
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=error,
                 producer_id=producer_id if ok else -1, producer_epoch=producer_epoch if ok else -1,
                 ongoing_txn_producer_id=ongoing_id if ok else -1,
                 ongoing_txn_producer_epoch=ongoing_epoch if ok else -1)
