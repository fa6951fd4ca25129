"""The transaction coordinator's request logic (Kafka's TransactionCoordinator), sans-IO.

Runs inside the coordinator worker (``workers/coordinator.py``), which owns the rings, sockets and
timers; this class owns the transaction metadata of every transactional id and decides. It is
single-threaded and every method returns at once: a state change is appended to the transaction
log (``TransactionStateManager.append``, durable per the flush policy) before the method returns,
so a reply built from the return value is always backed by the log. Nothing here raises into the
worker loop: illegal transitions answer INVALID_TXN_STATE, log failures answer an error code.

Behaviour is Kafka's (core/.../coordinator/transaction/, late-2024 trunk), KafkaApis for the
version-dependent error codes (PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH for InitProducerId
< v4 and AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < v2), and KIP-98, KIP-890 and KIP-939 where
Kafka leaves a choice. Departures are marked "(ours)".

Copy-on-write: every change builds a new ``TransactionMetadata`` from a copy, checks each state
step against the transition table, appends it, and only then replaces the cached object. A failed
append leaves memory as it was, so Kafka's ``hasFailedEpochFence`` bookkeeping is not needed.

Split by concern (mixins sharing this object's state):

- here: life cycle (load, the gate every request passes, the log append), AddPartitionsToTxn,
  AddOffsetsToTxn, KIP-890 verification, the KIP-939 fences, the admin queries (``admin``);
- ``init_producer_id``: InitProducerId, with KIP-939's keepPreparedTxn;
- ``end_txn``: EndTxn, Prepare*, and CompleteCommit/CompleteAbort once the markers are written;
- ``expiry``: the timers (``tick``: transaction timeouts, Prepare* re-driven, transactional-id
  expiration);
- ``marker_channel``: the marker jobs and their delivery to the partition writers (Kafka's
  TransactionMarkerChannelManager), created here as ``markers``.

The worker must call ``tick(now)`` regularly (each loop turn is fine: the scans rate-limit
themselves), drive ``markers`` (``send_marker_jobs``, ``check``, ``send_fences``), and stop (exit,
to be restarted with a new coordinator epoch) when ``needs_restart`` is true. The answers are the
ring result types of ``appliance.txn.messages``; ``appliance.txn.service`` serves the requests.
"""

from __future__ import annotations

import collections

import logging
from typing import Callable, Iterable, Sequence

from appliance.catalog import OFFSETS_TOPIC
from appliance.config import FlushPolicy, TransactionsConfig
from appliance.errors import ErrorCode
from appliance.txn import admin
from appliance.txn.end_txn import EndTxnMixin
from appliance.txn.expiry import TxnExpiry
from appliance.txn.init_producer_id import InitProducerIdMixin
from appliance.txn.marker_channel import TransactionMarkerChannelManager
from appliance.txn.messages import ListTransactionsResult, TxnDescription, fenced_for
from appliance.txn.metadata import (MAX_EPOCH, NO_PRODUCER_ID, TV_0, TV_2, IllegalTransition,
                                    TransactionMetadata, TransactionState)
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, TxnLogWriteError

__all__ = ["TransactionCoordinator", "partition_for", "java_string_hash", "OFFSETS_TOPIC_PARTITIONS"]

log = logging.getLogger("appliance.txn.coordinator")

E = ErrorCode
S = TransactionState
OFFSETS_TOPIC_PARTITIONS = 50          # offsets.topic.num.partitions default
REMOVE_EXPIRED_INTERVAL_MS = 3600000   # transaction.remove.expired.transaction.cleanup.interval.ms

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


def _append_error(code: ErrorCode) -> ErrorCode:
    """Kafka's appendTransactionToLog mapping of a failed log append to a coordinator error: a
    full disk (KAFKA_STORAGE_ERROR) is NOT_COORDINATOR, which clients answer by looking the
    coordinator up again and retrying. As in Kafka, whose updateCacheCallback completes the
    transition only after a successful append, the cached metadata stays as it was (``_persist``)."""
    if code in (E.kafka_storage_error, E.not_leader_or_follower):
        return E.not_coordinator
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas,
                E.not_enough_replicas_after_append, E.request_timed_out):
        return E.coordinator_not_available
    return E.unknown_server_error


class TransactionCoordinator(InitProducerIdMixin, EndTxnMixin, TxnExpiry):
    def __init__(self, state_manager: TransactionStateManager, producer_ids: ProducerIdManager,
                 tx_config: TransactionsConfig, coordinator_epoch: int,
                 now_ms: Callable[[], int], *, marker_retry_backoff_ms: int = 100,
                 remove_expired_interval_ms: int = REMOVE_EXPIRED_INTERVAL_MS,
                 offsets_topic_partitions: int = OFFSETS_TOPIC_PARTITIONS) -> None:
        self._sm = state_manager
        self._pids = producer_ids
        self.config = tx_config
        self.coordinator_epoch = coordinator_epoch
        self._now = now_ms
        self.remove_expired_interval_ms = remove_expired_interval_ms
        self.offsets_topic_partitions = offsets_topic_partitions
        self._txns: dict[str, TransactionMetadata] = {}
        # For the metrics: transactions completed ("commits", "aborts") and aborted by the
        # timeout scan ("timedout_aborts"), since this coordinator started.
        self.stats: collections.Counter = collections.Counter()
        self.markers = TransactionMarkerChannelManager(
            now_ms, on_complete=self._complete, on_abandoned=self._abandoned,
            on_fenced=self._on_fenced, kept_fences=self.kept_fences,
            retry_backoff_ms=marker_retry_backoff_ms)
        self._loaded = False
        self._fenced = False
        self._broken = False
        now = now_ms()
        # Kafka schedules both scans with an initial delay of one interval.
        self._next_abort_scan = now + tx_config.abort_timed_out_interval_ms
        self._next_expire_scan = now + remove_expired_interval_ms

    # -- life cycle -----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def needs_restart(self) -> bool:
        """True once a writer reported TRANSACTION_COORDINATOR_FENCED (a newer coordinator
        exists) or a log write may have landed although it failed (memory and log may differ):
        the worker should exit so that a restart reloads from the log under a new epoch."""
        return self._fenced or self._broken

    def load(self) -> None:
        """Replay the transaction log. Prepare* transactions get their markers sent again;
        Ongoing ones keep their start time, so their timeout still runs (Kafka's coordinator
        startup)."""
        if self._loaded:
            return
        self._txns = self._sm.load()
        self._loaded = True
        for md in list(self._txns.values()):
            if md.state.is_prepare:
                self._start_markers(md)
        log.info("transaction coordinator loaded %d transactional ids at coordinator epoch %d",
                 len(self._txns), self.coordinator_epoch)

    def _on_fenced(self) -> None:
        self._fenced = True

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self._txns.get(transactional_id)

    def _gate(self) -> ErrorCode | None:
        if self._fenced or self._broken:
            return E.not_coordinator
        if not self._loaded:
            return E.coordinator_load_in_progress
        return None

    def _persist(self, new: TransactionMetadata) -> ErrorCode:
        """Append ``new`` and make it the cached metadata; on failure memory is unchanged."""
        try:
            self._sm.append(new)
        except TxnLogWriteError as e:
            log.error("transaction log append for %r failed: %s", new.transactional_id, e)
            if e.maybe_written:
                self._broken = True
                return E.not_coordinator
            return _append_error(e.code)
        self._txns[new.transactional_id] = new
        return E.none

    def _new_producer_id(self) -> int | None:
        try:
            return self._pids.next_id()
        except Exception:
            log.exception("producer id allocation failed")
            return None


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
                         partition: Partition, *, add: bool) -> ErrorCode:
        """KIP-890 for a partition writer. ``add=False`` (part 1, old clients): NONE only when
        the transaction is Ongoing with this producer id and epoch and already holds the
        partition, else INVALID_TXN_STATE; never changes state. ``add=True`` (part 2): add the
        partition as AddPartitionsToTxn would. Codes are the ones Kafka's broker passes on after
        its AddPartitionsToTxnManager mapping: a stale epoch is INVALID_PRODUCER_EPOCH, and a
        partition not in the transaction is INVALID_TXN_STATE (Kafka's coordinator says
        TRANSACTION_ABORTABLE, which its broker turns into INVALID_TXN_STATE for Produce <= v10
        and passes through for v11+: the writer maps by produce version)."""
        try:
            if add:
                err = self._add(transactional_id, producer_id, producer_epoch, [partition], TV_2)
            else:
                err = self._verify(transactional_id, producer_id, producer_epoch, partition)
        except IllegalTransition as e:
            log.warning("%s", e)
            err = E.invalid_txn_state
        return E.invalid_producer_epoch if err == E.producer_fenced else err

    def _verify(self, tid: str, pid: int, epoch: int, partition: Partition) -> ErrorCode:
        if not tid:
            return E.invalid_request
        if (err := self._gate()) is not None:
            return err
        md = self._txns.get(tid)
        if md is not None and (kept := self._kept_guard(md, pid, epoch)) is not None:
            return kept
        if md is None or md.producer_id != pid:
            return E.invalid_producer_id_mapping
        if md.producer_epoch != epoch:
            return E.producer_fenced
        if md.state.is_prepare:
            return E.concurrent_transactions
        if md.state == S.Ongoing and partition in md.partitions:
            return E.none
        return E.invalid_txn_state

    def _add(self, tid: str, pid: int, epoch: int, parts: Sequence[Partition], tv: int) -> ErrorCode:
        try:
            return self._add_inner(tid, pid, epoch, parts, tv)
        except IllegalTransition as e:
            log.warning("%s", e)
            return E.invalid_txn_state

    def _add_inner(self, tid: str, pid: int, epoch: int, parts: Sequence[Partition], tv: int) -> ErrorCode:
        if not tid:
            return E.invalid_request
        if (err := self._gate()) is not None:
            return err
        md = self._txns.get(tid)
        if md is None:
            return E.invalid_producer_id_mapping             # unknown, or expired (KIP-98)
        if (kept := self._kept_guard(md, pid, epoch)) is not None:
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
        now = self._now()
        new = md.copy()
        new.transition(S.Ongoing)
        if md.state != S.Ongoing:
            new.txn_start_ms = now                           # the timeout runs from here (Kafka)
        new.partitions |= wanted
        new.txn_last_update_ms = now
        new.client_txn_version = tv
        return self._persist(new)                            # logged before the reply (KIP-98)

    # -- KIP-939 fences ---------------------------------------------------------------------------
    def kept_fences(self) -> list[tuple[int, int, list[Partition]]]:
        """(producer id, lowest epoch allowed, partitions) for every transaction kept by
        InitProducerId(keepPreparedTxn): the marker channel tells each partition's writer to refuse the
        data batches of earlier incarnations, which still hold the ongoing pair (ours; KIP-939
        alone fences them only when the markers land). The channel sends these again to a writer
        that restarted (the fence lives in the writer's memory)."""
        return [(md.producer_id, md.producer_epoch + 1, sorted(md.partitions))
                for md in self._txns.values()
                if md.state == S.Ongoing and md.next_producer_id != NO_PRODUCER_ID
                and md.producer_epoch < MAX_EPOCH]


    # -- admin ------------------------------------------------------------------------------------
    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = -1,
                          transactional_id_pattern: str | None = None) -> ListTransactionsResult:
        """ListTransactions v0-2 (see ``admin.list_transactions``)."""
        if (err := self._gate()) is not None:
            return ListTransactionsResult(err, [], [])
        return admin.list_transactions(self._txns.values(), self._now(), state_filters,
                                       producer_id_filters, duration_filter_ms, transactional_id_pattern)

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        """DescribeTransactions v0 (see ``admin.describe_transactions``)."""
        return admin.describe_transactions(self._txns, transactional_ids, self._gate())

    def reconfigure(self, tx_config: TransactionsConfig, flush_policy) -> None:
        """A configuration reload: the new ``[transactions]`` section and flush policy."""
        self.config = tx_config
        self._sm.flush_policy = FlushPolicy(flush_policy)

    def state_counts(self) -> collections.Counter:
        """Transactional ids by the (Kafka) name of their transaction's state."""
        return collections.Counter(md.state.name for md in self._txns.values())

    def active_transaction_open_time_max_ms(self) -> int:
        """KIP-939 metric ActiveTransactionOpenTimeMaxMs (see ``admin``)."""
        return admin.active_transaction_open_time_max_ms(self._txns.values(), self._now())
