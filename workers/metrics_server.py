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
OpenMetrics format when the scraper's ``Accept`` prefers it (prometheus_client's negotiation).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket

from prometheus_client.exposition import choose_encoder

from appliance.metrics.collector import Collector, NotRunning
from appliance.runtime import WorkerContext
from workers.base import AsyncWorker

log = logging.getLogger("appliance.metrics")

MAX_HEAD_BYTES = 16384
IDLE_S = 60.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error", 503: "Service Unavailable"}


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

    # -- HTTP -----------------------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        try:
            while not self.stop:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                        ConnectionError):
                    return
                keep = await self._request(head, reader, writer)
                await writer.drain()
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except Exception:
            # A scraper's bad request, or a bug, costs that connection, never the server.
            log.exception("metrics connection failed")
        finally:
            self.clients.discard(writer)
            writer.close()

    async def _request(self, head: bytes, reader, writer) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._answer(writer, 400, b"bad request line\n", keep=False)
            return False
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > MAX_HEAD_BYTES:
            self._answer(writer, 400, b"bad request body\n", keep=False)
            return False
        if int(length):
            await reader.readexactly(int(length))
        conn = headers.get("connection", "").lower()
        keep = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._answer(writer, 405, b"only GET and HEAD\n", keep, extra={"Allow": "GET, HEAD"})
        elif path == "/metrics":
            self._metrics(writer, headers, keep, head_only=method == "HEAD")
        elif path == "/":
            self._answer(writer, 200, b"appliance: Prometheus metrics at /metrics\n", keep,
                         head_only=method == "HEAD")
        else:
            self._answer(writer, 404, b"not found: try /metrics\n", keep, head_only=method == "HEAD")
        return keep

    def _metrics(self, writer, headers: dict, keep: bool, head_only: bool) -> None:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        try:
            body = encoder(self.exposition)
        except NotRunning as e:
            self._answer(writer, 503, f"{e}\n".encode(), keep)
            return
        except Exception:
            log.exception("collecting metrics failed")
            self._answer(writer, 500, b"collecting metrics failed (see the log)\n", keep)
            return
        extra = {}
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            extra["Content-Encoding"] = "gzip"
        self._answer(writer, 200, body, keep, content_type=content_type, extra=extra,
                     head_only=head_only)

    def _answer(self, writer, status: int, body: bytes, keep: bool, *,
                content_type: str = "text/plain; charset=utf-8", extra: dict | None = None,
                head_only: bool = False) -> None:
        hdrs = {"Content-Type": content_type, "Content-Length": str(len(body)),
                "Connection": "keep-alive" if keep else "close", **(extra or {})}
        out = f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        writer.write(out.encode("latin-1") + (b"" if head_only else body))
