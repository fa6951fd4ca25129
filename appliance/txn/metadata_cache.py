"""The transaction coordinator's state: the cached ``TransactionMetadata`` of every transactional
id, and what every request handler shares with it.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded; created by the
``TransactionCoordinator`` and handed to each of its collaborators (``InitProducerIdHandler``,
``EndTxnHandler``, ``TxnExpiry``), which read and replace metadata only through it. Owns: the
cache (Kafka's TransactionStateManager ``transactionMetadataCache``; here the log itself is
``appliance.txn.state_manager.TransactionStateManager``), the copy-on-write append (``persist``),
the gate every request passes (loaded / fenced by a newer coordinator / broken by a write that
may have landed), the producer-id source, the configuration, the coordinator epoch, the clock and
the counters for the metrics.

Copy-on-write: every change builds a new ``TransactionMetadata`` from a copy, checks each state
step against the transition table, appends it (``persist``), and only then replaces the cached
object. A failed append leaves memory as it was, so Kafka's ``hasFailedEpochFence`` bookkeeping
is not needed.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Callable

from appliance.config import TransactionsConfig
from appliance.durable import is_no_space
from appliance.errors import ErrorCode
from appliance.txn.metadata import TransactionMetadata
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, TxnLogWriteError

__all__ = ["TxnMetadataCache"]

log = logging.getLogger("appliance.txn.coordinator")

# A full coordinator dir fails every InitProducerId until space comes back: say so once in this
# long, not once a request.
NO_SPACE_LOG_INTERVAL_S = 10.0

E = ErrorCode


def _append_error(code: ErrorCode) -> ErrorCode:
    """Kafka's appendTransactionToLog mapping of a failed log append to a coordinator error: a
    full disk (KAFKA_STORAGE_ERROR) is NOT_COORDINATOR, which clients answer by looking the
    coordinator up again and retrying. As in Kafka, whose updateCacheCallback completes the
    transition only after a successful append, the cached metadata stays as it was (``persist``)."""
    if code in (E.kafka_storage_error, E.not_leader_or_follower):
        return E.not_coordinator
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas,
                E.not_enough_replicas_after_append, E.request_timed_out):
        return E.coordinator_not_available
    return E.unknown_server_error


class TxnMetadataCache:
    """The metadata of every transactional id, and the log append that replaces it."""

    def __init__(self, state_manager: TransactionStateManager, producer_ids: ProducerIdManager,
                 tx_config: TransactionsConfig, coordinator_epoch: int,
                 now_ms: Callable[[], int]) -> None:
        self.sm = state_manager
        self._pids = producer_ids
        self.config = tx_config                  # replaced by a configuration reload
        self.coordinator_epoch = coordinator_epoch
        self.now = now_ms
        self.txns: dict[str, TransactionMetadata] = {}
        # For the metrics: transactions completed ("commits", "aborts") and aborted by the
        # timeout scan ("timedout_aborts"), since this coordinator started.
        self.stats: collections.Counter = collections.Counter()
        self.loaded = False
        self.fenced = False                      # a writer reported TRANSACTION_COORDINATOR_FENCED
        self.broken = False                      # a failed log write may have landed
        self._no_space_said_at = float("-inf")

    def load(self) -> None:
        """Replay the transaction log into the cache."""
        self.txns = self.sm.load()
        self.loaded = True

    def on_fenced(self) -> None:
        self.fenced = True

    def gate(self) -> ErrorCode | None:
        if self.fenced or self.broken:
            return E.not_coordinator
        if not self.loaded:
            return E.coordinator_load_in_progress
        return None

    def persist(self, new: TransactionMetadata) -> ErrorCode:
        """Append ``new`` and make it the cached metadata; on failure memory is unchanged."""
        try:
            self.sm.append(new)
        except TxnLogWriteError as e:
            log.error("transaction log append for %r failed: %s", new.transactional_id, e)
            if e.maybe_written:
                self.broken = True
                return E.not_coordinator
            return _append_error(e.code)
        self.txns[new.transactional_id] = new
        return E.none

    def new_producer_id(self) -> int | None:
        """The next producer id, or None when its block cannot be reserved (the caller answers a
        retriable error). A full disk is an operating condition, not a fault of ours: a warning
        without a traceback, at most once in ``NO_SPACE_LOG_INTERVAL_S``."""
        try:
            return self._pids.next_id()
        except OSError as e:
            if not is_no_space(e):
                log.exception("producer id allocation failed")
                return None
            now = time.monotonic()
            if now >= self._no_space_said_at + NO_SPACE_LOG_INTERVAL_S:
                self._no_space_said_at = now
                log.warning("producer id allocation failed: no room for the producer-id block "
                            "in the coordinator dir (%s); InitProducerId answers "
                            "COORDINATOR_NOT_AVAILABLE until there is", e.strerror)
            return None
        except Exception:
            log.exception("producer id allocation failed")
            return None
