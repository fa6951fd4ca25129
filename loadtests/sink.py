"""A do-nothing Kafka-protocol broker: the baseline the produce benchmark compares the appliance to.

Runs as its own process (one asyncio loop, one thread), started by ``loadtests/brokers.py`` (``sink_process``)
or by hand:

    python loadtests/sink.py --listen 127.0.0.1:0 --partitions 4

It prints ``listening on HOST:PORT`` (the port actually bound, so ``:0`` works) on stdout once it
accepts connections, and on SIGTERM/SIGINT prints what it received to stderr and exits 0.

What it answers, as cheaply as it can while staying a broker a confluent-kafka producer is happy
with. Nothing is stored: record batches are looked at only to count their records (for the base
offsets), then dropped.

| API                     | answer                                                               |
|-------------------------|----------------------------------------------------------------------|
| ApiVersions (18)        | the appliance's own version ranges (same client code paths), plus    |
|                         | InitProducerId / AddPartitionsToTxn / AddOffsetsToTxn / EndTxn       |
| Metadata (3)            | this node as the only broker, leader of every partition; every       |
|                         | requested topic exists with ``--partitions`` partitions (or the      |
|                         | count CreateTopics asked for); a null topic list: the topics seen    |
| Produce (0)             | error 0 for every partition, base offset = records acked so far on   |
|                         | that partition (per batch: the batch header's record count); acks=0: |
|                         | nothing, as Kafka                                                    |
| CreateTopics (19)       | success, remembered for Metadata                                     |
| FindCoordinator (10)    | this node                                                            |
| InitProducerId (22)     | a fresh producer id, epoch 0                                         |
| AddPartitionsToTxn (24) | success for every partition asked (v0-3)                             |
| anything else kio knows | the response with every field at its default (error 0, empty arrays) |

Frames the codec refuses (unknown API key, unsupported version, malformed body) close the
connection, as Kafka does.

Record batch header (v2), of which only two fields are read here:

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8 | crc uint32
    | attributes int16 | last_offset_delta int32 | ... | records_count int32 (at byte 57) | records
    next batch starts at 12 + batch_length
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import struct
import sys
import uuid
from typing import Any, Callable

# Run as a script from anywhere: the project root is the parent of loadtests/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from appliance.errors import ProtocolViolation  # noqa: E402
from appliance.protocol import frames, messages  # noqa: E402
from appliance.protocol.fetch_response import (  # noqa: E402
    ProducePartition,
    ProduceTopic,
    encode_produce_response,
)

NODE_ID = 1
CLUSTER_ID = "appliance-sink"
NO_OPS = -2147483648  # "authorized operations not requested"

# The appliance's ranges as of this writing; used only when its handler registry cannot be
# imported (the sink must keep working while the appliance's modules are half-written).
FALLBACK_RANGES: dict[int, tuple[int, int]] = {
    0: (3, 11), 1: (4, 17), 2: (1, 11), 3: (0, 13), 10: (0, 6), 18: (0, 4), 19: (2, 7),
    20: (1, 6), 32: (1, 4), 60: (0, 2),
}
# What the sink serves on top, so idempotent and transactional producers get going.
EXTRA_RANGES: dict[int, tuple[int, int]] = {22: (0, 4), 24: (0, 3), 25: (0, 3), 26: (0, 3)}

_I32 = struct.Struct(">i")
_BATCH_LENGTH_AT = 8
_RECORDS_COUNT_AT = 57
_BATCH_OVERHEAD = 12  # base_offset + batch_length


def api_ranges() -> dict[int, tuple[int, int]]:
    """The appliance's advertised ranges (so both brokers negotiate the same versions) + extras."""
    try:
        from appliance.api import api_ranges as registry_ranges, load_handlers
        load_handlers()
        ranges = dict(registry_ranges())
    except Exception as exc:  # noqa: BLE001 - any import error of a module being written
        print(f"sink: using built-in version ranges ({type(exc).__name__}: {exc})", file=sys.stderr)
        ranges = dict(FALLBACK_RANGES)
    for key, rng in EXTRA_RANGES.items():
        ranges.setdefault(key, rng)
    return ranges


def count_records(records: bytes | None) -> int:
    """Records in a (v2) record set: the sum of each batch header's record count."""
    if not records:
        return 0
    n = 0
    pos = 0
    end = len(records)
    while pos + _RECORDS_COUNT_AT + 4 <= end:
        n += _I32.unpack_from(records, pos + _RECORDS_COUNT_AT)[0]
        pos += _BATCH_OVERHEAD + _I32.unpack_from(records, pos + _BATCH_LENGTH_AT)[0]
    return n


class Sink:
    """Broker-wide state: the topics seen, next offsets, producer ids, counters."""

    def __init__(self, host: str, port: int, partitions: int, ranges: dict[int, tuple[int, int]]) -> None:
        self.host = host
        self.port = port
        self.partitions = partitions
        self.ranges = ranges
        self.topics: dict[str, tuple[int, uuid.UUID]] = {}  # name -> (partitions, topic id)
        self.next_offset: dict[tuple[str, int], int] = {}
        self.next_producer_id = 1000
        self.requests = 0
        self.produce_requests = 0
        self.produced_records = 0
        self.produced_bytes = 0
        self.connections = 0
        self._metadata_cache: dict[tuple[int, tuple[str, ...] | None], bytes] = {}
        self.handlers: dict[int, Callable[[int, Any], bytes | None]] = {
            0: self.produce,
            3: self.metadata,
            10: self.find_coordinator,
            19: self.create_topics,
            22: self.init_producer_id,
            24: self.add_partitions_to_txn,
        }

    # -- topics -------------------------------------------------------------------------------
    def topic(self, name: str, partitions: int | None = None) -> tuple[int, uuid.UUID]:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = (partitions or self.partitions, uuid.uuid4())
            self._metadata_cache.clear()
        return t

    # -- handlers: (version, decoded request) -> response body, or None for no response --------
    def produce(self, v: int, req: Any) -> bytes | None:
        self.produce_requests += 1
        out = []
        next_offset = self.next_offset
        for td in req.topic_data:
            parts = []
            for pd in td.partition_data:
                records = pd.records
                n = count_records(records)
                key = (td.name, pd.index)
                base = next_offset.get(key, 0)
                next_offset[key] = base + n
                self.produced_records += n
                self.produced_bytes += len(records) if records else 0
                parts.append(ProducePartition(pd.index, 0, base, -1, 0))
            out.append(ProduceTopic(td.name, None, parts))
        if req.acks == 0:
            return None
        return encode_produce_response(v, out)

    def metadata(self, v: int, req: Any) -> bytes:
        requested = req.topics
        if v == 0 and not requested:
            requested = None  # v0: an empty list means all topics
        names = None if requested is None else tuple(t.name for t in requested if t.name)
        cached = self._metadata_cache.get((v, names))
        if cached is not None:
            return cached
        for n in names or ():
            self.topic(n)
        listed = sorted(self.topics) if names is None else names
        topics = []
        for n in listed:
            count, tid = self.topics[n]
            topics.append({
                "error_code": 0, "name": n, "topic_id": tid, "is_internal": False,
                "topic_authorized_operations": NO_OPS,
                "partitions": [{
                    "error_code": 0, "partition_index": p, "leader_id": NODE_ID, "leader_epoch": 0,
                    "replica_nodes": (NODE_ID,), "isr_nodes": (NODE_ID,), "offline_replicas": (),
                } for p in range(count)],
            })
        body = messages.encode_response(messages.build_response(3, v, {
            "brokers": [{"node_id": NODE_ID, "host": self.host, "port": self.port, "rack": None}],
            "cluster_id": CLUSTER_ID, "controller_id": NODE_ID, "topics": topics,
            "cluster_authorized_operations": NO_OPS,
        }))
        self._metadata_cache[(v, names)] = body
        return body

    def find_coordinator(self, v: int, req: Any) -> bytes:
        me = {"node_id": NODE_ID, "host": self.host, "port": self.port, "error_code": 0}
        if v < 4:
            values = me
        else:
            values = {"coordinators": [{"key": k, **me} for k in req.coordinator_keys]}
        return messages.encode_response(messages.build_response(10, v, values))

    def create_topics(self, v: int, req: Any) -> bytes:
        results = []
        for t in req.topics:
            count, tid = self.topic(t.name, t.num_partitions if t.num_partitions > 0 else None)
            results.append({"name": t.name, "topic_id": tid, "error_code": 0, "num_partitions": count,
                            "replication_factor": 1})
        return messages.encode_response(messages.build_response(19, v, {"topics": results}))

    def init_producer_id(self, v: int, req: Any) -> bytes:
        pid = self.next_producer_id
        self.next_producer_id += 1
        return messages.encode_response(messages.build_response(
            22, v, {"error_code": 0, "producer_id": pid, "producer_epoch": 0}))

    def add_partitions_to_txn(self, v: int, req: Any) -> bytes:
        results = [{"name": t.name, "results_by_partition": [
            {"partition_index": p, "partition_error_code": 0} for p in t.partitions]}
            for t in req.v3_and_below_topics]
        return messages.encode_response(messages.build_response(
            24, v, {"results_by_topic_v3_and_below": results}))

    def default(self, api_key: int, v: int) -> bytes:
        return messages.encode_response(messages.build_response(api_key, v))


class SinkConnection(asyncio.Protocol):
    """One client connection: frames in, one response per request out, in order (we never wait)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.decoder = frames.FrameDecoder(100 * 1024 * 1024)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.sink.connections += 1

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        try:
            for frame in self.decoder.feed(data):
                out = self.handle(frame)
                if out is not None:
                    transport.writelines(out)
        except ProtocolViolation as exc:
            print(f"sink: closing connection: {exc}", file=sys.stderr)
            transport.abort()

    def handle(self, frame: Any) -> list | None:
        sink = self.sink
        sink.requests += 1
        header, body_offset = frames.parse_request_header(frame)
        key, v = header.api_key, header.api_version
        if key == 18:  # ApiVersions: any version gets an answer (KIP-511), see frames docstring
            if messages.is_known_version(key, v):
                req = messages.decode_request(key, v, frame, body_offset)
                error = 0 if messages.api_versions_request_valid(req) else 42  # INVALID_REQUEST
            else:
                error = 0
            body = messages.build_api_versions_response(v, sink.ranges, error_code=error)
        else:
            req = messages.decode_request(key, v, frame, body_offset)
            handler = sink.handlers.get(key)
            body = handler(v, req) if handler is not None else sink.default(key, v)
            if body is None:
                return None
        return frames.encode_response_frame(header.correlation_id,
                                            frames.response_header_version(key, v), body)


async def serve(host: str, port: int, partitions: int) -> None:
    loop = asyncio.get_running_loop()
    ranges = api_ranges()
    messages.preload(ranges)  # compile the decoders now, not on the measured path
    sink = Sink(host, port, partitions, ranges)
    server = await loop.create_server(lambda: SinkConnection(sink), host, port, reuse_address=True,
                                      backlog=1024)
    sink.port = server.sockets[0].getsockname()[1]
    print(f"listening on {host}:{sink.port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    cpu = os.times()
    print(f"sink: {sink.connections} connections, {sink.requests} requests, "
          f"{sink.produce_requests} produce requests, {sink.produced_records} records, "
          f"{sink.produced_bytes} record-set bytes, cpu {cpu.user:.1f} s user {cpu.system:.1f} s sys",
          file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                    help="address to listen on (port 0: any free port; the bound one is printed)")
    ap.add_argument("--partitions", type=int, default=1,
                    help="partitions of every topic not created with an explicit count")
    args = ap.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host.strip("[]") or "127.0.0.1", int(port), args.partitions))


if __name__ == "__main__":
    main()
