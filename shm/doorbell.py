"""Doorbells: wake-ups between processes over Unix datagram sockets.

Owns: one socket per consumer process (``Doorbell``, bound at ``bell.<endpoint>`` in the runtime
directory) and one unbound socket per producer process (``BellSender``). Every worker process runs
both: it is the consumer of its input rings and a producer into other processes' rings.

Protocol (see docs/architecture.md, "Runtime directory and channels"): a producer puts a record in
a ring and rings the consumer's bell only if the ring's ``consumer_waiting`` flag is set. A datagram
carries no information (one zero byte); the consumer drains all pending datagrams on wake-up and
then looks at all its rings. Datagrams suit this: each ``sendto`` is one syscall, the socket is
pollable (select/poll/epoll/asyncio ``add_reader``), and the kernel bounds the queue (Linux
``net.unix.max_dgram_qlen``, default 10 to 512 by distribution), so a flood of rings costs nothing
once the consumer has wake-ups pending: the sender just gets EAGAIN, which means "already rung".

Failure modes that are ignored on purpose by ``BellSender.ring``:

* EAGAIN / EWOULDBLOCK / ENOBUFS: the consumer's queue is full - it has wake-ups pending already.
* ENOENT / ECONNREFUSED / ENOTDIR: the consumer has not started yet, or died and is restarting (its
  socket file is gone, or exists with nobody bound to it). It will look at its rings when it comes
  up; the supervisor's restart is the recovery, not the producer's retry.

Linux limits a socket path to 107 bytes; longer paths raise ValueError (runtime directories are
short: ``/dev/shm/appliance-<pid>``).
"""

from __future__ import annotations

import errno
import os
import select
import socket

__all__ = ["Doorbell", "BellSender", "MAX_PATH"]

MAX_PATH = 107   # sizeof(sun_path) - 1 on Linux (104 - 1 on the BSDs; the kernel then refuses)

_IGNORED = frozenset({
    errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS,           # wake-ups already pending
    errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR,          # consumer absent / restarting
})
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


def _check_path(path: str) -> str:
    path = os.fspath(path)
    if len(os.fsencode(path)) > MAX_PATH:
        raise ValueError(f"doorbell path longer than {MAX_PATH} bytes: {path!r}")
    return path


class Doorbell:
    """Consumer side: a non-blocking datagram socket bound at ``path``."""

    __slots__ = ("path", "_sock", "_ino", "_poll")

    def __init__(self, path: str) -> None:
        self.path = _check_path(path)
        # A stale socket file from a dead predecessor would make bind() fail with EADDRINUSE.
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(self.path)
            sock.setblocking(False)
            self._ino = os.stat(self.path).st_ino
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._poll = select.poll() if hasattr(select, "poll") else None
        if self._poll is not None:
            self._poll.register(sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> int:
        """Consume every pending datagram; return how many there were."""
        n = 0
        recv = self._sock.recv
        while True:
            try:
                recv(16)
            except (BlockingIOError, InterruptedError):
                return n
            n += 1

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung or ``timeout`` seconds pass (None = forever). True if rung.

        Pending datagrams are all drained, so several rings before the wait make one wake-up.
        """
        if self.drain():
            return True
        if timeout is not None and timeout <= 0:
            return False
        if self._poll is not None:
            ms = -1 if timeout is None else max(1, int(timeout * 1000 + 0.999))
            ready = self._poll.poll(ms)
        else:  # pragma: no cover - platforms without poll()
            ready = select.select([self._sock], [], [], timeout)[0]
        if not ready:
            return False
        self.drain()
        return True

    def close(self, unlink: bool = True) -> None:
        """Close the socket and (by default) remove its file - unless a successor has already bound
        a new socket at the same path (a different inode), which must stay."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        if unlink:
            try:
                if os.stat(self.path).st_ino == self._ino:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "Doorbell":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Doorbell({self.path!r})"


class BellSender:
    """Producer side: one unbound datagram socket per process, used for every bell it rings."""

    __slots__ = ("_sock",)

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)

    def ring(self, path: str) -> bool:
        """Send one wake-up to the doorbell at ``path``; never blocks. True if a datagram was
        queued, False if it was not needed or not possible (see the module docstring)."""
        try:
            self._sock.sendto(b"\0", _DONTWAIT, path)
        except OSError as e:
            if e.errno in _IGNORED:
                return False
            raise
        return True

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "BellSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
