"""Raw wire requests: a minimal Kafka client over a raw socket, for tests that need exact requests
and bytes, and the single requests the tests send with it, returning plain values.

``RawClient``: requests are kio entities (or dicts, through the codec's ``build``), encoded with
kio's writer and the request header version the API version calls for; responses are decoded
with kio's reader. Also sends arbitrary bytes, for the bad-input tests. ``encode_request`` and
``read_response`` are the same framing for asyncio streams (tests that drive many connections at
once), and ``produce_then_fetch`` their one round trip.

Then Kafka's error codes as the tests check them (one table: no client library sits in between,
so every code a test sees is the broker's own), ``retry`` for the coordinator errors a client
retries, and requests by hand: CreateTopics, Produce, Fetch (``fetch`` decoded into batches and
control markers; ``raw_batches`` / ``stored_batches`` every batch header the broker stores, so
that no client code is trusted to describe itself), ListOffsets and Metadata.

Transactions over the wire are in txn_wire.py, groups and offsets in group_wire.py. Runs in the
pytest process.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import NamedTuple

from kio.serial import entity_reader, entity_writer

from appliance.protocol import frames, messages
from appliance.protocol.records import (Record, build_batch, decode_records, iter_batch_headers,
                                        parse_control_record)


def encode_request(api_key: int, version: int, corr: int, values: dict,
                   client_id: bytes = b"load") -> bytes:
    """One framed request (size prefix, header of the version's header version, body)."""
    cls = messages.request_class(api_key, version)
    buf = io.BytesIO()
    entity_writer(cls)(buf, messages.build(cls, values))
    head = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    if frames.request_header_version(api_key, version) >= 2:
        head += b"\x00"
    body = head + buf.getvalue()
    return struct.pack(">i", len(body)) + body


async def read_response(reader, api_key: int, version: int):
    """The next response on an asyncio StreamReader, decoded."""
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    frame = await reader.readexactly(size)
    pos = 4 + (1 if frames.response_header_version(api_key, version) >= 1 else 0)
    return entity_reader(messages.response_class(api_key, version))(frame, pos)[0]


async def produce_then_fetch(reader, writer, corr: int, topic: str, partition: int, records: bytes,
                             max_wait_ms: int = 0, min_bytes: int = 0):
    """On one asyncio connection: an acks=1 Produce (v9) of ``records``, then a Fetch (v12) at
    the base offset its answer gave (correlation ids ``corr`` and ``corr + 1``). Returns (the
    Produce's partition answer, the Fetch's partition answer, or None when the Produce failed)."""
    writer.write(encode_request(0, 9, corr, {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
                                             "topic_data": [{"name": topic, "partition_data": [
                                                 {"index": partition, "records": records}]}]}))
    p = (await read_response(reader, 0, 9)).responses[0].partition_responses[0]
    if p.error_code:
        return p, None
    writer.write(encode_request(1, 12, corr + 1, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 1 << 16,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "current_leader_epoch": -1, "fetch_offset": p.base_offset,
             "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 16}]}],
        "forgotten_topics_data": [], "rack_id": ""}))
    return p, (await read_response(reader, 1, 12)).responses[0].partitions[0]


class RawClient:
    def __init__(self, bootstrap: str, timeout: float = 10.0, client_id: str | None = "raw-test",
                 ssl_context=None) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        if ssl_context is not None:
            try:
                self.sock = ssl_context.wrap_socket(self.sock, server_hostname=host)
            except BaseException:
                self.sock.close()
                raise
        self.client_id = client_id
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- framing ---------------------------------------------------------------------------------
    def header(self, api_key: int, version: int, correlation: int) -> bytes:
        hv = frames.request_header_version(api_key, version)
        out = struct.pack(">hhi", api_key, version, correlation)
        if self.client_id is None:
            out += struct.pack(">h", -1)
        else:
            cid = self.client_id.encode()
            out += struct.pack(">h", len(cid)) + cid
        if hv >= 2:
            out += b"\x00"
        return out

    def encode(self, api_key: int, version: int, request) -> bytes:
        cls = messages.request_class(api_key, version)
        if isinstance(request, dict):
            request = messages.build(cls, request)
        buf = io.BytesIO()
        entity_writer(cls)(buf, request)
        return buf.getvalue()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            out += chunk
        return bytes(out)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exact(4))
        return self.recv_exact(size)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the broker closes the connection (reads EOF) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except socket.timeout:
            return False
        except (ConnectionResetError, ssl.SSLEOFError):
            return True

    # -- request / response ------------------------------------------------------------------------
    def request(self, api_key: int, version: int, request, *, expect_response: bool = True):
        self.correlation += 1
        corr = self.correlation
        self.send_frame(self.header(api_key, version, corr) + self.encode(api_key, version, request))
        if not expect_response:
            return None
        return self.read_response(api_key, version, corr)

    def read_response(self, api_key: int, version: int, corr: int):
        frame = self.recv_frame()
        (got,) = struct.unpack_from(">i", frame, 0)
        assert got == corr, f"correlation id {got} != {corr}"
        pos = 4
        if frames.response_header_version(api_key, version) >= 1:
            assert frame[pos] == 0, "unexpected response header tags"
            pos += 1
        cls = messages.response_class(api_key, version)
        entity, _ = entity_reader(cls)(frame, pos)
        return entity


# -- Kafka's error codes (Kafka's Errors) ---------------------------------------------------------------

NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTION_COORDINATOR_FENCED = 52
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SECURITY_DISABLED = 54
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
INVALID_RECORD = 87
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90
TRANSACTION_ABORTABLE = 120

# What a client retries while a coordinator (re)loads or a transaction is being completed.
RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
             CONCURRENT_TRANSACTIONS}


def retry(op, *, timeout: float = 30.0, retriable=RETRIABLE):
    """Calls ``op()`` until its answer is not a retriable coordinator error (an int error code,
    or an object with ``error_code``; any other answer is final); returns that answer. Socket
    errors are retried too."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = op()
        except (OSError, ConnectionError) as e:       # timeouts included
            r = e
        else:
            code = r if isinstance(r, int) else getattr(r, "error_code", None)
            if code is None or code not in retriable:
                return r
        assert time.monotonic() < deadline, f"still retriable after {timeout}s: {r!r}"
        time.sleep(0.05)


# -- topics, produce ------------------------------------------------------------------------------------

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST, LATEST = -2, -1               # ListOffsets timestamps
CREATE_TIME, LOG_APPEND_TIME = "CreateTime", "LogAppendTime"     # a batch's timestamp type


def create_topic(raw, name, partitions=1, configs=()):
    r = raw.request(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                        "assignments": [],
                                        "configs": [{"name": k, "value": v} for k, v in configs]}],
                            "timeout_ms": 30000, "validate_only": False})
    assert r.topics[0].error_code == NONE, r


def records_of(values):
    return [Record(key=None, value=v) for v in values]


def produce(raw, topic, partition, batch, *, txn_id=None, version=9, timeout_ms=10000):
    """One Produce request with one batch; the partition's response."""
    r = raw.request(0, version, {"transactional_id": txn_id, "acks": -1, "timeout_ms": timeout_ms,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": partition, "records": batch}]}]})
    return r.responses[0].partition_responses[0]


def plain(raw, topic, partition, values):
    p = produce(raw, topic, partition, build_batch(records_of(values)))
    assert p.error_code == NONE, p
    return p.base_offset


# -- fetch, decoded ---------------------------------------------------------------------------------------

@dataclass
class Batch:
    base_offset: int
    last_offset: int
    producer_id: int
    producer_epoch: int
    transactional: bool
    control: bool
    values: list            # data: record values; control: [(type, coordinator epoch)]


@dataclass
class Fetched:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list | None    # [(producer id, first offset)] or None (not sent)
    batches: list[Batch]

    def data_offsets(self):
        return [b.base_offset for b in self.batches if not b.control]

    def values(self):
        return [v for b in self.batches if not b.control for v in b.values]

    def markers(self):
        return [(b.base_offset, b.producer_id, b.values[0][0]) for b in self.batches if b.control]


def parse_batches(data) -> list[Batch]:
    out = []
    buf = bytes(data or b"")
    for pos, h in iter_batch_headers(buf):
        raw = buf[pos:pos + h.size]
        values = [parse_control_record(raw)] if h.is_control else [r.value for r in decode_records(raw)]
        out.append(Batch(h.base_offset, h.last_offset, h.producer_id, h.producer_epoch,
                         h.is_transactional, h.is_control, values))
    return out


def fetch(raw, topic, partition=0, offset=0, isolation=READ_UNCOMMITTED, *, max_bytes=1 << 20,
          version=11) -> Fetched:
    r = raw.request(1, version, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
                                 "isolation_level": isolation, "session_id": 0, "session_epoch": -1,
                                 "topics": [{"topic": topic, "partitions": [
                                     {"partition": partition, "fetch_offset": offset,
                                      "partition_max_bytes": max_bytes}]}],
                                 "forgotten_topics_data": [], "rack_id": ""})
    p = r.responses[0].partitions[0]
    aborted = None if p.aborted_transactions is None else sorted(
        (a.producer_id, a.first_offset) for a in p.aborted_transactions)
    return Fetched(p.error_code, p.high_watermark, p.last_stable_offset,
                   getattr(p, "log_start_offset", -1), aborted, parse_batches(p.records))


# -- the batches as stored (Fetch v12, read_uncommitted) ---------------------------------------------------

class RawBatch(NamedTuple):
    base_offset: int
    last_offset: int
    size: int
    codec: str
    timestamp_type: str
    max_timestamp: int


CODECS_BY_ID = ("none", "gzip", "snappy", "lz4", "zstd", "5?", "6?", "7?")


def _fetch12(bootstrap: str, topic: str, partition: int, offset: int, partition_max_bytes: int,
             max_bytes: int):
    with RawClient(bootstrap) as raw:
        r = raw.request(1, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                 "log_start_offset": -1, "last_fetched_epoch": -1,
                 "partition_max_bytes": partition_max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    p = r.responses[0].partitions[0]
    assert p.error_code == 0, p
    return p


def stored_batches(bootstrap: str, topic: str, partition: int, offset: int = 0) -> list:
    """Every batch header the broker holds for the partition from ``offset`` on (producer id,
    epoch, sequence, attributes...), read with Fetch v12 (read_uncommitted)."""
    out = []
    while True:
        p = _fetch12(bootstrap, topic, partition, offset, 16 << 20, 16 << 20)
        got = [h for _, h in iter_batch_headers(bytes(p.records or b""))]
        out.extend(got)
        if not got or got[-1].last_offset + 1 >= p.high_watermark:
            return out
        offset = got[-1].last_offset + 1


def _raw_batch(h) -> RawBatch:
    return RawBatch(h.base_offset, h.base_offset + h.last_offset_delta, h.batch_length + 12,
                    CODECS_BY_ID[h.attributes & 7],
                    LOG_APPEND_TIME if h.attributes & 8 else CREATE_TIME, h.max_timestamp)


def raw_batches(bootstrap: str, topic: str, partition: int, offset: int = 0) -> list[RawBatch]:
    """Every batch the broker holds for the partition from ``offset`` on: its boundaries, codec
    and timestamp type as stored."""
    return [_raw_batch(h) for h in stored_batches(bootstrap, topic, partition, offset)]


def raw_fetch_sizes(bootstrap: str, topic: str, partition: int, offset: int,
                    partition_max_bytes: int, max_bytes: int) -> tuple[int, list[RawBatch]]:
    """(bytes of records returned, the batches in them) for one Fetch v12."""
    p = _fetch12(bootstrap, topic, partition, offset, partition_max_bytes, max_bytes)
    data = bytes(p.records or b"")
    return len(data), [_raw_batch(h) for _, h in iter_batch_headers(data)]


# -- offsets, metadata ------------------------------------------------------------------------------------

def list_offset(raw, topic, partition=0, ts=LATEST, isolation=READ_UNCOMMITTED, version=7):
    r = raw.request(2, version, {"replica_id": -1, "isolation_level": isolation,
                                 "topics": [{"name": topic, "partitions": [
                                     {"partition_index": partition, "timestamp": ts}]}]})
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE, p
    return p.offset


def end_offsets(raw, topic, partition=0):
    """(high watermark, last stable offset) as ListOffsets reports them."""
    return (list_offset(raw, topic, partition, isolation=READ_UNCOMMITTED),
            list_offset(raw, topic, partition, isolation=READ_COMMITTED))


def raw_topic_error(bootstrap: str, topic: str) -> int:
    """The Metadata v12 error code of one topic, without auto-creating it."""
    with RawClient(bootstrap) as raw:
        r = raw.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
    return r.topics[0].error_code
