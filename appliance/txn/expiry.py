"""The transaction coordinator's timers: transaction timeouts, re-driving Prepare*, and
transactional-id expiration.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, sans-IO: the
``TransactionCoordinator`` creates a ``TxnExpiry`` and delegates ``tick`` to it, which the worker
calls every turn. Owns when each scan is next due; the transaction metadata it reads and replaces
through the ``TxnMetadataCache`` it is given, aborting through ``fence_and_abort`` and re-sending
markers through ``start_markers`` (both ``EndTxnHandler``'s). Behaviour is Kafka's:
abortTimedOutTransactions every ``transactions.abort_timed_out_interval_ms`` (the producer is
fenced by an epoch bump and its transaction aborted), the same scan re-sends the markers of a
Prepare* transaction without a marker job (after loading, or after its job was abandoned), and
removeExpiredTransactionalIds every ``remove_expired_interval_ms``.
"""

from __future__ import annotations

import logging
from typing import Callable

from appliance.errors import ErrorCode
from appliance.txn.marker_channel import TransactionMarkerChannelManager
from appliance.txn.metadata import IllegalTransition, TransactionMetadata, TransactionState
from appliance.txn.metadata_cache import TxnMetadataCache
from appliance.txn.state_manager import TxnLogWriteError

__all__ = ["TxnExpiry", "REMOVE_EXPIRED_INTERVAL_MS"]

log = logging.getLogger("appliance.txn.coordinator")

S = TransactionState
REMOVE_EXPIRED_INTERVAL_MS = 3600000   # transaction.remove.expired.transaction.cleanup.interval.ms


class TxnExpiry:
    """The timers over the coordinator's ``TxnMetadataCache``."""

    def __init__(self, cache: TxnMetadataCache, markers: TransactionMarkerChannelManager, *,
                 fence_and_abort: Callable[[TransactionMetadata], ErrorCode],
                 start_markers: Callable[[TransactionMetadata], None],
                 remove_expired_interval_ms: int = REMOVE_EXPIRED_INTERVAL_MS) -> None:
        self._cache = cache
        self._markers = markers
        self._fence_and_abort = fence_and_abort
        self._start_markers = start_markers
        self.remove_expired_interval_ms = remove_expired_interval_ms
        now = cache.now()
        # Kafka schedules both scans with an initial delay of one interval.
        self._next_abort_scan = now + cache.config.abort_timed_out_interval_ms
        self._next_expire_scan = now + remove_expired_interval_ms

    def tick(self, now_ms: int | None = None) -> None:
        """Timers: retry failed Complete* appends; every abort_timed_out_interval_ms abort
        timed-out transactions and re-drive Prepare* without a job; every
        remove_expired_interval_ms expire idle transactional ids."""
        if self._cache.gate() is not None:
            return
        now = self._cache.now() if now_ms is None else now_ms
        self._markers.retry_completions()
        if now >= self._next_abort_scan:
            self._next_abort_scan = now + self._cache.config.abort_timed_out_interval_ms
            self._abort_timed_out(now)
            self._redrive_prepared()
        if now >= self._next_expire_scan:
            self._next_expire_scan = now + self.remove_expired_interval_ms
            self._expire(now)

    def _abort_timed_out(self, now: int) -> None:
        for md in list(self._cache.txns.values()):
            # Kafka's timedOutTransactions: Ongoing, no pending transition, start + timeout < now
            # (from the transaction's start, as Kafka counts it); timeout -1 (a KIP-939 2PC
            # transaction) never times out.
            if (md.state == S.Ongoing and md.pending_state is None and md.txn_timeout_ms >= 0
                    and md.txn_start_ms + md.txn_timeout_ms < now):
                log.info("transaction of %r (producer %d epoch %d) timed out; aborting",
                         md.transactional_id, md.producer_id, md.producer_epoch)
                try:
                    if self._fence_and_abort(md) == ErrorCode.none:
                        self._cache.stats["timedout_aborts"] += 1
                except IllegalTransition as e:
                    log.error("%s", e)

    def _redrive_prepared(self) -> None:
        for md in list(self._cache.txns.values()):
            if md.state.is_prepare and not self._markers.has_job(md.transactional_id):
                self._start_markers(md)

    def _expire(self, now: int) -> None:
        """Transactional-id expiration (Kafka's TransactionStateManager expiration): only
        Empty/Complete* ids idle for transactional.id.expiration.ms, never Ongoing or Prepare*; a
        tombstone, then removal."""
        limit = now - self._cache.config.id_expiration_ms
        doomed = [md for md in self._cache.txns.values()
                  if md.state.is_expiration_allowed and md.pending_state is None
                  and md.txn_last_update_ms <= limit]
        ids = []
        for md in doomed:
            try:
                md.copy().transition(S.Dead)                 # checked against the table
            except IllegalTransition as e:
                log.error("%s", e)
                continue
            ids.append(md.transactional_id)
        if not ids:
            return
        try:
            self._cache.sm.append_tombstones(ids)            # one fdatasync for all of them
        except TxnLogWriteError as e:
            # Kafka: the ids stay; the next scan tries again.
            log.error("tombstones for %d expired transactional ids failed: %s", len(ids), e)
            if e.maybe_written:
                self._cache.broken = True
            return
        for tid in ids:
            del self._cache.txns[tid]
        log.info("%d transactional ids expired", len(ids))
