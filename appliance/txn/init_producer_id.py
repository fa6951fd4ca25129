"""InitProducerId for the transaction coordinator, with KIP-939's keepPreparedTxn.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, sans-IO: the
``TransactionCoordinator`` creates an ``InitProducerIdHandler`` and delegates InitProducerId to
it. Owns no state of its own: it reads and replaces transaction metadata through the
``TxnMetadataCache`` it is given (copy-on-write, see ``appliance.txn.metadata_cache``), tells the
marker channel when a kept transaction changed, and aborts an Ongoing transaction through the
``fence_and_abort`` it is given (``EndTxnHandler.fence_and_abort``). Behaviour is Kafka's
TransactionCoordinator.handleInitProducerId: a transactional id gets its producer id and a bumped
epoch (fencing every earlier incarnation), an Ongoing transaction of the previous incarnation is
aborted first, a Prepare* one is waited for; KIP-360 lets a producer keep its id after an error,
KIP-890 rotates to a new producer id instead of wrapping the epoch, KIP-939 keeps an Ongoing
transaction open for the caller (``_keep_prepared``). Also here: the checks every later request
makes against a kept transaction (``kept_guard``, ``kept_retry``; functions of the metadata).
"""

from __future__ import annotations

import logging
from typing import Callable

from appliance.errors import ErrorCode
from appliance.txn.marker_channel import TransactionMarkerChannelManager
from appliance.txn.messages import InitProducerIdResult, fenced_for
from appliance.txn.metadata import (MAX_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0, TV_2,
                                    IllegalTransition, TransactionMetadata, TransactionState,
                                    is_epoch_exhausted)
from appliance.txn.metadata_cache import TxnMetadataCache

__all__ = ["InitProducerIdHandler", "kept_guard", "kept_retry"]

log = logging.getLogger("appliance.txn.coordinator")

E = ErrorCode
S = TransactionState


class InitProducerIdHandler:
    """InitProducerId over the coordinator's ``TxnMetadataCache``."""

    def __init__(self, cache: TxnMetadataCache, markers: TransactionMarkerChannelManager,
                 fence_and_abort: Callable[[TransactionMetadata], ErrorCode]) -> None:
        """``fence_and_abort(md)``: bump the epoch of an Ongoing transaction and abort it (the
        coordinator's own abort, ``EndTxnHandler.fence_and_abort``)."""
        self._cache = cache
        self._markers = markers
        self._fence_and_abort = fence_and_abort

    def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                         *, api_version: int = 0, enable_2pc: bool = False,
                         keep_prepared_txn: bool = False) -> InitProducerIdResult:
        """InitProducerId. v6 (KIP-939) adds ``enable_2pc`` (the transaction never times out;
        its timeout is stored as -1) and ``keep_prepared_txn`` (an Ongoing transaction is kept
        for the caller to commit or abort, see ``_keep_prepared``)."""
        try:
            r = self._init_producer_id(transactional_id, timeout_ms, producer_id, producer_epoch,
                                       enable_2pc, keep_prepared_txn)
        except IllegalTransition as e:
            log.warning("%s", e)
            r = InitProducerIdResult(E.invalid_txn_state)
        if r.error != E.none:
            return InitProducerIdResult(fenced_for(api_version, 4, r.error))
        return r

    def _init_producer_id(self, tid: str | None, timeout_ms: int, pid: int, epoch: int,
                          enable_2pc: bool = False, keep_prepared: bool = False) -> InitProducerIdResult:
        if (pid == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
            return InitProducerIdResult(E.invalid_request)          # KafkaApis: id without epoch or v.v.
        if tid is None and (enable_2pc or keep_prepared):
            return InitProducerIdResult(E.invalid_request)          # (ours) 2PC needs a transactional id
        if tid is None:
            # Idempotent producer: a fresh id, epoch 0, no log (KIP-98).
            new_pid = self._cache.new_producer_id()
            if new_pid is None:
                return InitProducerIdResult(E.coordinator_not_available)
            return InitProducerIdResult(E.none, new_pid, 0)
        if tid == "":
            return InitProducerIdResult(E.invalid_request)
        if enable_2pc:
            # KIP-939: the broker switch, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED (the
            # TwoPhaseCommit permission on the transactional id is the frontend's to check, as
            # KafkaApis checks it before the coordinator sees the request); the requested timeout
            # is ignored (a 2PC transaction is never timed out).
            if not self._cache.config.two_phase_commit_enable:
                return InitProducerIdResult(E.transactional_id_authorization_failed)
            timeout_ms = -1
        elif not 0 < timeout_ms <= self._cache.config.max_timeout_ms:
            return InitProducerIdResult(E.invalid_transaction_timeout)
        if (err := self._cache.gate()) is not None:
            return InitProducerIdResult(err)
        expected = (pid, epoch) if pid != NO_PRODUCER_ID else None
        md = self._cache.txns.get(tid)
        now = self._cache.now()
        if md is None:
            new_pid = self._cache.new_producer_id()
            if new_pid is None:
                return InitProducerIdResult(E.coordinator_not_available)
            # Not cached until the first record is written (Kafka caches it at once with epoch
            # -1; a failed append then leaves that behind, harmless either way).
            md = TransactionMetadata(tid, new_pid, NO_PRODUCER_EPOCH, timeout_ms, S.Empty,
                                     txn_last_update_ms=now)
        if md.pending_state is not None:
            return InitProducerIdResult(E.concurrent_transactions)
        if keep_prepared and md.state == S.Ongoing:
            return self._keep_prepared(md, expected, timeout_ms)   # KIP-939: kept, not aborted
        if expected is not None and not self._valid_expected_producer(md, *expected):
            return InitProducerIdResult(E.producer_fenced)
        if md.state.is_prepare:
            # Never changes the decided outcome (KIP-98): wait for Complete*.
            return InitProducerIdResult(E.concurrent_transactions)
        if md.state == S.Ongoing:
            # Fence the current producer and abort its transaction with the bumped epoch; that
            # epoch is never returned: the client retries, and gets a second bump (Kafka).
            err = self._fence_and_abort(md)
            return InitProducerIdResult(E.concurrent_transactions if err == E.none else err)
        if md.state not in (S.Empty, S.CompleteCommit, S.CompleteAbort):
            return InitProducerIdResult(E.invalid_txn_state)        # Dead / PrepareEpochFence: never cached
        new = md.copy()
        new.transition(S.Empty)
        if md.is_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch):
            # KIP-890: a new producer id with epoch 0 instead of wrapping the epoch.
            new_pid = self._cache.new_producer_id()
            if new_pid is None:
                return InitProducerIdResult(E.coordinator_not_available)
            new.producer_id, new.producer_epoch = new_pid, 0
            new.last_producer_epoch = md.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        elif expected is None:
            new.producer_epoch = md.producer_epoch + 1        # -1 -> 0 for a new id
            new.last_producer_epoch = NO_PRODUCER_EPOCH
        elif md.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == md.producer_epoch:
            # KIP-360: the producer continues after an error; remember the epoch it had.
            new.producer_epoch = md.producer_epoch + 1
            new.last_producer_epoch = md.producer_epoch
        elif expected[1] == md.last_producer_epoch:
            pass    # a retry of a bump whose answer was lost: same epoch again
        else:
            return InitProducerIdResult(E.producer_fenced)
        if new.producer_id != md.producer_id:
            # a rotation: remember the old id so that its retry is recognised (isValidProducerId)
            new.prev_producer_id = md.producer_id
        elif md.producer_epoch == NO_PRODUCER_EPOCH:
            new.prev_producer_id = NO_PRODUCER_ID             # a new transactional id (KIP-939)
        new.next_producer_id = NO_PRODUCER_ID
        new.next_producer_epoch = NO_PRODUCER_EPOCH
        new.txn_timeout_ms = timeout_ms
        new.partitions = set()
        new.txn_start_ms = -1
        new.txn_last_update_ms = now
        new.client_txn_version = TV_0
        err = self._cache.persist(new)                        # logged before the reply (KIP-98)
        if err != E.none:
            return InitProducerIdResult(err)
        return InitProducerIdResult(E.none, new.producer_id, new.producer_epoch)

    def _keep_prepared(self, md: TransactionMetadata, expected: tuple[int, int] | None,
                       timeout_ms: int) -> InitProducerIdResult:
        """KIP-939 InitProducerId(keepPreparedTxn=true) on an Ongoing transaction: it stays open
        with its producer id and epoch (what the client's PreparedTxnState holds, and what the
        markers will carry, bumped by one), and the caller gets a *next* pair that fences every
        earlier incarnation: the first call takes the ongoing epoch + 1 (a new producer id with
        epoch 0 when the ongoing epoch is MAX-1, because MAX is kept for the markers), each
        repeated call (a client in a crash loop) bumps the next epoch again, with a new producer
        id once it would pass MAX (KIP-939's crash-loop example). Both pairs are persisted before
        the reply (NextProducerId/NextProducerEpoch in the log). From now on only EndTxn with the
        next pair is allowed (``kept_guard``); the writers of its partitions are told to fence
        the earlier incarnations (the marker channel's KIP-939 fences)."""
        kept = md.next_producer_id != NO_PRODUCER_ID
        if expected is not None:
            if kept:
                ok = expected == (md.next_producer_id, md.next_producer_epoch)
            else:
                ok = expected == (md.producer_id, md.producer_epoch)
            if not ok:
                return InitProducerIdResult(E.producer_fenced)
        if not kept:
            base_pid, base_epoch, exhausted = md.producer_id, md.producer_epoch, md.is_epoch_exhausted
        else:
            base_pid, base_epoch = md.next_producer_id, md.next_producer_epoch
            exhausted = base_epoch >= MAX_EPOCH
        if exhausted:
            next_pid = self._cache.new_producer_id()
            if next_pid is None:
                return InitProducerIdResult(E.coordinator_not_available)
            next_epoch = 0
        else:
            next_pid, next_epoch = base_pid, base_epoch + 1
        new = md.copy()
        new.transition(S.Ongoing)
        new.next_producer_id, new.next_producer_epoch = next_pid, next_epoch
        new.txn_timeout_ms = timeout_ms                      # -1 with Enable2Pc: never timed out
        new.txn_last_update_ms = self._cache.now()
        err = self._cache.persist(new)
        if err != E.none:
            return InitProducerIdResult(err)
        self._markers.kept_changed()
        log.info("transactional id %r: prepared transaction of producer %d epoch %d kept; "
                 "next producer %d epoch %d", md.transactional_id, md.producer_id,
                 md.producer_epoch, next_pid, next_epoch)
        return InitProducerIdResult(E.none, next_pid, next_epoch, md.producer_id, md.producer_epoch)

    @staticmethod
    def _valid_expected_producer(md: TransactionMetadata, pid: int, epoch: int) -> bool:
        # Kafka's isValidProducerId: a fresh id, the current id, or the previous id with an
        # exhausted epoch (a retry after a rotation whose answer was lost).
        return (md.producer_epoch == NO_PRODUCER_EPOCH or pid == md.producer_id
                or (pid == md.prev_producer_id and is_epoch_exhausted(epoch)))


def kept_guard(md: TransactionMetadata, pid: int, epoch: int) -> ErrorCode | None:
    """For a transaction kept by InitProducerId(keepPreparedTxn) (Ongoing with a next pair):
    the caller may only commit or abort it (INVALID_TXN_STATE for anything else with the
    next pair), and the earlier incarnation, which still holds the ongoing pair, is fenced.
    None when the transaction is not kept."""
    if md.state != S.Ongoing or md.next_producer_id == NO_PRODUCER_ID:
        return None
    if (pid, epoch) == (md.next_producer_id, md.next_producer_epoch):
        return E.invalid_txn_state
    if pid in (md.producer_id, md.next_producer_id):
        return E.producer_fenced
    return E.invalid_producer_id_mapping


def kept_retry(md: TransactionMetadata, pid: int, epoch: int) -> bool:
    """A retried EndTxn, sent with the next pair, of a kept transaction now in Prepare*:
    PrevProducerId holds the id the client sent; its epoch follows from the pair for the
    next transaction (TV2: one more, or a new id when it was exhausted; TV0: the same)."""
    if md.next_producer_id == NO_PRODUCER_ID or pid != md.prev_producer_id:
        return False
    if md.client_txn_version < TV_2:
        return (pid, epoch) == (md.next_producer_id, md.next_producer_epoch)
    if md.next_producer_id == pid:
        return epoch + 1 == md.next_producer_epoch
    return is_epoch_exhausted(epoch)
