"""systemd's notify protocol, from the supervisor (``Type=notify``, ``NotifyAccess=main``).

Runs in the supervisor only; owns its watchdog schedule. What the supervisor tells systemd on
``$NOTIFY_SOCKET`` (all no-ops outside systemd):

- ``STATUS=recovering 120/1024 partitions`` while the writers recover, then ``READY=1`` with
  ``STATUS=serving ...`` once every frontend is forked (``systemctl status`` shows the line);
- ``WATCHDOG=1`` every quarter of ``WatchdogSec=`` (``$WATCHDOG_USEC``), from the supervisor's
  loop, and only while every worker's heartbeat is fresh (younger than half of it): a supervisor
  stuck in its loop, or a worker that stays stuck although the supervisor kills it (uninterruptible
  sleep), then gets the whole service restarted by systemd. While pings are withheld the
  ``STATUS=`` line names the silent workers;
- ``RELOADING=1`` with ``MONOTONIC_USEC=`` (what systemd 253+ expects) before a SIGHUP reload and
  ``READY=1`` after it;
- ``STOPPING=1`` when the drain starts.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from typing import Mapping

log = logging.getLogger("appliance.supervisor")


def sd_notify(*lines: str) -> None:
    """Send one datagram of ``lines`` to systemd; a no-op outside systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    state = "\n".join(lines)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.ECONNREFUSED):
            log.warning("sd_notify(%s) failed: %s", state, e)


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as RELOADING=1's MONOTONIC_USEC= wants it."""
    return time.monotonic_ns() // 1000


class Watchdog:
    """When to send ``WATCHDOG=1``. ``interval_s`` is systemd's ``WatchdogSec=`` (0: off, when
    ``$WATCHDOG_USEC`` is unset or ``$WATCHDOG_PID`` names another process)."""

    def __init__(self, environ: Mapping[str, str] | None = None, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        self.interval_s = 0.0
        try:
            usec = int(env.get("WATCHDOG_USEC", "0"))
            owner = int(env.get("WATCHDOG_PID", "0") or 0)
        except ValueError:
            usec, owner = 0, 0
        if usec > 0 and (not owner or owner == (os.getpid() if pid is None else pid)):
            self.interval_s = usec / 1e6
        self.last_ping = float("-inf")
        self.withheld: tuple[str, ...] = ()      # workers named in the last "withheld" status

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    @property
    def fresh_s(self) -> float:
        """A heartbeat older than this withholds the ping."""
        return self.interval_s / 2

    def due(self, now: float) -> bool:
        return self.enabled and now - self.last_ping >= self.interval_s / 4

    def turn(self, now: float, stale: list[tuple[str, float]]) -> str | None:
        """Called by the supervisor's loop with the workers whose heartbeat is older than
        ``fresh_s`` (name, age). Pings when due and none is stale; returns the notify state
        sent, if any."""
        if not self.due(now):
            return None
        if stale:
            names = tuple(n for n, _ in stale)
            if names == self.withheld:
                return None
            self.withheld = names
            what = ", ".join(f"{n} ({age:.1f} s)" for n, age in stale[:5])
            more = f" and {len(stale) - 5} more" if len(stale) > 5 else ""
            log.warning("watchdog: not telling systemd we are alive: no heartbeat from %s%s",
                        what, more)
            state = f"STATUS=watchdog withheld: no heartbeat from {what}{more}"
            sd_notify(state)
            return state
        self.last_ping = now
        if self.withheld:
            self.withheld = ()
            log.info("watchdog: every worker beats again")
        sd_notify("WATCHDOG=1")
        return "WATCHDOG=1"
