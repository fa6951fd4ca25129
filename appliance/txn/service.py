"""The transaction requests of the coordinator worker: ring requests in, ring results out.

Runs in the coordinator worker (``workers/coordinator.py``), which registers this service with
its ``appliance.service.Registry``; single-threaded, sans-IO. Each method serves one request type
of ``appliance.txn.messages`` with the ``TransactionCoordinator`` (which decides, and logs before
it returns) and answers at once. VerifyPartition comes from partition writers holding a
transactional batch (KIP-890) as well as from frontends (AddPartitionsToTxn v4+).
"""

from __future__ import annotations

from appliance.errors import ErrorCode
from appliance.service import serves
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.messages import (AddOffsetsToTxnRequest, AddOffsetsToTxnResult,
                                    AddPartitionsToTxnRequest, AddPartitionsToTxnResult,
                                    DescribeTransactionsRequest, DescribeTransactionsResult,
                                    EndTxnRequest, EndTxnResult, InitProducerIdRequest,
                                    InitProducerIdResult, ListTransactionsRequest,
                                    ListTransactionsResult, PartitionError, VerifyPartitionRequest,
                                    VerifyPartitionResult)

__all__ = ["TransactionService"]


class TransactionService:
    def __init__(self, tc: TransactionCoordinator) -> None:
        self.tc = tc

    @serves(InitProducerIdRequest)
    def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResult:
        return self.tc.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms, req.producer_id, req.producer_epoch,
            api_version=req.api_version, enable_2pc=req.enable_2pc,
            keep_prepared_txn=req.keep_prepared_txn)

    @serves(AddPartitionsToTxnRequest)
    def add_partitions(self, req: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResult:
        errors = self.tc.add_partitions(req.transactional_id, req.producer_id, req.producer_epoch,
                                        req.partitions, api_version=req.api_version)
        return AddPartitionsToTxnResult([PartitionError(t, p, errors.get((t, p), ErrorCode.none))
                                         for t, p in req.partitions])

    @serves(VerifyPartitionRequest)
    def verify_partition(self, req: VerifyPartitionRequest) -> VerifyPartitionResult:
        return VerifyPartitionResult(self.tc.verify_partition(
            req.transactional_id, req.producer_id, req.producer_epoch, (req.topic, req.partition),
            add=req.add))

    @serves(AddOffsetsToTxnRequest)
    def add_offsets(self, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResult:
        return AddOffsetsToTxnResult(self.tc.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id,
            api_version=req.api_version))

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
