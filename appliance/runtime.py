"""What every forked worker is handed, the layouts of the state pages they publish, and the exit
statuses of ``appliance run`` (with ``StartFailure``, which carries them).

Owns nothing at run time. The supervisor builds a ``WorkerContext`` for each child just before it
forks; the child's entry point (``workers/*.py``) receives it as its only argument.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field

import setproctitle

from .config import Config
from .listeners import Listener

# Endpoint names (see docs/architecture.md, "Runtime directory and channels").
SUPERVISOR = "sup"
COORDINATOR = "co"


def frontend_name(i: int) -> str:
    return f"fe{i}"


def fetcher_name(i: int) -> str:
    return f"fx{i}"


METRICS_SERVER = "mx"       # the metrics worker (serves [metrics] listen)
CONSOLE = "cx"              # the console worker (serves [console] listen)


def cleaner_name(i: int) -> str:
    return f"cl{i}"


def cleaner_of(writer: str, processes: int) -> str:
    """The cleaner process that cleans the partition of writer endpoint ``writer`` (a stable
    spread: the assignment changes only with log.cleaner.processes, which needs a restart)."""
    return cleaner_name(zlib.crc32(writer.encode()) % processes)


def writer_name(topic_id: bytes, partition: int) -> str:
    """A partition's name in the runtime dir: its state page is ``page.<this>``."""
    return f"w{topic_id.hex()}.{partition}"


def writer_process_name(n: int) -> str:
    """A writer process's endpoint (its rings, doorbell, process page, metrics table): ``wp<n>``,
    carrying one or more partitions (docs/architecture.md, "Writer processes and their rings")."""
    return f"wp{n}"


# Worker status values published in state pages.
STARTING, RECOVERING, READY, DRAINING, STOPPED = 0, 1, 2, 3, 4

# A partition's state page, published by the writer process that carries it (see
# docs/architecture.md, "State pages"): generation is its process's at the partition's open.
PARTITION_PAGE_FIELDS = [
    ("generation", "I"), ("status", "I"), ("pid", "I"), ("reserved", "I"),
    ("high_watermark", "q"), ("last_stable_offset", "q"), ("log_start_offset", "q"),
    ("active_base_offset", "q"), ("active_end_position", "q"), ("segments_version", "Q"),
    ("first_unstable_offset", "q"), ("coordinator_ring_head", "Q"),
]
# catalog_version: the published catalog's; credentials_version: the published SCRAM
# credentials' (appliance.security.credentials); tls_version: bumped when a reload (SIGHUP) made
# the supervisor publish re-read certificates (appliance.security.tls), before config_version;
# config_version: bumped by a SIGHUP reload after the new configuration is in CONFIG_FILE; workers
# compare it with the version they were forked with (WorkerContext.config_version); acl_version:
# the published ACLs' (appliance.acl.store); assignment_version: the published assignment of
# partitions to writer processes (appliance.catalog.assignment); quotas_version: the published
# client quotas' (appliance.quota.store).
SUPERVISOR_PAGE_FIELDS = [("catalog_version", "Q"), ("status", "I"), ("pid", "I"),
                          ("credentials_version", "Q"), ("tls_version", "Q"),
                          ("config_version", "Q"), ("acl_version", "Q"),
                          ("assignment_version", "Q"), ("quotas_version", "Q")]
WORKER_PAGE_FIELDS = [("generation", "I"), ("status", "I"), ("pid", "I"), ("reserved", "I")]
# The coordinator's page also carries its coordinator epoch (bumped at every start): the
# WriteTxnMarkers API refuses a marker whose epoch is above it.
COORDINATOR_PAGE_FIELDS = WORKER_PAGE_FIELDS + [("coordinator_epoch", "i")]
# A frontend's page also carries its client connections now open and those it refused since it
# started (Kafka's max.connections.per.ip): frontends sum each other's connections to enforce
# max_connections across all of them (workers/frontend/quotas.py).
FRONTEND_PAGE_FIELDS = WORKER_PAGE_FIELDS + [("connections", "I"), ("refused_connections", "Q")]
# A writer process's page: where this generation starts reading the coordinator's ring into it
# (the marker channel resends only what a dead predecessor took); the partitions it carries have
# pages of their own (PARTITION_PAGE_FIELDS).
WRITER_PROCESS_PAGE_FIELDS = WORKER_PAGE_FIELDS + [("coordinator_ring_head", "Q")]


def page_fields(role: str) -> list[tuple[str, str]]:
    """The state-page layout of a worker of ``role`` (the supervisor makes the page with it)."""
    return {"writer": WRITER_PROCESS_PAGE_FIELDS, "coordinator": COORDINATOR_PAGE_FIELDS,
            "frontend": FRONTEND_PAGE_FIELDS}.get(role, WORKER_PAGE_FIELDS)

HEARTBEAT_FILE = "heartbeats"
HEARTBEAT_SLOTS = 8192
PROCESSES_FILE = "processes.json"
CONFIG_FILE = "config.msgpack"   # the running configuration, rewritten by a reload (msgspec)
RUNTIME_POINTER = ".runtime"   # in the data dir: path of the current runtime dir (for tools/tests)

# Exit statuses of ``appliance run`` (README, "Exit status"; systemd/appliance.service lists in
# RestartPreventExitStatus= those a restart cannot fix). 1 stays Python's: an unexpected error.
EXIT_OK = 0
EXIT_CONFIG = 2             # configuration error (also click's usage error): not restarted
EXIT_DATA_DIR = 3           # data dir unusable (not writable, locked, another node id): not restarted
EXIT_CRASH_LOOP = 4         # a worker crash-loops or failed to boot: restarted
EXIT_LISTEN_IN_USE = 5      # a listener (server.listen/listeners) is in use (EADDRINUSE): restarted,
                            # its holder may go
EXIT_LISTEN_ADDRESS = 6     # a listener's host does not resolve, is not this machine's, or the
                            # port needs privileges: not restarted
EXIT_RUNTIME_DIR = 7        # server.runtime_dir cannot be made, or holds files that are not ours:
                            # not restarted
# Workers: WORKER_BOOT_ERROR tells the supervisor not to restart (the arbiter's reserved code, as
# in pre-fork servers); the supervisor then stops everything and exits EXIT_CRASH_LOOP.
WORKER_BOOT_ERROR = 3
# A worker found its own state in the data dir damaged beyond what it may repair (a sealed segment
# of a coordinator log, issue 34): the supervisor stops everything and exits EXIT_DATA_DIR, as for
# a damaged catalog, rather than restart it into the same damage until the crash-loop rule.
WORKER_DATA_DIR_ERROR = 65        # sysexits' EX_DATAERR


class StartFailure(Exception):
    """The appliance cannot start for a reason the operator must see; ``exit_code`` is the
    documented exit status of ``appliance run`` (EXIT_*). Raised by the supervisor's start
    (``appliance.supervisor``) and by what it loads there (the ACLs, the credentials)."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class DataDirUnusable(StartFailure):
    exit_code = EXIT_DATA_DIR


class RuntimeDirUnusable(StartFailure):
    exit_code = EXIT_RUNTIME_DIR


@dataclass(frozen=True)
class BoundListener:
    """A listener and its listening socket's fd, bound by the supervisor before any fork."""
    listener: Listener
    fd: int
    port: int                 # the port bound (differs from the configured one for port 0)


@dataclass
class WorkerContext:
    config: Config
    role: str                 # "writer" | "frontend" | "fetcher" | "coordinator" | "metrics" | "cleaner" | "console"
    name: str                 # endpoint name
    index: int                # frontend, fetcher, cleaner or writer process number
    generation: int           # bumps on every restart of this worker
    heartbeat_slot: int
    run_dir: str
    data_dir: str
    frontends: list[str]
    fetchers: list[str]
    listen_fd: int = -1       # the first listener's inherited socket (see listeners)
    bound_port: int = 0
    listeners: list[BoundListener] = field(default_factory=list)   # frontends serve every one
    config_version: int = 0   # of ``config`` (the supervisor's page shows the current one)
    metrics_fd: int = -1      # the metrics worker: the inherited [metrics] listen socket
    console_fd: int = -1      # the console worker: the inherited [console] listen socket
    log_format: str = "text"  # "text" | "json" (``appliance run --log-format``)


_PR_SET_NAME = 15


def worker_title(ctx: "WorkerContext") -> str:
    """What ``ps`` shows for a worker: its role, and the number of a writer process, frontend or
    fetcher (``writer 3``, ``frontend 0``, ``coordinator``)."""
    return role_title(ctx.role, ctx.index)


def role_title(role: str, index: int) -> str:
    """``worker_title`` from its parts (also the ``worker`` label of the worker metrics)."""
    if role in ("frontend", "fetcher", "writer"):
        return f"{role} {index}"
    if role == "cleaner" and index:
        return f"cleaner {index}"        # the first (often the only) one is "cleaner"
    return role


def set_process_title(title: str, comm: str | None = None) -> None:
    """Show ``appliance: <title>`` as the process's command line (ps, top, systemd-cgls) and
    ``comm`` (default: the title), cut to 15 characters, as the kernel's name for it (``comm``:
    ps -o comm, psutil's name)."""
    setproctitle.setproctitle(f"appliance: {title}")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, (comm or title).encode()[:15], 0, 0, 0)
    except OSError:
        pass


_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGTERM this worker when the supervisor dies (it then drains and exits);
    if the supervisor is already gone, exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


_libc_malloc_trim = None


def release_free_memory() -> None:
    """Give the pages malloc holds free back to the kernel (glibc's ``malloc_trim(0)``, which
    also releases whole free pages in the middle of the heap, not only at its top). Buffers
    between 512 bytes and the mmap threshold come from the heap, and glibc keeps what is freed
    there: without this a frontend keeps its peak of connection buffers after a connection
    storm ends. No-op where the C library has no malloc_trim."""
    global _libc_malloc_trim
    if _libc_malloc_trim is None:
        try:
            _libc_malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _libc_malloc_trim = False
    if _libc_malloc_trim:
        _libc_malloc_trim(0)


def child_reset_signals() -> None:
    """A forked child inherits the supervisor's handlers and wakeup fd; start from defaults."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    # SIGHUP is the supervisor's (it reloads the configuration and the TLS certificates and tells
    # the workers through its state page); one sent to the whole process group (a closed
    # terminal) must not kill every worker.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers: time (RFC 3339, UTC, ms), level, role, process
    (the worker's title, as ``ps`` shows it), pid, logger, message, and the traceback as
    ``exception`` when there is one."""

    def __init__(self, role: str, process: str) -> None:
        super().__init__()
        self.role = role
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "role": self.role, "process": self.process,
               "pid": record.process, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False)


def setup_logging(name: str, level: int = logging.INFO, fmt: str = "text", role: str = "",
                  title: str = "") -> None:
    """Every process logs to stderr: ``fmt`` "text" (``time LEVEL [name pid] logger: message``)
    or "json" (``JsonFormatter``, with ``role`` and ``title``)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        h.setFormatter(JsonFormatter(role or name, title or name))
    else:
        h.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s [{name} %(process)d] %(name)s: %(message)s"))
    root.addHandler(h)
    root.setLevel(level)


def run_dir_of(data_dir: str) -> str:
    """The runtime dir of the appliance running (or last run) on ``data_dir``, from the pointer
    the supervisor keeps there (RUNTIME_POINTER). FileNotFoundError: it never ran there."""
    with open(os.path.join(data_dir, RUNTIME_POINTER)) as f:
        return f.read().strip()


def read_processes(run_dir: str) -> dict:
    """The supervisor's process table (PROCESSES_FILE, rewritten by the supervisor whenever a
    worker starts or stops): {"supervisor": pid, "port", "listeners": {name: port}, "workers":
    [{"role", "name", "pid", "generation", "topic", "partition", "index", "slot"}]}. For tools and
    tests; workers never read it."""
    with open(os.path.join(run_dir, PROCESSES_FILE)) as f:
        return json.load(f)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user's counts: signal 0 is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def default_run_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if base is None:
        import tempfile
        base = tempfile.gettempdir()
    return os.path.join(base, f"appliance-{os.getpid()}")
