"""KIP-890 verification of one partition's transactional produce: ``TransactionVerifier``.

Owned by the partition's writer process (``workers/partition_writer.py`` runs it, on its one
thread); sans-IO: no rings, no clock, no coordinator. It owns the produce requests parked for
verification (by producer id, in arrival order: a copy of each batch, the ring slot it came in is
reused), the question in flight or the retry due for each such producer, and the ids of its
questions. Its methods return **actions** that the writer carries out, in order:

* ``AskCoordinator``: send ``VerifyPartitionRequest`` to the coordinator under that request id;
* ``AppendParked``: append this parked batch now (sequence checks, log, producer state, ack),
  as any produce batch;
* ``FailParked``: answer this parked request with this error, nothing appended.

The rule (docs/transactions.md, "Writer side"): a transactional batch of a producer with no open
transaction on this partition is parked, with every later batch of that producer, until the
coordinator confirms (KIP-890 part 1: verify only) or performs (part 2, Produce v12: implicit add)
that the partition belongs to the producer's transaction. A marker arriving meanwhile voids the
confirmation (the race guard: ``ProducerStateManager.start_verification`` / ``verification_valid``)
and the batch is refused with INVALID_TXN_STATE. An implicit add that meets the previous
transaction's markers still on their way (CONCURRENT_TRANSACTIONS) is asked again, with a new
guard, every ``add_partitions_retry_backoff_ms`` for up to ``add_partitions_retry_backoff_max_ms``
from the first question before the client is told, as Kafka's ReplicaManager does for clients of
transaction version 2 (maybeRetryOnConcurrentTransactions): a Produce is costly to retry and the
client's backoff long. A question unanswered within ``server.internal_request_timeout_ms`` fails
its producer's parked requests with NOT_ENOUGH_REPLICAS.

Which batch parks is decided on the writer's fast path without a call (it reads ``parked`` and
``enabled`` here and asks the producer state, ``ProducerStateManager.needs_verification``); the
same test applies again here to each later batch released after a verification (``verified``).

Times are ``time.monotonic()`` seconds, handed in by the caller.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Union

from appliance.config import Config
from appliance.errors import ErrorCode
from appliance.log.producer_state import ProducerStateManager
from appliance.protocol.records import BatchHeader, read_header

__all__ = ["TransactionVerifier", "Parked", "Verifying", "AskCoordinator", "AppendParked",
           "FailParked", "VERIFY_ERRORS", "VERIFY_FAILED"]

# The start of the error message of every refusal a verification decided (``FailParked``): the
# frontend leaves them out of the failed-produce counter, as Kafka's ReplicaManager does (its
# postVerificationCallback answers them without marking failedProduceRequestRate).
VERIFY_FAILED = "transaction verification failed: "

# KIP-890 verification failures as a producer sees them (Kafka's ReplicaManager and
# AddPartitionsToTxnManager): retriable coordinator trouble becomes NOT_ENOUGH_REPLICAS, which old
# clients retry without a metadata refresh (CONCURRENT_TRANSACTIONS only for Produce before v12).
VERIFY_ERRORS = {
    ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
    ErrorCode.transaction_abortable: ErrorCode.invalid_txn_state,
    ErrorCode.concurrent_transactions: ErrorCode.not_enough_replicas,
    ErrorCode.network_exception: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_load_in_progress: ErrorCode.not_enough_replicas,
    ErrorCode.coordinator_not_available: ErrorCode.not_enough_replicas,
    ErrorCode.not_coordinator: ErrorCode.not_enough_replicas,
    ErrorCode.request_timed_out: ErrorCode.not_enough_replicas,
}


@dataclass
class Parked:
    """A produce request waiting for its partition to be verified (a copy of the batch: the ring
    slot it came in is reused)."""
    src: str
    req_id: int
    acks: int
    version: int
    txn_id: str
    batch: bytearray


@dataclass
class Verifying:
    req_id: int | None       # the question in flight; None: waiting to ask again
    token: object            # the KIP-890 guard of the question in flight
    deadline: float          # when its answer is overdue, or (req_id None) when to ask again
    started: float           # the first question: the retries' window counts from it


class AskCoordinator(NamedTuple):
    """Send ``VerifyPartitionRequest(transactional_id, producer_id, producer_epoch, <this
    partition>, add)`` to the coordinator under ``req_id``; its answer goes to ``verified``."""
    req_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    add: bool


class AppendParked(NamedTuple):
    """Append the parked batch now, as any produce batch (its header read once more)."""
    parked: Parked
    header: BatchHeader


class FailParked(NamedTuple):
    """Answer the parked request with ``code`` (already the one its Produce version gets)."""
    parked: Parked
    code: ErrorCode

    @property
    def message(self) -> str:
        return f"{VERIFY_FAILED}{self.code.name}"


Action = Union[AskCoordinator, AppendParked, FailParked]


class TransactionVerifier:
    """The KIP-890 verifications of one partition (see the module docstring)."""

    def __init__(self, psm: ProducerStateManager, cfg: Config, generation: int,
                 ids: Iterator[int] | None = None) -> None:
        self.psm = psm
        self.parked: dict[int, collections.deque[Parked]] = {}     # by producer id
        self.verifying: dict[int, Verifying] = {}                  # by producer id
        self.verify_reqs: dict[int, int] = {}                      # request id -> producer id
        # Request ids unique across the writer's generations (a late answer to a predecessor's
        # question matches nothing), and across the partitions of its process (``ids``: the
        # process's one counter, so that an answer finds its partition).
        self._ids = ids if ids is not None else itertools.count(((generation & 0xFFFF) << 40) | 1)
        self.configure(cfg)

    def configure(self, cfg: Config) -> None:
        """The settings (at start and at every reload)."""
        self.enabled = cfg.transactions.partition_verification_enable
        self.timeout_s = cfg.server.internal_request_timeout_ms / 1000
        self.add_retry_s = cfg.transactions.add_partitions_retry_backoff_ms / 1000
        self.add_retry_max_s = cfg.transactions.add_partitions_retry_backoff_max_ms / 1000

    def must_verify(self, h: BatchHeader, version: int) -> bool:
        """Whether a transactional batch of a producer with nothing parked waits for the
        coordinator: verification on (or Produce v12, whose implicit add is always asked) and
        no open transaction of its epoch here. The writer's fast path tests the same inline."""
        return h.is_transactional and (self.enabled or version >= 12) \
            and self.psm.needs_verification(h)

    def next_deadline(self) -> float | None:
        """When ``expire`` has something to do: an answer overdue or a retry due."""
        if not self.verifying:
            return None
        return min(v.deadline for v in self.verifying.values())

    # -- park and ask ------------------------------------------------------------------------------
    def park(self, p: Parked, h: BatchHeader, now: float) -> list[Action]:
        """Hold ``p`` behind the producer's other parked batches; ask the coordinator when no
        question of that producer is in flight."""
        pid = h.producer_id
        queue = self.parked.setdefault(pid, collections.deque())
        queue.append(p)
        if pid in self.verifying:
            return []
        if not p.txn_id:
            return self._fail(pid, ErrorCode.transactional_id_authorization_failed)
        return [self._ask(pid, p, h, now, now)]

    def _ask(self, pid: int, p: Parked, h: BatchHeader, started: float,
             now: float) -> AskCoordinator:
        """Ask the coordinator about the first parked batch of ``pid``, under a new guard."""
        req_id = next(self._ids)
        token = self.psm.start_verification(pid, h.producer_epoch)
        self.verifying[pid] = Verifying(req_id, token, now + self.timeout_s, started)
        self.verify_reqs[req_id] = pid
        return AskCoordinator(req_id, p.txn_id, pid, h.producer_epoch, p.version >= 12)

    # -- the answer --------------------------------------------------------------------------------
    def verified(self, req_id: int, error: ErrorCode, now: float) -> Iterator[Action]:
        """The coordinator's answer to a verification (the only answer a writer gets).

        A generator: the caller carries out each action before it takes the next, because
        whether a later parked batch of the producer needs a verification of its own depends on
        what the appends before it did to the producer state (the first opens the transaction
        here; a later one of the next transaction parks again, in order)."""
        pid = self.verify_reqs.pop(req_id, None)
        if pid is None:
            return                           # timed out earlier and answered already
        v = self.verifying.pop(pid)
        held = self.parked.get(pid)
        # An implicit add (KIP-890 part 2) that met the previous transaction's markers.
        add_concurrent = (error == ErrorCode.concurrent_transactions and bool(held)
                          and held[0].version >= 12)
        if add_concurrent:
            # Ask again after the backoff while the window lasts (Kafka's ReplicaManager
            # maybeRetryOnConcurrentTransactions; the window counts from the first question).
            if now - v.started < self.add_retry_max_s:
                self.verifying[pid] = Verifying(None, None, now + self.add_retry_s, v.started)
                return
        if error == ErrorCode.none and not self.psm.verification_valid(pid, v.token):
            # A marker for this producer landed between the check and now (KIP-890 race guard).
            yield from self._fail(pid, ErrorCode.invalid_txn_state)
            return
        if error != ErrorCode.none:
            # Transaction version 2 clients get CONCURRENT_TRANSACTIONS itself, as Kafka's
            # ReplicaManager passes it on for them: common at a commit, and clearer.
            code = error if add_concurrent else VERIFY_ERRORS.get(error, error)
            yield from self._fail(pid, code)
            return
        queue = self.parked.pop(pid, collections.deque())
        first = True                         # the batch this verification was for
        while queue:
            p = queue.popleft()
            h = read_header(p.batch, 0)
            if not first and self.must_verify(h, p.version):
                # It belongs to a later transaction of this producer: verify again, in order.
                actions = self.park(p, h, now)
                self.parked[pid].extend(queue)
                yield from actions
                return
            first = False
            yield AppendParked(p, h)

    def _fail(self, pid: int, code: ErrorCode) -> list[Action]:
        out: list[Action] = []
        for p in self.parked.pop(pid, ()):
            c = code
            if c == ErrorCode.invalid_txn_state and p.version > 10:
                # Kafka answers Produce v11+ with the abortable error (KafkaApis: genericError).
                c = ErrorCode.transaction_abortable
            out.append(FailParked(p, c))
        return out

    # -- timers ------------------------------------------------------------------------------------
    def expire(self, now: float) -> list[Action]:
        """Ask again where a retried add's backoff is over; fail the producers whose answer is
        overdue (NOT_ENOUGH_REPLICAS: retriable, no metadata refresh)."""
        if not self.verifying:
            return []
        out: list[Action] = []
        for pid, v in list(self.verifying.items()):
            if v.deadline > now:
                continue
            if v.req_id is None:             # the backoff of a retried add is over
                p = self.parked[pid][0]
                out.append(self._ask(pid, p, read_header(p.batch, 0), v.started, now))
                continue
            del self.verifying[pid]
            self.verify_reqs.pop(v.req_id, None)
            out += self._fail(pid, ErrorCode.not_enough_replicas)
        return out
