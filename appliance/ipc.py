"""Messages that travel between the appliance's processes through shm rings.

Owns nothing; imported by every process. Two encodings:

* The produce path (frontend -> writer, writer -> frontend) is hot, so its messages are fixed
  ``struct`` headers followed by raw bytes, read in place from the ring:

      ProduceRequest  (frontend -> writer), little endian, 24 bytes, the transactional id, then
      the record batch:
        0  u8   kind = KIND_PRODUCE
        1  u8   flags (reserved)
        2  i16  acks (0, 1, -1)
        4  u32  writer generation the frontend addressed (a restarted writer refuses older ones)
        8  u64  request id (unique per frontend process incarnation)
        16 i32  batch length
        20 u16  Produce request version (KIP-890: v12+ adds partitions to the transaction itself)
        22 u16  length of the transactional id (0 = none)
        24 ...  the transactional id (UTF-8), then the RecordBatch exactly as the client sent it
                (the writer patches the base offset in place)

      ProduceAck (writer -> frontend), 48 bytes then an optional UTF-8 error message:
        0  u8   kind = KIND_PRODUCE_ACK
        1  u8   reserved
        2  i16  error code
        4  u32  writer generation
        8  u64  request id
        16 i64  base offset (-1 on error)
        24 i64  log append time (-1 for CreateTime topics)
        32 i64  log start offset
        40 i32  message length, 44 u32 reserved, 48 ... message bytes

* Everything else (admin, fetch, coordinator) is a msgspec Struct in a tagged union, msgpack
  encoded with ``array_like`` (positional, small, ~1 µs). ``encode``/``decode`` below handle it; the
  first byte of such a record is never KIND_PRODUCE/KIND_PRODUCE_ACK because msgpack arrays start
  at 0x90 or above.
"""

from __future__ import annotations

import struct
from typing import Union

import msgspec

KIND_PRODUCE = 1
KIND_PRODUCE_ACK = 2

PRODUCE_HDR = struct.Struct("<BBhIQiHH")
PRODUCE_ACK = struct.Struct("<BBhIQqqqiI")
assert PRODUCE_HDR.size == 24 and PRODUCE_ACK.size == 48


def produce_header(acks: int, generation: int, request_id: int, batch_len: int, version: int = 0,
                   transactional_id: str | None = None) -> bytes:
    tid = transactional_id.encode() if transactional_id else b""
    return PRODUCE_HDR.pack(KIND_PRODUCE, 0, acks, generation, request_id, batch_len, version,
                            len(tid)) + tid


def produce_ack(error: int, generation: int, request_id: int, base_offset: int,
                log_append_time: int, log_start_offset: int, message: str | None = None) -> bytes:
    msg = message.encode("utf-8", "replace")[:1024] if message else b""
    return PRODUCE_ACK.pack(KIND_PRODUCE_ACK, 0, error, generation, request_id, base_offset,
                            log_append_time, log_start_offset, len(msg), 0) + msg


# -- msgpack messages -------------------------------------------------------------------------

class _Msg(msgspec.Struct, tag=True, array_like=True, frozen=True):
    pass


# Admin: frontend -> supervisor -> frontend

class NewTopic(msgspec.Struct, array_like=True, frozen=True):
    name: str
    num_partitions: int
    configs: dict[str, str] = {}


class CreateTopicsReq(_Msg):
    req_id: int
    topics: list[NewTopic]
    validate_only: bool = False


class TopicResult(msgspec.Struct, array_like=True, frozen=True):
    name: str
    error_code: int
    error_message: str | None = None
    topic_id: bytes = b""
    num_partitions: int = -1
    configs: dict[str, str] = {}


class CreateTopicsResp(_Msg):
    req_id: int
    results: list[TopicResult]


class DeleteTopicsReq(_Msg):
    req_id: int
    names: list[str]


class DeleteTopicsResp(_Msg):
    req_id: int
    results: list[TopicResult]


# Fetch: frontend -> fetcher -> frontend

class FetchPart(msgspec.Struct, array_like=True, frozen=True):
    topic_id: bytes
    partition: int
    fetch_offset: int
    max_bytes: int


class FetchReq(_Msg):
    req_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    parts: list[FetchPart]


class Slice(msgspec.Struct, array_like=True, frozen=True):
    segment_base: int
    position: int
    length: int


class FetchPartResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] | None = None
    slices: list[Slice] = []


class FetchResp(_Msg):
    req_id: int
    parts: list[FetchPartResult]


class ListOffsetsPart(msgspec.Struct, array_like=True, frozen=True):
    topic_id: bytes
    partition: int
    timestamp: int


class ListOffsetsReq(_Msg):
    req_id: int
    isolation_level: int
    parts: list[ListOffsetsPart]


class ListOffsetsResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    timestamp: int = -1
    offset: int = -1


class ListOffsetsResp(_Msg):
    req_id: int
    parts: list[ListOffsetsResult]


# Coordinator: frontend -> coordinator -> frontend

class InitProducerIdReq(_Msg):
    req_id: int
    transactional_id: str | None
    transaction_timeout_ms: int
    producer_id: int = -1
    producer_epoch: int = -1
    version: int = 0
    enable_2pc: bool = False
    keep_prepared_txn: bool = False


class InitProducerIdResp(_Msg):
    req_id: int
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    ongoing_txn_producer_id: int = -1
    ongoing_txn_producer_epoch: int = -1


# Producer state: frontend -> writer (on the produce ring) -> frontend (on the ack ring)

class DescribeProducersReq(_Msg):
    req_id: int


class ProducerInfo(msgspec.Struct, array_like=True, frozen=True):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


class DescribeProducersResp(_Msg):
    req_id: int
    error_code: int
    producers: list[ProducerInfo] = []


# Transactions (docs/transactions.md). Partitions are (topic name, partition index).

class TxnPartitions(msgspec.Struct, array_like=True, frozen=True):
    topic: str
    partitions: list[int]


class AddPartitionsToTxnReq(_Msg):        # frontend -> coordinator (client form, v0-3)
    req_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topics: list[TxnPartitions]
    version: int


class PartitionError(msgspec.Struct, array_like=True, frozen=True):
    topic: str
    partition: int
    error_code: int


class AddPartitionsToTxnResp(_Msg):
    req_id: int
    results: list[PartitionError]


class VerifyTxnReq(_Msg):                 # writer -> coordinator, and frontend (v4+ API)
    req_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    topic: str
    partition: int
    add: bool                              # False: KIP-890 part 1 verify only; True: implicit add


class VerifyTxnResp(_Msg):
    req_id: int
    error_code: int


class AddOffsetsToTxnReq(_Msg):
    req_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    version: int


class EndTxnReq(_Msg):
    req_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    version: int


class TxnResp(_Msg):                       # AddOffsetsToTxn, EndTxn
    req_id: int
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1


class WriteMarkerReq(_Msg):                # coordinator (or the WriteTxnMarkers API) -> writer
    req_id: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


class FenceProducerReq(_Msg):              # coordinator -> writer, no answer
    """KIP-939: a transaction kept by InitProducerId(keepPreparedTxn) still has its producer id
    and epoch on the partitions; data batches below ``producer_epoch`` are refused from now on,
    until a marker for the producer lands (ours: Kafka lets such a zombie append to the prepared
    transaction until the marker)."""
    producer_id: int
    producer_epoch: int


class WriteMarkerResp(_Msg):
    req_id: int
    error_code: int


class ListTransactionsReq(_Msg):
    req_id: int
    state_filters: list[str]
    producer_id_filters: list[int]
    duration_filter_ms: int = -1
    transactional_id_pattern: str | None = None     # v2: a Java regular expression


class TxnListing(msgspec.Struct, array_like=True, frozen=True):
    transactional_id: str
    producer_id: int
    state: str


class ListTransactionsResp(_Msg):
    req_id: int
    error_code: int
    unknown_state_filters: list[str]
    transactions: list[TxnListing]


class DescribeTransactionsReq(_Msg):
    req_id: int
    transactional_ids: list[str]


class TxnDescription(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    transactional_id: str
    state: str = ""
    timeout_ms: int = 0
    start_time_ms: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    topics: list[TxnPartitions] = []


class DescribeTransactionsResp(_Msg):
    req_id: int
    transactions: list[TxnDescription]


# Consumer groups and offsets (issue 5): frontend -> coordinator -> frontend. JoinGroup and
# SyncGroup are answered late (when the rebalance completes); the frontend waits for them as long
# as the rebalance timeout allows.

class GroupProtocol(msgspec.Struct, array_like=True, frozen=True):
    name: str
    metadata: bytes


class GroupMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinGroupReq(_Msg):
    req_id: int
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[GroupProtocol]
    reason: str | None
    version: int
    client_id: str
    client_host: str


class JoinGroupResp(_Msg):
    req_id: int
    error_code: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    member_id: str = ""
    members: list[GroupMember] = []


class SyncGroupReq(_Msg):
    req_id: int
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: list[GroupProtocol]       # (member id, assignment)
    version: int


class SyncGroupResp(_Msg):
    req_id: int
    error_code: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class HeartbeatReq(_Msg):
    req_id: int
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


class GroupResp(_Msg):                     # Heartbeat, and any single-error answer
    req_id: int
    error_code: int


class LeavingMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None
    error_code: int = 0


class LeaveGroupReq(_Msg):
    req_id: int
    group_id: str
    members: list[LeavingMember]


class LeaveGroupResp(_Msg):
    req_id: int
    error_code: int
    members: list[LeavingMember] = []


class OffsetEntry(msgspec.Struct, array_like=True, frozen=True):
    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = ""
    error_code: int = 0


class OffsetCommitReq(_Msg):
    req_id: int
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    offsets: list[OffsetEntry]
    version: int


class TxnOffsetCommitReq(_Msg):
    req_id: int
    transactional_id: str
    group_id: str
    producer_id: int
    producer_epoch: int
    generation_id: int
    member_id: str
    group_instance_id: str | None
    offsets: list[OffsetEntry]
    version: int


class OffsetsResp(_Msg):                   # OffsetCommit, TxnOffsetCommit, OffsetDelete
    req_id: int
    error_code: int
    offsets: list[OffsetEntry] = []


class OffsetFetchGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    partitions: list[OffsetEntry] | None   # None: every partition with a committed offset
    error_code: int = 0


class OffsetFetchReq(_Msg):
    req_id: int
    groups: list[OffsetFetchGroup]
    require_stable: bool


class OffsetFetchResp(_Msg):
    req_id: int
    groups: list[OffsetFetchGroup]


class OffsetDeleteReq(_Msg):
    req_id: int
    group_id: str
    partitions: list[OffsetEntry]


class DescribeGroupsReq(_Msg):
    req_id: int
    group_ids: list[str]


class DescribedMember(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


class DescribedGroup(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    group_id: str
    state: str = ""
    protocol_type: str = ""
    protocol: str = ""
    members: list[DescribedMember] = []


class DescribeGroupsResp(_Msg):
    req_id: int
    groups: list[DescribedGroup]


class ListGroupsReq(_Msg):
    req_id: int
    states: list[str]
    types: list[str]


class ListedGroup(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


class ListGroupsResp(_Msg):
    req_id: int
    error_code: int
    groups: list[ListedGroup] = []


class DeleteGroupsReq(_Msg):
    req_id: int
    group_ids: list[str]


class GroupError(msgspec.Struct, array_like=True, frozen=True):
    group_id: str
    error_code: int


class DeleteGroupsResp(_Msg):
    req_id: int
    results: list[GroupError]


Message = Union[CreateTopicsReq, CreateTopicsResp, DeleteTopicsReq, DeleteTopicsResp,
                FetchReq, FetchResp, ListOffsetsReq, ListOffsetsResp,
                InitProducerIdReq, InitProducerIdResp, DescribeProducersReq, DescribeProducersResp,
                AddPartitionsToTxnReq, AddPartitionsToTxnResp, VerifyTxnReq, VerifyTxnResp,
                AddOffsetsToTxnReq, EndTxnReq, TxnResp, WriteMarkerReq, WriteMarkerResp, FenceProducerReq,
                ListTransactionsReq, ListTransactionsResp, DescribeTransactionsReq,
                DescribeTransactionsResp,
                JoinGroupReq, JoinGroupResp, SyncGroupReq, SyncGroupResp, HeartbeatReq, GroupResp,
                LeaveGroupReq, LeaveGroupResp, OffsetCommitReq, TxnOffsetCommitReq, OffsetsResp,
                OffsetFetchReq, OffsetFetchResp, OffsetDeleteReq, DescribeGroupsReq,
                DescribeGroupsResp, ListGroupsReq, ListGroupsResp, DeleteGroupsReq, DeleteGroupsResp]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes | memoryview) -> Message:
    return _decoder.decode(data)
