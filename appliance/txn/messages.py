"""The transaction coordinator's requests and results, as they travel the rings.

Owns nothing; imported by frontends (the API handlers build the requests), partition writers
(KIP-890 verification) and the coordinator worker, where ``appliance.txn.service`` serves them
with ``appliance.txn.coordinator.TransactionCoordinator``, which returns the result types defined
here. Fields are Kafka's (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
ListTransactions, DescribeTransactions); version-dependent wire details stay with the handlers,
which pass the request version on as ``api_version`` where the coordinator's answer depends on it
(``fenced_for``: the error code old clients get instead of PRODUCER_FENCED; ``abortable_for``:
the one they get instead of TRANSACTION_ABORTABLE). Partitions are (topic name, partition index).
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request
from appliance.txn.metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

Partition = tuple[str, int]


# -- InitProducerId -----------------------------------------------------------------------------

class InitProducerIdResult(Message):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    # KIP-939 (InitProducerId v6): the pair of the transaction kept open by keepPreparedTxn
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = NO_PRODUCER_EPOCH


class InitProducerIdRequest(Request):
    transactional_id: str | None
    transaction_timeout_ms: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    api_version: int = 0
    enable_2pc: bool = False
    keep_prepared_txn: bool = False

    def error_reply(self, code: ErrorCode) -> InitProducerIdResult:
        return InitProducerIdResult(code)


# -- AddPartitionsToTxn (client form, v0-3) and KIP-890 verification ----------------------------

class PartitionError(msgspec.Struct, array_like=True, frozen=True):
    topic: str
    partition: int
    error: ErrorCode


class AddPartitionsToTxnResult(Message):
    results: list[PartitionError]


class AddPartitionsToTxnRequest(Request):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: list[Partition]
    api_version: int

    def error_reply(self, code: ErrorCode) -> AddPartitionsToTxnResult:
        return AddPartitionsToTxnResult([PartitionError(t, p, code) for t, p in self.partitions])


class VerifyPartitionResult(Message):
    error: ErrorCode


class VerifyPartitionRequest(Request):
    """KIP-890 for one partition: from a partition writer holding a transactional batch, and from
    AddPartitionsToTxn v4+ (VerifyOnly). ``add=False``: part 1, verify only; ``add=True``: part 2,
    the implicit add of Produce v12+."""
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topic: str
    partition: int
    add: bool
    # AddPartitionsToTxn v4+: the coordinator's own codes (``TransactionCoordinator.verify_partition``)
    raw: bool = False

    def error_reply(self, code: ErrorCode) -> VerifyPartitionResult:
        return VerifyPartitionResult(code)


# -- AddOffsetsToTxn, EndTxn --------------------------------------------------------------------

class AddOffsetsToTxnResult(Message):
    error: ErrorCode


class AddOffsetsToTxnRequest(Request):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    api_version: int

    def error_reply(self, code: ErrorCode) -> AddOffsetsToTxnResult:
        return AddOffsetsToTxnResult(code)


class EndTxnResult(Message):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID          # v5+ (KIP-890): the pair to use next
    producer_epoch: int = NO_PRODUCER_EPOCH


class EndTxnRequest(Request):
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    api_version: int

    def error_reply(self, code: ErrorCode) -> EndTxnResult:
        return EndTxnResult(code)


# -- ListTransactions, DescribeTransactions -----------------------------------------------------

class TxnListing(msgspec.Struct, array_like=True, frozen=True):
    transactional_id: str
    producer_id: int
    state: str                                  # Kafka's state name


class ListTransactionsResult(Message):
    error: ErrorCode
    unknown_state_filters: list[str] = []
    transactions: list[TxnListing] = []


class ListTransactionsRequest(Request):
    state_filters: list[str]
    producer_id_filters: list[int]
    duration_filter_ms: int = -1
    transactional_id_pattern: str | None = None     # v2: a Java regular expression

    def error_reply(self, code: ErrorCode) -> ListTransactionsResult:
        return ListTransactionsResult(code)


class TxnDescription(msgspec.Struct, array_like=True, frozen=True):
    error: ErrorCode
    transactional_id: str
    state: str = ""
    timeout_ms: int = 0
    start_time_ms: int = -1
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: list[Partition] = []            # sorted


class DescribeTransactionsResult(Message):
    transactions: list[TxnDescription]


class DescribeTransactionsRequest(Request):
    transactional_ids: list[str]

    def error_reply(self, code: ErrorCode) -> DescribeTransactionsResult:
        return DescribeTransactionsResult([TxnDescription(code, t) for t in self.transactional_ids])


def fenced_for(api_version: int, first_mapped: int, err: ErrorCode) -> ErrorCode:
    """KafkaApis: clients older than ``first_mapped`` do not know PRODUCER_FENCED, and get
    INVALID_PRODUCER_EPOCH instead (InitProducerId < v4; AddPartitionsToTxn, AddOffsetsToTxn and
    EndTxn < v2)."""
    if err == ErrorCode.producer_fenced and api_version < first_mapped:
        return ErrorCode.invalid_producer_epoch
    return err


# KIP-890 (Kafka 3.8) / KIP-1050: the first version of each API whose clients understand
# TRANSACTION_ABORTABLE ("Version N adds support for new error code TRANSACTION_ABORTABLE" in
# Kafka's message definitions): Produce v11, InitProducerId v5, AddPartitionsToTxn v4 (the
# broker form: Kafka's KafkaApis passes its coordinator's answer to a VerifyOnly through at v4
# as at v5, although the definition names v5), AddOffsetsToTxn v4, EndTxn v4, TxnOffsetCommit v4.
ABORTABLE_SINCE = {0: 11, 22: 5, 24: 4, 25: 4, 26: 4, 28: 4}


def abortable_for(api_key: int, api_version: int, err: ErrorCode) -> ErrorCode:
    """TRANSACTION_ABORTABLE for clients whose request version carries it, INVALID_TXN_STATE for
    older ones (Kafka's AddPartitionsToTxnManager ``defaultError`` mapping, "for backward
    compatibility with clients"). Kafka's transaction coordinator writes the code only when a
    KIP-890 verification finds the partition outside the transaction, so it reaches clients
    through Produce and TxnOffsetCommit; InitProducerId, AddOffsetsToTxn, EndTxn and the client
    form of AddPartitionsToTxn never carry it from Kafka 4.3, and the gate keeps it from old
    versions of them should a path ever produce it."""
    if err == ErrorCode.transaction_abortable and api_version < ABORTABLE_SINCE.get(api_key, 1 << 15):
        return ErrorCode.invalid_txn_state
    return err
