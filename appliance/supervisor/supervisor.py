"""The supervisor: a pre-fork arbiter that owns the process table and the shared resources.

Runs in the top process (``appliance run``). Owns, alone: the process table (pid, role, generation
of every worker), the listening sockets (one per listener), the runtime directory with every shm
file, the topic catalog (``appliance.supervisor.catalog_store.CatalogStore``), the SCRAM credential store and the
published copy of the TLS certificates (both through ``appliance.security.supervisor``), the ACLs
(``appliance.acl.store``), the client quotas (``appliance.quota.supervisor``) and the data-dir
lock.

Shape (as in pre-fork servers): signal handlers only enqueue the signal and poke a self-pipe; one
loop dispatches queued signals, serves admin requests from frontends (topic administration,
``appliance.supervisor.topic_admin``, which changes the process table through the ``ProcessTable``
interface this class implements; AlterUserScramCredentials, ``appliance.security.supervisor``;
CreateAcls/DeleteAcls, ``appliance.acl.store``; AlterClientQuotas, ``appliance.quota.supervisor``),
reaps dead children, kills workers whose heartbeat
went stale, and respawns with backoff. A worker that restarts more than ``crash_loop_restarts``
times in ``crash_loop_window_ms``, or exits with the reserved WORKER_BOOT_ERROR code, stops the
appliance (exit 4) rather than loop forever; one that exits WORKER_DATA_DIR_ERROR (its state in the
data dir is damaged: a sealed segment of a coordinator log) stops it with exit 3, as a damaged
catalog does.

I/O errors never stop the supervisor: a catalog commit that fails answers the topic request
KAFKA_STORAGE_ERROR with the old catalog in place, a runtime dir (tmpfs) without room for a new
topic's rings refuses it the same way, and the files kept only for tools (processes.json) or
republished every turn (the published catalog) are logged once when they cannot be written.

Start (failures: ``appliance.runtime.StartFailure``, each with its exit status; the directories:
``appliance.supervisor.dirs``; the listeners: ``appliance.supervisor.startup``): lock the data dir,
give back the disk reserve (``appliance.supervisor.reserve``) if the disk is full, load the catalog
and the credentials, create the runtime dir and every ring and page (every shm file gets its memory
when made: a runtime dir without room exits 7; a catalog that does not fit the machine starts with
smaller rings, ``appliance.supervisor.memory``), publish the TLS certificates, bind every listener
(and the metrics listener), fork the writers and wait for them to recover, then fork coordinator,
fetchers, frontends and the metrics server, then notify systemd READY=1. SIGTERM drains: frontends
first (stop accepting, finish in-flight requests), then writers (flush, close segments cleanly),
fetchers and the coordinator. SIGHUP reloads the configuration file and re-reads the TLS
certificate files (``Operating``, ``appliance.supervisor.operating``: also the STATUS= line, the
watchdog, recovery progress, the supervisor's metrics; the certificates are a reload hook of
``appliance.security.supervisor``).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import selectors
import signal
import socket
import time
from typing import Callable

from shm.conntable import ConnectionTable
from shm.doorbell import BellSender
from shm.ready import ReadyMap
from shm.heartbeat import HeartbeatTable
from shm.metrics import MetricsTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

from appliance.catalog.model import Catalog, TopicInfo
from appliance.supervisor.catalog_store import CatalogStore
from appliance.catalog.view import PUBLISHED_FILE, publish
from appliance import ipc
from appliance.acl import store as acl_store
from appliance.config import Config
from appliance.config_print import non_defaults
from appliance.errors import ErrorCode
from appliance.listeners import Listener
from appliance.durable import atomic_write
from appliance.reload import file_path as config_file, publish as publish_config
from appliance.runtime import (COORDINATOR, EXIT_CRASH_LOOP, EXIT_DATA_DIR, EXIT_OK, HEARTBEAT_FILE,
                               HEARTBEAT_SLOTS, METRICS_SERVER, CONSOLE, PROCESSES_FILE, READY, RECOVERING,
                               STOPPED, SUPERVISOR, SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR,
                               WORKER_DATA_DIR_ERROR,
                               BoundListener, StartFailure, WorkerContext, cleaner_name,
                               cleaner_of, default_run_dir, fetcher_name, frontend_name,
                               page_fields, set_process_title, setup_logging,
                               writer_process_name)
from appliance.security.supervisor import SecurityService
from appliance.quota.supervisor import QuotaService
from appliance.service import Registry

from .child import run_child
from .dirs import SupervisorDirs, runtime_dir_space
from .memory import room_problem, start_ring_bytes
from .operating import Operating
from .process_table import TABLE_CAPACITY, WorkerSpec
from .reserve import DiskReserve
from .startup import bind_address, bind_listeners, raise_fd_limit
from .systemd import sd_notify
from .topic_admin import TopicAdmin
from .writers import WriterTable

log = logging.getLogger("appliance.supervisor")

# A worker that has not beaten yet is still starting (its interpreter importing its modules, a
# coordinator opening its logs): its silence counts from its spawn, but it is given at least this
# long, whatever heartbeat_timeout_ms is. A short timeout (the chaos suite's 5 s, so that a SIGSTOP
# ends in a SIGKILL soon) otherwise killed every coordinator of a loaded box before its first beat,
# at every restart, until the crash-loop rule stopped the appliance (issue 34, Jepsen-sized run 1).
FIRST_BEAT_GRACE_NS = 30_000_000_000

SUPERVISOR_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT)


def _kill(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Supervisor:
    """The supervisor process: its set-up, its loop and the process table (``ProcessTable``,
    ``appliance.supervisor.process_table``, is what ``TopicAdmin`` may do to it). Holds its
    collaborators: ``dirs`` (the data dir's lock and the runtime dir), ``operating`` (systemd,
    the metrics table, the reload) and ``topic_admin``."""

    # The system calls and clocks the loop uses, as attributes so that tests drive the restart
    # and heartbeat rules without forking (as pre-fork servers test their arbiters).
    fork = staticmethod(os.fork)
    waitpid = staticmethod(os.waitpid)
    kill = staticmethod(_kill)
    clock = staticmethod(time.monotonic)
    clock_ns = staticmethod(time.monotonic_ns)

    def __init__(self, config: Config, source: Callable[[], Config] | None = None,
                 log_format: str = "text") -> None:
        self.cfg = config
        self.log_format = log_format
        self.data_dir = os.path.abspath(config.server.data_dir)
        self.run_dir = os.path.abspath(config.server.runtime_dir) if config.server.runtime_dir \
            else default_run_dir()
        self.dirs = SupervisorDirs(self.data_dir, self.run_dir, config.server.node_id)
        self.operating = Operating(source or (lambda: config), self.data_dir,
                                   status=self.serving_status, publish=self._publish_config)
        self.workers: dict[str, WorkerSpec] = {}
        self.by_pid: dict[int, WorkerSpec] = {}
        self.signals: collections.deque[int] = collections.deque()
        self.stopping = False
        self.exit_code = EXIT_OK
        self.free_slots = list(range(HEARTBEAT_SLOTS - 1, -1, -1))
        self.topic_admin = TopicAdmin(self)
        self.frontends = [frontend_name(i) for i in range(config.frontend_count)]
        self.fetchers = [fetcher_name(i) for i in range(config.server.fetchers)]
        self.bound: list[tuple[Listener, socket.socket]] = []   # every listener's socket
        self.bound_port = 0                                     # the first listener's port
        self.metrics_listener: socket.socket | None = None
        self.console_listener: socket.socket | None = None
        self._io_problems: dict[str, str] = {}
        self._start_writers: list[WorkerSpec] = []
        self._start_partitions: list = []
        self._next_writer = 0                # the number of the next writer process (wp<n>)
        # The partitions and the writer processes that carry them (appliance.supervisor.writers).
        self.writers = WriterTable(topo=None, new_process=self._new_writer_process,
                                   forget_worker=self.forget_worker,
                                   publish_version=lambda v: self.page.publish(assignment_version=v))
        self.writers.configure(config.topics.writer_processes, config.topics.partitions_per_writer)
        self._start_others: list[WorkerSpec] = []
        self.processes_changed = False       # processes.json is behind the table (_turn)
        # The produce rings' size: shm.produce_ring_bytes, unless the start had to make them
        # smaller to serve its catalog (_check_start_memory).
        self.produce_ring_bytes = config.shm.produce_ring_bytes

    # -- set-up ---------------------------------------------------------------------------------
    def _bind(self) -> None:
        self.bound = bind_listeners(self.cfg)
        self.bound_port = self.bound[0][1].getsockname()[1]
        if self.cfg.metrics.listen:
            self.metrics_listener = bind_address(self.cfg.metrics.listen, "metrics.listen")
        if self.cfg.console.listen:
            self.console_listener = bind_address(self.cfg.console.listen, "console.listen")

    def listening(self) -> str:
        """Every listener with the address it is bound to (the configured ones before that)."""
        if self.bound:
            return ", ".join(f"{lst.name}://{sock.getsockname()[0]}:{sock.getsockname()[1]}"
                             for lst, sock in self.bound)
        return ", ".join(str(lst) for lst in self.cfg.listeners)

    def serving_status(self) -> str:
        """systemd's STATUS= line while the appliance serves (``Operating.notify_serving``)."""
        c = self.store.catalog
        return (f"serving on {self.listening()}: {len(c.topics)} topics, "
                f"{c.partition_count()} partitions, {len(self.frontends)} frontends")

    def _setup(self) -> None:
        self._pid = os.getpid()
        raise_fd_limit()
        self.dirs.prepare_data_dir()
        self.reserve = DiskReserve(self.data_dir, self.cfg.server.disk_reserve_bytes)
        self.reserve.at_start()
        self.store = CatalogStore(self.data_dir)
        self.store.load()
        self.acls = acl_store.AclStore(self.data_dir)
        self.acls.load()
        self.dirs.prepare_run_dir()
        self.topo = Topology(self.run_dir)
        self.writers.topo = self.topo
        with runtime_dir_space(self.run_dir, "its shared memory files"):
            self.hb = HeartbeatTable.create(os.path.join(self.run_dir, HEARTBEAT_FILE), HEARTBEAT_SLOTS)
            self.page = StatePage.create(self.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS)
            self.page.publish(catalog_version=self.store.catalog.version, status=RECOVERING,
                              pid=os.getpid())
            self.operating.metrics = MetricsTable.create(self.topo.metrics_path(SUPERVISOR),
                                                         TABLE_CAPACITY[SUPERVISOR])
            self.operating.init_metrics([r for r in TABLE_CAPACITY if r != SUPERVISOR])
            publish(self.store.catalog, self.topo.file_path(PUBLISHED_FILE))
            publish_config(self.cfg, config_file(self.run_dir))
        with runtime_dir_space(self.run_dir, "the published credentials and certificates"):
            self.security = SecurityService(self.cfg, self.data_dir, self.run_dir, self.topo,
                                            self.page)
            self.security.start()
            self.quotas = QuotaService(self.data_dir, self.topo, self.page)
            self.quotas.start()
        with runtime_dir_space(self.run_dir, "the published ACLs"):
            self.acl_service = acl_store.AclService(
                self.acls, self.topo.file_path(acl_store.PUBLISHED_FILE),
                lambda v: self.page.publish(acl_version=v),
                reply_bytes=self.cfg.shm.small_ring_bytes // 4)
            self.acl_service.publish()
        # SIGHUP re-reads the certificate files (a renewed certificate needs no restart).
        self.operating.reload_hooks.append(self.security.reload)
        self._bind()
        small = self.cfg.shm.small_ring_bytes
        with runtime_dir_space(self.run_dir, "the frontends' rings"):
            for fe in self.frontends:
                for fx in self.fetchers:
                    self._make_ring(fe, fx, small)
                    self._make_ring(fx, fe, small)
                for peer in (SUPERVISOR, COORDINATOR):
                    self._make_ring(fe, peer, small)
                    self._make_ring(peer, fe, small)
            # Every writer's rings and page, and every other worker's page, before any fork: a
            # runtime dir too small for them stops the start here, with its own exit status, and
            # so does a machine whose memory cannot hold them (rather than the OOM killer).
            self._check_start_memory(self.store.catalog.partition_count())
            # The catalog laid out from scratch (appliance.supervisor.placement).
            self._start_partitions = [self.add_partition(t, p)
                                      for t in self.store.catalog.topics.values()
                                      for p in range(t.partitions)]
            self._start_writers = list(self.writers.processes)
            self.writers.publish()
            from workers.cleaner import main as cleaner_main
            from workers.coordinator import main as coordinator_main
            from workers.fetcher import main as fetcher_main
            from workers.frontend import main as frontend_main
            self._start_others = [self._add_worker("coordinator", COORDINATOR, 0, coordinator_main)]
            self._start_others += [self._add_worker("cleaner", cleaner_name(i), i, cleaner_main)
                                   for i in range(self.cfg.log.cleaner.processes)]
            self._start_others += [self._add_worker("fetcher", name, i, fetcher_main)
                                   for i, name in enumerate(self.fetchers)]
            self._start_others += [self._add_worker("frontend", name, i, frontend_main)
                                   for i, name in enumerate(self.frontends)]
            if self.metrics_listener is not None:
                from workers.metrics_server import main as metrics_main
                self._start_others.append(self._add_worker("metrics", METRICS_SERVER, 0,
                                                           metrics_main))
            if self.console_listener is not None:
                from workers.console_server import main as console_main
                self._start_others.append(self._add_worker("console", CONSOLE, 0, console_main))
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, SUPERVISOR)
        for fe in self.frontends:
            self.mailbox.add(fe)
        self.outboxes = {fe: Outbox(self.topo, SUPERVISOR, fe, self.bells) for fe in self.frontends}
        # Topic administration (appliance.supervisor.topic_admin), AlterUserScramCredentials
        # (appliance.security.supervisor), CreateAcls/DeleteAcls (appliance.acl.store); an error
        # there stops the appliance rather than go on with a catalog (or credentials, or ACLs)
        # whose state is unknown.
        self.registry = Registry(self.topic_admin, self.security, self.acl_service, self.quotas,
                                 post=self._reply, contain=False)

    def _make_ring(self, src: str, dst: str, capacity: int) -> None:
        self.topo.create_ring(src, dst, capacity).close()   # the supervisor only creates it

    def _check_start_memory(self, partitions: int) -> None:
        """Serve the catalog, with the smallest produce rings the configuration allows when it
        does not fit at ``shm.produce_ring_bytes`` (``memory.start_ring_bytes``: exit 7 only when
        even those cannot be held)."""
        self.produce_ring_bytes = start_ring_bytes(
            self.cfg, len(self.frontends), self.run_dir, partitions, self.produce_ring_bytes,
            min(partitions, self.writers.budget) if self.writers.per_writer == 1
            else -(-partitions // self.writers.per_writer))

    # -- worker table ---------------------------------------------------------------------------
    def _add_worker(self, role: str, name: str, index: int, entry) -> WorkerSpec:
        spec = WorkerSpec(role=role, name=name, index=index, heartbeat_slot=self.free_slots.pop(),
                          entry=entry)
        try:
            # Every worker publishes generation, status and pid there (workers.base);
            # frontends watch the fetchers', the coordinator's and the writer processes'
            # generation to fail what a dead one held. The supervisor reads a writer
            # process's (ready, recovering).
            page = StatePage.create(self.topo.page_path(name), page_fields(role))
            if role == "writer":
                spec.page = page
            else:
                page.close()
            if role == "frontend" and self.cfg.server.limits_connections_per_ip:
                ConnectionTable.create(self.topo.conns_path(name)).close()
            # Its ready map (shm.ready), made here like every runtime file: a worker that made
            # its own at start grew the runtime dir after the appliance was ready.
            ReadyMap.create(self.topo.ready_path(name)).close()
            # The worker's metrics table outlives its restarts (appliance.metrics).
            table = MetricsTable.create(self.topo.metrics_path(name), TABLE_CAPACITY[role])
        except OSError:
            self.free_slots.append(spec.heartbeat_slot)
            self.topo.remove_endpoint(name)     # what was made of it (ENOSPC on a full tmpfs)
            raise
        table.close()
        self.workers[name] = spec
        return spec

    def _new_writer_process(self) -> WorkerSpec:
        """A writer process's row (``wp<n>``), with its rings to and from every frontend, the
        coordinator and its cleaner, its process page, ready map and metrics table; forked by
        ``start_partitions`` (or at start)."""
        from workers.writer_process import main as writer_main
        n = self._next_writer
        self._next_writer += 1
        name = writer_process_name(n)
        try:
            small = self.cfg.shm.partition_ring_bytes
            for fe in self.frontends:
                self._make_ring(fe, name, self.produce_ring_bytes)
                self._make_ring(name, fe, small)
            self._make_ring(COORDINATOR, name, small)
            self._make_ring(name, COORDINATOR, small)
            cleaner = cleaner_of(name, self.cfg.log.cleaner.processes)
            self._make_ring(cleaner, name, small)
            self._make_ring(name, cleaner, small)
            return self._add_worker("writer", name, n, writer_main)
        except OSError:
            self.topo.remove_endpoint(name)     # what was made of it (ENOSPC on a full tmpfs)
            raise

    def _context(self, spec: WorkerSpec) -> WorkerContext:
        return WorkerContext(
            config=self.cfg, role=spec.role, name=spec.name, index=spec.index,
            generation=spec.generation, heartbeat_slot=spec.heartbeat_slot, run_dir=self.run_dir,
            data_dir=self.data_dir, frontends=self.frontends, fetchers=self.fetchers,
            listen_fd=self.bound[0][1].fileno() if self.bound else -1, bound_port=self.bound_port,
            listeners=[BoundListener(lst, sock.fileno(), sock.getsockname()[1])
                       for lst, sock in self.bound],
            config_version=self.operating.config_version,
            metrics_fd=self.metrics_listener.fileno() if self.metrics_listener else -1,
            console_fd=self.console_listener.fileno() if self.console_listener else -1,
            log_format=self.log_format)

    def spawn_writers(self, specs: list[WorkerSpec]) -> None:
        """Fork writer processes (each opens the partitions the published assignment gives it)."""
        for spec in specs:
            self._spawn(spec)

    def _spawn(self, spec: WorkerSpec) -> None:
        """Fork one worker."""
        spec.generation += 1
        self.hb.clear(spec.heartbeat_slot)
        ctx = self._context(spec)
        # The supervisor's signals stay blocked across the fork until the child has put back the
        # defaults (child_reset_signals unblocks them): a SIGTERM that reached the child while it
        # still had the supervisor's handler was swallowed there, and that worker then ignored
        # the drain until the shutdown timeout's SIGKILL (20 s for a stop right after start).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISOR_SIGNALS)
        pid = -1
        try:
            pid = self.fork()
        finally:
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if pid == 0:  # child
            run_child(spec, ctx, self._pid, self._close_in_child, self.log_format)
        spec.pid = pid
        spec.started_at = self.clock()
        self.by_pid[pid] = spec
        log.debug("spawned %s pid %d generation %d", spec.name, pid, spec.generation)
        self.processes_changed = True

    def _close_in_child(self, role: str) -> None:
        try:
            self.selector.close()
        except Exception:
            pass
        if self.metrics_listener is not None and role != "metrics":
            self.metrics_listener.close()      # only the metrics server keeps the port
        if self.console_listener is not None and role != "console":
            self.console_listener.close()      # only the console keeps its port
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        # Only our copy of the fd: Mailbox.close() would disarm and unlink the supervisor's bell.
        self.mailbox.doorbell.close(unlink=False)
        # The data-dir lock fd stays open in every worker on purpose: the flock is released only
        # when the last holder exits, so a new appliance cannot start beside an orphaned writer.

    def write_processes(self) -> None:
        """Rewrite processes.json: once per loop turn that changed the table (``_turn``), not
        once per fork, which made a 1,024-partition CreateTopics quadratic (seconds of JSON)."""
        self.processes_changed = False
        rows = [{"role": s.role, "name": s.name, "pid": s.pid, "generation": s.generation,
                 "index": s.index, "slot": s.heartbeat_slot,
                 **({"partitions": [[e.topic.name, e.index] for e in s.partitions]}
                    if s.role == "writer" else {})}
                for s in self.workers.values()]
        try:
            atomic_write(os.path.join(self.run_dir, PROCESSES_FILE),
                         json.dumps({"supervisor": os.getpid(), "port": self.bound_port,
                                     "listeners": {lst.name: sock.getsockname()[1]
                                                   for lst, sock in self.bound},
                                     "workers": rows}).encode(), sync=False)
        except OSError as e:
            # For operators and tools only: a full runtime dir leaves the last one in place.
            self.io_trouble("processes", f"{PROCESSES_FILE} not written: {e}")
        else:
            self.io_trouble("processes", None)

    def wake_writers(self) -> None:
        """Ring every running writer process's bell: a catalog, an assignment or a configuration
        was just published on the page, and an idle writer process sleeps up to seconds
        (``workers.writer_process``, IDLE_WRITER_WAIT_S) rather than wake to look for one."""
        for spec in self.workers.values():
            if spec.role == "writer" and spec.pid is not None:
                self.bells.ring(self.topo.bell_path(spec.name))

    def io_trouble(self, what: str, problem: str | None) -> None:
        """Log a failing write once, and once more when it works again (not every turn)."""
        before = self._io_problems.get(what)
        if problem is not None and before is None:
            log.warning("%s", problem)
            self._io_problems[what] = problem
        elif problem is None and before is not None:
            log.info("%s: written again", what)
            del self._io_problems[what]

    # -- what topic administration does to the table (ProcessTable) -------------------------------
    def room_problem(self, new: int) -> tuple[ErrorCode, str] | None:
        return room_problem(self.cfg, len(self.frontends), self.run_dir, new,
                            self.produce_ring_bytes, self.writers.new_processes_for(new))

    def add_partition(self, topic: TopicInfo, partition: int):
        return self.writers.add(topic, partition)

    def start_partitions(self, entries: list) -> None:
        new = []
        for e in entries:
            spec = e.process
            if spec.pid is None and spec.generation == 0 and spec not in new:
                new.append(spec)
        self.writers.publish()
        self.processes_changed = True        # processes.json lists each process's partitions
        self.wake_writers()
        self.spawn_writers(new)

    def forget_partition(self, entry) -> None:
        self.writers.forget(entry)

    def forget_worker(self, spec: WorkerSpec) -> None:
        """Remove a worker that never ran from the table, with its runtime-dir files."""
        if spec.page is not None:
            spec.page.close()
            spec.page = None
        self.topo.remove_endpoint(spec.name, self.bells)
        if self.workers.pop(spec.name, None) is not None:
            self.free_slots.append(spec.heartbeat_slot)

    def partition_ready(self, entry) -> bool:
        return self.writers.ready(entry)

    def topic_grown(self, topic: TopicInfo) -> None:
        self.writers.topic_grown(topic)

    def stop_partitions(self, topic: TopicInfo) -> list:
        entries = self.writers.remove_topic(topic)
        for spec in self.writers.emptied():
            # Nothing left to carry: stopped, never restarted (a new partition past the budget
            # goes to the others; under it, to a new process).
            spec.removed = True
            if spec.pid is not None:
                self.kill(spec.pid, signal.SIGTERM)
        return entries

    def partition_stopped(self, entry) -> bool:
        return self.writers.stopped(entry)

    def release_partitions(self, entries: list) -> None:
        self.writers.release(entries)
        for spec in [s for s in self.writers.processes if s.removed and s.pid is None]:
            self.writers.processes.remove(spec)
            self.topo.remove_endpoint(spec.name, self.bells)
            if spec.page is not None:
                spec.page.close()
                spec.page = None
            self.workers.pop(spec.name, None)
            self.free_slots.append(spec.heartbeat_slot)

    def publish_catalog(self, catalog: Catalog) -> None:
        publish(catalog, self.topo.file_path(PUBLISHED_FILE))

    def catalog_published(self, version: int) -> None:
        self.page.publish(catalog_version=version)
        self.wake_writers()
        self.operating.notify_serving()          # systemd STATUS= names the partition count

    # -- signals ----------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w)
        for sig in SUPERVISOR_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # only enqueue (the wakeup fd pokes the loop)
        self.signals.append(signum)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> int:
        set_process_title("supervisor")
        setup_logging("supervisor", fmt=self.log_format, role="supervisor", title="supervisor")
        try:
            self._setup()
        except StartFailure as e:
            log.error("cannot start: %s (exit %d)", e, e.exit_code)
            self.dirs.cleanup()
            return e.exit_code
        except OSError as e:
            log.error("cannot start: %s", e)
            self.dirs.cleanup()
            return 1
        self.selector = selectors.DefaultSelector()
        self._install_signals()
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.selector.register(self.mailbox.fileno(), selectors.EVENT_READ)
        self.mailbox.arm()
        log.info("appliance starting: data dir %s, listening on %s, %d frontends, %d fetchers",
                 self.data_dir, self.listening(), len(self.frontends), len(self.fetchers))
        changed = non_defaults(self.cfg)
        log.info("settings other than the defaults: %s", ", ".join(changed) if changed else "none")
        try:
            self.spawn_writers(self._start_writers)
            if not self._wait_writers_ready(self._start_writers):
                return self._finish()
            # Import the handlers once, before forking frontends, so every frontend shares them
            # (pre-fork). The message classes of each API version are not: importing all 217
            # versions' took 1.5 s of every start (most of it), for versions a client may never
            # use; a frontend imports a version's on its first request of it (~5 ms, once).
            from appliance.api import load_handlers
            load_handlers()
            for spec in self._start_others:
                self._spawn(spec)
            if self.metrics_listener is not None:
                log.info("metrics served at http://%s/metrics", self.cfg.metrics.listen)
            if self.console_listener is not None:
                log.info("console served at %s://%s/", "https" if self.cfg.console.tls else "http",
                         self.cfg.console.listen)
            self.write_processes()
            self.page.publish(status=READY)
            log.info("appliance ready on %s", self.listening())
            self.operating.serving = True
            self.operating.notify_serving("READY=1")
            while not self.stopping:
                self._turn(0.1 if self.topic_admin.busy else 0.5)
        finally:
            pass
        return self._finish()

    def _finish(self) -> int:
        if self.by_pid:
            self._stop_all()
        self.dirs.cleanup()
        log.info("appliance stopped (exit %d)", self.exit_code)
        return self.exit_code

    def _turn(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif key.fd == self.mailbox.fileno():
                # Consume the wake-ups, or epoll reports the socket readable forever and this
                # loop spins (regression: 100% CPU after the first admin request).
                self.mailbox.drain()
        while self.signals:
            self._dispatch_signal(self.signals.popleft())
        self._reap()
        for box in self.outboxes.values():
            if box.queued:
                box.flush()
        if not self.stopping:
            if self.topic_admin.unpublished:
                self.topic_admin.publish()
            self._serve_admin()
            self.topic_admin.check_pending()
            self._murder_stale()
            self._respawn_due()
            self.operating.watchdog_turn(self.clock(), self.silent_workers)
        if self.processes_changed:
            self.write_processes()

    def _dispatch_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            if not self.stopping:
                log.info("received %s: draining", signal.Signals(signum).name)
                self._begin_stop()
        elif signum == signal.SIGQUIT:
            log.info("received SIGQUIT: stopping immediately")
            self.stopping = True
            for spec in list(self.by_pid.values()):
                self.kill(spec.pid, signal.SIGKILL)
        elif signum == signal.SIGHUP:
            log.info("received SIGHUP: reloading the configuration and the certificates")
            self.reload()
        # SIGCHLD: reaping happens every turn.

    def reload(self) -> None:
        """SIGHUP (``systemctl reload``): the supervisor's one reload entry point
        (``Operating.reload``); what it returns runs from now on, and every worker forked from
        now on gets it."""
        self.cfg = self.operating.reload(self.cfg)
        self.writers.configure(self.cfg.topics.writer_processes,
                               self.cfg.topics.partitions_per_writer)

    def _publish_config(self, cfg: Config, version: int) -> None:
        """A reloaded configuration, for the workers: the file first, then its version on the
        page (what the workers follow), then the writers' bells."""
        publish_config(cfg, config_file(self.run_dir))
        self.page.publish(config_version=version)
        self.wake_writers()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = self.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            spec = self.by_pid.pop(pid, None)
            if spec is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.processes_changed = True
            spec.pid = None
            if self.stopping or spec.removed:
                log.debug("%s exited (%d)", spec.name, code)
                continue
            self._on_unexpected_death(spec, code)

    def _on_unexpected_death(self, spec: WorkerSpec, code: int) -> None:
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        if code == WORKER_DATA_DIR_ERROR:
            log.error("%s %s (its state in the data dir is damaged, see its message above): "
                      "stopping the appliance", spec.name, how)
            self.exit_code = EXIT_DATA_DIR
            self._begin_stop()
            return
        if code == WORKER_BOOT_ERROR:
            log.error("%s %s (boot error): stopping the appliance", spec.name, how)
            self.exit_code = EXIT_CRASH_LOOP
            self._begin_stop()
            return
        now = self.clock()
        window = self.cfg.supervisor.crash_loop_window_ms / 1000
        spec.deaths.append(now)
        while spec.deaths and spec.deaths[0] < now - window:
            spec.deaths.popleft()
        if len(spec.deaths) > self.cfg.supervisor.crash_loop_restarts:
            log.error("%s is crash-looping: %d restarts within %.0f s (last: %s); stopping the appliance",
                      spec.name, len(spec.deaths) - 1, window, how)
            self.exit_code = EXIT_CRASH_LOOP
            self._begin_stop()
            return
        sc = self.cfg.supervisor
        backoff = min(sc.restart_backoff_max_ms,
                      sc.restart_backoff_initial_ms * (2 ** (len(spec.deaths) - 1))) / 1000
        spec.next_start = now + backoff
        self.operating.count_restart(spec.role)
        log.warning("%s (pid gen %d) %s; restarting in %.2f s", spec.name, spec.generation, how, backoff)

    def _respawn_due(self) -> None:
        now = self.clock()
        for spec in list(self.workers.values()):
            if spec.pid is None and not spec.removed and spec.next_start and spec.next_start <= now:
                spec.next_start = 0.0
                self._spawn(spec)

    def silent_workers(self, timeout_ns: int):
        """(spec, ns since its last beat) of every running worker silent for longer than
        ``timeout_ns`` (a recovering writer is not: recovery of a big log may take longer; a
        worker that has not beaten yet is given at least ``FIRST_BEAT_GRACE_NS`` from its spawn)."""
        now_ns = self.clock_ns()
        for spec in [s for s in list(self.by_pid.values()) if s.pid is not None]:
            last = self.hb.last(spec.heartbeat_slot)
            if spec.page is not None:
                st = spec.page.read()
                if st.generation == spec.generation and st.status == RECOVERING:
                    continue
            limit = timeout_ns
            if last == 0:
                last = int(spec.started_at * 1e9)
                limit = max(timeout_ns, FIRST_BEAT_GRACE_NS)
            if now_ns - last > limit:
                yield spec, now_ns - last

    def _murder_stale(self) -> None:
        for spec, age in self.silent_workers(self.cfg.supervisor.heartbeat_timeout_ms * 1_000_000):
            log.error("%s (pid %d) missed its heartbeat for %.1f s: SIGKILL", spec.name,
                      spec.pid, age / 1e9)
            self.kill(spec.pid, signal.SIGKILL)

    def _wait_writers_ready(self, specs: list[WorkerSpec]) -> bool:
        """Block (serving signals and restarts) until every writer has recovered, telling
        the operator how far it got (``Operating``)."""
        progress = self.operating.recovery_progress(self._start_partitions, self.clock())
        while True:
            self._turn(0.05)
            if self.stopping:
                return False
            progress.turn(self.clock(), self.partition_ready)
            if all(self.writer_ready(s) for s in specs):
                self.operating.recovery_finished(progress, self.clock())
                return True

    def writer_ready(self, spec: WorkerSpec) -> bool:
        st = spec.page.read()
        return spec.pid is not None and st.generation == spec.generation and st.status == READY

    # -- admin requests (frontends -> supervisor) -----------------------------------------------
    def _serve_admin(self) -> None:
        for src, ring in self.mailbox.inputs.items():
            while (raw := ring.get()) is not None:
                self.registry.handle(src, raw)

    def _reply(self, dst: str, req_id: int, body: ipc.Message) -> None:
        # A full ring (a slow or restarting frontend) queues the reply; every turn retries it.
        box = self.outboxes[dst]
        box.post(ipc.encode(req_id, body))
        box.flush()

    # -- stopping -------------------------------------------------------------------------------
    def _begin_stop(self) -> None:
        self.stopping = True
        sd_notify("STOPPING=1")
        self.page.publish(status=STOPPED)

    def _stop_all(self) -> None:
        """Drain in order: frontends (finish in-flight requests), then everything else."""
        for _, sock in self.bound:
            sock.close()
        self.bound = []
        deadline = time.monotonic() + self.cfg.supervisor.shutdown_timeout_ms / 1000
        for phase in (("frontend", "metrics", "console", "cleaner"), ("fetcher", "coordinator", "writer")):
            targets = [s for s in self.by_pid.values() if s.role in phase]
            for s in targets:
                self.kill(s.pid, signal.SIGTERM)
            while any(s.pid is not None for s in targets) and time.monotonic() < deadline:
                self._wait_children(0.05)
        for s in list(self.by_pid.values()):
            log.error("%s (pid %d) did not stop in time: SIGKILL", s.name, s.pid)
            self.kill(s.pid, signal.SIGKILL)
        while self.by_pid:
            self._wait_children(0.05)

    def _wait_children(self, timeout: float) -> None:
        try:
            self.selector.select(timeout)
        except Exception:
            time.sleep(timeout)
        self.signals.clear()
        self._reap()
