"""What stops ``appliance run`` before it serves, each with its documented exit status, and the
data dir's disk reserve.

Owns: the reserve file ``<data_dir>/.reserve`` (``DiskReserve``), and the supervisor's preparation
and removal of the data dir's lock and the runtime dir (``SupervisorDirs``). Runs in the supervisor
only, during its start-up, at exit and when a DeleteTopics has freed space; single-threaded.

A full data dir must not stop the start: Kafka starts on a full log dir and serves the deletes
that free it, and an appliance that cannot start cannot free its own disk. What a start writes
(recovered indexes, checkpoints, producer snapshots, the coordinator's epoch, the catalog a
DeleteTopics commits) needs a little space, so the supervisor keeps ``server.disk_reserve_bytes``
of it set aside in a file while the disk has room, and gives it back to the file system when a
start finds the disk full (as CockroachDB's emergency ballast does). It makes the file again once
deletes have freed twice its size.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import time

import psutil

from . import catalog as cat
from .log.files import TMP_SUFFIX, atomic_write

from .config import DEFAULT_LISTEN, Config, parse_hostport
from .listeners import Listener
from .runtime import (EXIT_DATA_DIR, EXIT_LISTEN_ADDRESS, EXIT_LISTEN_IN_USE, EXIT_RUNTIME_DIR,
                      HEARTBEAT_FILE, RUNTIME_POINTER, pid_alive)

log = logging.getLogger("appliance.supervisor")

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
RESERVE_FILE = ".reserve"
# A start that finds the data dir locked only by the workers of an appliance whose supervisor is
# gone waits this long for them to exit (805 processes took 4.4 s to die after a kill -9), looking
# every LOCK_POLL_S.
LOCK_WAIT_S = 60.0
# The disk reserve is at most a RESERVE_SHARE-th of the data dir's file system, at least
# RESERVE_MIN_BYTES (reserve_size).
RESERVE_SHARE = 16
RESERVE_MIN_BYTES = 1 << 20
LOCK_POLL_S = 0.05


class StartFailure(Exception):
    """The appliance cannot start for a reason the operator must see; ``exit_code`` is the
    documented exit status of ``appliance run`` (appliance.runtime EXIT_*)."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class DataDirUnusable(StartFailure):
    exit_code = EXIT_DATA_DIR


class RuntimeDirUnusable(StartFailure):
    exit_code = EXIT_RUNTIME_DIR


def is_runtime_dir(path: str) -> bool:
    """An empty directory, or one an appliance supervisor made (it holds the heartbeat table)."""
    return os.path.isdir(path) and not os.path.islink(path) and (
        not os.listdir(path) or os.path.exists(os.path.join(path, HEARTBEAT_FILE)))


def bind_listeners(cfg: Config) -> list[tuple[Listener, socket.socket]]:
    """A listening socket for every listener (``server.listeners``, or the one of
    ``server.listen``), inheritable by the frontends. All or none: a listener that cannot be
    bound closes the ones bound before it."""
    bound: list[tuple[Listener, socket.socket]] = []
    try:
        for lst in cfg.listeners:
            if cfg.server.listeners:
                where = f"server.listeners {lst}"
            else:
                where = f"server.listen {cfg.server.listen or DEFAULT_LISTEN}"
            bound.append((lst, bind_socket(lst.host, lst.port, where)))
    except BaseException:
        for _, s in bound:
            s.close()
        raise
    return bound


def bind_address(address: str, key: str) -> socket.socket:
    """A listening TCP socket on ``address`` (HOST:PORT, from config ``key``), inheritable; the
    failures are StartFailures naming the key, with their exit statuses."""
    host, port = parse_hostport(address, key)
    return bind_socket(host, port, f"{key} {address}")


def bind_socket(host: str, port: int, where: str) -> socket.socket:
    """A listening TCP socket on ``host``:``port``, inheritable; the failures are StartFailures
    whose message starts with ``where`` (the key and value that named the address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(1024)
    except socket.gaierror as e:
        s.close()
        raise StartFailure(f"{where}: host {host!r} does not resolve: {e.strerror}",
                           EXIT_LISTEN_ADDRESS) from None
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            raise StartFailure(f"{where}: address {host}:{port} already in use"
                               f"{port_holder(port)}", EXIT_LISTEN_IN_USE) from None
        if e.errno in (errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM, errno.EAFNOSUPPORT):
            raise StartFailure(f"{where}: cannot listen there: {e.strerror}",
                               EXIT_LISTEN_ADDRESS) from None
        raise
    s.set_inheritable(True)
    return s


def _describe(pid: int | None) -> str:
    if not pid:
        return ""
    try:
        cmd = " ".join(psutil.Process(pid).cmdline()).strip()
    except psutil.Error:
        return f" (pid {pid})"
    return f" (pid {pid}: {cmd})" if cmd else f" (pid {pid})"


def port_holder(port: int) -> str:
    """`` (pid N: command line)`` of the process listening on TCP ``port``, when this user may
    see it; empty otherwise."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return _describe(c.pid)
    except (psutil.Error, OSError):
        pass
    return ""


def lock_holder(fd: int) -> str:
    """`` (pid N: command line)`` of the live process whose pid the data dir's lock file names
    (each appliance writes its pid there), for the message of a refused start."""
    pid = lock_file_pid(fd)
    return _describe(pid) if pid and psutil.pid_exists(pid) else ""


def lock_file_pid(fd: int) -> int | None:
    """The pid the lock file names (each supervisor writes its own there once it holds it)."""
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def lock_holders(path: str) -> list[psutil.Process]:
    """The live processes with ``path`` open (an appliance's supervisor and every worker it forked
    share the lock file's open description, so each holds the lock until it exits). Zombies hold
    nothing. Only the processes this user may look into are seen."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    fst = os.stat(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                if fst.st_ino == st.st_ino and fst.st_dev == st.st_dev:
                    p = psutil.Process(int(entry))
                    if p.status() != psutil.STATUS_ZOMBIE:
                        found.append(p)
                    break
        except (OSError, psutil.Error):
            continue
    return found


def is_supervisor(p: psutil.Process) -> bool:
    """Whether ``p`` is an appliance's supervisor (its title, ``appliance: supervisor``)."""
    try:
        return " ".join(p.cmdline()).startswith("appliance: supervisor")
    except psutil.Error:
        return False


def _pids(procs: list[psutil.Process]) -> str:
    shown = ", ".join(str(p.pid) for p in procs[:8])
    return f"pid {shown}" + (f" and {len(procs) - 8} more" if len(procs) > 8 else "")


def free_bytes(path: str) -> int:
    """Bytes a write may still take (the supervisor's view: root also gets the blocks the file
    system reserves for root)."""
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def reserve_size(configured: int, fs_bytes: int, catalog_bytes: int) -> int:
    """The disk reserve for a file system of ``fs_bytes``: ``server.disk_reserve_bytes`` where
    the file system is large, a sixteenth of it where that is less (a 64 MiB reserve cannot exist
    on a 32 MiB disk, and without one a full disk could not commit the DeleteTopics that frees
    it), and never less than what a catalog commit needs (its copy, twice over) or
    RESERVE_MIN_BYTES. 0 stays 0: no reserve."""
    if configured == 0:
        return 0
    floor = max(RESERVE_MIN_BYTES, 2 * catalog_bytes)
    return min(configured, max(fs_bytes // RESERVE_SHARE, floor))


class DiskReserve:
    """``<data_dir>/.reserve``: ``size`` bytes of the data dir's file system set aside for the
    writes a start and a DeleteTopics need when everything else is full (``reserve_size``)."""

    def __init__(self, data_dir: str, configured: int) -> None:
        self.path = os.path.join(data_dir, RESERVE_FILE)
        self.data_dir = data_dir
        st = os.statvfs(data_dir)
        try:
            catalog_bytes = os.path.getsize(os.path.join(data_dir, cat.CATALOG_FILE))
        except OSError:
            catalog_bytes = 0
        self.size = reserve_size(configured, st.f_blocks * st.f_frsize, catalog_bytes)
        if 0 < self.size < configured:
            log.info("data dir %s: a disk reserve of %d bytes, a share of its %d-byte file system "
                     "(server.disk_reserve_bytes is %d)", data_dir, self.size,
                     st.f_blocks * st.f_frsize, configured)

    def held(self) -> int:
        try:
            return os.stat(self.path).st_blocks * 512
        except FileNotFoundError:
            return 0

    def at_start(self) -> None:
        """Give the reserve back when the disk is full; else make sure it is there."""
        if self.size == 0:
            self.release("server.disk_reserve_bytes is 0")
            return
        held, free = self.held(), free_bytes(self.data_dir)
        if free < self.size:
            if held:
                self.release(f"the data dir's file system is full ({free} bytes free)")
            else:
                log.warning("data dir %s: file system full (%d bytes free) and no reserve to give "
                            "back: recovery may fail; delete topics or free space", self.data_dir,
                            free)
            return
        self.restore()

    def release(self, why: str) -> bool:
        held = self.held()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        if held:
            log.warning("data dir %s: %s: gave back the %d-byte reserve so that recovery and "
                        "deletes can write; delete topics (or free space) to get it back",
                        self.data_dir, why, held)
        return bool(held)

    def restore(self, need_free: int = 0) -> None:
        """Make the reserve whole, if the file system has ``need_free`` bytes beyond it."""
        if self.size == 0 or self.held() >= self.size:
            return
        if free_bytes(self.data_dir) < self.size + need_free:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)   # real blocks, not a sparse file
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno not in NO_SPACE and e.errno != errno.EOPNOTSUPP:
                raise
            try:
                os.unlink(self.path)     # a partial reserve would only hide the full disk
            except FileNotFoundError:
                pass
            return
        log.info("data dir %s: %d-byte disk reserve in place", self.data_dir, self.size)


class SupervisorDirs:
    """The supervisor's start and end in its two directories: the data dir (lock, pid,
    ``meta.properties``) and the runtime dir (made fresh, removed on exit, with the pointer to it
    in the data dir). Mixed into ``appliance.supervisor.Supervisor``, whose attributes
    (``cfg``, ``data_dir``, ``run_dir``, ``_lock_fd``, ``_run_dir_made``) these methods use."""

    cfg: Config
    data_dir: str
    run_dir: str
    _lock_fd: int
    _run_dir_made: bool

    def _prepare_data_dir(self) -> None:
        # No probe write: on a full disk it would fail, and the appliance must start there to
        # serve the deletes that free it. Opening the lock file read-write proves what the probe
        # did (EROFS on a read-only mount, EACCES without permission), creating it when missing.
        if os.path.exists(self.data_dir) and not os.path.isdir(self.data_dir):
            raise DataDirUnusable(f"data dir {self.data_dir} is unusable: it is a file, not a "
                                  "directory (server.data_dir)")
        try:
            os.makedirs(self.data_dir, exist_ok=True)
            if not os.access(self.data_dir, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            self._lock_fd = os.open(os.path.join(self.data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DataDirUnusable(f"data dir {self.data_dir} is unusable: {e.strerror}") from None
        try:
            self._take_lock()
        except DataDirUnusable:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
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

    lock_wait_s = LOCK_WAIT_S

    def _take_lock(self) -> None:
        """flock the data dir's lock file. Held by a live appliance: refused at once. Held only by
        the workers of an appliance whose supervisor is gone (a kill -9 of its process group:
        hundreds of processes with gigabytes of shared memory take seconds to die, and each keeps
        the lock, which every child inherits, until it exits): wait for them, up to
        ``lock_wait_s``, saying so."""
        path = os.path.join(self.data_dir, ".lock")
        deadline = time.monotonic() + self.lock_wait_s
        next_say = 0.0
        waited = unseen = 0
        while True:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            except OSError as e:
                raise DataDirUnusable(f"data dir {self.data_dir} cannot be locked: {e.strerror}") from None
            else:
                if waited:
                    log.info("data dir %s: the previous appliance's processes are gone", self.data_dir)
                return
            holders = lock_holders(path)
            named = lock_file_pid(self._lock_fd)
            live = [p for p in holders if p.pid == named or is_supervisor(p)]
            if live or not holders:
                # A live appliance; or no holder this user can see (another user's process, or
                # the holders exited between the flock and the look: two more tries first).
                unseen += not holders
                if holders or unseen > 2:
                    who = _describe(live[0].pid) if live else lock_holder(self._lock_fd)
                    raise DataDirUnusable(
                        f"data dir {self.data_dir} is locked by another appliance process{who}")
                continue
            now = time.monotonic()
            if now >= deadline:
                raise DataDirUnusable(
                    f"data dir {self.data_dir} is locked by {len(holders)} process(es) of an "
                    f"appliance whose supervisor is gone ({_pids(holders)}), still running "
                    f"{self.lock_wait_s:g} s later: stop them (a stopped process cannot exit)")
            if now >= next_say:
                log.warning("data dir %s is locked by %d process(es) of an appliance whose "
                            "supervisor%s is gone (%s): waiting up to %.0f s for them to exit",
                            self.data_dir, len(holders), f" (pid {named})" if named else "",
                            _pids(holders), deadline - now)
                next_say = now + 5.0
            waited += 1
            time.sleep(LOCK_POLL_S)

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
                    if pid != os.getpid() and not pid_alive(pid):
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


def raise_fd_limit() -> None:
    """Raise the soft open-files limit to the hard one, as servers do (Java's MaxFDLimit for
    Kafka): every client connection is a descriptor in a frontend, every shm mapping keeps
    one too (Python 3.11 mmap), and so does the socket connected to each bell a process rings:
    a frontend holds about five per partition. Workers inherit it.
    Logged, since it bounds the connections a frontend can hold."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.info("raised the open-files limit (RLIMIT_NOFILE) from %d to %d", soft, want)
            return
        except (ValueError, OSError) as e:
            log.warning("could not raise the open-files limit (RLIMIT_NOFILE) from %d to %d: %s",
                        soft, want, e)
    log.info("open-files limit (RLIMIT_NOFILE) is %d", soft)
