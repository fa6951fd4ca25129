"""The frontend worker's shell: the listening sockets, the connections, the drain.

Runs as a child of the supervisor (``server.frontends`` of them); ``Frontend`` is the worker base's
``AsyncWorker`` (``workers.base``): the base's prologue, its mailbox in the event loop, its 20 ms
tick (heartbeat, then ``Broker.tick``). Owns the client connections (``connection.py``), the
listening sockets it inherited from the supervisor (one per listener: every frontend accepts on
the same sockets, the kernel hands each new connection to one of them, and frontends are the only
workers that keep them) and its SSL context. Counts requests, their latency and error codes into
its metrics table (``metrics.py``). Parses requests, runs the API handlers (``appliance.api``)
and answers in per-connection order. Talks to writers, fetchers, the coordinator and the
supervisor only through rings (``broker.py``).

Listeners: a PLAINTEXT or SASL_PLAINTEXT one is an asyncio server; an SSL or SASL_SSL one is an
accept loop of our own that hands each accepted socket to ``connect_accepted_socket`` with the
SSL context current at that moment, so that a renewed certificate reaches the next connection
while open ones keep theirs: on SIGHUP the supervisor re-reads the certificate files and bumps
``tls_version`` on its page before the configuration version, and ``reload`` (the worker's one
reload entry point) builds the new context (``appliance.security.tls``). The TLS handshake has
``TLS_HANDSHAKE_TIMEOUT_S``; a client that fails it (a plaintext client on a TLS port, an
untrusted certificate) is closed, as Kafka's SslTransportLayer does.

SIGTERM drains: stop accepting, stop reading new requests, answer every request already read
(in-flight produce requests wait for their acks), then exit. Requests that may wait long by
design (a JoinGroup parked until its rebalance completes, up to the rebalance timeout; anything
waiting on a worker that is gone) do not hold the drain: after ``DRAIN_GRACE_S`` (at most half
the supervisor's shutdown timeout) the remaining connections are closed, as a Kafka broker that
shuts down closes its connections; the clients retry elsewhere or after the restart. Without
this, one parked JoinGroup made the supervisor SIGKILL the writers at its deadline instead of
letting them close their segments cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time

from appliance.api import api_ranges, load_handlers
from appliance.runtime import COORDINATOR, SUPERVISOR, BoundListener, WorkerContext
from appliance.security import tls
from appliance.security.principal import parse_mapping_rules
from workers.base import AsyncWorker
from workers.frontend.broker import Broker
from workers.frontend.connection import KafkaConnection
from workers.frontend.metrics import FrontendMetrics

log = logging.getLogger("appliance.frontend")

DRAIN_GRACE_S = 5.0
REAP_IDLE_S = 1.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class Frontend(AsyncWorker):
    serves_clients = True

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        load_handlers()
        self.api_ranges = api_ranges()
        self.counters = FrontendMetrics(self.metrics, [b.listener.name for b in ctx.listeners])
        self.broker = Broker(self)
        self.broker.counters = self.counters
        self.connections: set[KafkaConnection] = set()
        self.draining = False
        self.servers: list[asyncio.AbstractServer] = []
        self.tls_sockets: list[socket.socket] = []       # accepted by _accept_tls
        self.ssl_context: ssl.SSLContext | None = None
        self.tls_version = 0
        self.principal_rules = parse_mapping_rules(self.cfg.tls.principal_mapping_rules)

    def inputs(self) -> list[str]:
        # Writers' ack rings join with the catalog (Broker._sync_writers).
        return list(self.ctx.fetchers) + [SUPERVISOR, COORDINATOR]

    def outputs(self) -> list[str]:
        return []           # the broker's channels are this worker's outboxes

    # -- hooks ----------------------------------------------------------------------------------
    async def start_async(self) -> None:
        loop = self.event_loop
        self.broker.attach(loop)
        if any(b.listener.tls for b in self.ctx.listeners):
            self._load_tls()
        for bound in self.ctx.listeners:
            sock = socket.socket(fileno=bound.fd)
            sock.setblocking(False)
            if bound.listener.tls:
                self.tls_sockets.append(sock)
                loop.add_reader(sock.fileno(), self._accept_tls, sock, bound)
            else:
                self.servers.append(await loop.create_server(
                    lambda b=bound: KafkaConnection(self, b), sock=sock, backlog=1024))
        loop.call_later(REAP_IDLE_S, self._reap_idle)

    # -- TLS ------------------------------------------------------------------------------------
    def _load_tls(self) -> None:
        version = self.sup_page.read().tls_version
        try:
            self.ssl_context = tls.load_published(self.cfg.tls, self.ctx.run_dir, version)
        except tls.TlsError as e:
            if self.ssl_context is None:
                raise
            log.error("keeping the certificates in use: %s", e)
        self.tls_version = version

    def _accept_tls(self, sock: socket.socket, bound: BoundListener) -> None:
        for _ in range(64):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return          # another frontend took it, or nothing left
            except OSError as e:
                log.warning("accept on %s failed: %s", bound.listener, e)
                return
            conn.setblocking(False)
            task = self.event_loop.create_task(self._tls_handshake(conn, bound, self.ssl_context))
            task.add_done_callback(_consume)

    async def _tls_handshake(self, conn: socket.socket, bound: BoundListener,
                             context: ssl.SSLContext) -> None:
        peer = _peer(conn)
        try:
            await self.event_loop.connect_accepted_socket(
                lambda: KafkaConnection(self, bound), conn, ssl=context,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as e:
            log.info("TLS handshake with %s on %s failed: %s", peer, bound.listener, e)
            conn.close()

    def drain_inputs(self) -> bool:
        self.broker.drain()
        return True

    def on_tick(self, now: float) -> None:
        self.broker.tick(now)

    def reload(self, old, new) -> None:
        # Handlers read the configuration through the broker: new requests see the new values,
        # connections accepted from now on get the new socket_request_max_bytes, SASL mechanisms
        # and TLS settings.
        self.broker.cfg = new
        self.principal_rules = parse_mapping_rules(new.tls.principal_mapping_rules)
        # The supervisor published the re-read certificates before the version we follow moved.
        if self.tls_sockets and self.sup_page.read().tls_version != self.tls_version:
            self._load_tls()
            log.info("new TLS connections use the certificates of version %d", self.tls_version)

    def begin_stop(self) -> None:
        self.draining = True
        log.info("draining %d connections", len(self.connections))
        for server in self.servers:
            server.close()
        for sock in self.tls_sockets:
            self.event_loop.remove_reader(sock.fileno())
            sock.close()
        self.tls_sockets = []
        for conn in list(self.connections):
            conn.begin_drain()
        grace = min(DRAIN_GRACE_S, self.cfg.supervisor.shutdown_timeout_ms / 2000)
        self.event_loop.call_later(grace, self._end_drain)
        self._check_drained()

    # -- draining -------------------------------------------------------------------------------
    def _end_drain(self) -> None:
        if self.connections:
            log.info("closing %d connections still waiting after the drain grace period",
                     len(self.connections))
        for conn in list(self.connections):
            conn._abort("broker shutting down")

    def _check_drained(self) -> None:
        if not self.connections:
            self.finish()
            return
        self.event_loop.call_later(0.01, self._check_drained)

    def _reap_idle(self) -> None:
        limit = self.cfg.server.connections_max_idle_ms / 1000
        now = time.monotonic()
        for conn in list(self.connections):
            if not conn.slots and now - conn.last_active > limit:
                conn._abort("idle for longer than connections_max_idle_ms")
        self.event_loop.call_later(REAP_IDLE_S, self._reap_idle)


def _consume(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def main(ctx: WorkerContext) -> int:
    return Frontend(ctx).main()
