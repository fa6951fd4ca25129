"""The console worker: the appliance's web console (``appliance.console``) on ``[console] listen``.

Runs as one child of the supervisor when ``console.listen`` is set (an ``AsyncWorker``,
``workers.base``: its heartbeat, state page and restarts like every worker's; never the
supervisor's loop or a frontend). Owns the HTTP(S) connections of browsers, the listening socket
it inherited from the supervisor (bound before the fork, so a taken port stops the start with
its exit status), the login sessions, the Overview's hour of samples and the watched groups' lag points. It has no rings: what it
shows it reads as a Kafka client of the appliance's own listener, as the logged-in user
(``appliance.console.kafka``), and from what every process publishes (metrics tables, state
pages, ``processes.json``), so it is off the data path: a busy console costs the brokers'
processes only the Kafka requests its pages make, as any admin client's would
(loadtests/README.md measures it).

It runs at nice 10, after the brokers' processes when the CPU is contended. Requests are
served one at a time in the event loop (each page's admin calls block it for a few milliseconds;
their timeout, 8 s, is far inside the heartbeat timeout). TLS (``console.tls``): ``[tls]``'s
certificate and key, re-read on SIGHUP for new connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time

from appliance.console.app import HEADERS, METHODS, Console, pick_target
from appliance.console.history import SAMPLE_S
from appliance.http import MAX_HEAD_BYTES, serve_connection
from appliance.metrics.collector import Collector, NotRunning
from appliance.runtime import WorkerContext
from workers.base import AsyncWorker

log = logging.getLogger("appliance.console")


def main(ctx: WorkerContext) -> int:
    return ConsoleServer(ctx).main()


class ConsoleServer(AsyncWorker):
    tick_s = 0.5

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        # The listeners' bound ports, kept before close_listener forgets the inherited sockets.
        ports = {b.listener.name: b.port for b in ctx.listeners}
        self.ssl_ctx = self._ssl_context() if self.cfg.console.tls else None
        self.console = Console(self.cfg, ctx.run_dir, ctx.data_dir, pick_target(self.cfg, ports),
                               secure=self.ssl_ctx is not None)
        self.collector = Collector(ctx.run_dir)
        self.next_sample = 0.0
        self.server: asyncio.AbstractServer | None = None
        self.clients: set[asyncio.StreamWriter] = set()

    def setup(self) -> int | None:
        # After the brokers' processes: a person waiting for a page can wait a little, produce
        # and fetch should not (nice 10: about a tenth of a busy worker's share of a contended
        # CPU; not SCHED_IDLE, under which a loaded machine could starve the heartbeat and the
        # pages for seconds).
        try:
            os.nice(10)
        except OSError:
            pass
        return None

    def inputs(self) -> list[str]:
        return []

    def outputs(self) -> list[str]:
        return []

    def drain_inputs(self) -> bool:
        return False          # no rings: nothing ever arrives

    def _ssl_context(self) -> ssl.SSLContext:
        tls = self.cfg.tls
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLSv1.3"
                               else ssl.TLSVersion.TLSv1_2)
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=tls.key_password or None)
        return ctx

    async def start_async(self) -> None:
        sock = socket.socket(fileno=self.ctx.console_fd)
        sock.setblocking(False)
        self.server = await asyncio.start_server(self._client, sock=sock, limit=MAX_HEAD_BYTES,
                                                 ssl=self.ssl_ctx)

    def reload(self, old, new) -> None:
        self.console.reload(new)
        if self.ssl_ctx is not None:
            try:                # new handshakes get the renewed certificate
                self.ssl_ctx.load_cert_chain(new.tls.cert_file, new.tls.key_file,
                                             password=new.tls.key_password or None)
            except (OSError, ssl.SSLError) as e:
                log.error("console: the reloaded certificate does not load (the old one stays): %s", e)

    def on_tick(self, now: float) -> None:
        if now < self.next_sample:
            return
        self.next_sample = now + SAMPLE_S
        try:
            self.console.sample(self.collector.families(), time.time())
        except NotRunning:
            pass
        except Exception:
            log.exception("console: sampling the metrics failed")

    def begin_stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for w in list(self.clients):
            w.close()
        self.finish()

    def close(self) -> None:
        self.console.close()
        self.collector.close()

    # -- HTTP (appliance.http: the parser and keep-alive loop the metrics server uses too) ------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        try:
            await serve_connection(reader, writer, self.console.handle, methods=METHODS,
                                   stopping=lambda: self.stop, log=log, fixed=HEADERS,
                                   failed_text="the console failed on this page (see the log)\n")
        finally:
            self.clients.discard(writer)
