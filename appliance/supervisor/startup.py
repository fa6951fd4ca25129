"""What the supervisor's start does besides its directories (``appliance.supervisor.dirs``):
bind every listener, with the documented exit status of each failure, and raise the open-files
limit.

Runs in the supervisor only (``appliance.supervisor``), during its start-up; single-threaded; owns
nothing once the sockets are handed to the ``Supervisor``.
"""

from __future__ import annotations

import errno
import logging
import socket

import psutil

from appliance.config import DEFAULT_LISTEN, Config, parse_hostport
from appliance.listeners import Listener
from appliance.runtime import EXIT_LISTEN_ADDRESS, EXIT_LISTEN_IN_USE, StartFailure

log = logging.getLogger("appliance.supervisor")


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


def describe_pid(pid: int | None) -> str:
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
                return describe_pid(c.pid)
    except (psutil.Error, OSError):
        pass
    return ""

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
