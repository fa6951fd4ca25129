"""The frontend worker's shell: the listening socket, the connections, the drain.

Runs as a child of the supervisor (``server.frontends`` of them); ``Frontend`` is the worker base's
``AsyncWorker`` (``workers.base``): the base's prologue, its mailbox in the event loop, its 20 ms
tick (heartbeat, then ``Broker.tick``). Owns the client connections (``connection.py``) and the
listening socket it inherited from the supervisor: every frontend accepts on the same socket (the
kernel hands each new connection to one of them), and frontends are the only workers that keep
it. Counts requests, their latency and error codes into its metrics table (``metrics.py``). Parses requests, runs the API handlers (``appliance.api``) and answers in per-connection
order. Talks to writers, fetchers, the coordinator and the supervisor only through rings
(``broker.py``).

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
import socket
import time

from appliance.api import api_ranges, load_handlers
from appliance.runtime import COORDINATOR, FRONTEND_PAGE_FIELDS, SUPERVISOR, WorkerContext
from workers.base import AsyncWorker
from workers.frontend.broker import Broker
from workers.frontend.connection import KafkaConnection
from workers.frontend.metrics import FrontendMetrics
from workers.frontend.quotas import ConnectionQuotas

log = logging.getLogger("appliance.frontend")

DRAIN_GRACE_S = 5.0
REAP_IDLE_S = 1.0
ACCEPT_BATCH = 64          # connections accepted per wake-up of the listening socket
ACCEPT_RETRY_S = 1.0       # out of file descriptors: accept again after this long (as asyncio)
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Frontend(AsyncWorker):
    serves_clients = True
    page_fields = FRONTEND_PAGE_FIELDS

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        load_handlers()
        self.api_ranges = api_ranges()
        self.counters = FrontendMetrics(self.metrics)
        self.broker = Broker(self)
        self.broker.counters = self.counters
        self.connections: set[KafkaConnection] = set()
        self.quota_keys: dict[KafkaConnection, bytes] = {}
        self.draining = False
        self.listen_sock: socket.socket | None = None
        self.accepting = False
        self.quotas: ConnectionQuotas | None = None

    def inputs(self) -> list[str]:
        # Writers' ack rings join with the catalog (Broker._sync_writers).
        return list(self.ctx.fetchers) + [SUPERVISOR, COORDINATOR]

    def outputs(self) -> list[str]:
        return []           # the broker's channels are this worker's outboxes

    # -- hooks ----------------------------------------------------------------------------------
    async def start_async(self) -> None:
        loop = self.event_loop
        self.broker.attach(loop)
        self.quotas = ConnectionQuotas(self)
        self.listen_sock = socket.socket(fileno=self.ctx.listen_fd)
        self.listen_sock.setblocking(False)
        self._resume_accepting()
        loop.call_later(REAP_IDLE_S, self._reap_idle)

    def drain_inputs(self) -> bool:
        self.broker.drain()
        return True

    def on_tick(self, now: float) -> None:
        self.broker.tick(now)
        if not self.accepting and self.quotas.slot_available():
            self._resume_accepting()        # another frontend's connection closed

    def reload(self, old, new) -> None:
        # Handlers read the configuration through the broker: new requests see the new values,
        # connections accepted from now on get the new socket_request_max_bytes.
        self.broker.cfg = new

    def begin_stop(self) -> None:
        self.draining = True
        log.info("draining %d connections", len(self.connections))
        self._pause_accepting()
        self.listen_sock.close()
        for conn in list(self.connections):
            conn.begin_drain()
        grace = min(DRAIN_GRACE_S, self.cfg.supervisor.shutdown_timeout_ms / 2000)
        self.event_loop.call_later(grace, self._end_drain)
        self._check_drained()

    # -- accepting -------------------------------------------------------------------------------
    # Our own accept loop instead of loop.create_server: Kafka's acceptor stops accepting at
    # max_connections until a slot frees, and closes a connection over its address's limit right
    # after the accept (quotas.py); asyncio's server can do neither.
    def _resume_accepting(self) -> None:
        if not self.accepting and not self.draining:
            self.accepting = True
            self.event_loop.add_reader(self.listen_sock.fileno(), self._accept)

    def _pause_accepting(self) -> None:
        if self.accepting:
            self.accepting = False
            self.event_loop.remove_reader(self.listen_sock.fileno())

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self.quotas.slot_available():
                self._pause_accepting()     # the tick looks again (a slot may free anywhere)
                return
            try:
                sock, addr = self.listen_sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    raise
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
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)    # as Kafka's acceptor
            self.event_loop.create_task(self._serve(sock, key))

    async def _serve(self, sock: socket.socket, key: bytes) -> None:
        made: list[KafkaConnection] = []

        def protocol() -> KafkaConnection:
            conn = KafkaConnection(self)
            self.quota_keys[conn] = key
            made.append(conn)
            return conn
        try:
            await self.event_loop.connect_accepted_socket(protocol, sock=sock)
        except Exception:
            log.exception("could not set up an accepted connection")
            sock.close()
            if not made or self.quota_keys.pop(made[0], None) is not None:
                self.quotas.release(key)

    def connection_closed(self, conn: KafkaConnection) -> None:
        """A connection's transport is gone (KafkaConnection.connection_lost)."""
        if conn in self.connections:
            self.connections.discard(conn)
            self.counters.connections(-1)
        key = self.quota_keys.pop(conn, None)
        if key is not None:
            self.quotas.release(key)
            if not self.accepting and not self.draining and self.quotas.slot_available():
                self._resume_accepting()

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


def main(ctx: WorkerContext) -> int:
    return Frontend(ctx).main()
