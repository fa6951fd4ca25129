"""The producer's transaction manager: producer id and epoch, the transaction state machine, the
coordinator requests, and KIP-939's ``PreparedTxnState``.

Owns the producer id and epoch (for idempotent producers too), the per-partition sequence numbers
that belong to them (``SequenceTracker``: reset whenever the pair changes), the partitions of the
open transaction, and the state:

    UNINITIALIZED --init_transactions--> READY --begin--> IN_TRANSACTION --prepare--> PREPARED
    IN_TRANSACTION / PREPARED --commit / abort--> READY
    UNINITIALIZED --init_transactions(keep_prepared_txn=True), a transaction was open--> PREPARED
    an error the transaction cannot survive --> ABORTABLE_ERROR --abort--> READY
    fenced, or refused by the broker for good --> FATAL_ERROR (every call raises)

Requests (all to the transaction coordinator found with FindCoordinator, each retried while the
answer is retriable - CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR after
a new lookup, a lost connection - until ``max_block_ms`` is spent): InitProducerId (v6 carries
KIP-939's Enable2Pc and KeepPreparedTxn), AddPartitionsToTxn (transaction version 1 only),
EndTxn, AddOffsetsToTxn (version 1) and TxnOffsetCommit (to the group coordinator).

Transaction version: version 2 (KIP-890 part 2) when the broker finalizes the feature
``transaction.version`` >= 2 and speaks EndTxn v5 and Produce v12, unless the producer is
configured with ``transaction_version=1``. Under version 2, as the Java client does, no
AddPartitionsToTxn or AddOffsetsToTxn is sent (Produce v12 and TxnOffsetCommit v5 add their
partitions), and every EndTxn answers the producer id and epoch of the next transaction (the
epoch goes up by one; sequences restart at 0). Under version 1 the pair stays, and an abort
after a sequence error bumps the epoch with InitProducerId (KIP-360) so that sequences restart.

Two-phase commit (KIP-939) needs version 2: under version 1 consecutive transactions share one
(producer id, epoch), so a ``PreparedTxnState`` could not tell them apart.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from appliance.client.accumulator import SequenceTracker, TopicPartition
from appliance.client.errors import (COORDINATOR_ERRORS, FENCED, ErrorCode, FatalProducerError,
                                     IllegalStateError, KafkaConnectionError, KafkaError,
                                     KafkaTimeoutError, ProducerFencedError,
                                     TransactionAbortableError, error_code, error_for)
from appliance.client.metadata import (COORDINATOR_GROUP, COORDINATOR_TRANSACTION, Cluster,
                                       Deadline)

__all__ = ["PreparedTxnState", "TxnState", "TransactionManager"]

log = logging.getLogger(__name__)

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 0, 22, 24, 25, 26, 28
NO_PRODUCER_ID, NO_PRODUCER_EPOCH = -1, -1


@dataclass(frozen=True, init=False)
class PreparedTxnState:
    """The identity of a prepared transaction: its producer id and epoch (KIP-939).

    ``str(state)`` is ``"<producer id>:<epoch>"``, or ``""`` for "no transaction"; the constructor
    takes either that string or the two numbers, so ``PreparedTxnState(str(s)) == s``.
    """

    producer_id: int
    epoch: int

    def __init__(self, producer_id: int | str | None = None, epoch: int | None = None) -> None:
        if isinstance(producer_id, str) or producer_id is None:
            if epoch is not None:
                raise TypeError("PreparedTxnState(serialized) takes no epoch")
            pid, ep = self._parse(producer_id or "")
        else:
            pid, ep = int(producer_id), int(-1 if epoch is None else epoch)
            if (pid < 0) != (ep < 0):
                raise ValueError(f"producer id {pid} and epoch {ep}: both or neither must be set")
            if pid < 0:
                pid, ep = NO_PRODUCER_ID, NO_PRODUCER_EPOCH
            if ep > 0x7FFF:
                raise ValueError(f"epoch {ep} is not an int16")
        object.__setattr__(self, "producer_id", pid)
        object.__setattr__(self, "epoch", ep)

    @staticmethod
    def _parse(text: str) -> tuple[int, int]:
        text = text.strip()
        if not text:
            return NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        pid_s, sep, epoch_s = text.partition(":")
        try:
            if not sep:
                raise ValueError
            pid, ep = int(pid_s), int(epoch_s)
        except ValueError:
            raise ValueError(f"not a serialized PreparedTxnState: {text!r} (expected 'producerId:epoch')") \
                from None
        if pid < 0 or not 0 <= ep <= 0x7FFF:
            raise ValueError(f"invalid producer id or epoch in PreparedTxnState {text!r}")
        return pid, ep

    @classmethod
    def from_string(cls, text: str | None) -> "PreparedTxnState":
        return cls(text or "")

    @property
    def has_transaction(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.epoch}" if self.has_transaction else ""

    def __repr__(self) -> str:
        return f"PreparedTxnState({str(self)!r})"


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    PREPARED = "prepared"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"


class TransactionManager:
    """Producer id, epoch, sequences and (with a transactional id) the transaction state."""

    def __init__(self, cluster: Cluster, *, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60000, enable_two_phase_commit: bool = False,
                 transaction_version: int | None = None, max_block_ms: int = 60000,
                 retry_backoff_ms: int = 100) -> None:
        if transactional_id == "":
            raise ValueError("transactional_id must not be empty")
        if transaction_version not in (None, 1, 2):
            raise ValueError(f"transaction_version must be 1 or 2, not {transaction_version!r}")
        if enable_two_phase_commit and transactional_id is None:
            raise ValueError("enable_two_phase_commit needs a transactional_id")
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.enable_two_phase_commit = enable_two_phase_commit
        self.configured_version = transaction_version
        self.max_block_ms = max_block_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.producer_id = NO_PRODUCER_ID
        self.epoch = NO_PRODUCER_EPOCH
        self.sequences = SequenceTracker()
        self.state = TxnState.UNINITIALIZED
        self.tv2 = False
        self.partitions: set[TopicPartition] = set()    # in the open transaction (known to be)
        self.started = False                             # the coordinator knows the transaction
        self.prepared: PreparedTxnState | None = None
        self.last_error: KafkaError | None = None
        self._needs_bump = False                         # TV1: bump the epoch after the abort

    # -- helpers ----------------------------------------------------------------------------
    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    def _coordinator(self):
        assert self.transactional_id is not None
        return self.cluster.coordinator(self.transactional_id, COORDINATOR_TRANSACTION,
                                        timeout_ms=self.max_block_ms)

    def _set_pair(self, pid: int, epoch: int) -> None:
        if (pid, epoch) != (self.producer_id, self.epoch):
            self.sequences.reset()
        self.producer_id, self.epoch = pid, epoch

    def _fatal(self, err: KafkaError) -> KafkaError:
        if not isinstance(err, FatalProducerError):
            err = FatalProducerError(err.code, err.message)
        self.state = TxnState.FATAL_ERROR
        self.last_error = err
        return err

    def _check_not_fatal(self) -> None:
        if self.state == TxnState.FATAL_ERROR:
            assert self.last_error is not None
            raise self.last_error

    def _coordinator_call(self, what: str, api_key: int, body: dict, *, to_group: str | None = None,
                          check=None, version: int | None = None):
        """Send ``body`` to the transaction (or ``to_group``'s) coordinator until an answer that
        ``check(resp) -> ErrorCode`` says is final; retriable codes and lost connections are retried
        within ``max_block_ms``. Returns the response; raises the final error."""
        last: KafkaError = KafkaTimeoutError(f"{what}: no answer in {self.max_block_ms} ms")
        key, key_type = ((to_group, COORDINATOR_GROUP) if to_group is not None
                         else (self.transactional_id, COORDINATOR_TRANSACTION))
        assert key is not None
        for _ in Deadline(self.max_block_ms, self.retry_backoff_ms):
            try:
                conn = self.cluster.coordinator(key, key_type, timeout_ms=self.max_block_ms)
                resp = conn.request(api_key, body, version=version)
            except KafkaConnectionError as exc:
                self.cluster.forget_coordinator(key, key_type)
                last = exc
                continue
            except KafkaTimeoutError as exc:
                last = exc
                continue
            code = error_code(check(resp))
            if code == ErrorCode.none:
                return resp
            last = KafkaError(code, what)
            if code in COORDINATOR_ERRORS:
                self.cluster.forget_coordinator(key, key_type)
                continue
            if code.retriable or code == ErrorCode.operation_not_attempted:
                continue
            raise last
        raise last

    # -- idempotent producers ---------------------------------------------------------------
    def ensure_producer_id(self) -> None:
        """An idempotent (non-transactional) producer gets its producer id on first use."""
        self._check_not_fatal()
        if self.transactional or self.producer_id != NO_PRODUCER_ID:
            return
        self._init_idempotent(bump=False)

    def _init_idempotent(self, *, bump: bool) -> None:
        last: KafkaError = KafkaTimeoutError("InitProducerId: no answer")
        for _ in Deadline(self.max_block_ms, self.retry_backoff_ms):
            try:
                conn = self.cluster.any_connection()
                body = {"transactional_id": None, "transaction_timeout_ms": self.transaction_timeout_ms,
                        "producer_id": self.producer_id if bump else -1,
                        "producer_epoch": self.epoch if bump else -1}
                resp = conn.request(INIT_PRODUCER_ID, body)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            code = error_code(resp.error_code)
            if code == ErrorCode.none:
                self._set_pair(resp.producer_id, resp.producer_epoch)
                self.sequences.reset()
                self.state = TxnState.READY
                return
            last = KafkaError(code, "InitProducerId")
            if not code.retriable:
                raise self._fatal(last)
        raise last

    def reset_idempotent(self) -> None:
        """After OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID on an idempotent producer:
        a new producer id (or epoch), sequences from 0 (KIP-360)."""
        self._init_idempotent(bump=True)

    # -- transactions -------------------------------------------------------------------------
    def negotiate_version(self) -> None:
        """Decide the transaction version from what the coordinator advertises."""
        conn = self._coordinator()
        finalized = conn.finalized_features.get("transaction.version", 0)
        broker_tv2 = finalized >= 2 and conn.supports(END_TXN, 5) and conn.supports(PRODUCE, 12)
        if self.configured_version == 2 and not broker_tv2:
            raise self._fatal(KafkaError(ErrorCode.unsupported_version,
                                         f"transaction_version=2 but the broker finalizes "
                                         f"transaction.version={finalized}"))
        self.tv2 = broker_tv2 if self.configured_version is None else self.configured_version == 2

    def init_transactions(self, keep_prepared_txn: bool = False) -> None:
        if not self.transactional:
            raise IllegalStateError("init_transactions needs a transactional_id")
        self._check_not_fatal()
        if self.state != TxnState.UNINITIALIZED:
            raise IllegalStateError(f"init_transactions called twice (state {self.state.value})")
        self.negotiate_version()
        conn = self._coordinator()
        version = conn.version(INIT_PRODUCER_ID)
        kip939 = self.enable_two_phase_commit or keep_prepared_txn
        if kip939 and version < 6:
            raise self._fatal(KafkaError(
                ErrorCode.unsupported_version,
                f"the broker speaks InitProducerId up to v{version}; "
                f"{'enable_two_phase_commit' if self.enable_two_phase_commit else 'keep_prepared_txn'} "
                f"needs v6 (KIP-939 two-phase commit)"))
        if self.enable_two_phase_commit and not self.tv2:
            raise self._fatal(KafkaError(
                ErrorCode.unsupported_version,
                "enable_two_phase_commit needs transaction version 2 (KIP-890): under version 1 "
                "consecutive transactions share one producer id and epoch, so a PreparedTxnState "
                "cannot identify a transaction"))
        body = {"transactional_id": self.transactional_id,
                "transaction_timeout_ms": self.transaction_timeout_ms,
                "producer_id": -1, "producer_epoch": -1,
                "enable2_pc": self.enable_two_phase_commit, "keep_prepared_txn": keep_prepared_txn}
        try:
            resp = self._coordinator_call("InitProducerId", INIT_PRODUCER_ID, body,
                                          check=lambda r: r.error_code)
        except KafkaError as exc:
            if exc.retriable:
                raise
            raise self._fatal(error_for(exc.code, f"InitProducerId for {self.transactional_id!r}"))
        self._set_pair(resp.producer_id, resp.producer_epoch)
        self.sequences.reset()
        self._clear_txn()
        ongoing = getattr(resp, "ongoing_txn_producer_id", NO_PRODUCER_ID)
        if keep_prepared_txn and ongoing != NO_PRODUCER_ID:
            self.prepared = PreparedTxnState(ongoing, resp.ongoing_txn_producer_epoch)
            self.started = True
            self.state = TxnState.PREPARED
            log.info("transactional id %r: kept the open transaction %s (next producer %d epoch %d)",
                     self.transactional_id, self.prepared, self.producer_id, self.epoch)
        else:
            self.state = TxnState.READY

    def _clear_txn(self) -> None:
        self.partitions = set()
        self.started = False
        self.prepared = None
        self.last_error = None

    def require_transaction(self, what: str) -> None:
        """Raise unless records may be added to the open transaction now."""
        self._check_not_fatal()
        if self.state == TxnState.IN_TRANSACTION:
            return
        if self.state == TxnState.ABORTABLE_ERROR:
            assert self.last_error is not None
            raise self.last_error
        if self.state == TxnState.PREPARED:
            raise IllegalStateError(f"{what}: the transaction is prepared; only commit_transaction, "
                                    f"abort_transaction or complete_transaction are allowed")
        raise IllegalStateError(f"{what}: no transaction in progress (state {self.state.value}); "
                                f"call begin_transaction first")

    def begin(self) -> None:
        self._check_not_fatal()
        if self.state != TxnState.READY:
            if self.state == TxnState.UNINITIALIZED:
                raise IllegalStateError("begin_transaction before init_transactions")
            raise IllegalStateError(f"begin_transaction: a transaction is already open "
                                    f"(state {self.state.value})")
        self._clear_txn()
        self.state = TxnState.IN_TRANSACTION

    def abortable(self, err: KafkaError) -> KafkaError:
        """Record an error the open transaction cannot survive; returns the exception to raise."""
        if isinstance(err, FatalProducerError) or err.code in FENCED:
            return self._fatal(error_for(err.code, err.message))
        if not isinstance(err, TransactionAbortableError):
            err = TransactionAbortableError(err.code, err.message)
        if self.state in (TxnState.IN_TRANSACTION, TxnState.PREPARED):
            self.state = TxnState.ABORTABLE_ERROR
            self.last_error = err
        if err.code in (ErrorCode.out_of_order_sequence_number, ErrorCode.unknown_producer_id):
            self._needs_bump = True
        return err

    def add_partitions(self, tps: Iterable[TopicPartition]) -> None:
        """Transaction version 1: register partitions with the coordinator before writing to
        them. Version 2: nothing to send (Produce v12 adds them); remember them."""
        new = {tp for tp in tps if tp not in self.partitions}
        if not new:
            return
        if self.tv2:
            self.partitions |= new
            self.started = True
            return
        topics: dict[str, list[int]] = {}
        for t, p in sorted(new):
            topics.setdefault(t, []).append(p)
        body = {"v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.epoch,
                "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

        def check(resp) -> ErrorCode:
            worst = ErrorCode.none
            for t in resp.results_by_topic_v3_and_below:
                for p in t.results_by_partition:
                    code = error_code(p.partition_error_code)
                    if code == ErrorCode.operation_not_attempted:
                        continue
                    if code != ErrorCode.none and (worst == ErrorCode.none or not code.retriable):
                        worst = code
            return worst

        try:
            self._coordinator_call("AddPartitionsToTxn", ADD_PARTITIONS, body, check=check,
                                   version=min(3, self._coordinator().version(ADD_PARTITIONS)))
        except KafkaError as exc:
            raise self.abortable(exc) from None
        self.partitions |= new
        self.started = True

    def prepare(self) -> PreparedTxnState:
        """KIP-939 prepare (the producer has flushed every record already)."""
        self._check_not_fatal()
        if not self.enable_two_phase_commit:
            raise KafkaError(ErrorCode.invalid_txn_state,
                             "prepare_transaction needs enable_two_phase_commit=True")
        if self.state == TxnState.PREPARED:
            raise IllegalStateError("prepare_transaction: the transaction is already prepared")
        self.require_transaction("prepare_transaction")
        # A transaction that wrote nothing is not known to the coordinator: there is nothing to
        # identify, and its (producer id, epoch) will also be the next transaction's.
        self.prepared = PreparedTxnState(self.producer_id, self.epoch) if self.started else PreparedTxnState()
        self.state = TxnState.PREPARED
        return self.prepared

    def end(self, commit: bool) -> None:
        """EndTxn (commit or abort) of the open transaction; READY afterwards."""
        self._check_not_fatal()
        what = "commit_transaction" if commit else "abort_transaction"
        if self.state == TxnState.ABORTABLE_ERROR and commit:
            assert self.last_error is not None
            raise self.last_error
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.PREPARED, TxnState.ABORTABLE_ERROR):
            raise IllegalStateError(f"{what}: no transaction in progress (state {self.state.value})")
        if self.started:
            body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                    "producer_epoch": self.epoch, "committed": commit}
            conn = self._coordinator()
            version = conn.version(END_TXN)
            try:
                resp = self._coordinator_call("EndTxn", END_TXN, body, check=lambda r: r.error_code,
                                              version=version)
            except KafkaError as exc:
                if exc.retriable:
                    raise                       # the outcome is unknown: the caller may call again
                raise self._fatal(error_for(exc.code, f"EndTxn({'commit' if commit else 'abort'})"))
            if version >= 5:
                self._set_pair(resp.producer_id, resp.producer_epoch)
        bump = self._needs_bump and not self.tv2
        self._needs_bump = False
        self._clear_txn()
        self.state = TxnState.READY
        if bump:
            self._bump_epoch()

    def _bump_epoch(self) -> None:
        """KIP-360 for transaction version 1: InitProducerId with our current pair bumps the
        epoch without fencing ourselves; sequences restart at 0."""
        body = {"transactional_id": self.transactional_id,
                "transaction_timeout_ms": self.transaction_timeout_ms,
                "producer_id": self.producer_id, "producer_epoch": self.epoch,
                "enable2_pc": self.enable_two_phase_commit, "keep_prepared_txn": False}
        try:
            resp = self._coordinator_call("InitProducerId", INIT_PRODUCER_ID, body,
                                          check=lambda r: r.error_code)
        except KafkaError as exc:
            raise self._fatal(error_for(exc.code, "InitProducerId (epoch bump)")) from None
        self._set_pair(resp.producer_id, resp.producer_epoch)
        self.sequences.reset()

    def complete(self, state: PreparedTxnState) -> bool | None:
        """KIP-939 completeTransaction: True = committed, False = aborted, None = nothing open."""
        self._check_not_fatal()
        if self.state == TxnState.UNINITIALIZED:
            raise IllegalStateError("complete_transaction before init_transactions")
        if self.state == TxnState.READY:
            return None
        commit = self.state == TxnState.PREPARED and self.prepared == state
        self.end(commit)
        return commit

    def send_offsets(self, offsets: Mapping[TopicPartition, int], group_id: str) -> None:
        """Consumer offsets committed with the transaction (AddOffsetsToTxn under version 1,
        then TxnOffsetCommit to the group coordinator)."""
        self.require_transaction("send_offsets_to_transaction")
        try:
            if not self.tv2:
                body = {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
                        "producer_epoch": self.epoch, "group_id": group_id}
                self._coordinator_call("AddOffsetsToTxn", ADD_OFFSETS, body, check=lambda r: r.error_code)
            self.started = True
            topics: dict[str, list[dict]] = {}
            for (t, p), off in sorted(offsets.items()):
                topics.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                                 "committed_leader_epoch": -1, "committed_metadata": ""})
            body = {"transactional_id": self.transactional_id, "group_id": group_id,
                    "producer_id": self.producer_id, "producer_epoch": self.epoch,
                    "generation_id": -1, "member_id": "", "group_instance_id": None,
                    "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

            def check(resp) -> ErrorCode:
                codes = [error_code(p.error_code) for t in resp.topics for p in t.partitions]
                bad = [c for c in codes if c != ErrorCode.none]
                return next((c for c in bad if not c.retriable), bad[0] if bad else ErrorCode.none)

            version = None if self.tv2 else min(4, self.cluster.coordinator(
                group_id, COORDINATOR_GROUP, timeout_ms=self.max_block_ms).version(TXN_OFFSET_COMMIT))
            self._coordinator_call("TxnOffsetCommit", TXN_OFFSET_COMMIT, body, to_group=group_id,
                                   check=check, version=version)
        except ProducerFencedError as exc:
            raise self._fatal(exc) from None
        except KafkaError as exc:
            if exc.retriable:
                raise
            raise self.abortable(exc) from None
