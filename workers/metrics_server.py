"""The metrics server: Prometheus' text format at ``GET /metrics`` on ``[metrics] listen``.

Runs as one child of the supervisor when ``metrics.listen`` is set (an ``AsyncWorker``,
``workers.base``: its heartbeat, page and restart like every worker's). Owns the HTTP connections
of scrapers and the listening socket it inherited from the supervisor (bound there before the
fork, so a bad address stops the start with its exit status, and handed again to a restarted
server). It has no rings: each scrape reads what every process publishes
(``appliance.metrics.collector``: metrics tables, state pages, the heartbeat table, ring headers,
the coordinator's snapshot), so a scrape never waits for, locks or wakes a worker, and the
supervisor's loop never serves HTTP.

HTTP/1.1 with keep-alive (Prometheus reuses its connection), ``HEAD``, gzip when asked, and the
OpenMetrics format when the scraper's ``Accept`` prefers it (prometheus_client's negotiation);
the request parser and the connection loop are ``appliance.http``'s, the console's too.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket

from prometheus_client.exposition import choose_encoder

from appliance.http import MAX_HEAD_BYTES, Request, Response, serve_connection
from appliance.metrics.collector import Collector, NotRunning
from appliance.runtime import WorkerContext
from workers.base import AsyncWorker

log = logging.getLogger("appliance.metrics")

METHODS = ("GET", "HEAD")


def main(ctx: WorkerContext) -> int:
    return MetricsServer(ctx).main()


class MetricsServer(AsyncWorker):
    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.collector = Collector(ctx.run_dir)
        self.exposition = self.collector.registry()   # prometheus_client's registry
        self.server: asyncio.AbstractServer | None = None
        self.clients: set[asyncio.StreamWriter] = set()

    def inputs(self) -> list[str]:
        return []

    def outputs(self) -> list[str]:
        return []

    def drain_inputs(self) -> bool:
        return False          # no rings: nothing ever arrives

    async def start_async(self) -> None:
        sock = socket.socket(fileno=self.ctx.metrics_fd)
        sock.setblocking(False)
        self.server = await asyncio.start_server(self._client, sock=sock, limit=MAX_HEAD_BYTES)

    def begin_stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for w in list(self.clients):
            w.close()
        self.finish()

    def close(self) -> None:
        self.collector.close()

    # -- HTTP (appliance.http: the parser and keep-alive loop the console uses too) ------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        try:
            await serve_connection(reader, writer, self._answer, methods=METHODS,
                                   stopping=lambda: self.stop, log=log, max_body=MAX_HEAD_BYTES)
        finally:
            self.clients.discard(writer)

    def _answer(self, req: Request) -> Response:
        if req.path == "/metrics":
            return self._metrics(req.headers)
        if req.path == "/":
            return Response.text(200, "appliance: Prometheus metrics at /metrics\n")
        return Response.text(404, "not found: try /metrics\n")

    def _metrics(self, headers: dict[str, str]) -> Response:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        try:
            body = encoder(self.exposition)
        except NotRunning as e:
            return Response.text(503, f"{e}\n")
        except Exception:
            log.exception("collecting metrics failed")
            return Response.text(500, "collecting metrics failed (see the log)\n")
        extra = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            extra.append(("Content-Encoding", "gzip"))
        return Response(200, body, content_type, headers=extra)
