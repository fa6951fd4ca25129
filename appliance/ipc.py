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

* Everything else is the **envelope**: a msgpack array ``[request id, body]`` where the body is a
  ``Message``, a msgspec Struct tagged by its class name, encoded ``array_like`` (positional,
  small, ~1 µs). ``encode``/``decode`` below handle it; its first byte is 0x92, never
  KIND_PRODUCE/KIND_PRODUCE_ACK. The request id belongs to the envelope, not to the body: the
  sender picks it, the answer carries it back, and the domain types never see it.

A ``Request`` is a message that asks for something and knows its own error answer
(``error_reply``, Kafka's getErrorResponse); any other ``Message`` is an answer, or a one-way
notice. The domain request and result types are defined next to the code that serves them, each
package's in a module named ``messages`` (``appliance.txn.messages``, ``appliance.group.messages``,
``appliance.catalog.messages`` ...); this module holds the base classes and the messages of the
data path: Fetch and ListOffsets (frontend -> fetcher), and what the partition writers are asked
besides Produce (markers, KIP-939 fences, DescribeProducers, DeleteRecords). The decoder's tagged
union is every ``Message`` subclass of this module and of every ``messages`` module of the
``appliance`` package tree that builds on this one (``message_modules``: found on disk, so a new
package's messages need no list kept by hand), collected the first time it decodes.
"""

from __future__ import annotations

import importlib
import os
import re
import struct
from dataclasses import dataclass
from typing import Union

import msgspec

from appliance.errors import ErrorCode
from shm.topology import SPILLED, unspill

KIND_PRODUCE = 1
KIND_PRODUCE_ACK = 2

# A produce record: kind, 0, acks, the writer process's generation, request id, batch length,
# Produce version, transactional id length, then the partition it is for (topic id, index: a
# writer process carries many partitions and its rings are the process's), the transactional id,
# the batch.
PRODUCE_HDR = struct.Struct("<BBhIQiHH16sI")
PRODUCE_ACK = struct.Struct("<BBhIQqqqiI")
PRODUCE_KEY = struct.Struct("<16sI")          # the partition, at PRODUCE_KEY_AT
PRODUCE_KEY_AT = 24
assert PRODUCE_HDR.size == 44 and PRODUCE_ACK.size == 48


def produce_header(acks: int, generation: int, request_id: int, batch_len: int, version: int = 0,
                   transactional_id: str | None = None, topic_id: bytes = bytes(16),
                   partition: int = 0) -> bytes:
    tid = transactional_id.encode() if transactional_id else b""
    return PRODUCE_HDR.pack(KIND_PRODUCE, 0, acks, generation, request_id, batch_len, version,
                            len(tid), topic_id, partition) + tid


def produce_ack(error: int, generation: int, request_id: int, base_offset: int,
                log_append_time: int, log_start_offset: int, message: str | None = None) -> bytes:
    msg = message.encode("utf-8", "replace")[:1024] if message else b""
    return PRODUCE_ACK.pack(KIND_PRODUCE_ACK, 0, error, generation, request_id, base_offset,
                            log_append_time, log_start_offset, len(msg), 0) + msg


@dataclass(slots=True)
class ProduceResult:
    """One partition's answer to a produce request, as the frontend's handler sees it: a
    ProduceAck read from the ring, or an error the frontend decided itself."""
    error_code: int
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


# -- the envelope ---------------------------------------------------------------------------------

class Message(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A body of the envelope: an answer, or (as ``Request``) a question."""


class Request(Message):
    """A message served by a ``@serves`` method (``appliance.service``)."""

    def error_reply(self, code: ErrorCode) -> Message | None:
        """The answer that carries ``code`` for everything asked (Kafka's getErrorResponse);
        None for a one-way notice that gets no answer."""
        return None


_ROOT = os.path.dirname(os.path.abspath(__file__))          # the appliance package


def message_modules() -> list[str]:
    """This module and every module named ``messages`` under the ``appliance`` package that
    imports this one (ring messages live beside the code that serves them, in a module of that
    name; ``appliance.protocol.messages``, Kafka's wire messages, does not build on ``ipc`` and
    is left out). Found by walking the package's files, so that adding a package with ring
    messages needs no edit here."""
    found = [__name__]
    base = os.path.dirname(_ROOT)
    for directory, dirs, files in os.walk(_ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        if "messages.py" not in files:
            continue
        with open(os.path.join(directory, "messages.py"), encoding="utf-8") as f:
            source = f.read()
        if _IMPORTS_IPC.search(source):
            rel = os.path.relpath(directory, base).replace(os.sep, ".")
            found.append(f"{rel}.messages")
    return found


_IMPORTS_IPC = re.compile(r"^from appliance\.ipc import|^from appliance import ipc\b", re.M)

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder | None = None


def message_types() -> list[type[Message]]:
    """Every concrete Message subclass of ``message_modules()``, the modules imported first."""
    for name in message_modules():
        importlib.import_module(name)
    out, todo = [], [Message]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not Message and cls is not Request:
            out.append(cls)
    return sorted(out, key=lambda c: c.__name__)


def encode(req_id: int, body: Message) -> bytes:
    return _encoder.encode((req_id, body))


def decode(data: bytes | memoryview) -> tuple[int, Message]:
    """(request id, body) of one envelope, also of one too large for its ring (spilled to a
    file by ``shm.topology.Outbox.post``)."""
    global _decoder
    if _decoder is None:
        _decoder = msgspec.msgpack.Decoder(tuple[int, Union[tuple(message_types())]])
    if data[0] == SPILLED:
        data = unspill(data)
    return _decoder.decode(data)


# -- Fetch and ListOffsets: frontend -> fetcher -> frontend ---------------------------------------

class FetchPart(msgspec.Struct, array_like=True, frozen=True):
    topic_id: bytes
    partition: int
    fetch_offset: int
    max_bytes: int
    # A ShareFetch's read (``LogReader.read``): through the batch holding this offset and at
    # most ``ahead`` batches after it; -1: bounded by bytes only (Fetch).
    through: int = -1
    ahead: int = 0


class Slice(msgspec.Struct, array_like=True, frozen=True):
    segment_base: int
    position: int
    length: int
    inode: int = 0          # of the .log the fetcher read (a cleaner swap replaces files by name)


class FetchPartResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] | None = None
    slices: list[Slice] = []


class FetchResult(Message):
    parts: list[FetchPartResult]


class FetchRequest(Request):
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    parts: list[FetchPart]

    def error_reply(self, code: ErrorCode) -> FetchResult:
        return FetchResult([FetchPartResult(int(code))] * len(self.parts))


class ListOffsetsPart(msgspec.Struct, array_like=True, frozen=True):
    topic_id: bytes
    partition: int
    timestamp: int


class ListOffsetsPartResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    timestamp: int = -1
    offset: int = -1


class ListOffsetsResult(Message):
    parts: list[ListOffsetsPartResult]


class ListOffsetsRequest(Request):
    isolation_level: int
    parts: list[ListOffsetsPart]

    def error_reply(self, code: ErrorCode) -> ListOffsetsResult:
        return ListOffsetsResult([ListOffsetsPartResult(int(code))] * len(self.parts))


# -- Partition writers, besides Produce: on the produce ring, answered on the ack ring ------------
# Each names its partition (``topic_id``, ``partition``: the writer process carries many; a
# request for one it does not carry is answered NOT_LEADER_OR_FOLLOWER). ``for_partition``
# stamps a request with it.

class WriteMarkerResult(Message):
    error: ErrorCode


class WriteMarkerRequest(Request):
    """A COMMIT/ABORT marker: from the coordinator's TransactionMarkerChannelManager, or from a
    frontend serving the WriteTxnMarkers API."""
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    # The partition (every request to a writer names it: the writer process carries many).
    topic_id: bytes = b""
    partition: int = -1

    def error_reply(self, code: ErrorCode) -> WriteMarkerResult:
        return WriteMarkerResult(code)


class FenceProducerRequest(Request):
    """KIP-939, coordinator -> writer, no answer: a transaction kept by
    InitProducerId(keepPreparedTxn) still has its producer id and epoch on the partitions; data
    batches below ``producer_epoch`` are refused from now on, until a marker for the producer
    lands (ours: Kafka lets such a zombie append to the prepared transaction until the marker)."""
    producer_id: int
    producer_epoch: int
    topic_id: bytes = b""
    partition: int = -1


class ProducerInfo(msgspec.Struct, array_like=True, frozen=True):
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


class DescribeProducersResult(Message):
    error: ErrorCode
    producers: list[ProducerInfo] = []


class DescribeProducersRequest(Request):
    topic_id: bytes = b""
    partition: int = -1

    def error_reply(self, code: ErrorCode) -> DescribeProducersResult:
        return DescribeProducersResult(code)


class DeleteRecordsResult(Message):
    error: ErrorCode
    low_watermark: int = -1
    message: str | None = None


class DeleteRecordsRequest(Request):
    """DeleteRecords: move the partition's log start offset up to ``offset`` (-1: the high
    watermark); answered with the log start offset after it (Kafka's low watermark)."""
    offset: int
    topic_id: bytes = b""
    partition: int = -1

    def error_reply(self, code: ErrorCode) -> DeleteRecordsResult:
        return DeleteRecordsResult(code)


def for_partition(req: Request, topic_id: bytes, partition: int) -> Request:
    """``req`` (a request to a partition's writer) addressed to that partition."""
    return msgspec.structs.replace(req, topic_id=topic_id, partition=partition)
