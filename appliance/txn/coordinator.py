"""The transaction coordinator's request logic (Kafka's TransactionCoordinator), sans-IO.

Runs inside the coordinator worker (``workers/coordinator.py``), which owns the rings, sockets and
timers; this class and its collaborators decide, over the transaction metadata of every
transactional id (held by ``TxnMetadataCache``). It is single-threaded and every method returns
at once: a state change is appended to the transaction log (``TransactionStateManager.append``,
durable per the flush policy) before the method returns, so a reply built from the return value
is always backed by the log. Nothing here raises into the worker loop: illegal transitions answer
INVALID_TXN_STATE, log failures answer an error code.

Behaviour is Kafka's (core/.../coordinator/transaction/, late-2024 trunk), KafkaApis for the
version-dependent error codes (PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH for InitProducerId
< v4 and AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < v2), and KIP-98, KIP-890 and KIP-939 where
Kafka leaves a choice. Departures are marked "(ours)".

Copy-on-write: every change builds a new ``TransactionMetadata`` from a copy, checks each state
step against the transition table, appends it, and only then replaces the cached object
(``TxnMetadataCache.persist``). A failed append leaves memory as it was, so Kafka's
``hasFailedEpochFence`` bookkeeping is not needed.

Split by concern: one state object and collaborators that are handed it (as Kafka's
TransactionCoordinator works around its TransactionStateManager):

- ``metadata_cache``: ``TxnMetadataCache``, the state: the metadata of every transactional id,
  the copy-on-write log append, the gate every request passes (loaded / fenced / broken), the
  producer-id source, the configuration, the clock and the counters;
- here: ``TransactionCoordinator``, which composes the collaborators and keeps the life cycle
  (load), AddPartitionsToTxn, AddOffsetsToTxn, KIP-890 verification, the KIP-939 fences and the
  admin queries (``admin``), and delegates the rest;
- ``init_producer_id``: ``InitProducerIdHandler``, InitProducerId with KIP-939's keepPreparedTxn;
- ``end_txn``: ``EndTxnHandler``, EndTxn, Prepare*, CompleteCommit/CompleteAbort once the
  markers are written, and the coordinator's own fence-and-abort; it creates the marker channel
  (``marker_channel``: Kafka's TransactionMarkerChannelManager), exposed here as ``markers``;
- ``expiry``: ``TxnExpiry``, the timers (``tick``: transaction timeouts, Prepare* re-driven,
  transactional-id expiration).

Where collaborators need each other (InitProducerId and the timers abort through EndTxn, the
marker channel completes through EndTxn) they get the reference or callable at construction.

The worker must call ``tick(now)`` regularly (each loop turn is fine: the scans rate-limit
themselves), drive ``markers`` (``send_marker_jobs``, ``check``, ``send_fences``), and stop (exit,
to be restarted with a new coordinator epoch) when ``needs_restart`` is true. The answers are the
ring result types of ``appliance.txn.messages``; ``appliance.txn.service`` serves the requests.
"""

from __future__ import annotations

import collections
import logging
from typing import Callable, Iterable, Sequence

from appliance.catalog.model import OFFSETS_TOPIC
from appliance.config import FlushPolicy, TransactionsConfig
from appliance.errors import ErrorCode
from appliance.txn import admin
from appliance.txn.end_txn import EndTxnHandler
from appliance.txn.expiry import REMOVE_EXPIRED_INTERVAL_MS, TxnExpiry
from appliance.txn.init_producer_id import InitProducerIdHandler, kept_guard
from appliance.txn.marker_channel import TransactionMarkerChannelManager
from appliance.txn.messages import (EndTxnResult, InitProducerIdResult, ListTransactionsResult,
                                    TxnDescription, fenced_for)
from appliance.txn.metadata import (MAX_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0, TV_2,
                                    IllegalTransition, TransactionMetadata, TransactionState)
from appliance.txn.metadata_cache import TxnMetadataCache
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager

__all__ = ["TransactionCoordinator", "partition_for", "java_string_hash", "OFFSETS_TOPIC_PARTITIONS"]

log = logging.getLogger("appliance.txn.coordinator")

E = ErrorCode
S = TransactionState
OFFSETS_TOPIC_PARTITIONS = 50          # offsets.topic.num.partitions default

Partition = tuple[str, int]


# -- group -> offsets partition (Kafka's partitionFor) --------------------------------------------

def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, in int32 arithmetic."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """Kafka's GroupCoordinator.partitionFor: Utils.abs(groupId.hashCode) % partitions, where
    Utils.abs maps Integer.MIN_VALUE to 0."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class TransactionCoordinator:
    """The transaction coordinator of this node: composes the collaborators around one
    ``TxnMetadataCache`` and is the single entry point of the worker and the services."""

    def __init__(self, state_manager: TransactionStateManager, producer_ids: ProducerIdManager,
                 tx_config: TransactionsConfig, coordinator_epoch: int,
                 now_ms: Callable[[], int], *, marker_retry_backoff_ms: int = 100,
                 remove_expired_interval_ms: int = REMOVE_EXPIRED_INTERVAL_MS,
                 offsets_topic_partitions: int = OFFSETS_TOPIC_PARTITIONS) -> None:
        self._cache = cache = TxnMetadataCache(state_manager, producer_ids, tx_config,
                                               coordinator_epoch, now_ms)
        self.offsets_topic_partitions = offsets_topic_partitions
        self._end_txn = EndTxnHandler(cache, kept_fences=self.kept_fences,
                                      marker_retry_backoff_ms=marker_retry_backoff_ms)
        self.markers: TransactionMarkerChannelManager = self._end_txn.markers
        self._init_producer_id = InitProducerIdHandler(
            cache, self.markers, fence_and_abort=self._end_txn.fence_and_abort)
        self._expiry = TxnExpiry(cache, self.markers, fence_and_abort=self._end_txn.fence_and_abort,
                                 start_markers=self._end_txn.start_markers,
                                 remove_expired_interval_ms=remove_expired_interval_ms)

    # -- the shared state, as the worker and the services read it ---------------------------------
    @property
    def config(self) -> TransactionsConfig:
        return self._cache.config

    @property
    def coordinator_epoch(self) -> int:
        return self._cache.coordinator_epoch

    @property
    def stats(self) -> collections.Counter:
        """Transactions completed ("commits", "aborts") and aborted by the timeout scan
        ("timedout_aborts"), since this coordinator started (for the metrics)."""
        return self._cache.stats

    # -- life cycle -----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._cache.loaded

    @property
    def needs_restart(self) -> bool:
        """True once a writer reported TRANSACTION_COORDINATOR_FENCED (a newer coordinator
        exists) or a log write may have landed although it failed (memory and log may differ):
        the worker should exit so that a restart reloads from the log under a new epoch."""
        return self._cache.fenced or self._cache.broken

    def load(self) -> None:
        """Replay the transaction log. Prepare* transactions get their markers sent again;
        Ongoing ones keep their start time, so their timeout still runs (Kafka's coordinator
        startup)."""
        if self._cache.loaded:
            return
        self._cache.load()
        for md in list(self._cache.txns.values()):
            if md.state.is_prepare:
                self._end_txn.start_markers(md)
        log.info("transaction coordinator loaded %d transactional ids at coordinator epoch %d",
                 len(self._cache.txns), self.coordinator_epoch)

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self._cache.txns.get(transactional_id)

    # -- delegated to the collaborators -----------------------------------------------------------
    def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                         *, api_version: int = 0, enable_2pc: bool = False,
                         keep_prepared_txn: bool = False) -> InitProducerIdResult:
        """InitProducerId (``InitProducerIdHandler.init_producer_id``)."""
        return self._init_producer_id.init_producer_id(
            transactional_id, timeout_ms, producer_id, producer_epoch, api_version=api_version,
            enable_2pc=enable_2pc, keep_prepared_txn=keep_prepared_txn)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                *, api_version: int = 0) -> EndTxnResult:
        """EndTxn (``EndTxnHandler.end_txn``)."""
        return self._end_txn.end_txn(transactional_id, producer_id, producer_epoch, commit,
                                     api_version=api_version)

    def tick(self, now_ms: int | None = None) -> None:
        """The timers (``TxnExpiry.tick``); the worker calls it every turn."""
        self._expiry.tick(now_ms)

    # -- AddPartitionsToTxn / AddOffsetsToTxn / verification --------------------------------------
    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[Partition], *, api_version: int = 0) -> dict[Partition, ErrorCode]:
        """AddPartitionsToTxn (client form). Kafka answers one error for the whole request, so
        every partition gets the same code (OPERATION_NOT_ATTEMPTED only arises in KafkaApis,
        for unknown or unauthorized topics, before the coordinator is asked)."""
        parts = list(partitions)
        err = fenced_for(api_version, 2, self._add(transactional_id, producer_id, producer_epoch,
                                                     parts, TV_0))
        return {p: err for p in parts}

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str, *, api_version: int = 0) -> ErrorCode:
        """AddOffsetsToTxn: adds ``__consumer_offsets[partitionFor(group)]``; starts the
        transaction when there is none (as Kafka does: clients may send offsets first)."""
        part = (OFFSETS_TOPIC, partition_for(group_id, self.offsets_topic_partitions))
        return fenced_for(api_version, 2, self._add(transactional_id, producer_id, producer_epoch,
                                                      [part], TV_0))

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         partition: Partition, *, add: bool, raw: bool = False) -> ErrorCode:
        """KIP-890 for a partition writer, and AddPartitionsToTxn v4+ VerifyOnly. ``add=False``
        (part 1, old clients): NONE only when the transaction is Ongoing with this producer id
        and epoch and already holds the partition; never changes state. ``add=True`` (part 2):
        add the partition as AddPartitionsToTxn would.

        ``raw=True`` answers the coordinator's own codes (Kafka's
        handleVerifyPartitionsInTransaction, which KafkaApis passes through unchanged at
        AddPartitionsToTxn v4 and v5): a stale epoch is PRODUCER_FENCED, a partition not in the
        transaction TRANSACTION_ABORTABLE (the one place Kafka's transaction coordinator writes
        that code). Otherwise the codes are the ones Kafka's broker passes on to its writers
        after the AddPartitionsToTxnManager mapping: INVALID_PRODUCER_EPOCH, and
        INVALID_TXN_STATE (which Produce v11+ and TxnOffsetCommit v4+ turn back into
        TRANSACTION_ABORTABLE by request version: ``abortable_for``)."""
        try:
            if add:
                err = self._add(transactional_id, producer_id, producer_epoch, [partition], TV_2)
            else:
                err = self._verify(transactional_id, producer_id, producer_epoch, partition)
        except IllegalTransition as e:
            log.warning("%s", e)
            err = E.invalid_txn_state
        if raw:
            return err
        if err == E.transaction_abortable:
            return E.invalid_txn_state
        return E.invalid_producer_epoch if err == E.producer_fenced else err

    def _verify(self, tid: str, pid: int, epoch: int, partition: Partition) -> ErrorCode:
        if not tid:
            return E.invalid_request
        if (err := self._cache.gate()) is not None:
            return err
        md = self._cache.txns.get(tid)
        if md is not None and (kept := kept_guard(md, pid, epoch)) is not None:
            return kept
        if md is None or md.producer_id != pid:
            return E.invalid_producer_id_mapping
        if md.producer_epoch != epoch:
            return E.producer_fenced
        if md.state.is_prepare:
            return E.concurrent_transactions
        if md.state == S.Ongoing and partition in md.partitions:
            return E.none
        return E.transaction_abortable                       # Kafka: not in the transaction

    def _add(self, tid: str, pid: int, epoch: int, parts: Sequence[Partition], tv: int) -> ErrorCode:
        try:
            return self._add_inner(tid, pid, epoch, parts, tv)
        except IllegalTransition as e:
            log.warning("%s", e)
            return E.invalid_txn_state

    def _add_inner(self, tid: str, pid: int, epoch: int, parts: Sequence[Partition], tv: int) -> ErrorCode:
        if not tid:
            return E.invalid_request
        if (err := self._cache.gate()) is not None:
            return err
        md = self._cache.txns.get(tid)
        if md is None:
            return E.invalid_producer_id_mapping             # unknown, or expired (KIP-98)
        if (kept := kept_guard(md, pid, epoch)) is not None:
            return kept                                      # KIP-939: commit or abort only
        if md.producer_id != pid:
            if md.state.is_prepare and md.next_producer_id == pid:
                # (ours) A TV2 client that got (new id, 0) from an overflowing EndTxn starts its
                # next transaction while the markers of the last one are still being written.
                # Kafka would say INVALID_PRODUCER_ID_MAPPING (fatal); this is a retriable wait.
                return E.concurrent_transactions
            return E.invalid_producer_id_mapping
        if md.producer_epoch != epoch:
            return E.producer_fenced
        if md.pending_state is not None or md.state.is_prepare:
            return E.concurrent_transactions                 # retriable, as Kafka answers
        wanted = set(parts)
        if md.state == S.Ongoing and wanted <= md.partitions:
            return E.none                                    # nothing new: no log write
        now = self._cache.now()
        new = md.copy()
        new.transition(S.Ongoing)
        if md.state != S.Ongoing:
            new.txn_start_ms = now                           # the timeout runs from here (Kafka)
        new.partitions |= wanted
        new.txn_last_update_ms = now
        new.client_txn_version = tv
        return self._cache.persist(new)                      # logged before the reply (KIP-98)

    # -- KIP-939 fences ---------------------------------------------------------------------------
    def kept_fences(self) -> list[tuple[int, int, list[Partition]]]:
        """(producer id, lowest epoch allowed, partitions) for every transaction kept by
        InitProducerId(keepPreparedTxn): the marker channel tells each partition's writer to refuse the
        data batches of earlier incarnations, which still hold the ongoing pair (ours; KIP-939
        alone fences them only when the markers land). The channel sends these again to a writer
        that restarted (the fence lives in the writer's memory)."""
        return [(md.producer_id, md.producer_epoch + 1, sorted(md.partitions))
                for md in self._cache.txns.values()
                if md.state == S.Ongoing and md.next_producer_id != NO_PRODUCER_ID
                and md.producer_epoch < MAX_EPOCH]


    # -- admin ------------------------------------------------------------------------------------
    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = -1,
                          transactional_id_pattern: str | None = None) -> ListTransactionsResult:
        """ListTransactions v0-2 (see ``admin.list_transactions``)."""
        if (err := self._cache.gate()) is not None:
            return ListTransactionsResult(err, [], [])
        return admin.list_transactions(self._cache.txns.values(), self._cache.now(), state_filters,
                                       producer_id_filters, duration_filter_ms, transactional_id_pattern)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        """DescribeTransactions v0 (see ``admin.describe_transactions``)."""
        return admin.describe_transactions(self._cache.txns, transactional_ids, self._cache.gate())

    def reconfigure(self, tx_config: TransactionsConfig, flush_policy) -> None:
        """A configuration reload: the new ``[transactions]`` section and flush policy."""
        self._cache.config = tx_config
        self._cache.sm.flush_policy = FlushPolicy(flush_policy)

    def state_counts(self) -> collections.Counter:
        """Transactional ids by the (Kafka) name of their transaction's state."""
        return collections.Counter(md.state.name for md in self._cache.txns.values())

    def active_transaction_open_time_max_ms(self) -> int:
        """KIP-939 metric ActiveTransactionOpenTimeMaxMs (see ``admin``)."""
        return admin.active_transaction_open_time_max_ms(self._cache.txns.values(), self._cache.now())
