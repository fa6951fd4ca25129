"""One client connection: framing, dispatch to API handlers, responses in request order.

Runs inside a frontend process (asyncio, single thread). Owns the connection's socket transport,
its frame decoder and its queue of responses. Kafka answers the requests of one connection in the
order they came, so every request takes a slot in ``self.slots`` when it arrives and responses
leave only from the head of that queue, whatever order handlers finish in.

Where Kafka closes the connection we close it too: a frame over ``socket.request.max.bytes``, an
unknown API key, an unsupported version of any API but ApiVersions, a body that does not parse,
a failed acks=0 produce, a handler or an encoder that fails. Kafka's network thread reads a
connection's next request only after it has answered the previous one, so it answers every
request that came before the bad one and then closes; so do we (``_close_after``): reading stops
at the bad frame, the answers queued ahead of it still leave, then the socket is closed, and the
answers of requests pipelined behind it are dropped (the client fails them on the closed
connection). ApiVersions of an unknown version is answered (v0 layout, UNSUPPORTED_VERSION, our
ranges).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any

from appliance.api import REGISTRY, CloseConnection, RequestContext, encode_body
from appliance.errors import KafkaError, ProtocolViolation
from appliance.protocol import frames, messages
from appliance.protocol.produce_request import parse_produce_request
from workers.frontend.metrics import error_counts

log = logging.getLogger("appliance.connection")

API_VERSIONS_KEY = 18
PRODUCE_KEY = 0
ANONYMOUS = "User:ANONYMOUS"   # Kafka's principal of an unauthenticated connection
MAX_INFLIGHT = 64          # pause reading beyond this many unanswered requests on one connection
RESUME_INFLIGHT = 16


class _Slot:
    __slots__ = ("header", "parts", "done", "last", "api", "ctx", "started")

    def __init__(self, header, api: str = "", ctx=None) -> None:
        self.header = header
        self.parts: list | None = None   # encoded frame parts, or None for "no response" (acks=0)
        self.done = False
        self.last = False                # close the connection when this slot reaches the head
        self.api = api                   # the API's name, for the request metrics ("" = none)
        self.ctx = ctx                   # its RequestContext (the handler's error counts)
        self.started = time.monotonic_ns()


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, server: "Frontend") -> None:
        self.server = server
        self.broker = server.broker
        self.transport: asyncio.Transport | None = None
        # The socket reads straight into it; frames are views of it until the next read.
        self.decoder = frames.FrameBuffer(server.broker.cfg.server.socket_request_max_bytes)
        self.slots: collections.deque[_Slot] = collections.deque()
        self.paused = False
        self.closed = False
        self.closing = False       # a bad request was seen: answer what came before it, then close
        self.peer = "?"
        self.host = "?"
        self.principal = ANONYMOUS
        self.last_active = time.monotonic()
        self.fetcher = server.broker.next_fetcher()
        self.tasks: set[asyncio.Task] = set()

    # -- asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.host = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        self.server.counters.connections(1)
        if self.server.draining:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.server.counters.connections(-1)
        for t in self.tasks:
            t.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing or self.closed:
            return                  # nothing after a bad request is read (Kafka muted the channel)
        self.last_active = time.monotonic()
        try:
            for frame in self.decoder.commit(nbytes):
                self._on_frame(frame)
                if self.closing or self.closed:
                    return
            if self.decoder.error is not None:     # a bad frame after good ones in this read
                raise self.decoder.error
        except ProtocolViolation as e:
            self._close_after(None, str(e))
        except Exception:
            # A bug in a handler must cost this connection, never the frontend process.
            log.exception("request from %s failed", self.peer)
            self._close_after(None, "internal error")

    # -- requests ---------------------------------------------------------------------------------
    def _abort(self, why: str) -> None:
        """Close at once, answered or not (shutdown timeout, idle connection)."""
        log.info("closing connection from %s: %s", self.peer, why)
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _close_after(self, slot: _Slot | None, why: str, level: int = logging.INFO) -> None:
        """Close the connection once every request before ``slot`` (None: every request taken so
        far) is answered; ``slot`` itself and anything behind it gets no answer."""
        if self.closed:
            return
        if not self.closing:
            log.log(level, "closing connection from %s: %s", self.peer, why)
            self.closing = True
            if self.transport is not None and not self.paused:
                self.paused = True
                self.transport.pause_reading()
        if slot is None:
            slot = _Slot(None)
            self.slots.append(slot)
        slot.parts = None
        slot.done = slot.last = True
        self._flush()

    def _on_frame(self, frame) -> None:
        header, body_offset = frames.parse_request_header(frame)
        api = REGISTRY.get(header.api_key)
        if api is None:
            raise ProtocolViolation(f"unknown api key {header.api_key}")
        slot = _Slot(header, api.name)
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
        if header.api_key == PRODUCE_KEY:
            # Record batches stay views of the receive buffer (no copy before the ring's); the
            # handler hands them to the writers before it returns (appliance/api/produce.py).
            request = parse_produce_request(frame, body_offset, header.api_version)
        else:
            # kio's entities may keep views of what they decode: give them their own copy.
            request = messages.decode_request(header.api_key, header.api_version, bytes(frame),
                                              body_offset)
        self.slots.append(slot)
        ctx = slot.ctx = RequestContext(self.broker, self, header)
        try:
            result = api.handle(ctx, request)
        except KafkaError as e:
            self._fail(slot, api, request, e)
            return
        except Exception:
            log.exception("handler of api key %d failed (request from %s)", header.api_key, self.peer)
            self._close_after(slot, "internal error")
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
            log.exception("handler of api key %d failed (request from %s)", slot.header.api_key,
                          self.peer)
            self._close_after(slot, "internal error")
            return
        self._complete(slot, result)

    def _fail(self, slot: _Slot, api, request, e: KafkaError) -> None:
        if api.error_response is None:
            self._close_after(slot, f"{api.name}: {e}")
            return
        self._complete(slot, api.error_response(slot.header.api_version, request, e))

    def _complete(self, slot: _Slot, result: Any) -> None:
        if self.closed or slot.done:
            return
        if isinstance(result, CloseConnection):
            self._close_after(slot, result.reason)
            return
        h = slot.header
        if result is None:
            slot.parts = None
            errors = slot.ctx.errors if slot.ctx is not None else None
        else:
            errors = slot.ctx.errors if slot.ctx is not None else None
            if errors is None and not isinstance(result, (bytes, bytearray, memoryview, list)):
                errors = error_counts(result)
            try:
                body = encode_body(result)
                slot.parts = frames.encode_response_frame(
                    h.correlation_id, frames.response_header_version(h.api_key, h.api_version), body)
            except Exception:
                # An answer we cannot encode must not leave the client waiting forever: close,
                # as Kafka does when a response fails to serialise.
                log.exception("encoding the answer to api key %d v%d for %s failed",
                              h.api_key, h.api_version, self.peer)
                self._close_after(slot, "response encoding failed", logging.ERROR)
                return
        if slot.api:
            self.server.counters.request(slot.api, slot.started, errors)
        slot.done = True
        self._flush()

    def _flush(self) -> None:
        out = []
        last = False
        while self.slots and self.slots[0].done:
            slot = self.slots.popleft()
            if slot.last:
                last = True
                break
            if slot.parts is not None:
                out.extend(slot.parts)
        if out and not self.closed:
            self.transport.writelines(out)
        if last:
            # close() (not abort) sends what is buffered first.
            self.closed = True
            self.slots.clear()
            self.transport.close()
            return
        if (self.paused and not self.closing and len(self.slots) <= RESUME_INFLIGHT
                and not self.server.draining):
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
