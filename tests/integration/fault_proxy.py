"""Fault proxies: a loopback TCP proxy in front of the appliance that records requests, and loses or
delays responses on purpose.

Clients connect to the proxy; the appliance is configured to advertise the proxy's address, so
every connection (bootstrap and the ones Metadata points to) goes through it. The proxy reads the
Kafka frames of both directions, remembers each request's api key by correlation id, and for a
response the ``decide(api_key)`` policy may:

  * "drop": swallow the response and cut both connections, as when a broker's answer is lost
    after the broker did the work; the client retries the same batch on a new connection;
  * a float: hold the response that many seconds first.

``on_request(frame)``, when given, sees every request frame (size prefix included) the clients
send, before it is forwarded: the fuzz test records real clients' requests with it.

Threads, one pair per connection; test-only code.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from typing import Callable


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _recv_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _recv_exact(sock, size)
    return None if body is None else head + body


class FaultyProxy:
    def __init__(self, upstream_port: int, decide: Callable[[int], object] | None = None,
                 on_request: Callable[[bytes], None] | None = None) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.decide = decide or (lambda api_key: None)
        self.on_request = on_request
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self.delayed = 0
        self.closed = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            keys: dict[int, int] = {}
            threading.Thread(target=self._up, args=(client, server, keys), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, keys), daemon=True).start()

    def _up(self, client, server, keys) -> None:
        while True:
            frame = _read_frame(client)
            if frame is None:
                break
            api_key, _, corr = struct.unpack_from(">hhi", frame, 4)
            keys[corr] = api_key
            if self.on_request is not None:
                with self.lock:
                    self.on_request(frame)
            try:
                server.sendall(frame)
            except OSError:
                break
        _close(client, server)

    def _down(self, server, client, keys) -> None:
        while True:
            frame = _read_frame(server)
            if frame is None:
                break
            (corr,) = struct.unpack_from(">i", frame, 4)
            verdict = self.decide(keys.pop(corr, -1))
            if verdict == "drop":
                with self.lock:
                    self.dropped += 1
                break
            if isinstance(verdict, (int, float)) and verdict > 0:
                with self.lock:
                    self.delayed += 1
                time.sleep(verdict)
            try:
                client.sendall(frame)
            except OSError:
                break
        _close(client, server)


def _close(*socks) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def drop_some_produce(p: float, seed: int = 7, delay: float = 0.0):
    """A policy: lose a fraction ``p`` of Produce responses, delay some others."""
    rng = random.Random(seed)
    lock = threading.Lock()

    def decide(api_key: int):
        if api_key != 0:
            return None
        with lock:
            r = rng.random()
        if r < p:
            return "drop"
        if delay and r < 2 * p:
            return delay
        return None
    return decide
