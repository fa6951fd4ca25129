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

import asyncio
import logging
import socket
import time

from appliance.api import api_ranges, load_handlers
from appliance.runtime import COORDINATOR, SUPERVISOR, WorkerContext
from workers.base import AsyncWorker
from workers.frontend.broker import Broker
from workers.frontend.connection import KafkaConnection
from workers.frontend.metrics import FrontendMetrics

log = logging.getLogger("appliance.frontend")

DRAIN_GRACE_S = 5.0
REAP_IDLE_S = 1.0


class Frontend(AsyncWorker):
    serves_clients = True

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        load_handlers()
        self.api_ranges = api_ranges()
        self.counters = FrontendMetrics(self.metrics)
        self.broker = Broker(self)
        self.broker.counters = self.counters
        self.connections: set[KafkaConnection] = set()
        self.draining = False
        self.server: asyncio.AbstractServer | None = None

    def inputs(self) -> list[str]:
        # Writers' ack rings join with the catalog (Broker._sync_writers).
        return list(self.ctx.fetchers) + [SUPERVISOR, COORDINATOR]

    def outputs(self) -> list[str]:
        return []           # the broker's channels are this worker's outboxes

    # -- hooks ----------------------------------------------------------------------------------
    async def start_async(self) -> None:
        loop = self.event_loop
        self.broker.attach(loop)
        sock = socket.socket(fileno=self.ctx.listen_fd)
        sock.setblocking(False)
        self.server = await loop.create_server(lambda: KafkaConnection(self), sock=sock,
                                               backlog=1024)
        loop.call_later(REAP_IDLE_S, self._reap_idle)

    def drain_inputs(self) -> bool:
        self.broker.drain()
        return True

    def on_tick(self, now: float) -> None:
        self.broker.tick(now)

    def reload(self, old, new) -> None:
        # Handlers read the configuration through the broker: new requests see the new values,
        # connections accepted from now on get the new socket_request_max_bytes.
        self.broker.cfg = new

    def begin_stop(self) -> None:
        self.draining = True
        log.info("draining %d connections", len(self.connections))
        self.server.close()
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


def main(ctx: WorkerContext) -> int:
    return Frontend(ctx).main()
