"""One free-port picker for the benchmarks and the chaos run (run in their own single process).

The broker's port is picked below the kernel's ephemeral range: a port from that range can be
handed, between our pick and the broker's ``listen``, to any socket bound to port 0 or to the
source side of any ``connect`` (the same race the integration harness had).
"""

from __future__ import annotations

import os
import socket

_LOWEST = 10000
_next: int | None = None


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port(host: str = "127.0.0.1") -> int:
    global _next
    floor = _ephemeral_floor()
    if floor - _LOWEST < 2000:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    if _next is None:
        _next = _LOWEST + int.from_bytes(os.urandom(2), "big") % (floor - _LOWEST)
    for _ in range(floor - _LOWEST):
        port, _next = _next, (_LOWEST if _next + 1 >= floor else _next + 1)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below {floor}")
