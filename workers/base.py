"""The worker base: one shape for every process the supervisor forks.

Runs in every worker process (partition writers, the coordinator, fetchers, frontends); owns the
part of each worker that is the same everywhere: its ``Topology`` of the runtime directory, its
heartbeat slot, its ``Mailbox`` (doorbell and input rings) and ``Outbox``es to its peers, its
view of the supervisor's page and of the catalog, its own state page (generation, status, pid),
its metrics table (``self.metrics``, ``shm.metrics``), the SIGTERM handling, the ``Registry``
dispatch of incoming ring messages, the running configuration (``self.cfg``, replaced by a
SIGHUP reload: ``reload`` is the worker's one entry point for it), and the loop. The worker's own
state stays in the subclass, which the loop calls through hooks.

Like a pre-fork server's worker class, the arbiter (``appliance.supervisor``) hands the worker its
context and calls its entry point in the child; ``Worker.main`` then runs the one life cycle of
every worker process (``WorkerProcess.main``, here with the worker its only member; a process
of several members runs each step for every member before the next)::

    close the inherited listening socket   (unless serves_clients: only frontends hold it)
    install signals                        SIGTERM sets ``stop``; SIGINT is ignored (the
                                           supervisor orders the drain)
    publish generation, RECOVERING, pid    + start_fields()
    setup()                                recovery; an exit code (WORKER_BOOT_ERROR) ends here
    publish READY                          once every member has recovered
    run()                                  the loop below, or the event loop (AsyncWorker)
    publish DRAINING, on_stop(), flush     answer what is already queued
    close(); publish STOPPED               always, also after an exception

The loop (``Worker.loop``), one turn::

    beat the heartbeat
    if the supervisor's page moved: a new configuration version -> reload(old, new)
    worked = drain_inputs()     default: the input rings the ready map marked (shm.ready),
                                every one once a second (Mailbox.to_read), through the
                                registry; the partition writer replaces it with its produce
                                fast path
    on_tick(now)                every ``tick_s`` seconds
    on_turn(now)                per-turn work (replies, timers that need every turn)
    flush_outboxes()            one bell per peer per turn, not one per reply
    if not worked: mailbox.wait(min(wait_timeout(now), time to the next tick,
                                    10 ms while replies wait for room in a ring))

The base adds no work per message: dispatch is the registry's one lookup by type, and a worker
with a hot path (the writer's batches, the frontend's acks) drains its rings itself.

``AsyncWorker`` is the same prologue and the same hooks for a worker that sleeps in epoll (the
frontend): the mailbox's doorbell is a reader of the event loop (``drain_inputs`` runs on every
ring of the bell), SIGTERM is an event-loop signal handler that calls ``begin_stop``, and
``on_tick`` runs every ``tick_s`` from a timer, after the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import Sequence

from appliance import ipc, reload as config_reload
from appliance.catalog.view import PUBLISHED_FILE, CatalogView
from appliance.config import Config
from appliance.runtime import (DRAINING, HEARTBEAT_FILE, READY, RECOVERING, STOPPED, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_PAGE_FIELDS, WorkerContext)
from appliance.service import Registry
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.metrics import MetricsTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

log = logging.getLogger("appliance.worker")

# How long an idle worker sleeps on its doorbell (a lost wake-up costs at most this).
IDLE_WAIT_S = 0.5
# How soon a worker retries replies that found their ring full.
QUEUED_RETRY_S = 0.01


class WorkerProcess:
    """The life of one worker process, for the workers it runs (``members``): one, itself, for
    every ``Worker``; several that share its fate for a process that gives its own ``loop``
    turning them (none does today: a writer process carries many partitions as one ``Worker``,
    ``workers.writer_process``). ``main``, ``run``, the signals and the drain are the same."""

    #: the workers this process runs, in the order of their prologues
    members: Sequence["Worker"]
    stop: bool

    def main(self) -> int:
        """The process's whole life; returns its exit code."""
        members = self.members
        for w in members:
            w.close_listener()
        self.install_signals()
        for w in members:
            w.publish_start()
        for w in members:
            code = w.setup()
            if code:
                return code
        # READY only once every member has recovered: the supervisor holds a READY worker to its
        # heartbeat, and a member that is READY does not beat while a mate's recovery runs
        # (regression: a process whose last member took longer than heartbeat_timeout_ms to
        # recover was SIGKILLed for its first member's silence, and again after every restart).
        for w in members:
            w.page.publish(status=READY)
        return self.run()

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self.handle_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # the supervisor orders the drain

    def handle_term(self, signum=None, frame=None) -> None:
        self.stop = True
        for w in self.members:
            w.stop = True
        # Ring a member's bell: the handler runs while the loop may sleep in a poll of the
        # doorbells, which Python resumes after the handler (PEP 475) for the rest of its
        # timeout (up to IDLE_WAIT_S); the ring ends that sleep, so the drain starts now.
        first = self.members[0]
        first.bells.ring(first.mailbox.doorbell.path)

    def run(self) -> int:
        """The loop, then every member's drain (``stop_serving``); every member's ``close`` and
        STOPPED also after an exception (the first failure is raised once all are closed).
        The exit code is the highest of the members'."""
        members = self.members
        try:
            self.loop()
            for w in members:
                w.stop_serving()
        finally:
            failed: BaseException | None = None
            for w in members:
                try:
                    w.close()
                except BaseException as e:            # close the others' logs all the same
                    if len(members) > 1:
                        log.exception("%s: closing failed", w.name)
                    failed = failed or e
                finally:
                    w.page.publish(status=STOPPED)
            if failed is not None:
                raise failed
        return max(w.exit_code for w in members)

    def loop(self) -> None:
        raise NotImplementedError


class Worker(WorkerProcess):
    """Base of the blocking workers. Subclasses set the class attributes and override hooks."""

    #: layout of this worker's state page (``page.<name>``, created by the supervisor)
    page_fields: Sequence[tuple[str, str]] = WORKER_PAGE_FIELDS
    #: frontends keep the inherited listening socket; every other worker closes it at start
    serves_clients = False
    #: period of ``on_tick`` in seconds (None: no tick)
    tick_s: float | None = None
    #: the registry answers a failing request with its error reply (True) or lets the error stop
    #: the worker (False: the writer, whose state is not to be trusted after a failure)
    contain = True

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.name = ctx.name
        self.generation = ctx.generation
        self.stop = False
        self.exit_code = 0
        self.topo = Topology(ctx.run_dir)
        self.hb = HeartbeatTable.open(os.path.join(ctx.run_dir, HEARTBEAT_FILE))
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, ctx.name)
        for src in self.inputs():
            self.mailbox.add(src)
        # Replies that do not fit their ring (a slow or restarting peer) wait in the outbox's
        # queue and are retried every turn.
        self.outboxes: dict[str, Outbox] = {dst: Outbox(self.topo, ctx.name, dst, self.bells)
                                            for dst in self.outputs()}
        self.posted: set[str] = set()          # outboxes posted to since their last flush
        self.sup_page = StatePage.open(self.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS,
                                       readonly=True)
        self.catalog = CatalogView(self.topo.file_path(PUBLISHED_FILE),
                                   lambda: self.sup_page.read().catalog_version)
        self.page = StatePage.open(self.topo.page_path(ctx.name), self.page_fields)
        self.metrics = _open_metrics(self.topo, ctx.name)
        self.config_version = ctx.config_version
        self._sup_seq = -1                      # the supervisor page's seq last looked at
        self.next_tick = 0.0
        self.registry: Registry | None = None

    @property
    def members(self) -> tuple["Worker"]:
        """``main`` runs this worker alone."""
        return (self,)

    # -- wiring (hooks called by __init__) ------------------------------------------------------
    def inputs(self) -> list[str]:
        """The peers whose rings into this worker it consumes (default: every frontend)."""
        return list(self.ctx.frontends)

    def outputs(self) -> list[str]:
        """The peers this worker answers (default: every frontend)."""
        return list(self.ctx.frontends)

    def serve(self, *services, on_answer=None) -> Registry:
        """Serve the ``@serves`` methods of ``services`` on the input rings; answers go back
        through ``reply``; a message that is not a request goes to ``on_answer``."""
        self.registry = Registry(*services, post=self.reply, on_answer=on_answer,
                                 contain=self.contain)
        return self.registry

    # -- life cycle (WorkerProcess.main, with this worker its one member) ----------------------
    def publish_start(self) -> None:
        """This generation's first publish, before ``setup``: generation, RECOVERING, pid and
        ``start_fields``."""
        self.page.reset_seq()
        self.page.publish(generation=self.generation, status=RECOVERING, pid=os.getpid(),
                          **self.start_fields())

    def close_listener(self) -> None:
        """Every worker inherits the supervisor's listening socket; only frontends serve it. A
        worker that kept it would keep the port accepting connections nobody serves."""
        if self.serves_clients:
            return
        for fd in {self.ctx.listen_fd, *(b.fd for b in self.ctx.listeners)} - {-1}:
            try:
                os.close(fd)
            except OSError:
                pass
        self.ctx.listen_fd = -1
        self.ctx.listeners = []

    def exit(self, code: int) -> None:
        """Leave the loop at the end of this turn with ``code``."""
        self.exit_code = code
        self.stop = True

    def stop_serving(self) -> None:
        """After the loop: DRAINING, answer what is already queued (``on_stop``), hand the
        replies to the rings."""
        self.page.publish(status=DRAINING)
        self.on_stop()
        self.flush_outboxes()

    def loop(self) -> None:
        mailbox = self.mailbox
        while not self.stop:
            timeout = self.turn()
            if timeout is not None and not self.stop:
                mailbox.wait(timeout)

    def turn(self) -> float | None:
        """One turn of the loop without its sleep: None when it did work (turn again at once),
        else how long it may sleep."""
        self.hb.beat(self.ctx.heartbeat_slot)
        if self.sup_page.seq != self._sup_seq:
            self.check_config()
        worked = self.drain_inputs()
        now = time.monotonic()
        tick_s = self.tick_s          # a reload may change it
        if tick_s is not None and now >= self.next_tick:
            self.next_tick = now + tick_s
            self.on_tick(now)
        self.on_turn(now)
        queued = self.flush_outboxes()
        if worked:
            return None
        timeout = self.wait_timeout(now)
        if tick_s is not None:
            timeout = min(timeout, max(0.0, self.next_tick - time.monotonic()))
        if queued:
            timeout = min(timeout, QUEUED_RETRY_S)
        return timeout

    # -- configuration --------------------------------------------------------------------------
    def check_config(self) -> None:
        """The supervisor's page changed: when its configuration version moved, read the new
        configuration and hand it to ``reload``."""
        self._sup_seq = self.sup_page.seq
        version = self.sup_page.read().config_version
        if version == self.config_version:
            return
        try:
            new = config_reload.read_published(config_reload.file_path(self.ctx.run_dir))
        except (OSError, ValueError) as e:
            log.error("%s: the reloaded configuration cannot be read: %s", self.name, e)
            self.config_version = version
            return
        old = self.cfg
        self.cfg = self.ctx.config = new
        self.config_version = version
        try:
            self.reload(old, new)
        except Exception:
            log.exception("%s: applying the reloaded configuration failed", self.name)

    def reload(self, old: Config, new: Config) -> None:
        """SIGHUP reload: ``self.cfg`` is already ``new``; apply what this worker caches of it.
        Called on every reload whose file loaded, changed keys or not (files such as
        certificates may have changed)."""

    # -- hooks ----------------------------------------------------------------------------------
    def start_fields(self) -> dict:
        """Extra fields of the first publish (before ``setup``)."""
        return {}

    def setup(self) -> int | None:
        """Recovery and everything that needs the signals installed; a non-zero return is the
        exit code (WORKER_BOOT_ERROR: the supervisor stops the appliance)."""
        return None

    def drain_inputs(self) -> bool:
        """Serve every message waiting in the input rings the ready map marked (and in every
        input ring once a second: ``Mailbox.to_read``); True if there was any."""
        worked = False
        handle = self.registry.handle
        for src, ring in self.mailbox.to_read(time.monotonic()):
            while (raw := ring.get()) is not None:
                worked = True
                handle(src, raw)
        return worked

    def on_turn(self, now: float) -> None:
        """Work of every loop turn, after the inputs were drained."""

    def on_tick(self, now: float) -> None:
        """Work every ``tick_s`` seconds."""

    def wait_timeout(self, now: float) -> float:
        """How long an idle turn may sleep (capped by the next tick and queued replies)."""
        return IDLE_WAIT_S

    def on_stop(self) -> None:
        """After SIGTERM: answer what is already queued or held (the outboxes are flushed
        after this)."""

    def close(self) -> None:
        """Release what the worker holds; runs last, also after an exception."""

    def release(self) -> None:
        """Close what the prologue opened (mailbox and its doorbell, bell sender, pages, the
        heartbeat table, the rings). A worker process never needs it (its exit does it); a test
        that builds workers in its own process does."""
        self.mailbox.close()
        self.bells.close()
        self.page.close()
        self.sup_page.close()
        self.hb.close()
        self.metrics.close()
        self.topo.close()

    # -- replies --------------------------------------------------------------------------------
    def post(self, dst: str, data: bytes) -> None:
        """Queue ``data`` to ``dst``; the turn's ``flush_outboxes`` rings its bell."""
        self.outboxes[dst].post(data)
        self.posted.add(dst)

    def reply(self, dst: str, req_id: int, body: ipc.Message) -> None:
        """The registry's answer path. A peer that went away meanwhile (a deleted topic's
        writer) gets nothing."""
        box = self.outboxes.get(dst)
        if box is not None:
            box.post(ipc.encode(req_id, body))
            self.posted.add(dst)

    def flush_outboxes(self) -> bool:
        """Hand what was posted this turn to the rings and ring each waiting peer once; retry
        the queues of full rings. True while something remains queued."""
        queued = False
        posted = self.posted
        for dst, box in self.outboxes.items():
            if dst in posted or box.queued:
                if box.flush():
                    queued = True
        posted.clear()
        return queued


class AsyncWorker(Worker):
    """A worker that sleeps in epoll (asyncio): the same prologue and hooks, with the blocking
    loop replaced by the event loop (the mailbox is one of its readers, ``on_tick`` a timer)."""

    tick_s = 0.02

    def run(self) -> int:
        return asyncio.run(self.run_async())

    async def run_async(self) -> int:
        loop = asyncio.get_running_loop()
        self.event_loop = loop
        self.done = loop.create_future()
        # Producers always ring us: we sleep in epoll, never in Mailbox.wait.
        self.mailbox.arm()
        loop.add_reader(self.mailbox.fileno(), self._on_bell)
        await self.start_async()
        # After start_async: begin_stop may use what it set up (the frontend's server).
        loop.add_signal_handler(signal.SIGTERM, self.handle_term)
        loop.call_soon(self._tick)
        try:
            await self.done
            self.page.publish(status=DRAINING)
            self.on_stop()
        finally:
            loop.remove_reader(self.mailbox.fileno())
            self.close()
            self.page.publish(status=STOPPED)
        return self.exit_code

    def install_signals(self) -> None:
        # SIGTERM is the event loop's (run_async); SIGINT stays ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def handle_term(self, signum=None, frame=None) -> None:
        if not self.stop:
            self.stop = True
            self.begin_stop()

    def finish(self) -> None:
        """End ``run_async`` (the worker has drained)."""
        if not self.done.done():
            self.done.set_result(None)

    def _on_bell(self) -> None:
        # The mailbox stays armed from run_async on (inputs added later included): no re-arm.
        self.mailbox.drain()
        self.drain_inputs()

    def _tick(self) -> None:
        self.hb.beat(self.ctx.heartbeat_slot)
        if self.sup_page.seq != self._sup_seq:
            self.check_config()
        self.on_tick(time.monotonic())
        self.event_loop.call_later(self.tick_s, self._tick)

    # -- hooks ----------------------------------------------------------------------------------
    async def start_async(self) -> None:
        """Set-up that needs the running event loop (e.g. start serving clients)."""

    def begin_stop(self) -> None:
        """SIGTERM: start draining; call ``finish`` once drained."""
        self.finish()


def _open_metrics(topo: Topology, name: str) -> MetricsTable:
    """The worker's metrics table (made by the supervisor before the fork); a private one when
    it is missing, so that counting code never has to ask."""
    try:
        return MetricsTable.open(topo.metrics_path(name))
    except FileNotFoundError:
        return MetricsTable.anonymous()
