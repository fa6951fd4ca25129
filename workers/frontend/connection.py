"""One client connection: framing, dispatch to API handlers, responses in request order.

Runs inside a frontend process (asyncio, single thread). Owns the connection's socket transport,
its receive buffer and its queue of responses. Kafka answers the requests of one connection in the
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

Receiving: an ``asyncio.BufferedProtocol`` (the plain and the SSL transports alike): the socket,
or the TLS layer, reads straight into the connection's ``frames.FrameBuffer``, and each complete
frame is a view of that buffer, valid until the next read. A Produce request is parsed by hand
(``appliance.protocol.produce_request``) so that its record batches stay views until the writer's
ring (``appliance.api.produce`` sends them, or copies them, before the next read); every other
request is decoded from a copy of its frame, since kio's entities may keep views of their input.

Authentication, by the security protocol of the connection's listener (``listener``: Kafka's
listener name; ``security_protocol``; ``endpoint``: the ``appliance.listeners.Listener``): on
PLAINTEXT and SSL without a client certificate the principal is ``User:ANONYMOUS``; SSL with a
verified client certificate takes the certificate's subject (``appliance.security.principal``);
on SASL_PLAINTEXT and SASL_SSL the connection's ``SaslServerAuthenticator``
(``appliance.security.sasl``) gates every frame until authentication completes, as Kafka's
SaslServerAuthenticator does: only ApiVersions, SaslHandshake and SaslAuthenticate are served
(any other request in the handshake states closes the connection unanswered; in the
authenticate state it gets its error response with ILLEGAL_SASL_STATE), frames are limited to
512 KiB, the raw tokens of the SaslHandshake v0 flow are handed to the authenticator directly,
and a failed authentication is answered (or not) after
``server.connection_failed_authentication_delay_ms``, then the connection is closed.

Re-authentication (KIP-368): a session with an end (``sasl.connections_max_reauth_ms``, an
OAUTHBEARER token's exp) may be renewed by a SaslHandshake on the authenticated connection,
at most once a second (a second one is answered as after authentication, ILLEGAL_SASL_STATE);
the exchange is gated as the first one and must keep the mechanism and the principal. A request
other than that SaslHandshake after the session's end closes the connection unanswered, as
Kafka's SocketServer does ("expired credentials": a removed user, an expired token).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import inspect
import itertools
import logging
import os
import struct
import time
from typing import Any

from appliance.api import REGISTRY, CloseConnection, FailAuthentication, RequestContext, encode_body
from appliance.errors import ErrorCode, KafkaError, ProtocolViolation
from appliance.protocol import frames, messages
from appliance.protocol.produce_request import parse_produce_request
from appliance.quota.model import user_of
from appliance.quota.rates import NANOS_TO_PERCENTAGE, REQUEST
from appliance.security.principal import ANONYMOUS, NoMatchingRule, ssl_principal
from appliance.security.sasl import MAX_RECEIVE_SIZE, SaslFailure, SaslServerAuthenticator
from workers.frontend.metrics import error_counts

log = logging.getLogger("appliance.connection")
_SERIALS = itertools.count(1)

API_VERSIONS_KEY = 18
SASL_HANDSHAKE_KEY = 17
PRODUCE_KEY = 0
_SIZE = struct.Struct(">i")
# Not held to request_percentage: the handshake before any quota can name the client (Kafka's
# authenticator answers these before KafkaApis).
QUOTA_EXEMPT = frozenset((17, 18, 36))
MAX_INFLIGHT = 64          # pause reading beyond this many unanswered requests on one connection
RESUME_INFLIGHT = 16
# Plaintext answers are handed to the transport this much at a time, and only while its buffer is
# empty (see _pump); runs of smaller parts are joined into one write.
SEND_CHUNK = 256 * 1024


class _Slot:
    __slots__ = ("header", "parts", "done", "last", "api", "ctx", "started", "busy_ns",
                 "throttle_ms", "quota_done", "size")

    def __init__(self, header, api: str = "", ctx=None) -> None:
        self.header = header
        self.parts: list | None = None   # encoded frame parts, or None for "no response" (acks=0)
        self.done = False
        self.last = False                # close the connection when this slot reaches the head
        self.api = api                   # the API's name, for the request metrics ("" = none)
        self.ctx = ctx                   # its RequestContext (the handler's error counts)
        self.started = time.monotonic_ns()
        self.busy_ns = 0                 # the frontend's time on it so far (request_percentage)
        self.throttle_ms = 0             # mute the connection this long once it is sent (KIP-219)
        self.quota_done = False          # its quotas are recorded (at most once per request)
        self.size = 0                    # the request's bytes (producer_byte_rate counts them)


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, server: "Frontend", bound) -> None:
        self.server = server
        self.broker = server.broker
        self.transport: asyncio.Transport | None = None
        self.endpoint = bound.listener                 # the Listener (appliance.listeners)
        self.listener = bound.listener.name            # Kafka's listener name
        self.security_protocol = bound.listener.protocol
        self.advertised = server.broker.endpoints[bound.listener.name]
        self.sasl: SaslServerAuthenticator | None = None
        max_frame = server.broker.cfg.server.socket_request_max_bytes
        if self.endpoint.sasl:
            sasl_cfg = server.broker.cfg.sasl
            self.sasl = SaslServerAuthenticator(sasl_cfg.mechanisms,
                                                server.broker.scram_credentials,
                                                oauth=lambda: server.oauth_validator,
                                                reauth_ms=sasl_cfg.connections_max_reauth_ms)
            max_frame = min(max_frame, MAX_RECEIVE_SIZE)
        # The socket reads straight into it; frames are views of it until the next read.
        self.decoder = frames.FrameBuffer(max_frame)
        self.slots: collections.deque[_Slot] = collections.deque()
        self.paused = False
        self.closed = False
        self.closing = False       # a bad request was seen: answer what came before it, then close
        self.peer = "?"
        self.host = "?"
        self.principal = ANONYMOUS
        self.software = ("", "")      # KIP-511's client software name and version (ApiVersions v3+)
        self.auth_failed = False
        self.last_active = time.monotonic()
        self.fetcher = server.broker.next_fetcher()
        # Unique in the appliance's life (this frontend's worker name, its pid and a serial):
        # the share sessions opened on this connection (ShareFetch at epoch 0: (group id,
        # member id)) are closed when it closes, their records released
        # (appliance.api.share_fetch, KIP-932: Kafka's ShareSessionCache ties a session to the
        # connection of its initial epoch), and when a restarted frontend of this name says so.
        name = getattr(server, "name", "frontend")      # unit tests' servers have none
        self.connection_id = f"{name}/{os.getpid()}/{next(_SERIALS)}"
        self.share_sessions: set[tuple[str, str]] = set()
        self.tasks: dict[asyncio.Task, Any] = {}      # handler task -> the handler's coroutine
        self.produce_order: asyncio.Future | None = None   # appliance.api.produce keeps the order
        self.throttled = False      # muted by a quota (KIP-219) until unmute_at
        # A quota holds this connection's client: its requests are served one at a time, the
        # next read only once the previous is answered and the throttle has passed, as Kafka's
        # network thread does (a pipelined burst is not admitted before its first throttle).
        self.serial = False
        self.held: collections.deque[bytes] = collections.deque()
        self.releasing = False
        self.frame_t0 = 0
        self.unmute_at = 0.0
        self.unmute_timer: asyncio.TimerHandle | None = None
        # Answer bytes not yet handed to a plaintext transport (memoryviews of the segment maps
        # among them), and whether the transport's own buffer holds something (pause_writing).
        self.unsent: collections.deque = collections.deque()
        self.write_paused = False
        self.close_when_sent = False

    # -- asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if not self.endpoint.tls:
            # pause_writing as soon as the transport buffers anything: _pump hands it the next
            # chunk only once the socket took all of the last one.
            transport.set_write_buffer_limits(high=0)
        peer = transport.get_extra_info("peername")
        if peer:
            self.host = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        self.server.counters.connections(1, self.listener)
        if self.server.draining:
            self.transport.close()
            return
        if self.endpoint.tls and not self.endpoint.sasl:
            try:
                self.principal = ssl_principal(transport.get_extra_info("ssl_object"),
                                               self.server.principal_rules)
            except NoMatchingRule as e:
                # Kafka fails the SSL authentication: the connection is closed.
                self._abort(f"SSL authentication failed: {e}")

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.unsent.clear()
        self.server.connection_closed(self)     # forgets it, frees its quota, counts it
        if self.share_sessions:
            self.server.share_connection_closed(self.connection_id, sorted(self.share_sessions))
        for t, coro in list(self.tasks.items()):
            t.cancel()
            # A task cancelled before its first step never runs _run, so the handler's coroutine
            # would be collected un-awaited ("coroutine 'handle' was never awaited", found by
            # the frame fuzzer on abandoned pipelines): close it.
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing or self.closed:
            return                  # nothing after a bad request is read (Kafka muted the channel)
        self.last_active = time.monotonic()
        try:
            for frame in self.decoder.commit(nbytes):
                if self.serial and (self.held or self.slots or self.throttled):
                    self._hold(frame)
                    continue
                self._on_frame(frame)
                if self.closing or self.closed:
                    return
            if self.decoder.error is not None:     # a bad frame after good ones in this read
                raise self.decoder.error
        except ProtocolViolation as e:
            self._bad_frame(e)
        except Exception:
            # A bug in a handler must cost this connection, never the frontend process.
            log.exception("request from %s failed", self.peer)
            self._close_after(None, "internal error")

    def _bad_frame(self, e: ProtocolViolation) -> None:
        if self.sasl is not None and not self.sasl.complete:
            # Kafka: "Failing SASL authentication due to invalid receive size" (and any
            # other bad frame before authentication) fails the authentication.
            self._fail_authentication(None, None, str(e))
        else:
            self._close_after(None, str(e))

    # -- requests ---------------------------------------------------------------------------------
    def _abort(self, why: str) -> None:
        """Close at once, answered or not (shutdown timeout, idle connection)."""
        log.info("closing connection from %s: %s", self.peer, why)
        self.closed = True
        self.unsent.clear()
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

    # -- authentication -------------------------------------------------------------------------------
    def _fail_authentication(self, slot: _Slot | None, response: Any, why: str) -> None:
        """Stop reading; after Kafka's delay send ``response`` (if any) as the answer of
        ``slot``, then close."""
        if self.closed or self.auth_failed:
            return
        self.auth_failed = True
        log.info("failed authentication with %s on %s: %s", self.peer, self.endpoint, why)
        if self.sasl is not None and not self.sasl.complete:
            self.sasl.state = self.sasl.state.FAILED
        self.closing = True
        if self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if slot is None:
            slot = _Slot(None)
            self.slots.append(slot)

        def answer() -> None:
            if self.closed:
                return
            slot.parts = None
            if response is not None and slot.header is not None:
                try:
                    slot.parts = self._encode(slot.header, response)
                except Exception:
                    log.exception("encoding the authentication failure for %s failed", self.peer)
            if slot.api:        # a SaslAuthenticate answered with its failure counts as one
                self.server.counters.request(slot.api, slot.started,
                                             error_counts(response) if response is not None else None)
            slot.done = slot.last = True
            self._flush()

        delay = self.broker.cfg.server.connection_failed_authentication_delay_ms / 1000
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, answer)
        else:
            answer()

    def authenticated(self, principal: str) -> None:
        """SASL completed (or a re-authentication, KIP-368): the connection is ``principal``'s
        and takes any request of any size."""
        self.principal = principal
        self.decoder.max_frame_bytes = self.broker.cfg.server.socket_request_max_bytes
        self.decoder.min_frame_bytes = frames.REQUEST_HEADER_MIN_BYTES
        log.debug("%s authenticated as %s on %s", self.peer, principal, self.endpoint)

    def expect_raw_tokens(self) -> None:
        """After SaslHandshake v0: the next frames are bare SASL tokens, which may be shorter
        than a request header (a PLAIN token of a one-letter user and password)."""
        self.decoder.min_frame_bytes = 0

    def _on_raw_token(self, frame) -> None:
        """A SASL token of the SaslHandshake v0 flow: no request header; the answer is the
        server's token, size-prefixed, with no header either (nothing when there is none)."""
        try:
            token = self.sasl.evaluate(bytes(frame))
        except SaslFailure as e:
            self._fail_authentication(None, None, str(e))
            return
        slot = _Slot(None)
        slot.parts = [_SIZE.pack(len(token)), token]
        slot.done = True
        self.slots.append(slot)
        if self.sasl.complete:
            self.authenticated(self.sasl.principal)
        self._flush()

    def _before_authentication(self, frame) -> bool:
        """Gate a frame of a SASL connection that has not authenticated; True when it was dealt
        with here (refused, or a raw token), False to serve it normally."""
        auth = self.sasl
        if auth.raw and auth.state is auth.state.AUTHENTICATE:
            self._on_raw_token(frame)
            return True
        header, body_offset = frames.parse_request_header(frame)
        if not auth.refuses(header.api_key):
            return False
        what = f"unexpected request (api key {header.api_key}) during SASL {auth.state.name}"
        api = REGISTRY.get(header.api_key)
        slot = _Slot(header)
        if (auth.state is auth.state.AUTHENTICATE and api is not None and api.error_response
                and api.min_version <= header.api_version <= api.max_version):
            # Kafka answers it with its error response (ILLEGAL_SASL_STATE), then closes.
            request = messages.decode_request(header.api_key, header.api_version, bytes(frame),
                                              body_offset)
            self.slots.append(slot)
            self._fail_authentication(slot, api.error_response(
                header.api_version, request, KafkaError(ErrorCode.illegal_sasl_state, what)), what)
        else:
            self._fail_authentication(None, None, what)
        return True

    # -- dispatch ---------------------------------------------------------------------------------
    def _on_frame(self, frame) -> None:
        if self.broker.quotas.any:
            # request_percentage (KIP-124) counts the frontend's time on the request: the decode
            # and the handler's synchronous part here (an answer ready at once is recorded
            # within it, from frame_t0), plus the encoding of a later answer.
            self.frame_t0 = t0 = time.perf_counter_ns()
            slot = self._serve_frame(frame)
            self.frame_t0 = 0
            if slot is not None and not slot.done:
                slot.busy_ns = time.perf_counter_ns() - t0
            return
        self._serve_frame(frame)

    def _serve_frame(self, frame) -> "_Slot | None":
        if self.sasl is not None and not self.sasl.complete and self._before_authentication(frame):
            return None
        header, body_offset = frames.parse_request_header(frame)
        if self.sasl is not None and self.sasl.session_expires is not None:
            if header.api_key == SASL_HANDSHAKE_KEY and self.sasl.may_reauthenticate():
                # KIP-368: a SaslHandshake on an authenticated connection whose session has an
                # end begins a re-authentication; the connection keeps its principal meanwhile.
                self.sasl.begin_reauthentication()
            elif self.sasl.expired():
                # Kafka's SocketServer closes a connection whose session expired on its next
                # request that is not a re-authentication (expired token, removed user).
                self._close_after(None, f"SASL session of {self.principal} expired")
                return
        api = REGISTRY.get(header.api_key)
        if api is None:
            raise ProtocolViolation(f"unknown api key {header.api_key}")
        slot = _Slot(header, api.name)
        slot.size = len(frame) + 4
        if not api.min_version <= header.api_version <= api.max_version:
            if header.api_key != API_VERSIONS_KEY:
                raise ProtocolViolation(
                    f"unsupported version {header.api_version} of api key {header.api_key}")
            # Kafka answers an unknown ApiVersions version in the v0 layout with error 35 and its
            # own range, so the client can retry with a version we support.
            self.slots.append(slot)
            self._complete(slot, messages.build_api_versions_response(
                header.api_version, self.server.api_ranges))
            return slot
        if header.api_key == PRODUCE_KEY:
            # Record batches stay views of the receive buffer (no copy before the ring's); the
            # handler hands them to the writers before it returns, or copies them before it
            # gives the event loop back (appliance/api/produce.py).
            request = parse_produce_request(frame, body_offset, header.api_version)
        else:
            # kio's entities may keep views of what they decode: give them their own copy.
            request = messages.decode_request(header.api_key, header.api_version, bytes(frame),
                                              body_offset)
        self.slots.append(slot)
        ctx = slot.ctx = RequestContext(self.broker, self, header, slot)
        try:
            result = api.handle(ctx, request)
        except KafkaError as e:
            self._fail(slot, api, request, e)
            return slot
        except Exception:
            log.exception("handler of api key %d failed (request from %s)", header.api_key, self.peer)
            self._close_after(slot, "internal error")
            return slot
        if asyncio.iscoroutine(result):
            task = asyncio.ensure_future(self._run(slot, api, request, result))
            self.tasks[task] = result
            task.add_done_callback(self._task_done)
        else:
            self._complete(slot, result)
            if header.api_key == API_VERSIONS_KEY and self.sasl is not None:
                self.sasl.api_versions_answered()
        if len(self.slots) >= MAX_INFLIGHT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        return slot

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.pop(task, None)

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
        if isinstance(result, FailAuthentication):
            self._fail_authentication(slot, result.response, result.reason)
            return
        h = slot.header
        if not slot.quota_done and self.broker.quotas.any and h is not None:
            throttle = self.quota_throttle(slot, None, 0)
            if throttle and hasattr(result, "throttle_time"):
                result = dataclasses.replace(result, throttle_time=datetime.timedelta(
                    milliseconds=max(throttle, int(result.throttle_time.total_seconds() * 1000))))
        if result is None:
            slot.parts = None
            errors = slot.ctx.errors if slot.ctx is not None else None
        else:
            errors = slot.ctx.errors if slot.ctx is not None else None
            if errors is None and not isinstance(result, (bytes, bytearray, memoryview, list)):
                errors = error_counts(result)
            try:
                slot.parts = self._encode(h, result)
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

    @staticmethod
    def _encode(h, result) -> list:
        return frames.encode_response_frame(
            h.correlation_id, frames.response_header_version(h.api_key, h.api_version),
            encode_body(result))

    def _flush(self) -> None:
        out = []
        last = False
        mute = 0
        while self.slots and self.slots[0].done:
            slot = self.slots.popleft()
            if slot.parts is not None:          # a last slot has parts only for an auth failure
                out.extend(slot.parts)
            if slot.throttle_ms > mute:
                mute = slot.throttle_ms
            if slot.last:
                last = True
                break
        if out and not self.closed:
            self._write(out)
        if mute and not last and not self.closed:
            self._mute(mute)
        if last:
            self.closed = True
            self.slots.clear()
            self._close_when_sent()
            return
        if self.held and not self.slots and not self.throttled:
            if not self.releasing:
                self._release_held()
            return
        if (self.paused and not self.closing and len(self.slots) <= RESUME_INFLIGHT
                and not self.server.draining and not self.throttled and not self.held):
            self.paused = False
            self.transport.resume_reading()
        if self.server.draining and not self.slots:
            self._close_when_sent()

    # -- writing ----------------------------------------------------------------------------------
    # Python 3.11's transports copy what they are given: writelines joins every part into one
    # bytes object, write copies whatever the socket did not take at once into its buffer, and
    # a slice of what is left is copied again. A 27.5 MB Fetch answer was copied three times
    # before the kernel's own copy, and the client saw its first byte only after the join
    # (issue 39). On plaintext listeners the answer's parts (memoryviews of the segment maps)
    # are therefore handed over SEND_CHUNK at a time, the next only when the transport's buffer
    # is empty again (pause_writing / resume_writing with a high-water mark of 0): the socket
    # takes most chunks whole and the copy is at most one chunk's tail per wait. TLS transports
    # encrypt every byte anyway and take the part list as it is.

    def _write(self, parts: list) -> None:
        if self.endpoint.tls:
            self.transport.writelines(parts)
            return
        self.unsent.extend(parts)
        self._pump()

    def _pump(self) -> None:
        unsent = self.unsent
        transport = self.transport
        while unsent and not self.write_paused:
            if transport.is_closing():
                # The socket failed under a write (reset by the peer): connection_lost follows.
                unsent.clear()
                return
            first = unsent.popleft()
            n = len(first)
            if n >= SEND_CHUNK:
                if n > SEND_CHUNK:
                    first = memoryview(first)
                    unsent.appendleft(first[SEND_CHUNK:])
                    first = first[:SEND_CHUNK]
                transport.write(first)
                continue
            run = [first]
            while unsent and n + len(unsent[0]) <= SEND_CHUNK:
                part = unsent.popleft()
                run.append(part)
                n += len(part)
            transport.write(b"".join(run) if len(run) > 1 else first)
        if not unsent and self.close_when_sent:
            # close() (not abort) sends what the transport buffered first.
            transport.close()

    def _close_when_sent(self) -> None:
        self.close_when_sent = True
        if not self.unsent:
            self.transport.close()

    # -- client quotas (KIP-13, KIP-124, KIP-219) ---------------------------------------------
    def quota_throttle(self, slot: _Slot, quota_type: str | None, value: float) -> int:
        """Record the request against the client's quotas (its bytes against ``quota_type``'s,
        its frontend time so far against request_percentage), once; the throttle time for its
        response, which also mutes the connection that long once the response is sent."""
        if slot.quota_done:
            return slot.throttle_ms
        slot.quota_done = True
        q = self.broker.quotas
        h = slot.header
        user = user_of(self.principal)
        client_id = h.client_id or ""
        now_ms = int(time.monotonic() * 1000)
        throttle = 0
        if not self.serial and (
                (quota_type is not None and q.enabled[quota_type]
                 and q.governing(quota_type, user, client_id) is not None)
                or (q.enabled[REQUEST] and q.governing(REQUEST, user, client_id) is not None)):
            self.serial = True
        if quota_type is not None and q.enabled[quota_type]:
            throttle = q.record(quota_type, user, client_id, value, now_ms)
            if throttle:
                q.throttled(quota_type, user, client_id, throttle, now_ms)
        if q.enabled[REQUEST] and h.api_key not in QUOTA_EXEMPT:
            # An answer ready within _on_frame is timed from its frame's start; one taken while
            # the quotas came into force was not timed (0).
            busy = slot.busy_ns or (time.perf_counter_ns() - self.frame_t0 if self.frame_t0 else 0)
            t = q.record(REQUEST, user, client_id, busy * NANOS_TO_PERCENTAGE, now_ms)
            if t:
                q.throttled(REQUEST, user, client_id, t, now_ms)
                throttle = max(throttle, t)
        slot.throttle_ms = max(slot.throttle_ms, throttle)     # a mutation throttle may be set
        return throttle

    def quota_mutation(self, slot: _Slot, permits: float, strict: bool) -> tuple[bool, int]:
        """KIP-599: ``permits`` partition mutations against controller_mutation_rate
        (``ClientQuotas.mutation``); a throttle mutes the connection once the answer is sent."""
        admitted, throttle = self.broker.quotas.mutation(
            user_of(self.principal), slot.header.client_id or "", permits,
            int(time.monotonic() * 1000), strict)
        slot.throttle_ms = max(slot.throttle_ms, throttle)
        return admitted, throttle

    def quota_unmutate(self, slot: _Slot, permits: float) -> None:
        self.broker.quotas.unmutate(user_of(self.principal), slot.header.client_id or "", permits)

    def quota_unrecord(self, slot: _Slot, quota_type: str, value: float) -> None:
        """Take back ``value`` that ``quota_throttle`` recorded for ``slot`` (a throttled fetch
        sends no records: Kafka's unrecordQuotaSensor)."""
        q = self.broker.quotas
        if q.enabled[quota_type]:
            q.unrecord(quota_type, user_of(self.principal), slot.header.client_id or "",
                       value, int(time.monotonic() * 1000))

    def _mute(self, ms: int) -> None:
        """KIP-219: the response has gone; read nothing more from the client for ``ms``."""
        loop = asyncio.get_running_loop()
        until = loop.time() + ms / 1000
        if until <= self.unmute_at:
            return
        self.unmute_at = until
        self.throttled = True
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if self.unmute_timer is not None:
            self.unmute_timer.cancel()
        self.unmute_timer = loop.call_at(until, self._unmute)

    def _hold(self, frame) -> None:
        """A frame read while the connection's previous request is unanswered or throttled: a
        copy waits (the frame is a view of the receive buffer), and reading stops."""
        self.held.append(bytes(frame))
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _release_held(self) -> None:
        """Serve the next held frame (the one before it is answered, the throttle passed)."""
        self.releasing = True
        try:
            self._serve_held()
        finally:
            self.releasing = False
        if (not self.held and self.paused and not self.closing and not self.closed
                and not self.throttled and not self.server.draining
                and len(self.slots) <= RESUME_INFLIGHT):
            self.paused = False
            self.transport.resume_reading()

    def _serve_held(self) -> None:
        while self.held and not self.slots and not self.throttled:
            if self.closing or self.closed:
                self.held.clear()
                return
            frame = memoryview(self.held.popleft())
            try:
                self._on_frame(frame)
            except ProtocolViolation as e:
                self.held.clear()
                self._bad_frame(e)
                return
            except Exception:
                log.exception("request from %s failed", self.peer)
                self.held.clear()
                self._close_after(None, "internal error")
                return

    def _unmute(self) -> None:
        self.unmute_timer = None
        self.throttled = False
        if self.closed or self.closing or self.server.draining:
            return
        if self.held:
            if not self.slots:
                self._release_held()
            return
        if self.paused and len(self.slots) <= RESUME_INFLIGHT and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.unsent:
            self._pump()

    # -- draining -----------------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """Stop reading new requests; close once every accepted request has been answered."""
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        if not self.slots and self.transport is not None:
            self._close_when_sent()
