"""Kafka wire framing and headers, sans-IO.

Owns nothing but per-connection decoder state; runs in the frontend (one FrameDecoder per client
connection) and in our own test client.

Every message on a Kafka connection is a size-prefixed frame:

    +----------------+-------------------------------+
    | size: int32 BE | size bytes: header, then body |
    +----------------+-------------------------------+

Request header (the version follows from the API and its version, see request_header_version):

    v1: api_key int16 | api_version int16 | correlation_id int32 | client_id nullable int16 string
    v2: v1 fields, then tagged fields (uvarint count, per field uvarint tag, uvarint size, data)

    client_id stays a *legacy* (int16-length) string in v2 (RequestHeader.json: flexibleVersions
    "none" for ClientId) so that a broker can read the header of any ApiVersions request, even of
    a version it does not know. A null client_id is read as "" (Kafka's RequestHeader.parse).

Response header:

    v0: correlation_id int32
    v1: correlation_id int32 | tagged fields (we write none: one 0 byte)

    ApiVersions responses always use v0 (KIP-511), whatever the request version.

A request of a version the header table does not know is refused (ProtocolViolation: Kafka closes
the connection, SocketServer.parseRequestHeader) except for ApiVersions: a client opens with its
highest ApiVersions version, so Kafka reads the header of any ApiVersions version (v2 from v3 on,
"flexibleVersions": "3+"), does not parse the body, and answers in the v0 layout with
UNSUPPORTED_VERSION (RequestContext.parseRequest / isUnsupportedApiVersionsRequest). The frontend
does that with ``messages.is_known_version`` and ``messages.build_api_versions_response``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

from appliance.errors import ProtocolViolation
from appliance.protocol.messages import (
    API_VERSIONS_KEY,
    flexible_from,
    known_versions,
    request_class,
    response_class,
)
from appliance.protocol.primitives import buffer_len, read_uvarint

__all__ = [
    "FrameTooLarge",
    "FrameDecoder",
    "FrameBuffer",
    "RequestHeader",
    "REQUEST_HEADER_MIN_BYTES",
    "parse_request_header",
    "request_header_version",
    "response_header_version",
    "encode_response_frame",
]

# api_key + api_version + correlation_id + client_id length: the smallest v1 header (null client).
REQUEST_HEADER_MIN_BYTES: Final = 10

_SIZE: Final = struct.Struct(">i")
_HEAD: Final = struct.Struct(">hhi")
_CLIENT_ID_LEN: Final = struct.Struct(">h")
_RESPONSE_V0: Final = struct.Struct(">ii")
_RESPONSE_V1: Final = struct.Struct(">iiB")


class FrameTooLarge(ProtocolViolation):
    """A declared frame size above the limit, or negative (Kafka: InvalidReceiveException)."""


class FrameDecoder:
    """Splits a byte stream into frames; feed it whatever the socket delivered.

    ``feed`` returns the frames completed by this chunk, without their size prefix, in order.
    A frame lying wholly inside one chunk is returned as a read-only memoryview of that chunk
    (no copy; it keeps the chunk alive while referenced). A frame spread over several chunks is
    collected as a list of views and joined once when complete (one copy), so a 1 MiB frame in
    64 KiB reads costs O(n), and memory grows only as bytes actually arrive (no up-front buffer
    of the declared size).

    A declared size above ``max_frame_bytes`` or below 0 is FrameTooLarge as soon as the prefix
    is read; a size below ``min_frame_bytes`` (which cannot hold a request header; 0 is legal in
    Kafka only for raw SASL tokens, which we do not speak) is ProtocolViolation. The frames
    completed before a bad prefix in the same chunk are still returned (they are answered before
    the connection closes, as Kafka does), with the error kept in ``error``; ``feed`` raises it
    when no frame came before it, and on every later call. After an error the decoder is
    unusable: close the connection.
    """

    __slots__ = ("max_frame_bytes", "min_frame_bytes", "_head", "_need", "_chunks", "error")

    def __init__(self, max_frame_bytes: int, min_frame_bytes: int = REQUEST_HEADER_MIN_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.min_frame_bytes = min_frame_bytes
        self._head = b""  # a size prefix split across chunks (< 4 bytes)
        self._need = 0  # bytes still missing from the frame being collected
        self._chunks: list[memoryview] = []  # the collected pieces of that frame
        self.error: ProtocolViolation | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame (prefix included)."""
        return len(self._head) + sum(c.nbytes for c in self._chunks) + (4 if self._chunks else 0)

    def _check(self, size: int) -> int:
        if size > self.max_frame_bytes or size < 0:
            raise FrameTooLarge(f"invalid frame size {size} (limit {self.max_frame_bytes})")
        if size < self.min_frame_bytes:
            raise ProtocolViolation(f"frame of {size} bytes is too short for a request header")
        return size

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview | bytes]:
        if self.error is not None:
            raise self.error
        frames: list[memoryview | bytes] = []
        try:
            self._feed(data, frames)
        except ProtocolViolation as e:
            self.error = e
            if not frames:
                raise
        return frames

    def _feed(self, data: bytes | bytearray | memoryview, frames: list) -> list[memoryview | bytes]:
        if type(data) is not bytes:
            data = bytes(data)  # our views must not change under us
        n = len(data)
        view = memoryview(data)
        pos = 0
        if self._need:
            take = self._need if self._need < n else n
            self._chunks.append(view[:take])
            self._need -= take
            if self._need:
                return frames
            frames.append(b"".join(self._chunks))
            self._chunks = []
            pos = take
        elif self._head:
            missing = 4 - len(self._head)
            if n < missing:
                self._head += data
                return frames
            size = self._check(_SIZE.unpack(self._head + data[:missing])[0])
            self._head = b""
            pos = missing
            if n - pos >= size:
                frames.append(view[pos:pos + size])
                pos += size
            else:
                self._chunks = [view[pos:]]
                self._need = size - (n - pos)
                return frames
        while n - pos >= 4:
            size = self._check(_SIZE.unpack_from(data, pos)[0])
            start = pos + 4
            if n - start >= size:
                pos = start + size
                frames.append(view[start:pos])
            else:
                self._chunks = [view[start:]]
                self._need = size - (n - start)
                return frames
        if pos < n:
            self._head = data[pos:]
        return frames


class FrameBuffer:
    """The receive buffer of one connection, for ``asyncio.BufferedProtocol``: the socket reads
    straight into it (``get_buffer``, then ``commit`` with the count read), and ``commit``
    returns the frames completed so far as views of it, without their size prefix. Each byte is
    copied once, by the kernel; nothing is joined, whatever the size of a frame or of a read.

    The views stay valid only until the next ``get_buffer``: the buffer is reused (the partial
    frame at its end is moved to its start when room is needed). Whoever keeps a frame, or a
    part of it, past that must copy it.

    Room: ``initial`` bytes; a frame that does not fit gets a buffer its size (up to the frame
    limit), given back once it is consumed and the buffer is empty again. Errors as
    ``FrameDecoder``: FrameTooLarge / ProtocolViolation at the bad size prefix, the frames before
    it in the same read still returned with the error kept in ``error``.
    """

    __slots__ = ("max_frame_bytes", "min_frame_bytes", "initial", "_buf", "_start", "_end",
                 "_need", "error")

    MIN_READ = 16384          # never offer the socket less than this

    def __init__(self, max_frame_bytes: int, min_frame_bytes: int = REQUEST_HEADER_MIN_BYTES,
                 initial: int = 65536) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.min_frame_bytes = min_frame_bytes
        self.initial = initial = max(initial, self.MIN_READ)
        self._buf = bytearray(initial)
        self._start = 0           # first byte not yet handed out as (part of) a frame
        self._end = 0             # end of the bytes read
        self._need = 0            # size of the frame being read, prefix included (0: unknown)
        self.error: ProtocolViolation | None = None

    @property
    def buffered(self) -> int:
        """Bytes read but not yet returned as a frame."""
        return self._end - self._start

    @property
    def capacity(self) -> int:
        return len(self._buf)

    def get_buffer(self) -> memoryview:
        """Where the next read goes (at least MIN_READ bytes, and room for the whole frame being
        read). Invalidates the frames returned before."""
        start, end = self._start, self._end
        if start == end:
            start = end = self._start = self._end = 0
            if len(self._buf) > 4 * self.initial:
                self._buf = bytearray(self.initial)      # a large frame's buffer, given back
        pending = end - start
        want = max(self._need, pending + self.MIN_READ)
        if start + want > len(self._buf):
            if want <= len(self._buf):
                self._buf[:pending] = self._buf[start:end]        # move the partial frame down
            else:
                buf = bytearray(max(want, self.initial))
                buf[:pending] = self._buf[start:end]
                self._buf = buf
            self._start, self._end = 0, pending
        return memoryview(self._buf)[self._end:]

    def commit(self, nbytes: int) -> list[memoryview]:
        """``nbytes`` were read into the last ``get_buffer``: the frames now complete."""
        if self.error is not None:
            raise self.error
        self._end += nbytes
        frames: list[memoryview] = []
        try:
            self._split(frames)
        except ProtocolViolation as e:
            self.error = e
            if not frames:
                raise
        return frames

    def _split(self, frames: list[memoryview]) -> None:
        buf, pos, end = self._buf, self._start, self._end
        view = None
        while end - pos >= 4:
            size = _SIZE.unpack_from(buf, pos)[0]
            if size > self.max_frame_bytes or size < 0:
                self._start = pos
                raise FrameTooLarge(f"invalid frame size {size} (limit {self.max_frame_bytes})")
            if size < self.min_frame_bytes:
                self._start = pos
                raise ProtocolViolation(f"frame of {size} bytes is too short for a request header")
            if end - pos - 4 < size:
                self._need = size + 4
                self._start = pos
                return
            if view is None:
                view = memoryview(buf).toreadonly()
            frames.append(view[pos + 4:pos + 4 + size])
            pos += 4 + size
        self._need = 0
        self._start = pos


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    header_version: int


_REQUEST_HEADER_VERSIONS: dict[tuple[int, int], int] = {}
_RESPONSE_HEADER_VERSIONS: dict[tuple[int, int], int] = {}


def request_header_version(api_key: int, api_version: int) -> int:
    """1 or 2 (flexible versions, KIP-482), derived from kio's request classes.

    ProtocolViolation for an unknown api key, and for a version kio cannot parse unless the API
    is ApiVersions (see the module docstring).
    """
    hv = _REQUEST_HEADER_VERSIONS.get((api_key, api_version))
    if hv is not None:
        return hv
    rng = known_versions(api_key)
    if rng is None:
        raise ProtocolViolation(f"unknown api key {api_key}")
    if rng[0] <= api_version <= rng[1]:
        hv = 2 if request_class(api_key, api_version).__flexible__ else 1
        _REQUEST_HEADER_VERSIONS[(api_key, api_version)] = hv
        return hv
    if api_key == API_VERSIONS_KEY:
        first = flexible_from(api_key)
        return 2 if first is not None and api_version >= first else 1
    raise ProtocolViolation(f"api key {api_key} version {api_version} is not supported")


def response_header_version(api_key: int, api_version: int) -> int:
    """0 or 1 (flexible versions); always 0 for ApiVersions (KIP-511)."""
    hv = _RESPONSE_HEADER_VERSIONS.get((api_key, api_version))
    if hv is not None:
        return hv
    if api_key == API_VERSIONS_KEY:
        return 0
    rng = known_versions(api_key)
    if rng is None:
        raise ProtocolViolation(f"unknown api key {api_key}")
    if rng[0] <= api_version <= rng[1]:
        hv = 1 if response_class(api_key, api_version).__flexible__ else 0
        _RESPONSE_HEADER_VERSIONS[(api_key, api_version)] = hv
        return hv
    first = flexible_from(api_key)
    return 1 if first is not None and api_version >= first else 0


def parse_request_header(
    frame: bytes | memoryview,
    header_version_of: Callable[[int, int], int] | None = None,
) -> tuple[RequestHeader, int]:
    """Parse the request header at the start of ``frame``; returns (header, body offset).

    ``header_version_of(api_key, api_version)`` picks the header version (default:
    ``request_header_version``; it may raise ProtocolViolation to refuse the request).
    A frame too short for its header, a client_id length below -1 or past the end, or a bad
    tagged-field section raises ProtocolViolation. Unknown header tags are skipped, as Kafka does.
    """
    n = len(frame)
    if n < 8:
        raise ProtocolViolation(f"frame of {n} bytes is too short for a request header")
    api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
    hv = (header_version_of or request_header_version)(api_key, api_version)
    pos = 8
    client_id = ""
    if hv >= 1:
        if n < 10:
            raise ProtocolViolation(f"frame of {n} bytes is too short for a request header")
        length = _CLIENT_ID_LEN.unpack_from(frame, 8)[0]
        pos = 10
        if length >= 0:
            end = pos + length
            if end > n:
                raise ProtocolViolation(f"client_id of {length} bytes runs past the {n}-byte frame")
            # Java decodes with replacement characters rather than failing; so do we.
            client_id = str(frame[pos:end], "utf-8", "replace")
            pos = end
        elif length != -1:
            raise ProtocolViolation(f"negative client_id length {length}")
    if hv >= 2:
        if pos < n and frame[pos] == 0:  # the usual case: no header tags
            return RequestHeader(api_key, api_version, correlation_id, client_id, hv), pos + 1
        try:
            count, pos = read_uvarint(frame, pos)
            for _ in range(count):
                _tag, pos = read_uvarint(frame, pos)
                size, pos = read_uvarint(frame, pos)
                pos += size
        except (IndexError, ValueError) as exc:
            raise ProtocolViolation(f"bad tagged fields in request header: {exc}") from None
        if pos > n:
            raise ProtocolViolation("request header tagged fields run past the frame")
    return RequestHeader(api_key, api_version, correlation_id, client_id, hv), pos


def encode_response_frame(
    correlation_id: int,
    header_version: int,
    body: bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview],
    body_len: int | None = None,
) -> list[bytes | bytearray | memoryview]:
    """Size prefix + response header + body parts, ready for ``transport.writelines``.

    ``body`` is one buffer or a sequence of buffers (passed through untouched: zero copy for
    record data). ``body_len`` saves summing the parts when the caller knows it already.
    """
    if isinstance(body, (bytes, bytearray, memoryview)):
        parts: list[bytes | bytearray | memoryview] = [body]
    else:
        parts = list(body)
    if body_len is None:
        body_len = sum(buffer_len(p) for p in parts)
    if header_version == 0:
        head = _RESPONSE_V0.pack(body_len + 4, correlation_id)
    else:
        head = _RESPONSE_V1.pack(body_len + 5, correlation_id, 0)
    parts.insert(0, head)
    return parts
