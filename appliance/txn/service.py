"""The transaction requests of the coordinator worker: ring requests in, ring results out.

Runs in the coordinator worker (``workers/coordinator.py``), which registers this service with
its ``appliance.service.Registry``; single-threaded, sans-IO. Each method serves one request type
of ``appliance.txn.messages`` with the ``TransactionCoordinator`` (which decides, and logs before
it returns) and answers at once, with one exception below. VerifyPartition comes from partition
writers holding a transactional batch (KIP-890) as well as from frontends (AddPartitionsToTxn v4+).

AddPartitionsToTxn and AddOffsetsToTxn that arrive while the markers of the producer's previous
transaction are still being written wait for them, up to ``wait_ms``, instead of being
answered CONCURRENT_TRANSACTIONS at once (ours; Kafka answers at once). A client of the old
transaction protocol (librdkafka, the Java client before KIP-890's second part) begins its next
transaction a millisecond after EndTxn's answer, which comes once PrepareCommit is logged (KIP-98),
so its first AddPartitionsToTxn often finds the markers still on their way; told CONCURRENT_
TRANSACTIONS, it backs off 20 ms before it asks again, and that partition's records wait as long.
Here the markers take a few milliseconds, so the request is answered when they are done
(``retry_waiting``, each turn of the worker). The answer is one Kafka could give, only later;
after ``wait_ms`` (markers held up by a restarting writer) it is CONCURRENT_TRANSACTIONS, as
before. ``wait_ms`` is ``transactions.add_partitions_retry_backoff_max_ms``, the bound Kafka's
brokers put on their own retries of such an add (100 ms by default). VerifyPartition does not
wait: a partition writer that verifies a batch must not see the marker of the previous
transaction land while the answer is pending (KIP-890's race guard would refuse the batch), so
the writer asks again itself, as Kafka's broker does (``workers/partition_writer.py``).
"""

from __future__ import annotations

from typing import Callable

from appliance.errors import ErrorCode
from appliance.service import Responder, serves
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.messages import (AddOffsetsToTxnRequest, AddOffsetsToTxnResult,
                                    AddPartitionsToTxnRequest, AddPartitionsToTxnResult,
                                    DescribeTransactionsRequest, DescribeTransactionsResult,
                                    EndTxnRequest, EndTxnResult, InitProducerIdRequest,
                                    InitProducerIdResult, ListTransactionsRequest,
                                    ListTransactionsResult, PartitionError, VerifyPartitionRequest,
                                    VerifyPartitionResult)

__all__ = ["TransactionService"]

_Add = AddPartitionsToTxnRequest | AddOffsetsToTxnRequest


class TransactionService:
    def __init__(self, tc: TransactionCoordinator, now_ms: Callable[[], int], wait_ms: int) -> None:
        """``now_ms``: the clock of the waits (the worker's is monotonic). ``wait_ms``: how long
        an add waits for its producer's markers (a reload may change it)."""
        self.tc = tc
        self._now_ms = now_ms
        self.wait_ms = wait_ms
        # Requests waiting for markers, oldest first: (deadline in ms, request, responder).
        self.waiting: list[tuple[int, _Add, Responder]] = []

    @serves(InitProducerIdRequest)
    def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResult:
        return self.tc.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms, req.producer_id, req.producer_epoch,
            api_version=req.api_version, enable_2pc=req.enable_2pc,
            keep_prepared_txn=req.keep_prepared_txn)

    @serves(AddPartitionsToTxnRequest, late=True)
    def add_partitions(self, req: AddPartitionsToTxnRequest, respond: Responder) -> None:
        self._answer(req, respond, self._now_ms() + self.wait_ms)

    @serves(VerifyPartitionRequest)
    def verify_partition(self, req: VerifyPartitionRequest) -> VerifyPartitionResult:
        return VerifyPartitionResult(self.tc.verify_partition(
            req.transactional_id, req.producer_id, req.producer_epoch, (req.topic, req.partition),
            add=req.add, raw=req.raw))

    @serves(AddOffsetsToTxnRequest, late=True)
    def add_offsets(self, req: AddOffsetsToTxnRequest, respond: Responder) -> None:
        self._answer(req, respond, self._now_ms() + self.wait_ms)

    # -- waiting for markers --------------------------------------------------------------------
    def _attempt(self, req: _Add) -> tuple[AddPartitionsToTxnResult | AddOffsetsToTxnResult, bool]:
        """The coordinator's answer now, and whether it was CONCURRENT_TRANSACTIONS."""
        tc = self.tc
        if isinstance(req, AddOffsetsToTxnRequest):
            err = tc.add_offsets(req.transactional_id, req.producer_id, req.producer_epoch,
                                 req.group_id, api_version=req.api_version)
            return AddOffsetsToTxnResult(err), err == ErrorCode.concurrent_transactions
        errors = tc.add_partitions(req.transactional_id, req.producer_id, req.producer_epoch,
                                   req.partitions, api_version=req.api_version)
        return (AddPartitionsToTxnResult([PartitionError(t, p, errors.get((t, p), ErrorCode.none))
                                          for t, p in req.partitions]),
                ErrorCode.concurrent_transactions in errors.values())

    def _answer(self, req: _Add, respond: Responder, deadline_ms: int) -> None:
        result, concurrent = self._attempt(req)
        if concurrent and self.tc.markers.has_job(req.transactional_id) \
                and self._now_ms() < deadline_ms:
            self.waiting.append((deadline_ms, req, respond))
        else:
            respond(result)

    def retry_waiting(self) -> None:
        """Answer the waiting requests whose markers are done, or whose wait is over (each turn
        of the worker: a marker answer is what ends a wait)."""
        if not self.waiting:
            return
        now = self._now_ms()
        has_job = self.tc.markers.has_job
        waiting, self.waiting = self.waiting, []
        for deadline, req, respond in waiting:
            if now < deadline and has_job(req.transactional_id):
                self.waiting.append((deadline, req, respond))
            else:
                self._answer(req, respond, deadline)

    def next_deadline_ms(self) -> int | None:
        """When the first waiting request is answered whatever the markers do."""
        return min(w[0] for w in self.waiting) if self.waiting else None

    def wait_s(self) -> float | None:
        """Seconds until ``next_deadline_ms`` (None: nothing waits)."""
        due = self.next_deadline_ms()
        return None if due is None else max(0.0, (due - self._now_ms()) / 1000)

    def answer_waiting(self) -> None:
        """Answer every waiting request now (the worker stops)."""
        waiting, self.waiting = self.waiting, []
        for _, req, respond in waiting:
            respond(self._attempt(req)[0])

    @serves(EndTxnRequest)
    def end_txn(self, req: EndTxnRequest) -> EndTxnResult:
        return self.tc.end_txn(req.transactional_id, req.producer_id, req.producer_epoch,
                               req.commit, api_version=req.api_version)

    @serves(ListTransactionsRequest)
    def list_transactions(self, req: ListTransactionsRequest) -> ListTransactionsResult:
        return self.tc.list_transactions(req.state_filters, req.producer_id_filters,
                                         req.duration_filter_ms, req.transactional_id_pattern)

    @serves(DescribeTransactionsRequest)
    def describe_transactions(self, req: DescribeTransactionsRequest) -> DescribeTransactionsResult:
        return DescribeTransactionsResult(self.tc.describe_transactions(req.transactional_ids))
