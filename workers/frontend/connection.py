"""One client connection: framing, dispatch to API handlers, responses in request order.

Runs inside a frontend process (asyncio, single thread). Owns the connection's socket transport,
its frame decoder and its queue of responses. Kafka answers the requests of one connection in the
order they came, so every request takes a slot in ``self.slots`` when it arrives and responses
leave only from the head of that queue, whatever order handlers finish in.

Where Kafka closes the connection we close it too: a frame over ``socket.request.max.bytes``, an
unknown API key, an unsupported version of any API but ApiVersions, a body that does not parse.
ApiVersions of an unknown version is answered (v0 layout, UNSUPPORTED_VERSION, our ranges).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from appliance.api import REGISTRY, RequestContext, encode_body
from appliance.errors import KafkaError, ProtocolViolation
from appliance.protocol import frames, messages

log = logging.getLogger("appliance.connection")

API_VERSIONS_KEY = 18
MAX_INFLIGHT = 64          # pause reading beyond this many unanswered requests on one connection
RESUME_INFLIGHT = 16


class _Slot:
    __slots__ = ("header", "parts", "done")

    def __init__(self, header) -> None:
        self.header = header
        self.parts: list | None = None   # encoded frame parts, or None for "no response" (acks=0)
        self.done = False


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: "Frontend") -> None:
        self.server = server
        self.broker = server.broker
        self.transport: asyncio.Transport | None = None
        self.decoder = frames.FrameDecoder(server.broker.cfg.server.socket_request_max_bytes)
        self.slots: collections.deque[_Slot] = collections.deque()
        self.paused = False
        self.closed = False
        self.peer = "?"
        self.last_active = time.monotonic()
        self.fetcher = server.broker.next_fetcher()
        self.tasks: set[asyncio.Task] = set()

    # -- asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)
        if self.server.draining:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for t in self.tasks:
            t.cancel()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            for frame in self.decoder.feed(data):
                self._on_frame(frame)
                if self.closed:
                    return
        except ProtocolViolation as e:
            self._abort(str(e))
        except Exception:
            # A bug in a handler must cost this connection, never the frontend process.
            log.exception("request from %s failed", self.peer)
            self._abort("internal error")

    # -- requests ---------------------------------------------------------------------------------
    def _abort(self, why: str) -> None:
        log.info("closing connection from %s: %s", self.peer, why)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _on_frame(self, frame) -> None:
        header, body_offset = frames.parse_request_header(frame)
        api = REGISTRY.get(header.api_key)
        if api is None:
            raise ProtocolViolation(f"unknown api key {header.api_key}")
        slot = _Slot(header)
        if not api.min_version <= header.api_version <= api.max_version:
            if header.api_key != API_VERSIONS_KEY:
                raise ProtocolViolation(
                    f"unsupported version {header.api_version} of api key {header.api_key}")
            # Kafka answers an unknown ApiVersions version in the v0 layout with error 35 and its
            # own range, so the client can retry with a version we support.
            self.slots.append(slot)
            self._complete(slot, messages.build_api_versions_response(
                header.api_version, self.server.api_ranges))
            return
        request = messages.decode_request(header.api_key, header.api_version, frame, body_offset)
        self.slots.append(slot)
        ctx = RequestContext(self.broker, self, header)
        try:
            result = api.handle(ctx, request)
        except KafkaError as e:
            self._fail(slot, api, request, e)
            return
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(self._run(slot, api, request, result))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            self._complete(slot, result)
        if len(self.slots) >= MAX_INFLIGHT and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    async def _run(self, slot: _Slot, api, request, coro) -> None:
        try:
            result = await coro
        except KafkaError as e:
            self._fail(slot, api, request, e)
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler for api key %d failed", slot.header.api_key)
            self._abort("internal error")
            return
        self._complete(slot, result)

    def _fail(self, slot: _Slot, api, request, e: KafkaError) -> None:
        if api.error_response is None:
            self._abort(f"{api.name}: {e}")
            return
        self._complete(slot, api.error_response(slot.header.api_version, request, e))

    def _complete(self, slot: _Slot, result: Any) -> None:
        if self.closed:
            return
        h = slot.header
        if result is None:
            slot.parts = None
        else:
            body = encode_body(result)
            slot.parts = frames.encode_response_frame(
                h.correlation_id, frames.response_header_version(h.api_key, h.api_version), body)
        slot.done = True
        self._flush()

    def _flush(self) -> None:
        out = []
        while self.slots and self.slots[0].done:
            slot = self.slots.popleft()
            if slot.parts is not None:
                out.extend(slot.parts)
        if out and not self.closed:
            self.transport.writelines(out)
        if self.paused and len(self.slots) <= RESUME_INFLIGHT and not self.server.draining:
            self.paused = False
            self.transport.resume_reading()
        if self.server.draining and not self.slots:
            self.transport.close()

    # -- draining -----------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Stop reading new requests; close once every accepted request has been answered."""
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if not self.slots and self.transport is not None:
            self.transport.close()
