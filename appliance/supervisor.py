"""The supervisor: a pre-fork arbiter that owns the process table and the shared resources.

Runs in the top process (``appliance run``). Owns, alone: the process table (pid, role, generation
of every worker), the listening socket, the runtime directory with every shm file, the topic catalog
(``appliance.catalog.CatalogStore``), the ACLs (``appliance.acl.store``) and the data-dir lock.

Shape (as in pre-fork servers): signal handlers only enqueue the signal and poke a self-pipe; one
loop dispatches queued signals, serves admin requests (CreateTopics/DeleteTopics, CreateAcls/DeleteAcls
from frontends),
reaps dead children, kills workers whose heartbeat went stale, and respawns with backoff. A worker
that restarts more than ``crash_loop_restarts`` times in ``crash_loop_window_ms``, or exits with the
reserved WORKER_BOOT_ERROR code, stops the appliance (exit 4) rather than loop forever.

Start (failures: ``appliance.startup``, each with its exit status): lock the data dir, give
back the disk reserve if the disk is full, load the catalog, create the runtime dir and every ring, bind the listening
socket, fork the writers and wait for them to recover, then fork coordinator, fetchers, frontends,
then notify systemd READY=1. SIGTERM drains: frontends first (stop accepting, finish in-flight
requests), then writers (flush, close segments cleanly), fetchers and the coordinator.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Mailbox, Outbox, Topology

from . import catalog as cat
from . import ipc
from .acl import store as acl_store
from .config import Config
from .errors import ErrorCode, KafkaError
from .log.files import TMP_SUFFIX, atomic_write
from .runtime import (COORDINATOR, COORDINATOR_PAGE_FIELDS, die_with_parent, EXIT_CRASH_LOOP,
                      EXIT_OK, HEARTBEAT_FILE, HEARTBEAT_SLOTS,
                      PARTITION_PAGE_FIELDS, PROCESSES_FILE, READY, RECOVERING, RUNTIME_POINTER,
                      STOPPED, SUPERVISOR, SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR,
                      WORKER_PAGE_FIELDS, WorkerContext, child_reset_signals, default_run_dir,
                      fetcher_name, frontend_name, set_process_title, setup_logging, worker_title,
                      writer_name)
from .service import Registry, Responder, serves
from .startup import (NO_SPACE, DataDirUnusable, DiskReserve, RuntimeDirUnusable, StartFailure,
                      bind_listener, is_runtime_dir)
from .topic_config import validate_topic_configs

log = logging.getLogger("appliance.supervisor")


@dataclass
class WorkerSpec:
    role: str
    name: str
    index: int
    heartbeat_slot: int
    entry: Callable[[WorkerContext], int | None]
    topic: cat.TopicInfo | None = None
    pid: int | None = None
    generation: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    deaths: collections.deque = field(default_factory=collections.deque)
    removed: bool = False       # topic deleted: do not restart
    page: StatePage | None = None


@dataclass
class PendingCreate:
    respond: Responder
    results: list[cat.TopicResult]
    writers: list[WorkerSpec]
    deadline: float


@dataclass
class PendingDelete:
    respond: Responder
    results: list[cat.TopicResult]
    writers: list[WorkerSpec]
    topics: list[cat.TopicInfo]


def _kill(pid: int | None, sig: int) -> None:
    if pid:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Supervisor:
    # The system calls and clocks the loop uses, as attributes so that tests drive the restart
    # and heartbeat rules without forking (as pre-fork servers test their arbiters).
    fork = staticmethod(os.fork)
    waitpid = staticmethod(os.waitpid)
    kill = staticmethod(_kill)
    clock = staticmethod(time.monotonic)
    clock_ns = staticmethod(time.monotonic_ns)

    def __init__(self, config: Config) -> None:
        self.cfg = config
        self.data_dir = os.path.abspath(config.server.data_dir)
        self.run_dir = os.path.abspath(config.server.runtime_dir) if config.server.runtime_dir \
            else default_run_dir()
        self.workers: dict[str, WorkerSpec] = {}
        self.by_pid: dict[int, WorkerSpec] = {}
        self.signals: collections.deque[int] = collections.deque()
        self.stopping = False
        self.exit_code = EXIT_OK
        self.free_slots = list(range(HEARTBEAT_SLOTS - 1, -1, -1))
        self.pending_creates: list[PendingCreate] = []
        self.pending_deletes: list[PendingDelete] = []
        self.frontends = [frontend_name(i) for i in range(config.frontend_count)]
        self.fetchers = [fetcher_name(i) for i in range(config.server.fetchers)]
        self._lock_fd = -1
        self._run_dir_made = False
        self.listener: socket.socket | None = None
        self.bound_port = 0

    # -- set-up ---------------------------------------------------------------------------------
    def _prepare_data_dir(self) -> None:
        # No probe write: on a full disk it would fail, and the appliance must start there to
        # serve the deletes that free it. Opening the lock file read-write proves what the probe
        # did (EROFS on a read-only mount, EACCES without permission), creating it when missing.
        try:
            os.makedirs(self.data_dir, exist_ok=True)
            if not os.access(self.data_dir, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            self._lock_fd = os.open(os.path.join(self.data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DataDirUnusable(f"data dir {self.data_dir} is unusable: {e.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise DataDirUnusable(
                f"data dir {self.data_dir} is locked by another appliance process") from None
        # The pid is for operators only; written over the old one (no new block needed).
        pid = f"{os.getpid()}\n".encode()
        try:
            os.pwrite(self._lock_fd, pid, 0)
            os.ftruncate(self._lock_fd, len(pid))
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise DataDirUnusable(f"data dir {self.data_dir} is unusable: {e.strerror}") from None
            log.warning("data dir %s is full: the lock file does not name our pid", self.data_dir)
        try:
            self._check_meta_properties()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "meta.properties is not text"
            raise DataDirUnusable(f"data dir {self.data_dir} is unusable: {why}") from None

    def _check_meta_properties(self) -> None:
        """Kafka's meta.properties: the cluster id is made once; the node id must not change."""
        path = os.path.join(self.data_dir, "meta.properties")
        node = self.cfg.server.node_id
        if not os.path.exists(path):
            atomic_write(path, (f"version=1\nnode.id={node}\n"
                                    f"cluster.id={cat.uuid_to_kafka_str(cat.new_topic_id())}\n").encode())
            return
        props = {}
        with open(path) as f:
            for line in f:
                k, sep, v = line.strip().partition("=")
                if sep and not k.startswith("#"):
                    props[k] = v
        if props.get("node.id") != str(node):
            raise DataDirUnusable(
                f"data dir {self.data_dir} belongs to node.id {props.get('node.id')}, but "
                f"server.node_id is {node}")

    def _prepare_run_dir(self) -> None:
        parent = os.path.dirname(self.run_dir)
        try:
            # Remove runtime dirs of supervisors that died without cleaning up (kill -9).
            for entry in os.listdir(parent) if os.path.isdir(parent) else []:
                if entry.startswith("appliance-") and entry[10:].isdigit():
                    pid = int(entry[10:])
                    if pid != os.getpid() and not _pid_alive(pid):
                        shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
            if os.path.lexists(self.run_dir):
                # It is removed, and removed again on exit: only an old runtime dir of ours (or
                # an empty dir) may be, never a directory someone named by mistake.
                if not is_runtime_dir(self.run_dir):
                    raise RuntimeDirUnusable(
                        f"runtime dir {self.run_dir} (server.runtime_dir) is neither an empty "
                        f"directory nor an old appliance runtime dir; refusing to remove it")
                shutil.rmtree(self.run_dir)
            os.makedirs(self.run_dir, mode=0o700)
            self._run_dir_made = True
            probe = os.path.join(self.run_dir, HEARTBEAT_FILE)
            os.close(os.open(probe, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as e:
            raise RuntimeDirUnusable(
                f"runtime dir {self.run_dir} (server.runtime_dir) is unusable: {e.strerror}") from None
        ptr = os.path.join(self.data_dir, RUNTIME_POINTER)
        try:
            atomic_write(ptr, self.run_dir.encode())
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            # For tools and tests only: a full data dir goes on without it.
            log.warning("data dir %s is full: %s not written", self.data_dir, RUNTIME_POINTER)
            for stale in (ptr, ptr + TMP_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(stale)

    def _bind(self) -> None:
        self.listener = bind_listener(self.cfg)
        self.bound_port = self.listener.getsockname()[1]

    def _setup(self) -> None:
        self._pid = os.getpid()
        _raise_fd_limit()
        self._prepare_data_dir()
        self.reserve = DiskReserve(self.data_dir, self.cfg.server.disk_reserve_bytes)
        self.reserve.at_start()
        self.store = cat.CatalogStore(self.data_dir)
        self.store.load()
        self.acls = acl_store.AclStore(self.data_dir)
        self.acls.load()
        self._prepare_run_dir()
        self.topo = Topology(self.run_dir)
        self.hb = HeartbeatTable.create(os.path.join(self.run_dir, HEARTBEAT_FILE), HEARTBEAT_SLOTS)
        self.page = StatePage.create(self.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS)
        self.page.publish(catalog_version=self.store.catalog.version, status=RECOVERING, pid=os.getpid())
        cat.publish(self.store.catalog, self.topo.file_path(cat.PUBLISHED_FILE))
        self.acl_service = acl_store.AclService(
            self.acls, self.topo.file_path(acl_store.PUBLISHED_FILE),
            lambda v: self.page.publish(acl_version=v),
            reply_bytes=self.cfg.shm.small_ring_bytes // 4)
        self.acl_service.publish()
        self._bind()
        small = self.cfg.shm.small_ring_bytes
        for fe in self.frontends:
            for fx in self.fetchers:
                self._make_ring(fe, fx, small)
                self._make_ring(fx, fe, small)
            for peer in (SUPERVISOR, COORDINATOR):
                self._make_ring(fe, peer, small)
                self._make_ring(peer, fe, small)
        self.bells = BellSender()
        self.mailbox = Mailbox(self.topo, SUPERVISOR)
        for fe in self.frontends:
            self.mailbox.add(fe)
        self.outboxes = {fe: Outbox(self.topo, SUPERVISOR, fe, self.bells) for fe in self.frontends}
        # CreateTopics/DeleteTopics, CreateAcls/DeleteAcls; an error here stops the appliance
        # rather than go on with a catalog or ACLs whose state is unknown.
        self.registry = Registry(self, self.acl_service, post=self._reply, contain=False)

    def _make_ring(self, src: str, dst: str, capacity: int) -> None:
        self.topo.create_ring(src, dst, capacity).close()   # the supervisor only creates it

    # -- worker table ---------------------------------------------------------------------------
    def _add_worker(self, role: str, name: str, index: int, entry, topic=None) -> WorkerSpec:
        spec = WorkerSpec(role=role, name=name, index=index, heartbeat_slot=self.free_slots.pop(),
                          entry=entry, topic=topic)
        if role != "writer":       # a writer's page is made by _add_writer
            # Every worker publishes generation, status and pid there (workers.base); frontends
            # watch the fetchers' and the coordinator's generation to fail what a dead one held.
            fields = COORDINATOR_PAGE_FIELDS if role == "coordinator" else WORKER_PAGE_FIELDS
            StatePage.create(self.topo.page_path(name), fields).close()
        self.workers[name] = spec
        return spec

    def _add_writer(self, topic: cat.TopicInfo, partition: int) -> WorkerSpec:
        from workers.partition_writer import main as writer_main
        name = writer_name(topic.topic_id, partition)
        for fe in self.frontends:
            self._make_ring(fe, name, self.cfg.shm.produce_ring_bytes)
            self._make_ring(name, fe, self.cfg.shm.small_ring_bytes)
        self._make_ring(COORDINATOR, name, self.cfg.shm.small_ring_bytes)
        self._make_ring(name, COORDINATOR, self.cfg.shm.small_ring_bytes)
        spec = self._add_worker("writer", name, partition, writer_main, topic)
        spec.page = StatePage.create(self.topo.page_path(name), PARTITION_PAGE_FIELDS)
        return spec

    def _context(self, spec: WorkerSpec) -> WorkerContext:
        t = spec.topic
        return WorkerContext(
            config=self.cfg, role=spec.role, name=spec.name, index=spec.index,
            generation=spec.generation, heartbeat_slot=spec.heartbeat_slot, run_dir=self.run_dir,
            data_dir=self.data_dir, frontends=self.frontends, fetchers=self.fetchers,
            listen_fd=self.listener.fileno() if self.listener else -1, bound_port=self.bound_port,
            topic=t.name if t else "", topic_id=t.topic_id if t else b"",
            topic_configs=dict(t.configs) if t else {})

    def _spawn(self, spec: WorkerSpec) -> None:
        spec.generation += 1
        self.hb.clear(spec.heartbeat_slot)
        ctx = self._context(spec)
        pid = self.fork()
        if pid == 0:  # child
            code = 1
            try:
                child_reset_signals()
                die_with_parent(self._pid)
                self._close_in_child()
                set_process_title(worker_title(ctx))
                setup_logging(spec.name)
                code = spec.entry(ctx) or 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                logging.getLogger(spec.name).exception("worker crashed")
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        spec.pid = pid
        spec.started_at = self.clock()
        self.by_pid[pid] = spec
        log.debug("spawned %s pid %d generation %d", spec.name, pid, spec.generation)
        self._write_processes()

    def _close_in_child(self) -> None:
        try:
            self.selector.close()
        except Exception:
            pass
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        # Only our copy of the fd: Mailbox.close() would disarm and unlink the supervisor's bell.
        self.mailbox.doorbell.close(unlink=False)
        # The data-dir lock fd stays open in every worker on purpose: the flock is released only
        # when the last holder exits, so a new appliance cannot start beside an orphaned writer.

    def _write_processes(self) -> None:
        rows = [{"role": s.role, "name": s.name, "pid": s.pid, "generation": s.generation,
                 "topic": s.topic.name if s.topic else None,
                 "partition": s.index if s.role == "writer" else None}
                for s in self.workers.values()]
        atomic_write(os.path.join(self.run_dir, PROCESSES_FILE),
                         json.dumps({"supervisor": os.getpid(), "port": self.bound_port,
                                     "workers": rows}).encode(), sync=False)

    # -- signals ----------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:  # only enqueue (the wakeup fd pokes the loop)
        self.signals.append(signum)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> int:
        set_process_title("supervisor")
        setup_logging("supervisor")
        try:
            self._setup()
        except StartFailure as e:
            log.error("cannot start: %s (exit %d)", e, e.exit_code)
            self._cleanup()
            return e.exit_code
        except OSError as e:
            log.error("cannot start: %s", e)
            self._cleanup()
            return 1
        self.selector = selectors.DefaultSelector()
        self._install_signals()
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.selector.register(self.mailbox.fileno(), selectors.EVENT_READ)
        self.mailbox.arm()
        log.info("appliance starting: data dir %s, listening on %s:%d, %d frontends, %d fetchers",
                 self.data_dir, self.cfg.listen_host, self.bound_port, len(self.frontends),
                 len(self.fetchers))
        try:
            for t in self.store.catalog.topics.values():
                for p in range(t.partitions):
                    self._spawn(self._add_writer(t, p))
            if not self._wait_writers_ready([s for s in self.workers.values() if s.role == "writer"]):
                return self._finish()
            # Import the handlers and warm the codec tables once, before forking frontends, so
            # every frontend shares them (pre-fork) instead of paying the import itself.
            from appliance.api import api_ranges, load_handlers
            from appliance.protocol.messages import preload
            load_handlers()
            preload(api_ranges())
            from workers.coordinator import main as coordinator_main
            from workers.fetcher import main as fetcher_main
            from workers.frontend import main as frontend_main
            self._spawn(self._add_worker("coordinator", COORDINATOR, 0, coordinator_main))
            for i, name in enumerate(self.fetchers):
                self._spawn(self._add_worker("fetcher", name, i, fetcher_main))
            for i, name in enumerate(self.frontends):
                self._spawn(self._add_worker("frontend", name, i, frontend_main))
            self.page.publish(status=READY)
            log.info("appliance ready on %s:%d", self.cfg.listen_host, self.bound_port)
            sd_notify("READY=1")
            while not self.stopping:
                self._turn(0.1 if (self.pending_creates or self.pending_deletes) else 0.5)
        finally:
            pass
        return self._finish()

    def _finish(self) -> int:
        if self.by_pid:
            self._stop_all()
        self._cleanup()
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
            self._serve_admin()
            self._check_pending()
            self._murder_stale()
            self._respawn_due()

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
            log.info("SIGHUP: configuration reload is not supported; ignoring")
        # SIGCHLD: reaping happens every turn.

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
            spec.pid = None
            code = os.waitstatus_to_exitcode(status)
            self._write_processes()
            if self.stopping or spec.removed:
                log.debug("%s exited (%d)", spec.name, code)
                continue
            self._on_unexpected_death(spec, code)

    def _on_unexpected_death(self, spec: WorkerSpec, code: int) -> None:
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
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
        log.warning("%s (pid gen %d) %s; restarting in %.2f s", spec.name, spec.generation, how, backoff)

    def _respawn_due(self) -> None:
        now = self.clock()
        for spec in list(self.workers.values()):
            if spec.pid is None and not spec.removed and spec.next_start and spec.next_start <= now:
                spec.next_start = 0.0
                self._spawn(spec)

    def _murder_stale(self) -> None:
        timeout_ns = self.cfg.supervisor.heartbeat_timeout_ms * 1_000_000
        now_ns = self.clock_ns()
        for spec in list(self.by_pid.values()):
            last = self.hb.last(spec.heartbeat_slot)
            if spec.page is not None:
                st = spec.page.read()
                if st.generation == spec.generation and st.status == RECOVERING:
                    continue   # recovery of a big log may take longer than a heartbeat period
            if last == 0:
                last = int(spec.started_at * 1e9)
            if now_ns - last > timeout_ns:
                log.error("%s (pid %d) missed its heartbeat for %.1f s: SIGKILL", spec.name,
                          spec.pid, (now_ns - last) / 1e9)
                self.kill(spec.pid, signal.SIGKILL)

    def _wait_writers_ready(self, specs: list[WorkerSpec]) -> bool:
        """Block (serving signals and restarts) until every writer has recovered."""
        while True:
            self._turn(0.05)
            if self.stopping:
                return False
            if all(self._writer_ready(s) for s in specs):
                return True

    def _writer_ready(self, spec: WorkerSpec) -> bool:
        st = spec.page.read()
        return spec.pid is not None and st.generation == spec.generation and st.status == READY

    # -- admin requests (frontends -> supervisor) -----------------------------------------------
    def _serve_admin(self) -> None:
        for src, ring in self.mailbox.inputs.items():
            while (raw := ring.get()) is not None:
                self.registry.handle(src, raw)

    @serves(cat.CreateTopicsRequest, late=True)
    def _create_topics(self, req: cat.CreateTopicsRequest, respond: Responder) -> None:
        """Answered once the new writers are READY (or after 60 s)."""
        results: list[cat.TopicResult] = []
        accepted: list[cat.TopicInfo] = []
        current = self.store.catalog
        total = current.partition_count()
        seen: set[str] = set()
        for nt in req.topics:
            try:
                if nt.name in seen:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"Duplicate topic name {nt.name} in CreateTopics")
                seen.add(nt.name)
                cat.check_topic_name(nt.name)
                if nt.name in cat.INTERNAL_TOPICS:
                    raise KafkaError(ErrorCode.invalid_topic_exception,
                                     f"{nt.name} is an internal topic of the appliance")
                if nt.name in current.topics:
                    raise KafkaError(ErrorCode.topic_already_exists,
                                     f"Topic '{nt.name}' already exists.")
                parts = nt.num_partitions if nt.num_partitions != -1 else self.cfg.topics.default_partitions
                if parts <= 0:
                    raise KafkaError(ErrorCode.invalid_partitions,
                                     "Number of partitions must be larger than 0.")
                if total + parts > self.cfg.topics.max_partitions:
                    raise KafkaError(ErrorCode.policy_violation,
                                     f"Creating {parts} partitions would exceed topics.max_partitions "
                                     f"= {self.cfg.topics.max_partitions}")
                configs = validate_topic_configs(dict(nt.configs))
                info = cat.TopicInfo(name=nt.name, topic_id=cat.new_topic_id(), partitions=parts,
                                     configs=configs)
                total += parts
                accepted.append(info)
                results.append(cat.TopicResult(name=nt.name, error_code=0, topic_id=info.topic_id,
                                               num_partitions=parts, configs=configs))
            except KafkaError as e:
                results.append(cat.TopicResult(name=nt.name, error_code=int(e.code),
                                               error_message=e.message))
        writers: list[WorkerSpec] = []
        if accepted and not req.validate_only:
            try:
                self.store.add_topics(accepted)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                # Not committed (the sweep at the next start removes its directories); a full
                # disk is refused as Kafka refuses a write to a full log dir.
                accepted = []
                results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.kafka_storage_error),
                                           error_message="the data dir's file system is full")
                           if r.error_code == 0 else r for r in results]
            for t in accepted:
                for p in range(t.partitions):
                    spec = self._add_writer(t, p)
                    self._spawn(spec)
                    writers.append(spec)
        self.pending_creates.append(PendingCreate(respond, results, writers,
                                                  time.monotonic() + 60.0))
        self._check_pending()

    @serves(cat.DeleteTopicsRequest, late=True)
    def _delete_topics(self, req: cat.DeleteTopicsRequest, respond: Responder) -> None:
        """Answered once the writers have stopped and the directories are gone."""
        results: list[cat.TopicResult] = []
        names: list[str] = []
        for name in req.names:
            t = self.store.catalog.topics.get(name)
            if t is None:
                results.append(cat.TopicResult(name=name, error_code=int(ErrorCode.unknown_topic_or_partition),
                                               error_message="This server does not host this topic."))
            else:
                names.append(name)
                results.append(cat.TopicResult(name=name, error_code=0, topic_id=t.topic_id))
        removed = self._remove_topics(names) if names else []
        if names and not removed:
            results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.kafka_storage_error),
                                       error_message="the data dir's file system is full")
                       if r.error_code == 0 else r for r in results]
        self._publish_catalog()
        writers = []
        for t in removed:
            for p in range(t.partitions):
                spec = self.workers[writer_name(t.topic_id, p)]
                spec.removed = True
                if spec.pid is not None:
                    self.kill(spec.pid, signal.SIGTERM)
                writers.append(spec)
        self.pending_deletes.append(PendingDelete(respond, results, writers, removed))
        self._check_pending()

    def _remove_topics(self, names: list[str]) -> list[cat.TopicInfo]:
        """Commit a DeleteTopics; on a full disk the reserve gives the catalog its room (the
        delete is what frees the disk). Nothing removed when even that fails."""
        for attempt in (1, 2):
            try:
                return self.store.remove_topics(names)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                if attempt == 2 or not self.reserve.release("DeleteTopics needs room"):
                    break
        log.error("DeleteTopics %s: the data dir's file system is full", names)
        return []

    def _check_pending(self) -> None:
        now = time.monotonic()
        still = []
        publish = False
        done: list[PendingCreate] = []
        for pc in self.pending_creates:
            if all(self._writer_ready(s) for s in pc.writers):
                publish = publish or bool(pc.writers)
                done.append(pc)
            elif now > pc.deadline:
                pc.results = [cat.TopicResult(name=r.name, error_code=int(ErrorCode.request_timed_out),
                                              error_message="partition writers did not start in time")
                              if r.error_code == 0 else r for r in pc.results]
                publish = True
                done.append(pc)
            else:
                still.append(pc)
        self.pending_creates = still
        if publish:
            self._publish_catalog()
        for pc in done:
            pc.respond(cat.TopicsResult(pc.results))
        still_d = []
        for pd in self.pending_deletes:
            if any(s.pid is not None for s in pd.writers):
                still_d.append(pd)
                continue
            for s in pd.writers:
                self.topo.remove_endpoint(s.name)
                self.workers.pop(s.name, None)
                self.free_slots.append(s.heartbeat_slot)
            for t in pd.topics:
                self.store.delete_dirs(t)
            if pd.topics:
                self.reserve.restore(need_free=self.reserve.size)
            self._write_processes()
            pd.respond(cat.TopicsResult(pd.results))
        self.pending_deletes = still_d

    def _publish_catalog(self) -> None:
        cat.publish(self.store.catalog, self.topo.file_path(cat.PUBLISHED_FILE))
        self.page.publish(catalog_version=self.store.catalog.version)

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
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        deadline = time.monotonic() + self.cfg.supervisor.shutdown_timeout_ms / 1000
        for phase in (("frontend",), ("fetcher", "coordinator", "writer")):
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

    def _cleanup(self) -> None:
        # Only what this supervisor made: a runtime dir it refused to use stays, and the
        # pointer of another appliance holding the data-dir lock is that appliance's.
        try:
            if self._run_dir_made:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            ptr = os.path.join(self.data_dir, RUNTIME_POINTER)
            if self._lock_fd >= 0 and os.path.exists(ptr):
                os.unlink(ptr)
        except OSError:
            pass
        if self._lock_fd >= 0:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = -1


def _raise_fd_limit() -> None:
    """Every shm mapping keeps a file descriptor (Python 3.11 mmap): a frontend holds about three
    per partition. Raise the soft limit to the hard one."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ECONNREFUSED):
            log.warning("sd_notify(%s) failed: %s", state, e)
