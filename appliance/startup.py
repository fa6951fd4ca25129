"""What stops ``appliance run`` before it serves, each with its documented exit status, and the
data dir's disk reserve.

Owns: the reserve file ``<data_dir>/.reserve`` (``DiskReserve``). Runs in the supervisor only,
during its start-up and when a DeleteTopics has freed space; single-threaded.

A full data dir must not stop the start: Kafka starts on a full log dir and serves the deletes
that free it, and an appliance that cannot start cannot free its own disk. What a start writes
(recovered indexes, checkpoints, producer snapshots, the coordinator's epoch, the catalog a
DeleteTopics commits) needs a little space, so the supervisor keeps ``server.disk_reserve_bytes``
of it set aside in a file while the disk has room, and gives it back to the file system when a
start finds the disk full (as CockroachDB's emergency ballast does). It makes the file again once
deletes have freed twice its size.
"""

from __future__ import annotations

import errno
import logging
import os
import socket

from .config import DEFAULT_LISTEN, Config
from .listeners import Listener
from .runtime import (EXIT_DATA_DIR, EXIT_LISTEN_ADDRESS, EXIT_LISTEN_IN_USE, EXIT_RUNTIME_DIR,
                      HEARTBEAT_FILE)

log = logging.getLogger("appliance.supervisor")

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
RESERVE_FILE = ".reserve"


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
            bound.append((lst, _bind(cfg, lst)))
    except BaseException:
        for _, s in bound:
            s.close()
        raise
    return bound


def _bind(cfg: Config, lst: Listener) -> socket.socket:
    if cfg.server.listeners:
        where = f"server.listeners {lst}"
    else:
        where = f"server.listen {cfg.server.listen or DEFAULT_LISTEN}"
    host, port = lst.host, lst.port
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
            raise StartFailure(f"{where}: address already in use", EXIT_LISTEN_IN_USE) from None
        if e.errno in (errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM, errno.EAFNOSUPPORT):
            raise StartFailure(f"{where}: cannot listen there: {e.strerror}",
                               EXIT_LISTEN_ADDRESS) from None
        raise
    s.set_inheritable(True)
    return s


def free_bytes(path: str) -> int:
    """Bytes a write may still take (the supervisor's view: root also gets the blocks the file
    system reserves for root)."""
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


class DiskReserve:
    """``<data_dir>/.reserve``: ``size`` bytes of the data dir's file system set aside for the
    writes a start and a DeleteTopics need when everything else is full."""

    def __init__(self, data_dir: str, size: int) -> None:
        self.path = os.path.join(data_dir, RESERVE_FILE)
        self.data_dir = data_dir
        self.size = size

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
