"""What every forked worker is handed, and the layouts of the state pages they publish.

Owns nothing at run time. The supervisor builds a ``WorkerContext`` for each child just before it
forks; the child's entry point (``workers/*.py``) receives it as its only argument.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

import setproctitle

from .config import Config

# Endpoint names (see docs/architecture.md, "Runtime directory and channels").
SUPERVISOR = "sup"
COORDINATOR = "co"


def frontend_name(i: int) -> str:
    return f"fe{i}"


def fetcher_name(i: int) -> str:
    return f"fx{i}"


def writer_name(topic_id: bytes, partition: int) -> str:
    return f"w{topic_id.hex()}.{partition}"


# Worker status values published in state pages.
STARTING, RECOVERING, READY, DRAINING, STOPPED = 0, 1, 2, 3, 4

# The partition writer's state page (see docs/architecture.md, "State pages").
PARTITION_PAGE_FIELDS = [
    ("generation", "I"), ("status", "I"), ("pid", "I"), ("reserved", "I"),
    ("high_watermark", "q"), ("last_stable_offset", "q"), ("log_start_offset", "q"),
    ("active_base_offset", "q"), ("active_end_position", "q"), ("segments_version", "Q"),
    ("first_unstable_offset", "q"), ("coordinator_ring_head", "Q"),
]
SUPERVISOR_PAGE_FIELDS = [("catalog_version", "Q"), ("status", "I"), ("pid", "I"),
                          ("acl_version", "Q")]
WORKER_PAGE_FIELDS = [("generation", "I"), ("status", "I"), ("pid", "I"), ("reserved", "I")]
# The coordinator's page also carries its coordinator epoch (bumped at every start): the
# WriteTxnMarkers API refuses a marker whose epoch is above it.
COORDINATOR_PAGE_FIELDS = WORKER_PAGE_FIELDS + [("coordinator_epoch", "i")]

HEARTBEAT_FILE = "heartbeats"
HEARTBEAT_SLOTS = 8192
PROCESSES_FILE = "processes.json"
RUNTIME_POINTER = ".runtime"   # in the data dir: path of the current runtime dir (for tools/tests)

# Exit statuses of ``appliance run`` (README, "Exit status"; systemd/appliance.service lists in
# RestartPreventExitStatus= those a restart cannot fix). 1 stays Python's: an unexpected error.
EXIT_OK = 0
EXIT_CONFIG = 2             # configuration error (also click's usage error): not restarted
EXIT_DATA_DIR = 3           # data dir unusable (not writable, locked, another node id): not restarted
EXIT_CRASH_LOOP = 4         # a worker crash-loops or failed to boot: restarted
EXIT_LISTEN_IN_USE = 5      # server.listen is in use (EADDRINUSE): restarted, its holder may go
EXIT_LISTEN_ADDRESS = 6     # server.listen's host does not resolve, is not this machine's, or the
                            # port needs privileges: not restarted
EXIT_RUNTIME_DIR = 7        # server.runtime_dir cannot be made, or holds files that are not ours:
                            # not restarted
# Workers: WORKER_BOOT_ERROR tells the supervisor not to restart (the arbiter's reserved code, as
# in pre-fork servers); the supervisor then stops everything and exits EXIT_CRASH_LOOP.
WORKER_BOOT_ERROR = 3


@dataclass
class WorkerContext:
    config: Config
    role: str                 # "writer" | "frontend" | "fetcher" | "coordinator"
    name: str                 # endpoint name
    index: int                # frontend/fetcher index; partition for writers
    generation: int           # bumps on every restart of this worker
    heartbeat_slot: int
    run_dir: str
    data_dir: str
    frontends: list[str]
    fetchers: list[str]
    listen_fd: int = -1       # frontends: the inherited listening socket
    bound_port: int = 0
    topic: str = ""           # writers
    topic_id: bytes = b""     # writers
    topic_configs: dict[str, str] = field(default_factory=dict)


_PR_SET_NAME = 15


def worker_title(ctx: "WorkerContext") -> str:
    """What ``ps`` shows for a worker: its role, and the partition a writer owns or the index of
    a frontend or fetcher (``writer orders-3``, ``frontend 0``, ``coordinator``)."""
    if ctx.role == "writer":
        return f"writer {ctx.topic}-{ctx.index}"
    if ctx.role in ("frontend", "fetcher"):
        return f"{ctx.role} {ctx.index}"
    return ctx.role


def set_process_title(title: str) -> None:
    """Show ``appliance: <title>`` as the process's command line (ps, top, systemd-cgls) and its
    first 15 characters as the kernel's name for it (``comm``: ps -o comm, psutil's name)."""
    setproctitle.setproctitle(f"appliance: {title}")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, title.encode()[:15], 0, 0, 0)
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


def child_reset_signals() -> None:
    """A forked child inherits the supervisor's handlers and wakeup fd; start from defaults."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def setup_logging(role: str, level: int = logging.INFO) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter(
        f"%(asctime)s %(levelname)s [{role} %(process)d] %(name)s: %(message)s"))
    root.addHandler(h)
    root.setLevel(level)


def default_run_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if base is None:
        import tempfile
        base = tempfile.gettempdir()
    return os.path.join(base, f"appliance-{os.getpid()}")
