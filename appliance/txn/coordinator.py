"""The transaction coordinator's request logic (Kafka's TransactionCoordinator), sans-IO.

Runs inside the coordinator worker (``workers/coordinator.py``), which owns the rings, sockets and
timers; this class owns the transaction metadata of every transactional id and decides. It is
single-threaded and every method returns at once: a state change is appended to the transaction
log (``TransactionStateManager.append``, durable per the flush policy) before the method returns,
so a reply built from the return value is always backed by the log. Nothing here raises into the
worker loop: illegal transitions answer INVALID_TXN_STATE, log failures answer an error code.

Behaviour is Kafka's (core/.../coordinator/transaction/, late-2024 trunk), KafkaApis for the
version-dependent error codes (PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH for InitProducerId
< v4 and AddPartitionsToTxn/AddOffsetsToTxn/EndTxn < v2), seeds-digest §3 and §4.5-4.9 where
Kafka leaves a choice. Departures are marked "(ours)".

Copy-on-write: every change builds a new ``TransactionMetadata`` from a copy, checks each state
step against the transition table, appends it, and only then replaces the cached object. A failed
append leaves memory as it was, so Kafka's ``hasFailedEpochFence`` bookkeeping is not needed.

Markers (Kafka's TransactionMarkerChannelManager + ...RequestCompletionHandler)
-------------------------------------------------------------------------------
After PrepareCommit/PrepareAbort is logged the coordinator creates a marker job: (producer id,
producer epoch, commit, coordinator epoch, partitions). The transaction keeps the pending state
Complete* until every partition has answered, so requests meanwhile get CONCURRENT_TRANSACTIONS
(as in Kafka, where the pending transition is set as soon as the markers are queued). The worker
loop must:

  1. call ``take_marker_jobs()`` every loop turn and send one WriteMarkerReq per (job, partition);
     a job returned again later carries only partitions that are due for a retry (same job id);
  2. feed every answer back with ``on_marker_result(job_id, partition, error)``; a partition that
     gets no answer (writer died, deadline) may simply be sent again or reported as
     REQUEST_TIMED_OUT / NOT_LEADER_OR_FOLLOWER; answers are idempotent: the first NONE counts,
     anything for a finished partition or an unknown job id is ignored;
  3. report UNKNOWN_TOPIC_OR_PARTITION only when the partition does not exist any more (catalog):
     that partition is dropped from the job (Kafka skips partitions without a leader, "likely
     deleted"); a partition that exists but cannot be reached right now is a retriable error;
  4. call ``tick(now)`` regularly (each loop turn is fine: the scans rate-limit themselves);
  5. stop (exit, be restarted with a new coordinator epoch) when ``needs_restart`` is true.

Result handling per partition: NONE -> done. UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION,
UNSUPPORTED_FOR_MESSAGE_FORMAT -> dropped (Kafka removes the partition from the set waiting for
completion). INVALID_PRODUCER_EPOCH -> the job is abandoned (Kafka: "producer epoch has changed,
this txn can now be ignored"); the transaction stays Prepare* and the periodic scan starts a new
job for it (seeds-digest §4.8: the scan re-drives Prepare*). TRANSACTION_COORDINATOR_FENCED -> a
newer coordinator exists: every job is dropped, every request answers NOT_COORDINATOR, and
``needs_restart`` turns true. Any other error (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS*,
REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR, and the ones Kafka treats as fatal bugs) -> retried after
``marker_retry_backoff_ms`` (ours: never drop a partition on an error that might be transient).
When every partition is done, CompleteCommit/CompleteAbort is logged; if that append fails it is
retried by ``tick``.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Sequence

from appliance.config import TransactionsConfig
from appliance.errors import ErrorCode
from appliance.txn.metadata import (MAX_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TV_0, TV_2,
                                    IllegalTransition, TransactionMetadata, TransactionState,
                                    is_epoch_exhausted)
from appliance.txn import admin
from appliance.txn.admin import ListTransactionsResult, TxnDescription, TxnListing
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, TxnLogWriteError

__all__ = [
    "TransactionCoordinator", "InitPidResult", "EndTxnResult", "MarkerJob", "TxnListing",
    "ListTransactionsResult", "TxnDescription", "partition_for", "java_string_hash",
    "OFFSETS_TOPIC", "OFFSETS_TOPIC_PARTITIONS",
]

log = logging.getLogger("appliance.txn.coordinator")

E = ErrorCode
S = TransactionState
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS = 50          # offsets.topic.num.partitions default
REMOVE_EXPIRED_INTERVAL_MS = 3600000   # transaction.remove.expired.transaction.cleanup.interval.ms

Partition = tuple[str, int]


# -- results ------------------------------------------------------------------------------------

class InitPidResult(NamedTuple):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    # KIP-939 (InitProducerId v6): the pair of the transaction kept open by keepPreparedTxn
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH


class EndTxnResult(NamedTuple):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class MarkerJob(NamedTuple):
    job_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: list[Partition]


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


# -- marker jobs ----------------------------------------------------------------------------------

@dataclass(slots=True)
class _Job:
    job_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    pending: set[Partition]                                  # not acknowledged yet
    retry_at: dict[Partition, int] = field(default_factory=dict)
    complete_failed: bool = False                            # Complete* append to retry

    def marker(self, partitions: Iterable[Partition]) -> MarkerJob:
        return MarkerJob(self.job_id, self.transactional_id, self.producer_id, self.producer_epoch,
                         self.commit, self.coordinator_epoch, sorted(partitions))


_DROP_PARTITION = frozenset({E.unknown_topic_or_partition, E.unsupported_version,
                             E.unsupported_for_message_format})


def _fenced_for(version: int, first_mapped: int, err: ErrorCode) -> ErrorCode:
    """KafkaApis: clients older than ``first_mapped`` do not know PRODUCER_FENCED."""
    if err == E.producer_fenced and version < first_mapped:
        return E.invalid_producer_epoch
    return err


def _append_error(code: ErrorCode) -> ErrorCode:
    """Kafka's appendTransactionToLog mapping of a failed log append to a coordinator error."""
    if code in (E.kafka_storage_error, E.not_leader_or_follower):
        return E.not_coordinator
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas,
                E.not_enough_replicas_after_append, E.request_timed_out):
        return E.coordinator_not_available
    return E.unknown_server_error


class TransactionCoordinator:
    def __init__(self, state_manager: TransactionStateManager, producer_ids: ProducerIdManager,
                 tx_config: TransactionsConfig, coordinator_epoch: int,
                 now_ms: Callable[[], int], *, marker_retry_backoff_ms: int = 100,
                 remove_expired_interval_ms: int = REMOVE_EXPIRED_INTERVAL_MS,
                 offsets_topic_partitions: int = OFFSETS_TOPIC_PARTITIONS,
                 authorize_two_phase_commit: Callable[[str], bool] = lambda transactional_id: True) -> None:
        self._sm = state_manager
        self._pids = producer_ids
        self.config = tx_config
        self.coordinator_epoch = coordinator_epoch
        self._now = now_ms
        self.marker_retry_backoff_ms = marker_retry_backoff_ms
        self.remove_expired_interval_ms = remove_expired_interval_ms
        self.offsets_topic_partitions = offsets_topic_partitions
        # KIP-939: Enable2Pc needs the TWO_PHASE_COMMIT operation on the transactional id. There
        # is no authorizer yet, so the hook allows everything; the broker switch still applies.
        self._authorize_2pc = authorize_two_phase_commit
        self._txns: dict[str, TransactionMetadata] = {}
        self._jobs: dict[int, _Job] = {}
        self._job_of: dict[str, int] = {}                    # transactional id -> job id
        self._outbox: list[MarkerJob] = []
        self._retrying: set[int] = set()                     # job ids with partitions to retry
        self._job_ids = itertools.count(1)
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
        """Replay the transaction log. Prepare* transactions get their markers sent again
        (guarantee 27); Ongoing ones keep their start time, so their timeout still runs (28)."""
        if self._loaded:
            return
        self._txns = self._sm.load()
        self._loaded = True
        for md in list(self._txns.values()):
            if md.state.is_prepare:
                self._start_markers(md)
        log.info("transaction coordinator loaded %d transactional ids at coordinator epoch %d",
                 len(self._txns), self.coordinator_epoch)

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

    # -- InitProducerId -------------------------------------------------------------------------
    def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
                         *, api_version: int = 0, enable_2pc: bool = False,
                         keep_prepared_txn: bool = False) -> InitPidResult:
        """InitProducerId. v6 (KIP-939) adds ``enable_2pc`` (the transaction never times out;
        its timeout is stored as -1) and ``keep_prepared_txn`` (an Ongoing transaction is kept
        for the caller to commit or abort, see ``_keep_prepared``)."""
        try:
            r = self._init_producer_id(transactional_id, timeout_ms, producer_id, producer_epoch,
                                       enable_2pc, keep_prepared_txn)
        except IllegalTransition as e:
            log.warning("%s", e)
            r = InitPidResult(E.invalid_txn_state)
        if r.error != E.none:
            return InitPidResult(_fenced_for(api_version, 4, r.error))
        return r

    def _init_producer_id(self, tid: str | None, timeout_ms: int, pid: int, epoch: int,
                          enable_2pc: bool = False, keep_prepared: bool = False) -> InitPidResult:
        if (pid == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
            return InitPidResult(E.invalid_request)          # KafkaApis: id without epoch or v.v.
        if tid is None and (enable_2pc or keep_prepared):
            return InitPidResult(E.invalid_request)          # (ours) 2PC needs a transactional id
        if tid is None:
            # Idempotent producer: a fresh id, epoch 0, no log (guarantee 13).
            new_pid = self._new_producer_id()
            if new_pid is None:
                return InitPidResult(E.coordinator_not_available)
            return InitPidResult(E.none, new_pid, 0)
        if tid == "":
            return InitPidResult(E.invalid_request)
        if enable_2pc:
            # KIP-939: the broker switch and the TWO_PHASE_COMMIT permission, else
            # TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the requested timeout is ignored (C7).
            if not self.config.two_phase_commit_enable or not self._authorize_2pc(tid):
                return InitPidResult(E.transactional_id_authorization_failed)
            timeout_ms = -1
        elif not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitPidResult(E.invalid_transaction_timeout)
        if (err := self._gate()) is not None:
            return InitPidResult(err)
        expected = (pid, epoch) if pid != NO_PRODUCER_ID else None
        md = self._txns.get(tid)
        now = self._now()
        if md is None:
            new_pid = self._new_producer_id()
            if new_pid is None:
                return InitPidResult(E.coordinator_not_available)
            # Not cached until the first record is written (Kafka caches it at once with epoch
            # -1; a failed append then leaves that behind, harmless either way).
            md = TransactionMetadata(tid, new_pid, NO_PRODUCER_EPOCH, timeout_ms, S.Empty,
                                     txn_last_update_ms=now)
        if md.pending_state is not None:
            return InitPidResult(E.concurrent_transactions)
        if keep_prepared and md.state == S.Ongoing:
            return self._keep_prepared(md, expected, timeout_ms)   # T5, C6
        if expected is not None and not self._valid_expected_producer(md, *expected):
            return InitPidResult(E.producer_fenced)
        if md.state.is_prepare:
            # Never changes the decided outcome (guarantee 17): wait for Complete*.
            return InitPidResult(E.concurrent_transactions)
        if md.state == S.Ongoing:
            # Fence the current producer and abort its transaction with the bumped epoch; that
            # epoch is never returned: the client retries, and gets a second bump (Kafka).
            err = self._fence_and_abort(md)
            return InitPidResult(E.concurrent_transactions if err == E.none else err)
        if md.state not in (S.Empty, S.CompleteCommit, S.CompleteAbort):
            return InitPidResult(E.invalid_txn_state)        # Dead / PrepareEpochFence: never cached
        new = md.copy()
        new.transition(S.Empty)
        if md.is_epoch_exhausted and (expected is None or expected[1] == md.producer_epoch):
            # KIP-890/C1: a new producer id with epoch 0 instead of wrapping the epoch.
            new_pid = self._new_producer_id()
            if new_pid is None:
                return InitPidResult(E.coordinator_not_available)
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
            return InitPidResult(E.producer_fenced)
        if new.producer_id != md.producer_id:
            # a rotation: remember the old id so that its retry is recognised (isValidProducerId)
            new.prev_producer_id = md.producer_id
        elif md.producer_epoch == NO_PRODUCER_EPOCH:
            new.prev_producer_id = NO_PRODUCER_ID             # a new transactional id (seed 001)
        new.next_producer_id = NO_PRODUCER_ID
        new.next_producer_epoch = NO_PRODUCER_EPOCH
        new.txn_timeout_ms = timeout_ms
        new.partitions = set()
        new.txn_start_ms = -1
        new.txn_last_update_ms = now
        new.client_txn_version = TV_0
        err = self._persist(new)                              # before the reply (guarantee 14)
        if err != E.none:
            return InitPidResult(err)
        return InitPidResult(E.none, new.producer_id, new.producer_epoch)

    def _keep_prepared(self, md: TransactionMetadata, expected: tuple[int, int] | None,
                       timeout_ms: int) -> InitPidResult:
        """KIP-939 InitProducerId(keepPreparedTxn=true) on an Ongoing transaction: it stays open
        with its producer id and epoch (what the client's PreparedTxnState holds, and what the
        markers will carry, bumped by one), and the caller gets a *next* pair that fences every
        earlier incarnation: the first call takes the ongoing epoch + 1 (a new producer id with
        epoch 0 when the ongoing epoch is MAX-1, because MAX is kept for the markers), each
        repeated call (a client in a crash loop) bumps the next epoch again, with a new producer
        id once it would pass MAX (seed 001, example 2). Both pairs are persisted before the
        reply (NextProducerId/NextProducerEpoch in the log). From now on only EndTxn with the
        next pair is allowed (``_kept_guard``)."""
        kept = md.next_producer_id != NO_PRODUCER_ID
        if expected is not None:
            if kept:
                ok = expected == (md.next_producer_id, md.next_producer_epoch)
            else:
                ok = expected == (md.producer_id, md.producer_epoch)
            if not ok:
                return InitPidResult(E.producer_fenced)
        if not kept:
            base_pid, base_epoch, exhausted = md.producer_id, md.producer_epoch, md.is_epoch_exhausted
        else:
            base_pid, base_epoch = md.next_producer_id, md.next_producer_epoch
            exhausted = base_epoch >= MAX_EPOCH
        if exhausted:
            next_pid = self._new_producer_id()
            if next_pid is None:
                return InitPidResult(E.coordinator_not_available)
            next_epoch = 0
        else:
            next_pid, next_epoch = base_pid, base_epoch + 1
        new = md.copy()
        new.transition(S.Ongoing)
        new.next_producer_id, new.next_producer_epoch = next_pid, next_epoch
        new.txn_timeout_ms = timeout_ms                      # -1 with Enable2Pc: never timed out
        new.txn_last_update_ms = self._now()
        err = self._persist(new)
        if err != E.none:
            return InitPidResult(err)
        log.info("transactional id %r: prepared transaction of producer %d epoch %d kept; "
                 "next producer %d epoch %d", md.transactional_id, md.producer_id,
                 md.producer_epoch, next_pid, next_epoch)
        return InitPidResult(E.none, next_pid, next_epoch, md.producer_id, md.producer_epoch)

    @staticmethod
    def _kept_guard(md: TransactionMetadata, pid: int, epoch: int) -> ErrorCode | None:
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

    @staticmethod
    def _kept_retry(md: TransactionMetadata, pid: int, epoch: int) -> bool:
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

    @staticmethod
    def _valid_expected_producer(md: TransactionMetadata, pid: int, epoch: int) -> bool:
        # Kafka's isValidProducerId: a fresh id, the current id, or the previous id with an
        # exhausted epoch (a retry after a rotation whose answer was lost).
        return (md.producer_epoch == NO_PRODUCER_EPOCH or pid == md.producer_id
                or (pid == md.prev_producer_id and is_epoch_exhausted(epoch)))

    # -- AddPartitionsToTxn / AddOffsetsToTxn / verification --------------------------------------
    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[Partition], *, api_version: int = 0) -> dict[Partition, ErrorCode]:
        """AddPartitionsToTxn (client form). Kafka answers one error for the whole request, so
        every partition gets the same code (OPERATION_NOT_ATTEMPTED only arises in KafkaApis,
        for unknown or unauthorized topics, before the coordinator is asked)."""
        parts = list(partitions)
        err = _fenced_for(api_version, 2, self._add(transactional_id, producer_id, producer_epoch,
                                                     parts, TV_0))
        return {p: err for p in parts}

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str, *, api_version: int = 0) -> ErrorCode:
        """AddOffsetsToTxn: adds ``__consumer_offsets[partitionFor(group)]``; starts the
        transaction when there is none (C26)."""
        part = (OFFSETS_TOPIC, partition_for(group_id, self.offsets_topic_partitions))
        return _fenced_for(api_version, 2, self._add(transactional_id, producer_id, producer_epoch,
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
            return E.invalid_producer_id_mapping             # guarantee 19 / 35
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
            return E.concurrent_transactions                 # C27, guarantee 20
        wanted = set(parts)
        if md.state == S.Ongoing and wanted <= md.partitions:
            return E.none                                    # nothing new: no log write
        now = self._now()
        new = md.copy()
        new.transition(S.Ongoing)
        if md.state != S.Ongoing:
            new.txn_start_ms = now                           # the timeout runs from here (C18)
        new.partitions |= wanted
        new.txn_last_update_ms = now
        new.client_txn_version = tv
        return self._persist(new)                            # before the reply (guarantee 21)

    # -- EndTxn -----------------------------------------------------------------------------------
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
            return EndTxnResult(_fenced_for(api_version, 2, r.error))
        return r

    def _end_txn(self, tid: str, pid: int, epoch: int, commit: bool, tv: int) -> EndTxnResult:
        if not tid:
            return EndTxnResult(E.invalid_request)
        if (err := self._gate()) is not None:
            return EndTxnResult(err)
        md = self._txns.get(tid)
        if md is None:
            return EndTxnResult(E.invalid_producer_id_mapping)
        state = md.state
        if state == S.Ongoing and md.next_producer_id != NO_PRODUCER_ID:
            # KIP-939: a kept prepared transaction, finished with the next pair.
            if md.pending_state is not None:
                return EndTxnResult(E.concurrent_transactions)
            if (pid, epoch) == (md.next_producer_id, md.next_producer_epoch):
                return self._prepare_kept(md, commit, tv, pid, epoch)
            return EndTxnResult(self._kept_guard(md, pid, epoch) or E.producer_fenced)
        if state.is_prepare and self._kept_retry(md, pid, epoch):
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
                return EndTxnResult(E.concurrent_transactions)    # (ours), see _add_inner
            return EndTxnResult(E.invalid_producer_id_mapping)
        if not valid_epoch:
            return EndTxnResult(E.producer_fenced)
        if md.pending_state is not None:
            return EndTxnResult(E.concurrent_transactions)
        if state == S.Ongoing:
            return self._prepare(md, commit, tv)
        same = commit == (state in (S.PrepareCommit, S.CompleteCommit))
        if state.is_complete and same:
            # a retry after completion (guarantee 25; 53/55 answer the current pair)
            return EndTxnResult(E.none, md.producer_id, md.producer_epoch)
        if state.is_prepare and same:
            return EndTxnResult(E.concurrent_transactions)
        return EndTxnResult(E.invalid_txn_state)             # other command, Empty (26)

    def _prepare(self, md: TransactionMetadata, commit: bool, tv: int) -> EndTxnResult:
        new = md.copy()
        new.transition(S.PrepareCommit if commit else S.PrepareAbort)
        new.next_producer_id = NO_PRODUCER_ID
        new.client_txn_version = tv
        new.txn_last_update_ms = self._now()
        if tv >= TV_2:
            # KIP-890 (1): PREPARE carries epoch y+1 (markers too); on overflow a new producer id
            # is allocated now and becomes current at COMPLETE; markers keep (x, MAX).
            if md.is_epoch_exhausted:
                next_pid = self._new_producer_id()
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
        hold three distinct producer ids (seed 001, example 2, step 9)."""
        new = md.copy()
        new.transition(S.PrepareCommit if commit else S.PrepareAbort)
        new.producer_epoch = min(md.producer_epoch + 1, MAX_EPOCH)
        new.prev_producer_id = pid
        new.last_producer_epoch = NO_PRODUCER_EPOCH
        if tv >= TV_2:
            if is_epoch_exhausted(epoch):
                next_pid = self._new_producer_id()
                if next_pid is None:
                    return EndTxnResult(E.coordinator_not_available)
                new.next_producer_id, new.next_producer_epoch = next_pid, 0
            else:
                new.next_producer_id, new.next_producer_epoch = pid, epoch + 1
        else:
            new.next_producer_id, new.next_producer_epoch = pid, epoch
        new.client_txn_version = tv
        new.txn_last_update_ms = self._now()
        err = self._begin_completion(new)
        if err != E.none:
            return EndTxnResult(err)
        return EndTxnResult(E.none, new.next_producer_id, new.next_producer_epoch)

    def _fence_and_abort(self, md: TransactionMetadata) -> ErrorCode:
        """Bump the epoch (PrepareEpochFence, in memory only) and abort with it (PrepareAbort)
        (guarantees 16, 33). One bump: the fence epoch is what the markers carry. The record is
        written with client transaction version 0 (ours): the abort is the coordinator's, not a
        TV2 client's, so a retried EndTxn from the fenced producer is judged by strict epoch
        equality and fenced (guarantee 34), never taken for a TV2 retry of epoch+1. (Kafka's
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
        new.txn_last_update_ms = self._now()
        return self._begin_completion(new)

    def _begin_completion(self, new: TransactionMetadata) -> ErrorCode:
        err = self._persist(new)                             # durable before any marker (23)
        if err == E.none:
            self._start_markers(new)
        return err

    # -- markers ----------------------------------------------------------------------------------
    def _start_markers(self, md: TransactionMetadata) -> None:
        commit = md.state == S.PrepareCommit
        md.pending_state = S.CompleteCommit if commit else S.CompleteAbort
        job = _Job(next(self._job_ids), md.transactional_id, md.producer_id, md.producer_epoch,
                   commit, self.coordinator_epoch, set(md.partitions))
        self._jobs[job.job_id] = job
        self._job_of[md.transactional_id] = job.job_id
        if job.pending:
            self._outbox.append(job.marker(job.pending))
        else:
            self._complete(job)          # no partitions: straight to Complete* (as Kafka)

    def kept_fences(self) -> list[tuple[int, int, list[Partition]]]:
        """(producer id, lowest epoch allowed, partitions) for every transaction kept by
        InitProducerId(keepPreparedTxn): the worker tells each partition's writer to refuse the
        data batches of earlier incarnations, which still hold the ongoing pair (ours; KIP-939
        alone fences them only when the markers land). The worker sends these again to a writer
        that restarted (the fence lives in the writer's memory)."""
        return [(md.producer_id, md.producer_epoch + 1, sorted(md.partitions))
                for md in self._txns.values()
                if md.state == S.Ongoing and md.next_producer_id != NO_PRODUCER_ID
                and md.producer_epoch < MAX_EPOCH]

    def take_marker_jobs(self) -> list[MarkerJob]:
        """Jobs created since the last call, plus partitions of earlier jobs whose retry is due
        (as MarkerJobs with the same job id and only those partitions)."""
        if self._fenced:
            self._outbox.clear()
            return []
        out, self._outbox = self._outbox, []
        if self._retrying:
            now = self._now()
            for job_id in list(self._retrying):
                job = self._jobs.get(job_id)
                if job is None:
                    self._retrying.discard(job_id)
                    continue
                due = [p for p, t in job.retry_at.items() if t <= now]
                for p in due:
                    del job.retry_at[p]
                if not job.retry_at:
                    self._retrying.discard(job_id)
                if due:
                    out.append(job.marker(due))
        return out

    def next_retry_due_ms(self) -> int | None:
        """When the earliest marker retry is due (for the worker's sleep), or None."""
        due = [t for jid in self._retrying if (job := self._jobs.get(jid)) for t in job.retry_at.values()]
        return min(due) if due else None

    def on_marker_result(self, job_id: int, partition: Partition, error: ErrorCode | int) -> None:
        """The answer of one partition to one marker (see the module doc for what each error
        means)."""
        job = self._jobs.get(job_id)
        if job is None or partition not in job.pending or self._fenced:
            return                                           # stale or duplicate answer
        try:
            error = E(int(error))
        except ValueError:
            error = E.unknown_server_error
        if error == E.none or error in _DROP_PARTITION:
            if error != E.none:
                log.info("marker for %r dropped on %s-%d: %s", job.transactional_id,
                         partition[0], partition[1], error.name)
            job.pending.discard(partition)
            job.retry_at.pop(partition, None)
            if not job.pending:
                self._complete(job)
        elif error == E.transaction_coordinator_fenced:
            log.error("coordinator epoch %d fenced by %s-%d: a newer coordinator exists; stopping",
                      self.coordinator_epoch, partition[0], partition[1])
            self._fenced = True
            self._jobs.clear()
            self._job_of.clear()
            self._retrying.clear()
            self._outbox.clear()
        elif error == E.invalid_producer_epoch:
            log.warning("marker for %r (producer %d epoch %d) refused by %s-%d: %s; job abandoned",
                        job.transactional_id, job.producer_id, job.producer_epoch, partition[0],
                        partition[1], error.name)
            self._drop_job(job)
            md = self._txns.get(job.transactional_id)
            if md is not None and md.state.is_prepare:
                md.pending_state = None                      # the periodic scan re-drives it
        else:
            if partition not in job.retry_at:
                job.retry_at[partition] = self._now() + self.marker_retry_backoff_ms
                self._retrying.add(job.job_id)

    def _drop_job(self, job: _Job) -> None:
        self._jobs.pop(job.job_id, None)
        self._retrying.discard(job.job_id)
        if self._job_of.get(job.transactional_id) == job.job_id:
            del self._job_of[job.transactional_id]

    def _complete(self, job: _Job) -> None:
        """Every marker is written: log CompleteCommit/CompleteAbort (T10)."""
        md = self._txns.get(job.transactional_id)
        if md is None or not md.state.is_prepare or md.producer_id != job.producer_id:
            self._drop_job(job)
            return
        new = md.copy()
        new.pending_state = None
        try:
            new.transition(S.CompleteCommit if job.commit else S.CompleteAbort)
        except IllegalTransition as e:
            log.error("%s", e)
            self._drop_job(job)
            return
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
        new.txn_last_update_ms = self._now()
        if self._persist(new) == E.none:
            self._drop_job(job)
        else:
            job.complete_failed = True                       # tick retries

    # -- timers -----------------------------------------------------------------------------------
    def tick(self, now_ms: int | None = None) -> None:
        """Timers: retry failed Complete* appends; every abort_timed_out_interval_ms abort
        timed-out transactions and re-drive Prepare* without a job; every
        remove_expired_interval_ms expire idle transactional ids."""
        if self._gate() is not None:
            return
        now = self._now() if now_ms is None else now_ms
        for job in [j for j in self._jobs.values() if j.complete_failed and not j.pending]:
            job.complete_failed = False
            self._complete(job)
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
            # (C18: from the start); timeout -1 (KIP-939 2PC) never times out (guarantee 64).
            if (md.state == S.Ongoing and md.pending_state is None and md.txn_timeout_ms >= 0
                    and md.txn_start_ms + md.txn_timeout_ms < now):
                log.info("transaction of %r (producer %d epoch %d) timed out; aborting",
                         md.transactional_id, md.producer_id, md.producer_epoch)
                try:
                    self._fence_and_abort(md)
                except IllegalTransition as e:
                    log.error("%s", e)

    def _redrive_prepared(self) -> None:
        for md in list(self._txns.values()):
            if md.state.is_prepare and md.transactional_id not in self._job_of:
                self._start_markers(md)

    def _expire(self, now: int) -> None:
        """Transactional-id expiration (guarantees 35, 36): only Empty/Complete* ids idle for
        transactional.id.expiration.ms, never Ongoing or Prepare*; a tombstone, then removal."""
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

    def active_transaction_open_time_max_ms(self) -> int:
        """KIP-939 metric ActiveTransactionOpenTimeMaxMs (see ``admin``)."""
        return admin.active_transaction_open_time_max_ms(self._txns.values(), self._now())
