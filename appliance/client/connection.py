"""One blocking connection to one broker: socket, framing, headers, ApiVersions negotiation,
and the connection's security (TLS, then SASL after ApiVersions; ``appliance.client.security``).

Owns the socket, the correlation counter and what the broker said about itself in ApiVersions
(the version range of every API and the finalized features). Requests are plain dicts (or kio
entities) encoded with the appliance's own codec (``appliance.protocol.messages.build`` and kio's
``entity_writer``), with the request header version the API version calls for
(``appliance.protocol.frames``); responses are decoded with kio's ``entity_reader``.

One request at a time: ``request`` writes the frame and reads the answer before it returns, so
the connection never has to match out-of-order correlation ids. A socket error or a timeout
closes the connection (its byte stream can no longer be trusted) and raises
``KafkaConnectionError`` / ``KafkaTimeoutError``; the caller decides whether to retry, on a new
connection.

Version choice: ``version(api_key)`` is the highest version both sides support, where "ours" is
``CLIENT_MAX`` capped by the caller's ``max_versions`` (a test or the transaction-protocol choice
pins lower versions this way) and by what kio can encode.
"""

from __future__ import annotations

import io
import socket
import ssl
import struct
import time
from collections.abc import Mapping
from typing import Any

from kio.serial import entity_reader, entity_writer

from appliance.client.errors import (ErrorCode, KafkaConnectionError, KafkaError,
                                     KafkaTimeoutError)
from appliance.client.security import (SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslError, Security,
                                       authenticate)
from appliance.protocol import frames, messages
from appliance.protocol.primitives import read_uvarint

__all__ = ["BrokerConnection", "CLIENT_MAX", "CLIENT_MIN", "API_VERSIONS"]

API_VERSIONS = 18

# The versions this client implements (lowest, highest) per API key. Lowest: the first version
# with the fields the client relies on (Produce/Fetch v3/v4: record batch v2; ListOffsets v1:
# single offsets; FindCoordinator v1: key type; Metadata v1: leader ids).
CLIENT_MIN: dict[int, int] = {0: 3, 1: 4, 2: 1, 3: 1, 9: 1, 10: 1, 17: 1, 18: 0, 22: 0, 24: 0,
                              25: 0, 26: 0, 28: 0, 36: 0}
CLIENT_MAX: dict[int, int] = {0: 12, 1: 17, 2: 8, 3: 12, 9: 7, 10: 4, 17: 1, 18: 4, 22: 6, 24: 3,
                              25: 4, 26: 5, 28: 5, 36: 2}

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")
_ERR = struct.Struct(">h")
_WRITERS: dict[type, Any] = {}
_READERS: dict[type, Any] = {}


def _writer(cls: type):
    w = _WRITERS.get(cls)
    if w is None:
        w = _WRITERS[cls] = entity_writer(cls)
    return w


def _reader(cls: type):
    r = _READERS.get(cls)
    if r is None:
        r = _READERS[cls] = entity_reader(cls)
    return r


def encode_request(api_key: int, version: int, correlation_id: int, client_id: str | None,
                   body: Mapping[str, Any] | Any) -> bytes:
    """A complete frame (size prefix, request header, body) for one request."""
    cls = messages.request_class(api_key, version)
    if isinstance(body, Mapping):
        body = messages.build(cls, body)
    hv = frames.request_header_version(api_key, version)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(_HEAD.pack(api_key, version, correlation_id))
    if hv >= 1:
        if client_id is None:
            out.write(struct.pack(">h", -1))
        else:
            cid = client_id.encode()
            out.write(struct.pack(">h", len(cid)))
            out.write(cid)
    if hv >= 2:
        out.write(b"\0")                      # no header tagged fields
    _writer(cls)(out, body)
    frame = out.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def response_header(api_key: int, version: int, frame: bytes) -> tuple[int, int]:
    """(correlation id, offset of the body) of one response frame (without its size prefix)."""
    (corr,) = _SIZE.unpack_from(frame, 0)
    pos = 4
    if frames.response_header_version(api_key, version) >= 1:
        count, pos = read_uvarint(frame, pos)   # header tagged fields: none we know; skip them
        for _ in range(count):
            _tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
    return corr, pos


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, kio response entity) of one response frame (without its size prefix)."""
    corr, pos = response_header(api_key, version, frame)
    if api_key == API_VERSIONS and len(frame) >= pos + 2 and \
            _ERR.unpack_from(frame, pos)[0] == ErrorCode.unsupported_version:
        version = 0                            # KIP-511: the refusal comes in the v0 layout
    entity, _ = _reader(messages.response_class(api_key, version))(frame, pos)
    return corr, entity


class BrokerConnection:
    """A connected, version-negotiated socket to one broker (``node_id`` -1 for a bootstrap)."""

    def __init__(self, host: str, port: int, *, node_id: int = -1, client_id: str = "appliance-client",
                 request_timeout_ms: int = 30000, max_versions: Mapping[int, int] | None = None,
                 security: Security | None = None) -> None:
        self.host, self.port, self.node_id = host, port, node_id
        self.security = security or Security()
        self.client_id = client_id
        self.timeout = request_timeout_ms / 1000.0
        self.max_versions = dict(max_versions or {})
        self.sock: socket.socket | None = None
        self.correlation = 0
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.finalized_features: dict[str, int] = {}
        self._connect()

    def __repr__(self) -> str:
        return f"BrokerConnection({self.host}:{self.port}, node {self.node_id})"

    # -- lifecycle ----------------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise KafkaConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.security.tls:
            try:
                sock = self.security.ssl_context().wrap_socket(sock, server_hostname=self.host)
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise KafkaConnectionError(f"TLS to {self.host}:{self.port}: {exc}") from None
        self.sock = sock
        self._negotiate()
        if self.security.sasl:
            self._authenticate()

    def _authenticate(self) -> None:
        """SASL right after ApiVersions, before any other request (KIP-152). A refusal is not
        retriable: SASL_AUTHENTICATION_FAILED (or the broker's code) with its message."""
        try:
            authenticate(self.security, self._roundtrip, self.version(SASL_HANDSHAKE),
                         self.version(SASL_AUTHENTICATE))
        except SaslError as exc:
            self.close()
            raise KafkaError(ErrorCode(exc.code), f"{self.host}:{self.port}: {exc.message}") from None

    @property
    def connected(self) -> bool:
        return self.sock is not None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    # -- ApiVersions ----------------------------------------------------------------------------
    def _negotiate(self) -> None:
        version = min(CLIENT_MAX[API_VERSIONS], messages.known_versions(API_VERSIONS)[1])
        body = {"client_software_name": "appliance-client", "client_software_version": "1"}
        resp = self._roundtrip(API_VERSIONS, version, body)
        if resp.error_code == ErrorCode.unsupported_version:
            # The broker answered in the v0 layout and listed its ApiVersions range: retry with
            # the highest version it supports (KIP-511).
            theirs = {k.api_key: k.max_version for k in resp.api_keys}
            version = min(version, theirs.get(API_VERSIONS, 0))
            resp = self._roundtrip(API_VERSIONS, version, body)
        if resp.error_code != ErrorCode.none:
            self.close()
            raise KafkaError(resp.error_code, f"ApiVersions v{version} refused by {self.host}:{self.port}")
        self.api_versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        self.finalized_features = {f.name: f.max_version_level
                                   for f in getattr(resp, "finalized_features", ()) or ()}

    def version(self, api_key: int, *, minimum: int | None = None) -> int:
        """The highest version of ``api_key`` both sides support; UNSUPPORTED_VERSION if none."""
        theirs = self.api_versions.get(api_key)
        kio = messages.known_versions(api_key)
        ours_max = min(CLIENT_MAX.get(api_key, kio[1]), kio[1], self.max_versions.get(api_key, 1 << 15))
        ours_min = max(CLIENT_MIN.get(api_key, kio[0]), kio[0], minimum or 0)
        if theirs is None or theirs[1] < ours_min or theirs[0] > ours_max or ours_min > ours_max:
            raise KafkaError(ErrorCode.unsupported_version,
                             f"{messages.api_name(api_key)}: broker supports {theirs}, "
                             f"client {ours_min}-{ours_max}")
        return min(theirs[1], ours_max)

    def supports(self, api_key: int, version: int) -> bool:
        """True if the broker and our caps allow ``version`` of ``api_key``."""
        try:
            return self.version(api_key) >= version
        except KafkaError:
            return False

    # -- requests -------------------------------------------------------------------------------
    def request(self, api_key: int, body: Mapping[str, Any] | Any, *, version: int | None = None,
                expect_response: bool = True, raw: bool = False) -> Any:
        """Send one request (at the negotiated version unless ``version`` is given) and return
        the decoded response entity (None when ``expect_response`` is False, e.g. acks=0), or
        with ``raw`` the response body after its header, undecoded (for answers kio cannot
        read, such as a timestamp of -1)."""
        if version is None:
            version = self.version(api_key)
        if self.sock is None:
            self._connect()
        return self._roundtrip(api_key, version, body, expect_response=expect_response, raw=raw)

    def _roundtrip(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
                   raw: bool = False) -> Any:
        self.correlation = (self.correlation + 1) & 0x7FFFFFFF
        corr = self.correlation
        frame = encode_request(api_key, version, corr, self.client_id, body)
        sock = self.sock
        assert sock is not None
        try:
            sock.settimeout(self.timeout)
            sock.sendall(frame)
            if not expect_response:
                return None
            deadline = time.monotonic() + self.timeout
            (size,) = _SIZE.unpack(self._recv_exact(4, deadline))
            data = self._recv_exact(size, deadline)
        except socket.timeout:
            self.close()
            raise KafkaTimeoutError(f"{messages.api_name(api_key)} v{version} to {self.host}:{self.port}: "
                                    f"no answer in {self.timeout:.1f}s") from None
        except OSError as exc:
            self.close()
            raise KafkaConnectionError(f"{messages.api_name(api_key)} v{version} to "
                                       f"{self.host}:{self.port}: {exc}") from None
        if raw:
            got, pos = response_header(api_key, version, data)
            entity = data[pos:]
        else:
            got, entity = decode_response(api_key, version, data)
        if got != corr:
            self.close()
            raise KafkaConnectionError(f"correlation id {got} in the answer to request {corr}")
        return entity

    def _recv_exact(self, n: int, deadline: float) -> bytes:
        sock = self.sock
        assert sock is not None
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout()
            sock.settimeout(left)
            chunk = sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionResetError("connection closed by the broker")
            buf += chunk
        return bytes(buf)
