"""The transaction coordinator's timers: transaction timeouts, re-driving Prepare*, and
transactional-id expiration.

Part of ``appliance.txn.coordinator.TransactionCoordinator`` (a mixin, split out by concern; it
runs in the coordinator worker like the rest and shares its state). ``tick`` is what the worker
calls every turn. Behaviour is Kafka's: abortTimedOutTransactions every
``transactions.abort_timed_out_interval_ms`` (the producer is fenced by an epoch bump and its
transaction aborted), the same scan re-sends the markers of a Prepare* transaction without a
marker job (after loading, or after its job was abandoned), and
removeExpiredTransactionalIds every ``remove_expired_interval_ms``.
"""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

from appliance.errors import ErrorCode
from appliance.txn.metadata import IllegalTransition, TransactionMetadata, TransactionState
from appliance.txn.state_manager import TxnLogWriteError

if TYPE_CHECKING:
    from appliance.config import TransactionsConfig
    from appliance.txn.marker_channel import TransactionMarkerChannelManager
    from appliance.txn.state_manager import TransactionStateManager

__all__ = ["TxnExpiry"]

log = logging.getLogger("appliance.txn.coordinator")

S = TransactionState


class TxnExpiry:
    """The timers; mixed into TransactionCoordinator."""

    _txns: dict[str, TransactionMetadata]
    _sm: TransactionStateManager
    _broken: bool
    _next_abort_scan: int
    _next_expire_scan: int
    config: TransactionsConfig
    markers: TransactionMarkerChannelManager
    remove_expired_interval_ms: int
    stats: collections.Counter

    if TYPE_CHECKING:
        def _now(self) -> int: ...
        def _gate(self) -> ErrorCode | None: ...
        def _fence_and_abort(self, md: TransactionMetadata) -> ErrorCode: ...
        def _start_markers(self, md: TransactionMetadata) -> None: ...

    def tick(self, now_ms: int | None = None) -> None:
        """Timers: retry failed Complete* appends; every abort_timed_out_interval_ms abort
        timed-out transactions and re-drive Prepare* without a job; every
        remove_expired_interval_ms expire idle transactional ids."""
        if self._gate() is not None:
            return
        now = self._now() if now_ms is None else now_ms
        self.markers.retry_completions()
        if now >= self._next_abort_scan:
            self._next_abort_scan = now + self.config.abort_timed_out_interval_ms
            self._abort_timed_out(now)
            self._redrive_prepared()
        if now >= self._next_expire_scan:
            self._next_expire_scan = now + self.remove_expired_interval_ms
            self._expire(now)

    def _abort_timed_out(self, now: int) -> None:
        for md in list(self._txns.values()):
            # Kafka's timedOutTransactions: Ongoing, no pending transition, start + timeout < now
            # (from the transaction's start, as Kafka counts it); timeout -1 (a KIP-939 2PC
            # transaction) never times out.
            if (md.state == S.Ongoing and md.pending_state is None and md.txn_timeout_ms >= 0
                    and md.txn_start_ms + md.txn_timeout_ms < now):
                log.info("transaction of %r (producer %d epoch %d) timed out; aborting",
                         md.transactional_id, md.producer_id, md.producer_epoch)
                try:
                    if self._fence_and_abort(md) == ErrorCode.none:
                        self.stats["timedout_aborts"] += 1
                except IllegalTransition as e:
                    log.error("%s", e)

    def _redrive_prepared(self) -> None:
        for md in list(self._txns.values()):
            if md.state.is_prepare and not self.markers.has_job(md.transactional_id):
                self._start_markers(md)

    def _expire(self, now: int) -> None:
        """Transactional-id expiration (Kafka's TransactionStateManager expiration): only
        Empty/Complete* ids idle for transactional.id.expiration.ms, never Ongoing or Prepare*; a
        tombstone, then removal."""
        limit = now - self.config.id_expiration_ms
        doomed = [md for md in self._txns.values()
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
            self._sm.append_tombstones(ids)                  # one fdatasync for all of them
        except TxnLogWriteError as e:
            # Kafka: the ids stay; the next scan tries again.
            log.error("tombstones for %d expired transactional ids failed: %s", len(ids), e)
            if e.maybe_written:
                self._broken = True
            return
        for tid in ids:
            del self._txns[tid]
        log.info("%d transactional ids expired", len(ids))
