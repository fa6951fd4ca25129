"""A minimal Kafka client over a raw socket, for tests that need exact requests and bytes.

Requests are kio entities (or dicts, through the codec's ``build``), encoded with kio's writer and
the request header version the API version calls for; responses are decoded with kio's reader.
Also sends arbitrary bytes, for the bad-input tests. ``encode_request`` and ``read_response``
are the same framing for asyncio streams (tests that drive many connections at once), and
``produce_then_fetch`` their one round trip.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct

from kio.serial import entity_reader, entity_writer

from appliance.protocol import frames, messages


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
