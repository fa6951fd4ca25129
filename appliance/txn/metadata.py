"""Transaction states, the transition table, and the per-transactional-id metadata.

Owns nothing shared; used by the coordinator worker only (``coordinator`` and
``state_manager``). States and their ids are Kafka's (TransactionState.scala; the id is what the
transaction log stores, the name is what DescribeTransactions/ListTransactions show). The table
``VALID_PREVIOUS_STATES`` is Kafka's ``validPreviousStates``; every state change goes through
``TransactionMetadata.transition``, which checks it and raises ``IllegalTransition`` otherwise.
The coordinator catches that and answers INVALID_TXN_STATE: it never reaches the worker loop.

PrepareEpochFence is never written to the log (as in Kafka): it is the in-memory step between
Ongoing and PrepareAbort when the coordinator bumps the epoch to fence a producer (InitProducerId
on an Ongoing transaction, transaction timeout). Dead is never written either: expiration writes a
tombstone (null value) instead.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field

from appliance.txn.records import TransactionLogValue

__all__ = [
    "TransactionState", "VALID_PREVIOUS_STATES", "IllegalTransition", "TransactionMetadata",
    "NO_PRODUCER_ID", "NO_PRODUCER_EPOCH", "MAX_EPOCH", "is_epoch_exhausted",
    "TV_0", "TV_2",
]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767            # Short.MaxValue
TV_0 = 0                     # client transaction version of KIP-98 clients (EndTxn <= v4)
TV_2 = 2                     # KIP-890 part 2: EndTxn v5+, every commit/abort bumps the epoch


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka's TransactionMetadata.isEpochExhausted: a client never gets Short.MaxValue, so the
    coordinator can always fence it by one more bump (MAX is reserved for that and for the
    markers of an overflowing TV2 commit)."""
    return epoch >= MAX_EPOCH - 1


class TransactionState(enum.IntEnum):
    """Member names are Kafka's state names (``TransactionState.name``), values its ids."""

    Empty = 0
    Ongoing = 1
    PrepareCommit = 2
    PrepareAbort = 3
    CompleteCommit = 4
    CompleteAbort = 5
    Dead = 6
    PrepareEpochFence = 7

    @classmethod
    def from_name(cls, name: str) -> "TransactionState | None":
        """The state with Kafka's name (``"Ongoing"``), or None."""
        return cls.__members__.get(name)

    @property
    def is_expiration_allowed(self) -> bool:
        return self in (TransactionState.Empty, TransactionState.CompleteCommit,
                        TransactionState.CompleteAbort)

    @property
    def is_prepare(self) -> bool:
        return self in (TransactionState.PrepareCommit, TransactionState.PrepareAbort)

    @property
    def is_complete(self) -> bool:
        return self in (TransactionState.CompleteCommit, TransactionState.CompleteAbort)


S = TransactionState
# target state -> the states it may be entered from (Kafka's validPreviousStates)
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    S.Empty: frozenset({S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.Ongoing: frozenset({S.Ongoing, S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.PrepareCommit: frozenset({S.Ongoing}),
    S.PrepareAbort: frozenset({S.Ongoing, S.PrepareEpochFence}),
    S.CompleteCommit: frozenset({S.PrepareCommit}),
    S.CompleteAbort: frozenset({S.PrepareAbort}),
    S.Dead: frozenset({S.Empty, S.CompleteCommit, S.CompleteAbort}),
    S.PrepareEpochFence: frozenset({S.Ongoing}),
}
del S


class IllegalTransition(Exception):
    def __init__(self, transactional_id: str, current: TransactionState, target: TransactionState) -> None:
        super().__init__(f"transactional id {transactional_id!r}: {current.name} -> "
                         f"{target.name} is not a valid transition")
        self.current = current
        self.target = target


@dataclass(slots=True)
class TransactionMetadata:
    """What the coordinator knows about one transactional id (Kafka's TransactionMetadata).

    ``prev_producer_id``: the producer id of the last transaction (KIP-890: lets a retried EndTxn
    after an epoch overflow be recognised). ``next_producer_id``: the id an overflowing TV2
    commit/abort hands to the client (set in Prepare*, moved to ``producer_id`` by Complete*).
    ``next_producer_epoch``: KIP-939, carried through the log, unused until 2PC.
    ``last_producer_epoch``: the epoch before the last bump (KIP-360 retries of InitProducerId);
    in memory only, -1 after a load (as in Kafka, whose log record has no such field).
    ``pending_state``: a transition in progress; while set, requests answer
    CONCURRENT_TRANSACTIONS (here: Complete* while a transaction's markers are being written).
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    prev_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    next_producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: set[tuple[str, int]] = field(default_factory=set)
    txn_start_ms: int = -1
    txn_last_update_ms: int = -1
    client_txn_version: int = TV_0
    pending_state: TransactionState | None = None

    def transition(self, target: TransactionState) -> None:
        """Move to ``target`` if Kafka's table allows it from the current state."""
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalTransition(self.transactional_id, self.state, target)
        self.state = target

    def copy(self) -> "TransactionMetadata":
        new = copy.copy(self)
        new.partitions = set(self.partitions)
        return new

    @property
    def is_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    # -- log record -----------------------------------------------------------------------------
    def to_log_value(self) -> TransactionLogValue:
        if self.state in (TransactionState.Dead, TransactionState.PrepareEpochFence):
            raise ValueError(f"{self.state.name} is never written to the transaction log")
        if self.state == TransactionState.Empty:
            if self.partitions:
                raise ValueError("an Empty transaction cannot hold partitions")
            parts = None            # Kafka writes null for Empty
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, p in sorted(self.partitions):
                by_topic.setdefault(topic, []).append(p)
            parts = list(by_topic.items())
        return TransactionLogValue(
            producer_id=self.producer_id, producer_epoch=self.producer_epoch,
            transaction_timeout_ms=self.txn_timeout_ms, transaction_status=int(self.state),
            transaction_partitions=parts, transaction_last_update_ms=self.txn_last_update_ms,
            transaction_start_ms=self.txn_start_ms, previous_producer_id=self.prev_producer_id,
            next_producer_id=self.next_producer_id,
            client_transaction_version=self.client_txn_version,
            next_producer_epoch=self.next_producer_epoch)

    @classmethod
    def from_log_value(cls, transactional_id: str, v: TransactionLogValue) -> "TransactionMetadata":
        """Raises ValueError for a status id that is not a TransactionState."""
        state = TransactionState(v.transaction_status)
        parts: set[tuple[str, int]] = set()
        if state != TransactionState.Empty and v.transaction_partitions:
            parts = {(topic, p) for topic, ids in v.transaction_partitions for p in ids}
        return cls(transactional_id=transactional_id, producer_id=v.producer_id,
                   producer_epoch=v.producer_epoch, txn_timeout_ms=v.transaction_timeout_ms,
                   state=state, prev_producer_id=v.previous_producer_id,
                   next_producer_id=v.next_producer_id, next_producer_epoch=v.next_producer_epoch,
                   last_producer_epoch=NO_PRODUCER_EPOCH, partitions=parts,
                   txn_start_ms=v.transaction_start_ms,
                   txn_last_update_ms=v.transaction_last_update_ms,
                   client_txn_version=v.client_transaction_version)
