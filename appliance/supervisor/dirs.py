"""The supervisor's two directories: the data dir (its lock, the pid in it, ``meta.properties``)
and the runtime dir (made fresh at start, removed on exit, with the pointer to it in the data dir).

Runs in the supervisor only (``appliance.supervisor``), at its start and its exit; single-threaded.
Owns the data dir's lock (``SupervisorDirs``, held by the ``Supervisor``): the lock file's open
description is inherited by every worker, so the lock is released only when the last of them
exits, and a new appliance cannot start beside an orphaned writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import time

import psutil

from appliance.catalog.model import new_topic_id, uuid_to_kafka_str
from appliance.durable import NO_SPACE, TMP_SUFFIX, atomic_write, make_dirs
from appliance.runtime import (HEARTBEAT_FILE, RUNTIME_POINTER, DataDirUnusable,
                               RuntimeDirUnusable, pid_alive)

from .startup import describe_pid

log = logging.getLogger("appliance.supervisor")

# A start that finds the data dir locked only by the workers of an appliance whose supervisor is
# gone waits this long for them to exit (805 processes took 4.4 s to die after a kill -9), looking
# every LOCK_POLL_S.
LOCK_WAIT_S = 60.0
LOCK_POLL_S = 0.05
# How long a lock held by no process we can see is retried before the start is refused. A dying
# process drops its file table (its /proc/<pid>/fd empties) before the kernel releases its open
# files, and so its flock (the last fput runs as task work later in exit), so an exiting holder
# is briefly invisible while the lock is still held: three immediate retries fell inside that
# window on a loaded machine (CI). Another user's appliance stays invisible and is refused after.
UNSEEN_GRACE_S = 2.0


def is_runtime_dir(path: str) -> bool:
    """An empty directory, or one an appliance supervisor made (it holds the heartbeat table)."""
    return os.path.isdir(path) and not os.path.islink(path) and (
        not os.listdir(path) or os.path.exists(os.path.join(path, HEARTBEAT_FILE)))

def lock_holder(fd: int) -> str:
    """`` (pid N: command line)`` of the live process whose pid the data dir's lock file names
    (each appliance writes its pid there), for the message of a refused start."""
    pid = lock_file_pid(fd)
    return describe_pid(pid) if pid and psutil.pid_exists(pid) else ""


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


@contextlib.contextmanager
def runtime_dir_space(run_dir: str, what: str):
    """At start: a runtime dir (tmpfs) without room for ``what`` is a start failure with the
    runtime dir's exit status, not a traceback (every shm file gets its blocks when made)."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        raise RuntimeDirUnusable(
            f"runtime dir {run_dir} (server.runtime_dir) has no room for {what}: "
            f"{e.strerror}; make its file system larger (rings take shm.produce_ring_bytes "
            f"per frontend and partition) or free it") from None


class SupervisorDirs:
    """The supervisor's start and end in its two directories: the data dir (lock, pid,
    ``meta.properties``) and the runtime dir (made fresh, removed on exit, with the pointer to it
    in the data dir). Held by the ``Supervisor``: ``prepare_data_dir`` and ``prepare_run_dir`` at
    its start, ``cleanup`` at its exit (only what this start made)."""

    lock_wait_s = LOCK_WAIT_S

    def __init__(self, data_dir: str, run_dir: str, node_id: int,
                 lock_wait_s: float | None = None) -> None:
        self.data_dir = data_dir
        self.run_dir = run_dir
        self.node_id = node_id            # server.node_id, checked against meta.properties
        if lock_wait_s is not None:
            self.lock_wait_s = lock_wait_s
        self._lock_fd = -1
        self._run_dir_made = False

    def prepare_data_dir(self) -> None:
        # No probe write: on a full disk it would fail, and the appliance must start there to
        # serve the deletes that free it. Opening the lock file read-write proves what the probe
        # did (EROFS on a read-only mount, EACCES without permission), creating it when missing.
        if os.path.exists(self.data_dir) and not os.path.isdir(self.data_dir):
            raise DataDirUnusable(f"data dir {self.data_dir} is unusable: it is a file, not a "
                                  "directory (server.data_dir)")
        try:
            make_dirs(self.data_dir)   # its name durable, when this start makes it
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

    def _take_lock(self) -> None:
        """flock the data dir's lock file. Held by a live appliance: refused at once. Held only by
        the workers of an appliance whose supervisor is gone (a kill -9 of its process group:
        hundreds of processes with gigabytes of shared memory take seconds to die, and each keeps
        the lock, which every child inherits, until it exits): wait for them, up to
        ``lock_wait_s``, saying so."""
        path = os.path.join(self.data_dir, ".lock")
        deadline = time.monotonic() + self.lock_wait_s
        next_say = 0.0
        waited = 0
        unseen_since: float | None = None
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
            now = time.monotonic()
            if live:
                raise DataDirUnusable(f"data dir {self.data_dir} is locked by another appliance "
                                      f"process{describe_pid(live[0].pid)}")
            if not holders:
                # No holder this user can see: another user's process, or the last holders in
                # the middle of their exit (UNSEEN_GRACE_S).
                if unseen_since is None:
                    unseen_since = now
                elif now - unseen_since >= UNSEEN_GRACE_S:
                    raise DataDirUnusable(f"data dir {self.data_dir} is locked by another "
                                          f"appliance process{lock_holder(self._lock_fd)}")
                time.sleep(LOCK_POLL_S)
                continue
            unseen_since = None
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
        node = self.node_id
        if not os.path.exists(path):
            atomic_write(path, (f"version=1\nnode.id={node}\n"
                                    f"cluster.id={uuid_to_kafka_str(new_topic_id())}\n").encode())
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

    def prepare_run_dir(self) -> None:
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

    def cleanup(self) -> None:
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
