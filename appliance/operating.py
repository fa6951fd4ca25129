"""What the supervisor tells operators and systemd while it runs: the progress of recovery, the
``STATUS=`` line, the watchdog, the reload of the configuration file, and its own metrics.

Runs in the supervisor, in its loop (``SupervisorOperating`` is mixed into
``appliance.supervisor.Supervisor``; single-threaded). Owns the supervisor's metrics table
(``metrics.sup``: worker restarts by role, the time the last start took to recover, reloads) and
the reload hooks (``reload_hooks``: parts that re-read files of their own on SIGHUP append a
callable ``(old, new)`` there, as the TLS certificates do; the workers' counterpart is
``workers.base.Worker.reload``).

Recovery progress: every writer publishes the bytes its recovery has checked so far in its
metrics table (``appliance_log_recovery_bytes``); while the supervisor waits for the writers it
logs, every ``PROGRESS_LOG_S``, partitions done, bytes checked of the bytes of every log, and an
estimate of the time left, and keeps ``STATUS=recovering done/total partitions`` current.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from .catalog import partition_dir
from .config import Config
from .metrics import key
from .reload import file_path as config_file, publish as publish_config, reload_config
from .runtime import role_title
from .systemd import Watchdog, monotonic_usec, sd_notify

log = logging.getLogger("appliance.supervisor")

PROGRESS_LOG_S = 5.0
STATUS_EVERY_S = 0.5


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def log_bytes(directory: str) -> int:
    """Bytes of the segment files (``*.log``) of one partition directory."""
    total = 0
    try:
        with os.scandir(directory) as it:
            for e in it:
                if e.name.endswith(".log"):
                    try:
                        total += e.stat().st_size
                    except FileNotFoundError:
                        pass
    except FileNotFoundError:
        pass
    return total


class RecoveryProgress:
    """The supervisor's view of its writers' recovery at start."""

    def __init__(self, specs: list, data_dir: str, now: float) -> None:
        self.specs = specs
        self.started = now
        self.sizes = {s.name: log_bytes(partition_dir(data_dir, s.topic.name, s.index))
                      for s in specs}
        self.total_bytes = sum(self.sizes.values())
        self.next_log = now + PROGRESS_LOG_S
        self.next_status = now
        self.last_status = ""

    def checked(self, spec, ready: bool) -> int:
        if ready:
            return self.sizes.get(spec.name, 0)
        t = getattr(spec, "metrics", None)
        v = t.get(key("appliance_log_recovery_bytes", _tp(spec))) if t is not None else None
        return min(v or 0, self.sizes.get(spec.name, 0))

    def turn(self, now: float, ready: Callable[[object], bool]) -> None:
        done = [ready(s) for s in self.specs]
        n = sum(done)
        total = len(self.specs)
        status = f"STATUS=recovering {n}/{total} partitions"
        if status != self.last_status and (now >= self.next_status or n == total):
            self.last_status = status
            self.next_status = now + STATUS_EVERY_S
            sd_notify(status)
        if now >= self.next_log and n < total:
            self.next_log = now + PROGRESS_LOG_S
            checked = sum(self.checked(s, d) for s, d in zip(self.specs, done))
            elapsed = now - self.started
            if checked and self.total_bytes:
                left = f", about {elapsed * (self.total_bytes - checked) / checked:.0f} s left"
            elif n:
                left = f", about {elapsed * (total - n) / n:.0f} s left"
            else:
                left = ""
            log.info("recovery: %d/%d partitions ready, %s of %s of logs checked in %.0f s%s",
                     n, total, human_bytes(checked), human_bytes(self.total_bytes), elapsed, left)

    def finished(self, now: float) -> float:
        elapsed = now - self.started
        log.info("recovered %d partitions (%s of logs) in %.1f s", len(self.specs),
                 human_bytes(self.total_bytes), elapsed)
        return elapsed


def _tp(spec) -> list[tuple[str, object]]:
    return [("topic", spec.topic.name), ("partition", spec.index)]


class SupervisorOperating:
    """Mixed into the Supervisor (whose attributes these methods use)."""

    cfg: Config
    watchdog: Watchdog
    serving: bool
    reload_hooks: list[Callable[[Config, Config], None]]
    wake_writers: Callable[[], None]

    # -- status ---------------------------------------------------------------------------------
    def serving_status(self) -> str:
        cat = self.store.catalog
        return (f"serving on {self.listening()}: {len(cat.topics)} topics, "
                f"{cat.partition_count()} partitions, {len(self.frontends)} frontends")

    def notify_serving(self, *lines: str) -> None:
        """``lines`` (READY=1) with the serving STATUS= line; nothing before the appliance
        serves (recovery keeps its own line)."""
        if self.serving:
            sd_notify(*lines, f"STATUS={self.serving_status()}")

    # -- watchdog -------------------------------------------------------------------------------
    def watchdog_turn(self) -> None:
        wd = self.watchdog
        now = self.clock()
        if not wd.due(now):
            return
        stale = [(role_title(s.role, s.index, s.topic.name if s.topic else None), age / 1e9)
                 for s, age in self.silent_workers(int(wd.fresh_s * 1e9))]
        back = bool(wd.withheld) and not stale
        sent = wd.turn(now, stale)
        if back and sent and self.serving:
            sd_notify(f"STATUS={self.serving_status()}")

    # -- metrics --------------------------------------------------------------------------------
    def init_metrics(self, roles: list[str]) -> None:
        """Every series of the supervisor's table exists from the start (at 0), so that a rate
        over it is defined before the first restart or reload."""
        for role in roles:
            self.count_restart(role, 0)
        for result in ("applied", "failed"):
            self.metrics.add(key("appliance_config_reloads", [("result", result)]), 0)

    def count_restart(self, role: str, n: int = 1) -> None:
        self.metrics.add(key("appliance_worker_restarts", [("role", role)]), n)

    def recovery_progress(self, specs: list) -> RecoveryProgress:
        return RecoveryProgress(specs, self.data_dir, self.clock())

    def recovery_finished(self, progress: RecoveryProgress) -> None:
        elapsed = progress.finished(self.clock())
        self.metrics.set(key("appliance_recovery_seconds"), int(elapsed * 1e6))

    # -- reload ---------------------------------------------------------------------------------
    def reload(self) -> None:
        """SIGHUP (``systemctl reload``): the supervisor's one reload entry point. Re-reads the
        configuration, applies the live keys (``appliance.reload``), runs ``reload_hooks``, then
        publishes the result for the workers; the appliance serves throughout."""
        if self.serving:
            sd_notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}",
                      "STATUS=reloading the configuration")
        t0 = time.monotonic()
        p = reload_config(self.cfg, self.source)
        if p is None:
            self.metrics.add(key("appliance_config_reloads", [("result", "failed")]))
        else:
            old = self.cfg
            self.cfg = p.config
            # Hooks first: what they publish for the workers (re-read certificates) is in place
            # before the version the workers follow moves.
            for hook in list(self.reload_hooks):
                try:
                    hook(old, self.cfg)
                except Exception:
                    log.exception("reload hook %r failed", hook)
            self.config_version += 1
            publish_config(self.cfg, config_file(self.run_dir))
            self.page.publish(config_version=self.config_version)
            self.wake_writers()
            self.metrics.add(key("appliance_config_reloads", [("result", "applied")]))
            log.info("reload done in %.0f ms: %d settings changed, %d need a restart",
                     (time.monotonic() - t0) * 1000, len(p.applied), len(p.refused))
        self.notify_serving("READY=1")
