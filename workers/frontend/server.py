"""Frontend worker: owns client connections.

Runs as a child of the supervisor (``server.frontends`` of them). Accepts on the listening socket it
inherited from the supervisor (every frontend accepts on the same socket; the kernel hands each new
connection to one of them), parses requests, runs the API handlers (``appliance.api``) and answers
in per-connection order. Talks to writers, fetchers and the supervisor only through rings
(``appliance.server.broker``).

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
import signal
import socket
import time

from appliance.api import api_ranges, load_handlers
from appliance.runtime import WorkerContext
from appliance.server.broker import Broker
from appliance.server.connection import KafkaConnection

log = logging.getLogger("appliance.frontend")

DRAIN_GRACE_S = 5.0


class FrontendServer:
    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        load_handlers()
        self.api_ranges = api_ranges()
        self.broker = Broker(ctx)
        self.connections: set[KafkaConnection] = set()
        self.draining = False
        self.done: asyncio.Future | None = None

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        self.broker.attach(loop)
        sock = socket.socket(fileno=self.ctx.listen_fd)
        sock.setblocking(False)
        server = await loop.create_server(lambda: KafkaConnection(self), sock=sock, backlog=1024)
        loop.add_signal_handler(signal.SIGTERM, self._begin_drain, server)
        loop.add_signal_handler(signal.SIGINT, lambda: None)   # the supervisor orders the drain
        loop.call_later(1.0, self._reap_idle)
        await self.done
        return 0

    def _begin_drain(self, server: asyncio.AbstractServer) -> None:
        if self.draining:
            return
        self.draining = True
        log.info("draining %d connections", len(self.connections))
        server.close()
        for conn in list(self.connections):
            conn.begin_drain()
        grace = min(DRAIN_GRACE_S, self.ctx.config.supervisor.shutdown_timeout_ms / 2000)
        asyncio.get_running_loop().call_later(grace, self._end_drain)
        self._check_drained()

    def _end_drain(self) -> None:
        if self.connections:
            log.info("closing %d connections still waiting after the drain grace period",
                     len(self.connections))
        for conn in list(self.connections):
            conn._abort("broker shutting down")

    def _check_drained(self) -> None:
        if not self.connections:
            if not self.done.done():
                self.done.set_result(None)
            return
        asyncio.get_running_loop().call_later(0.01, self._check_drained)

    def _reap_idle(self) -> None:
        limit = self.ctx.config.server.connections_max_idle_ms / 1000
        now = time.monotonic()
        for conn in list(self.connections):
            if not conn.slots and now - conn.last_active > limit:
                conn._abort("idle for longer than connections_max_idle_ms")
        asyncio.get_running_loop().call_later(1.0, self._reap_idle)


def main(ctx: WorkerContext) -> int:
    server = FrontendServer(ctx)
    return asyncio.run(server.serve())
