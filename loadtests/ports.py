"""One free-port picker: for the benchmarks, the chaos run and the integration tests' harness.

A broker's port is picked below the kernel's ephemeral range. A port from that range can be
handed, between our pick and the broker's ``listen``, to any socket bound to port 0 or to the
source side of any ``connect`` (regression: a test's proxy, bound to port 0, got the port just
picked for the appliance behind it, CI 2026-11-27). Below that range only explicit binds compete,
and processes that run side by side (pytest-xdist workers) take disjoint shares of it.
"""

from __future__ import annotations

import os
import socket

LOWEST = 10000
_cursor: dict[tuple[int, int], int] = {}      # where the next look starts, per range


def ephemeral_floor() -> int:
    """The lowest port of the kernel's ephemeral range (0 when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def port_range(share: int = 0, shares: int = 1) -> tuple[int, int]:
    """Share ``share`` of ``shares`` equal parts of the ports below the ephemeral range, as
    [low, high); (0, 0) when that range leaves too little room below it."""
    floor = ephemeral_floor()
    if floor - LOWEST < 2000:
        return (0, 0)
    width = (floor - LOWEST) // shares
    return (LOWEST + share * width, LOWEST + (share + 1) * width)


def free_port(host: str = "127.0.0.1", share: int = 0, shares: int = 1) -> int:
    """A port nothing is bound to now, from ``port_range(share, shares)`` (the kernel's pick of
    an ephemeral port where there is no such range)."""
    lo, hi = port_range(share, shares)
    if lo == hi:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    # a random start, so two runs on one machine seldom walk the same ports
    port = _cursor.get((lo, hi)) or lo + int.from_bytes(os.urandom(2), "big") % (hi - lo)
    for _ in range(hi - lo):
        nxt = lo if port + 1 >= hi else port + 1
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                port = nxt
                continue
        _cursor[(lo, hi)] = nxt
        return port
    raise RuntimeError(f"no free port in {lo}-{hi}")
