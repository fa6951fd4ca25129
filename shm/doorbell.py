"""Doorbells: wake-ups between processes over Unix datagram sockets.

Owns: one socket per consumer process (``Doorbell``, bound at ``bell.<endpoint>`` in the runtime
directory) and, in each producer process, one socket per consumer it rings, connected to that
consumer's bell (``BellSender``). Every worker process runs both: it is the consumer of its input
rings and a producer into other processes' rings.

Why connected: a ``sendto`` that names the path makes the kernel find the socket by its path at
every call, which doubled the cost of a ring (2.7 against 1.4 us a datagram, measured on the
2-core VM of loadtests/README.md), and a frontend rings one bell per partition of a Produce
request. A consumer that dies takes its socket with it: the next send on a socket connected to it
fails (ECONNREFUSED, then ENOTCONN), and the sender connects again to whatever is bound at the
path now (a restarted consumer), or to nothing yet.

Protocol (see docs/architecture.md, "Runtime directory and channels"): a producer puts a record in
a ring and rings the consumer's bell only if the ring's ``consumer_waiting`` flag is set. A datagram
carries no information (one zero byte); the consumer drains all pending datagrams on wake-up and
then looks at all its rings. Datagrams suit this: each ``sendto`` is one syscall, the socket is
pollable (select/poll/epoll/asyncio ``add_reader``), and the kernel bounds the queue (Linux
``net.unix.max_dgram_qlen``, default 10 to 512 by distribution), so a flood of rings costs nothing
once the consumer has wake-ups pending: the sender just gets EAGAIN, which means "already rung".

Failure modes that are ignored on purpose by ``BellSender.ring`` (after one new connect, for a
consumer that restarted):

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

__all__ = ["Doorbell", "BellSender", "MAX_PATH", "MARK_STATE"]

MAX_PATH = 107   # sizeof(sun_path) - 1 on Linux (104 - 1 on the BSDs; the kernel then refuses)

_PENDING = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS})   # wake-ups already pending
_ABSENT = frozenset({errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR})     # consumer absent / restarting
# A send on a socket connected to a consumer that has died since (its socket closed with it).
_GONE = frozenset({errno.ECONNREFUSED, errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE})
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
# A ring's one byte: 0 wakes the consumer for its rings; MARK_STATE also says that a state page
# it watches moved, so that a consumer may skip looking at its pages after a wake-up that says
# nothing of them. Marks are OR-ed over the datagrams a drain reads (``Doorbell.marks``).
MARK_STATE = 1
_BYTES = [bytes((i,)) for i in range(256)]


def _queue_limit() -> int:
    """Datagrams a socket queues before a sender gets EAGAIN (Linux net.unix.max_dgram_qlen)."""
    try:
        with open("/proc/sys/net/unix/max_dgram_qlen") as f:
            return max(1, int(f.read()))
    except (OSError, ValueError):
        return 10


def _check_path(path: str) -> str:
    path = os.fspath(path)
    if len(os.fsencode(path)) > MAX_PATH:
        raise ValueError(f"doorbell path longer than {MAX_PATH} bytes: {path!r}")
    return path


class Doorbell:
    """Consumer side: a non-blocking datagram socket bound at ``path``."""

    __slots__ = ("path", "_sock", "_ino", "_poll", "marks", "_qlen")

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
        self.marks = 0           # OR of the marks of the datagrams drained since ``take_marks``
        self._qlen = _queue_limit()
        self._poll = select.poll() if hasattr(select, "poll") else None
        if self._poll is not None:
            self._poll.register(sock.fileno(), select.POLLIN)

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> int:
        """Consume every pending datagram; return how many there were. Their marks go to
        ``marks``; a full queue (senders got EAGAIN, their marks dropped) counts as every mark."""
        n = 0
        marks = self.marks
        recv = self._sock.recv
        while True:
            try:
                data = recv(16)
            except (BlockingIOError, InterruptedError):
                break
            if data:
                marks |= data[0]
            n += 1
        if n >= self._qlen:
            marks = 0xFF
        self.marks = marks
        return n

    def take_marks(self) -> int:
        """The marks drained so far (pending datagrams drained first), cleared."""
        self.drain()
        marks, self.marks = self.marks, 0
        return marks

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
    """Producer side: per consumer's bell, one datagram socket connected to it, made at the
    first ring (or ``connect``) and kept. Not thread-safe: a thread that rings has its own."""

    __slots__ = ("_socks",)

    def __init__(self) -> None:
        self._socks: dict[str, socket.socket] = {}

    def connect(self, path: str) -> None:
        """Connect to the bell at ``path`` now if it is there (a producer opening a channel:
        its descriptor is taken then, not at the first ring), else at the first ring."""
        if path not in self._socks:
            self._connect(path)

    def ring(self, path: str, mark: int = 0) -> bool:
        """Send one wake-up to the doorbell at ``path``, carrying ``mark`` (``MARK_STATE``: a
        watched state page moved); never blocks. True if a datagram was queued, False if it was
        not needed or not possible (see the module docstring)."""
        data = _BYTES[mark]
        for _ in range(2):
            sock = self._socks.get(path) or self._connect(path)
            if sock is None:
                return False
            try:
                sock.send(data, _DONTWAIT)
                return True
            except OSError as e:
                if e.errno in _PENDING:
                    return False
                if e.errno not in _GONE:
                    raise
            # The consumer died since this socket was connected; a successor may be bound at
            # the path now: connect once more.
            self.forget(path)
        return False

    def _connect(self, path: str) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.connect(path)
        except OSError as e:
            sock.close()
            if e.errno in _ABSENT:
                return None
            raise
        self._socks[path] = sock
        return sock

    def forget(self, path: str) -> None:
        """Close the socket connected to ``path`` (its consumer is gone for good: a deleted
        topic's writer)."""
        sock = self._socks.pop(path, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def __enter__(self) -> "BellSender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
