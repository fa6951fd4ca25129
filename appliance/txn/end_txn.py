"""EndTxn for the transaction coordinator, and the end of every transaction: Prepare*, then
CompleteCommit/CompleteAbort once the markers are written.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, sans-IO: the
``TransactionCoordinator`` creates an ``EndTxnHandler`` and delegates EndTxn to it. Owns the
marker channel (``markers``, a ``TransactionMarkerChannelManager``: it hands the channel its jobs
and the channel calls it back when they are done); the transaction metadata it reads and replaces
through the ``TxnMetadataCache`` it is given (copy-on-write, see ``appliance.txn.metadata_cache``).
Behaviour is Kafka's TransactionCoordinator.handleEndTransaction (with KIP-890's epoch bump on
every commit or abort for transaction version 2, and KIP-939's end of a kept transaction) and its
endTransaction completion: PrepareCommit/PrepareAbort is logged before any marker is sent
(``_begin_completion``), the markers go out through the channel (``start_markers``), and when
every partition has answered ``_complete`` logs CompleteCommit/CompleteAbort. ``fence_and_abort``
is the coordinator's own abort (InitProducerId over an Ongoing transaction, and the transaction
timeout).
"""

from __future__ import annotations

import logging
from typing import Callable

from appliance.errors import ErrorCode
from appliance.txn.init_producer_id import kept_guard, kept_retry
from appliance.txn.marker_channel import MarkerJob, Partition, TransactionMarkerChannelManager
from appliance.txn.messages import EndTxnResult, fenced_for
from appliance.txn.metadata import (MAX_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0, TV_2,
                                    IllegalTransition, TransactionMetadata, TransactionState,
                                    is_epoch_exhausted)
from appliance.txn.metadata_cache import TxnMetadataCache

__all__ = ["EndTxnHandler"]

log = logging.getLogger("appliance.txn.coordinator")

E = ErrorCode
S = TransactionState


class EndTxnHandler:
    """EndTxn and transaction completion over the coordinator's ``TxnMetadataCache``."""

    def __init__(self, cache: TxnMetadataCache, *,
                 kept_fences: Callable[[], list[tuple[int, int, list[Partition]]]],
                 marker_retry_backoff_ms: int = 100) -> None:
        """``kept_fences()``: the KIP-939 fences the marker channel sends
        (``TransactionCoordinator.kept_fences``)."""
        self._cache = cache
        self.markers = TransactionMarkerChannelManager(
            cache.now, on_complete=self._complete, on_abandoned=self._abandoned,
            on_fenced=cache.on_fenced, kept_fences=kept_fences,
            retry_backoff_ms=marker_retry_backoff_ms)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                *, api_version: int = 0) -> EndTxnResult:
        """EndTxn. v5+ is transaction version 2 (KafkaApis: version > 4): the epoch is bumped by
        every commit/abort and the answer carries the producer id and epoch to use next."""
        tv = TV_2 if api_version >= 5 else TV_0
        try:
            r = self._end_txn(transactional_id, producer_id, producer_epoch, commit, tv)
        except IllegalTransition as e:
            log.warning("%s", e)
            r = EndTxnResult(E.invalid_txn_state)
        if r.error != E.none:
            return EndTxnResult(fenced_for(api_version, 2, r.error))
        return r

    def _end_txn(self, tid: str, pid: int, epoch: int, commit: bool, tv: int) -> EndTxnResult:
        if not tid:
            return EndTxnResult(E.invalid_request)
        if (err := self._cache.gate()) is not None:
            return EndTxnResult(err)
        md = self._cache.txns.get(tid)
        if md is None:
            return EndTxnResult(E.invalid_producer_id_mapping)
        state = md.state
        if state == S.Ongoing and md.next_producer_id != NO_PRODUCER_ID:
            # KIP-939: a kept prepared transaction, finished with the next pair.
            if md.pending_state is not None:
                return EndTxnResult(E.concurrent_transactions)
            if (pid, epoch) == (md.next_producer_id, md.next_producer_epoch):
                return self._prepare_kept(md, commit, tv, pid, epoch)
            return EndTxnResult(kept_guard(md, pid, epoch) or E.producer_fenced)
        if state.is_prepare and kept_retry(md, pid, epoch):
            same = commit == (state == S.PrepareCommit)
            return EndTxnResult(E.concurrent_transactions if same else E.invalid_txn_state)
        tv2 = md.client_txn_version >= TV_2
        # TV2 retries (Kafka's endTransaction): the answer to an EndTxn was lost after the epoch
        # was bumped (retry_on_bump), or after it overflowed into a new producer id.
        retry_on_bump = tv2 and md.producer_epoch == epoch + 1
        # (MAX itself only after a kept 2PC transaction: KIP-939 may hand the client epoch MAX)
        retry_on_overflow = (tv2 and md.prev_producer_id == pid and is_epoch_exhausted(epoch)
                             and md.producer_epoch == 0)
        if tv2:
            if state.is_prepare:
                valid_epoch = retry_on_bump
            elif state.is_complete:
                valid_epoch = retry_on_bump or retry_on_overflow
            else:
                valid_epoch = epoch == md.producer_epoch
        else:
            valid_epoch = epoch == md.producer_epoch
        if md.producer_id != pid and not retry_on_overflow:
            if state.is_prepare and md.next_producer_id == pid:
                return EndTxnResult(E.concurrent_transactions)  # (ours), see coordinator._add_inner
            return EndTxnResult(E.invalid_producer_id_mapping)
        if not valid_epoch:
            return EndTxnResult(E.producer_fenced)
        if md.pending_state is not None:
            return EndTxnResult(E.concurrent_transactions)
        if state == S.Ongoing:
            return self._prepare(md, commit, tv)
        same = commit == (state in (S.PrepareCommit, S.CompleteCommit))
        if state.is_complete and same:
            # a retry after completion (KIP-98; under KIP-890 it answers the current pair)
            return EndTxnResult(E.none, md.producer_id, md.producer_epoch)
        if state.is_prepare and same:
            return EndTxnResult(E.concurrent_transactions)
        return EndTxnResult(E.invalid_txn_state)             # other command, or Empty (KIP-98)

    def _prepare(self, md: TransactionMetadata, commit: bool, tv: int) -> EndTxnResult:
        new = md.copy()
        new.transition(S.PrepareCommit if commit else S.PrepareAbort)
        new.next_producer_id = NO_PRODUCER_ID
        new.client_txn_version = tv
        new.txn_last_update_ms = self._cache.now()
        if tv >= TV_2:
            # KIP-890 (1): PREPARE carries epoch y+1 (markers too); on overflow a new producer id
            # is allocated now and becomes current at COMPLETE; markers keep (x, MAX).
            if md.is_epoch_exhausted:
                next_pid = self._cache.new_producer_id()
                if next_pid is None:
                    return EndTxnResult(E.coordinator_not_available)
                new.next_producer_id, new.next_producer_epoch = next_pid, 0
            new.last_producer_epoch = md.producer_epoch
            new.producer_epoch = min(md.producer_epoch + 1, MAX_EPOCH)
            new.prev_producer_id = md.producer_id
        err = self._begin_completion(new)
        if err != E.none:
            return EndTxnResult(err)
        if new.next_producer_id != NO_PRODUCER_ID:
            return EndTxnResult(E.none, new.next_producer_id, 0)
        return EndTxnResult(E.none, new.producer_id, new.producer_epoch)

    def _prepare_kept(self, md: TransactionMetadata, commit: bool, tv: int, pid: int,
                      epoch: int) -> EndTxnResult:
        """EndTxn of a kept (KIP-939) transaction, sent with the next pair (pid, epoch). The
        markers go out with the ongoing producer id and its epoch + 1; the next transaction uses
        the pair the client sent, plus one under TV2 (a new producer id when that epoch is
        exhausted); PrevProducerId keeps the id the client sent, for retries. Prepare* may thus
        hold three distinct producer ids (as in KIP-939's crash-loop example)."""
        new = md.copy()
        new.transition(S.PrepareCommit if commit else S.PrepareAbort)
        new.producer_epoch = min(md.producer_epoch + 1, MAX_EPOCH)
        new.prev_producer_id = pid
        new.last_producer_epoch = NO_PRODUCER_EPOCH
        if tv >= TV_2:
            if is_epoch_exhausted(epoch):
                next_pid = self._cache.new_producer_id()
                if next_pid is None:
                    return EndTxnResult(E.coordinator_not_available)
                new.next_producer_id, new.next_producer_epoch = next_pid, 0
            else:
                new.next_producer_id, new.next_producer_epoch = pid, epoch + 1
        else:
            new.next_producer_id, new.next_producer_epoch = pid, epoch
        new.client_txn_version = tv
        new.txn_last_update_ms = self._cache.now()
        err = self._begin_completion(new)
        if err != E.none:
            return EndTxnResult(err)
        return EndTxnResult(E.none, new.next_producer_id, new.next_producer_epoch)

    def fence_and_abort(self, md: TransactionMetadata) -> ErrorCode:
        """Bump the epoch (PrepareEpochFence, in memory only) and abort with it (PrepareAbort)
        (KIP-98: InitProducerId over an Ongoing transaction, and the transaction timeout). One
        bump: the fence epoch is what the markers carry. The record is
        written with client transaction version 0 (ours): the abort is the coordinator's, not a
        TV2 client's, so a retried EndTxn from the fenced producer is judged by strict epoch
        equality and fenced (KIP-98: a timed-out producer is fenced), never taken for a TV2 retry
        of epoch+1. (Kafka's
        late-2024 code applies the server's TV here, bumping twice when TV2 is enabled.)"""
        new = md.copy()
        new.transition(S.PrepareEpochFence)
        top = md.producer_epoch
        if md.next_producer_id == md.producer_id:
            # KIP-939 force-terminate of a kept transaction: also fence the holder of the next
            # pair (same producer id, a higher epoch).
            top = max(top, md.next_producer_epoch)
        if top < MAX_EPOCH:
            new.producer_epoch = top + 1
        else:
            new.producer_epoch = MAX_EPOCH
        # (an Ongoing transaction at MAX cannot come from a real client; abort at MAX)
        new.last_producer_epoch = NO_PRODUCER_EPOCH
        new.transition(S.PrepareAbort)
        new.next_producer_id = NO_PRODUCER_ID
        new.next_producer_epoch = NO_PRODUCER_EPOCH
        new.client_txn_version = TV_0
        new.txn_last_update_ms = self._cache.now()
        return self._begin_completion(new)

    def _begin_completion(self, new: TransactionMetadata) -> ErrorCode:
        err = self._cache.persist(new)                       # durable before any marker (KIP-98)
        if err == E.none:
            self.start_markers(new)
        return err

    # -- completion -------------------------------------------------------------------------------
    def start_markers(self, md: TransactionMetadata) -> None:
        commit = md.state == S.PrepareCommit
        md.pending_state = S.CompleteCommit if commit else S.CompleteAbort
        self.markers.add_job(md.transactional_id, md.producer_id, md.producer_epoch, commit,
                             self._cache.coordinator_epoch, md.partitions)

    def _complete(self, job: MarkerJob) -> bool:
        """Every marker is written: log CompleteCommit/CompleteAbort (KIP-98: only after every
        marker is acknowledged). False when the append failed (the marker channel retries)."""
        md = self._cache.txns.get(job.transactional_id)
        if md is None or not md.state.is_prepare or md.producer_id != job.producer_id:
            return True
        new = md.copy()
        new.pending_state = None
        try:
            new.transition(S.CompleteCommit if job.commit else S.CompleteAbort)
        except IllegalTransition as e:
            log.error("%s", e)
            return True
        if md.client_txn_version >= TV_2:
            new.last_producer_epoch = md.producer_epoch      # Prepare set PrevProducerId
        if md.next_producer_id != NO_PRODUCER_ID:
            # KIP-890 overflow: the new producer id becomes current with epoch 0 (COMPLETE);
            # KIP-939 kept transaction: the pair for the next transaction becomes current.
            new.producer_id = md.next_producer_id
            new.producer_epoch = max(md.next_producer_epoch, 0)
        new.next_producer_id = NO_PRODUCER_ID
        new.next_producer_epoch = NO_PRODUCER_EPOCH
        new.partitions = set()
        new.txn_last_update_ms = self._cache.now()
        if self._cache.persist(new) != E.none:
            return False
        self._cache.stats["commits" if job.commit else "aborts"] += 1
        return True

    def _abandoned(self, transactional_id: str) -> None:
        """The markers were refused with INVALID_PRODUCER_EPOCH: the transaction stays Prepare*
        and the periodic scan re-drives it."""
        md = self._cache.txns.get(transactional_id)
        if md is not None and md.state.is_prepare:
            md.pending_state = None
