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

Listeners: every listening socket is served by one accept loop of our own (``_accept``), which
applies the connection quotas (``quotas.py``: Kafka's max.connections and max.connections.per.ip)
and hands each accepted socket to ``connect_accepted_socket``; an SSL or SASL_SSL listener's
socket gets the SSL context current at that moment, so that a renewed certificate reaches the
next connection while open ones keep theirs: on SIGHUP the supervisor re-reads the certificate
files and bumps ``tls_version`` on its page before the configuration version, and ``reload`` (the
worker's one reload entry point) builds the new context (``appliance.security.tls``). The TLS
handshake has ``TLS_HANDSHAKE_TIMEOUT_S``; a client that fails it (a plaintext client on a TLS
port, an untrusted certificate) is closed, as Kafka's SslTransportLayer does.

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

import errno
import logging
import os
import socket
import ssl
import time

from appliance.api import api_ranges, load_handlers
from appliance.group.messages import ShareConnectionClosed, ShareFrontendStarted
from appliance.runtime import (COORDINATOR, FRONTEND_PAGE_FIELDS, SUPERVISOR, BoundListener,
                              WorkerContext, release_free_memory)
from appliance.security import tls
from appliance.principal_rules import parse_mapping_rules
from appliance.security.oauthbearer import JwtValidator, OAuthConfigError
from workers.base import AsyncWorker
from workers.frontend.broker import Broker
from workers.frontend.connection import KafkaConnection
from workers.frontend.metrics import FrontendMetrics
from appliance.quota.rates import CONNECTION
from workers.frontend.quotas import ConnectionQuotas

log = logging.getLogger("appliance.frontend")

DRAIN_GRACE_S = 5.0
REAP_IDLE_S = 1.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0
ACCEPT_BATCH = 64          # connections accepted per wake-up of a listening socket
ACCEPT_RETRY_S = 1.0       # out of file descriptors: accept again after this long (as asyncio)
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Frontend(AsyncWorker):
    serves_clients = True
    page_fields = FRONTEND_PAGE_FIELDS

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        load_handlers()
        self.api_ranges = api_ranges()
        self.counters = FrontendMetrics(self.metrics, [b.listener.name for b in ctx.listeners])
        self.broker = Broker(self)
        self.broker.counters = self.counters
        self.connections: set[KafkaConnection] = set()
        self.share_closes: set = set()          # _tell_coordinator calls under way
        self.closed_since_trim = 0             # connections closed since malloc was last trimmed
        self.quota_keys: dict[KafkaConnection, bytes] = {}
        self.draining = False
        self.listen_socks: list[tuple[socket.socket, BoundListener]] = []
        self.accepting = False
        self.quotas: ConnectionQuotas | None = None
        self.ssl_context: ssl.SSLContext | None = None
        self.tls_version = 0
        self.principal_rules = parse_mapping_rules(self.cfg.tls.principal_mapping_rules)
        # SASL/OAUTHBEARER's token validator (its JWKS read now and on every reload).
        self.oauth_validator: JwtValidator | None = JwtValidator.from_config(self.cfg.sasl)

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
        self.quotas = ConnectionQuotas(self)
        for bound in self.ctx.listeners:
            sock = socket.socket(fileno=bound.fd)
            sock.setblocking(False)
            self.listen_socks.append((sock, bound))
        self._resume_accepting()
        loop.call_later(REAP_IDLE_S, self._reap_idle)
        # The share sessions of a killed predecessor's connections close (their records go back
        # at once instead of at their locks' end): nobody could tell of those connections' close.
        self._tell_coordinator(ShareFrontendStarted(self.name, os.getpid()), "of its predecessor")

    # -- TLS ------------------------------------------------------------------------------------
    def _load_tls(self) -> None:
        version = self.sup_page.read().tls_version
        try:
            self.ssl_context = tls.load_published(self.cfg.tls, self.ctx.run_dir, version)
        except tls.TlsError as e:
            if self.ssl_context is None:
                raise
            log.error("keeping the certificates in use: %s", e)
        else:
            # Said at start too: a frontend that starts after a reload (SIGHUP right after the
            # appliance is ready, before every frontend is) begins with the new certificates
            # and has no reload to report them (regression: test_tls waited for its line).
            log.info("new TLS connections use the certificates of version %d", version)
        self.tls_version = version

    def _load_oauth(self, cfg) -> None:
        """Re-read the JWKS: new authentications use the keys read now (a rotated key set
        reaches the next login, as Kafka's JWKS refresh); a file that does not load keeps the
        keys in use."""
        try:
            self.oauth_validator = JwtValidator.from_config(cfg.sasl)
        except OAuthConfigError as e:
            log.error("OAUTHBEARER: keeping the JWKS in use: %s", e)
        else:
            if self.oauth_validator is not None:
                log.info("OAUTHBEARER: %d signature keys loaded", len(self.oauth_validator.keys))

    def drain_inputs(self) -> bool:
        self.broker.drain()
        return True

    def on_tick(self, now: float) -> None:
        self.broker.tick(now)
        if not self.accepting and self.quotas.slot_available():
            self._resume_accepting()        # another frontend's connection closed

    def reload(self, old, new) -> None:
        # Handlers read the configuration through the broker: new requests see the new values,
        # connections accepted from now on get the new socket_request_max_bytes, SASL mechanisms
        # and TLS settings.
        self.broker.cfg = new
        self.broker.client_quotas.settings(new.quotas)
        self.principal_rules = parse_mapping_rules(new.tls.principal_mapping_rules)
        self._load_oauth(new)
        # The supervisor published the re-read certificates before the version we follow moved.
        if self.ssl_context is not None and self.sup_page.read().tls_version != self.tls_version:
            self._load_tls()

    def begin_stop(self) -> None:
        self.draining = True
        log.info("draining %d connections", len(self.connections))
        self._pause_accepting()
        for sock, _bound in self.listen_socks:
            sock.close()
        for conn in list(self.connections):
            conn.begin_drain()
        grace = min(DRAIN_GRACE_S, self.cfg.supervisor.shutdown_timeout_ms / 2000)
        self.event_loop.call_later(grace, self._end_drain)
        self._check_drained()

    # -- accepting -------------------------------------------------------------------------------
    # Our own accept loop instead of loop.create_server: Kafka's acceptor stops accepting at
    # max_connections until a slot frees, and closes a connection over its address's limit right
    # after the accept (quotas.py); asyncio's server can do neither. A TLS listener's connection
    # gets the SSL context current when it is accepted (a renewed certificate reaches the next
    # connection; open ones keep theirs).
    def _resume_accepting(self) -> None:
        if not self.accepting and not self.draining:
            self.accepting = True
            for sock, bound in self.listen_socks:
                self.event_loop.add_reader(sock.fileno(), self._accept, sock, bound)

    def _pause_accepting(self) -> None:
        if self.accepting:
            self.accepting = False
            for sock, _bound in self.listen_socks:
                self.event_loop.remove_reader(sock.fileno())

    def _accept(self, listen_sock: socket.socket, bound: BoundListener) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self.quotas.slot_available():
                self._pause_accepting()     # the tick looks again (a slot may free anywhere)
                return
            try:
                sock, addr = listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return          # another frontend took it, or nothing left
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    log.warning("accept on %s failed: %s", bound.listener, e)
                    return
                log.error("accepting a connection failed (%s, %d open): accepting again in %.0f s",
                          e.strerror, len(self.connections), ACCEPT_RETRY_S)
                self._pause_accepting()
                self.event_loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)
                return
            host = addr[0] if isinstance(addr, tuple) else ""
            key, limit = self.quotas.admit(host)
            if key is None:
                log.info("Rejected connection from %s, address already has the configured "
                         "maximum of %d connections.", host, limit)
                sock.close()
                continue
            # The published table first (one page read): a connection quota altered since the
            # last tick holds this connection already (regression: connections opened right
            # after AlterClientQuotas answered were served, in CI).
            self.broker.client_quotas.refresh()
            if self.broker.quotas.enabled[CONNECTION]:
                hold = self.broker.quotas.connection(host, int(time.monotonic() * 1000))
                if hold:
                    # KIP-612: over its connection_creation_rate, the address's connection is
                    # held unserved for the throttle time, then closed (Kafka's acceptor keeps
                    # it in throttledSockets), so a reconnecting client is slowed, not spun.
                    log.info("Rejecting connection from %s, connection_creation_rate exceeded: "
                             "closing it in %d ms", host, hold)
                    self.quotas.release(key)
                    self.event_loop.call_later(hold / 1000, sock.close)
                    continue
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)    # as Kafka's acceptor
            context = self.ssl_context if bound.listener.tls else None
            self.event_loop.create_task(self._serve(sock, key, bound, context))

    async def _serve(self, sock: socket.socket, key: bytes, bound: BoundListener,
                     context: ssl.SSLContext | None) -> None:
        made: list[KafkaConnection] = []

        def protocol() -> KafkaConnection:
            conn = KafkaConnection(self, bound)
            self.quota_keys[conn] = key
            made.append(conn)
            return conn
        try:
            if context is None:
                await self.event_loop.connect_accepted_socket(protocol, sock=sock)
            else:
                await self.event_loop.connect_accepted_socket(
                    protocol, sock=sock, ssl=context,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
            return
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as e:
            if context is None:
                log.exception("could not set up an accepted connection")
            else:
                # A plaintext client on a TLS port, an untrusted certificate: closed, as Kafka's
                # SslTransportLayer does.
                log.info("TLS handshake with %s on %s failed: %s", _peer(sock), bound.listener, e)
        except Exception:
            log.exception("could not set up an accepted connection")
        sock.close()
        if not made or self.quota_keys.pop(made[0], None) is not None:
            self.quotas.release(key)

    def connection_closed(self, conn: KafkaConnection) -> None:
        """A connection's transport is gone (KafkaConnection.connection_lost)."""
        if conn in self.connections:
            self.connections.discard(conn)
            self.counters.connections(-1, conn.listener)
            self.closed_since_trim += 1
        key = self.quota_keys.pop(conn, None)
        if key is not None:
            self.quotas.release(key)
            if not self.accepting and not self.draining and self.quotas.slot_available():
                self._resume_accepting()

    def share_connection_closed(self, connection_id: str, sessions: list[tuple[str, str]]) -> None:
        """The share sessions a closed connection opened close at the coordinator, their
        members' records released to the others (``ShareConnectionClosed``); not awaited by
        anyone: a coordinator that does not answer leaves them to their locks' end."""
        self._tell_coordinator(ShareConnectionClosed(connection_id, sessions),
                               f"of connection {connection_id}")

    def _tell_coordinator(self, req, whose: str) -> None:
        async def tell() -> None:
            try:
                await self.broker.call_coordinator(req)
            except Exception:       # noqa: BLE001 (a draining or restarting coordinator)
                log.debug("the share sessions %s were not closed", whose, exc_info=True)
        task = self.event_loop.create_task(tell())
        self.share_closes.add(task)
        task.add_done_callback(self.share_closes.discard)

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
        if self.closed_since_trim:
            # Each connection's receive buffer (64 KiB) and what its requests allocated are
            # freed into malloc's heap when it closes; hand those pages back, at most once a
            # second, so that memory returns after a storm of connections.
            self.closed_since_trim = 0
            release_free_memory()
        self.event_loop.call_later(REAP_IDLE_S, self._reap_idle)


def _peer(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


def main(ctx: WorkerContext) -> int:
    return Frontend(ctx).main()
