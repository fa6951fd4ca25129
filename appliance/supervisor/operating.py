"""What the supervisor tells operators and systemd while it runs: the progress of recovery, the
``STATUS=`` line, the watchdog, the reload of the configuration file, and its own metrics.

Runs in the supervisor, in its loop (``Operating``, held by ``appliance.supervisor.Supervisor``;
single-threaded). Owns the supervisor's metrics table (``metrics.sup``: worker restarts by role,
the time the last start took to recover, reloads), the watchdog's schedule, whether the appliance
serves yet, the running configuration's version and the reload hooks (``reload_hooks``: parts
that re-read files of their own on SIGHUP append a callable ``(old, new)`` there, as the TLS
certificates do; the workers' counterpart is ``workers.base.Worker.reload``).

Recovery progress: every writer publishes the bytes its recovery has checked so far in its
metrics table (``appliance_log_recovery_bytes``); while the supervisor waits for the writers it
logs, every ``PROGRESS_LOG_S``, partitions done, bytes checked of the bytes of every log, and an
estimate of the time left, and keeps ``STATUS=recovering done/total partitions`` current.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, Iterable

from shm.metrics import MetricsTable

from appliance.data_layout import partition_dir
from appliance.config import Config
from appliance.metrics import key
from appliance.reload import reload_config
from appliance.runtime import SUPERVISOR, role_title

from .process_table import TABLE_CAPACITY
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
    """The supervisor's view of its partitions' recovery at start (``specs``: the partitions'
    rows, each with ``name``, ``topic``, ``index`` and its metrics table)."""

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
        try:
            with spec.metrics() as t:
                v = t.get(key("appliance_log_recovery_bytes", _tp(spec)))
        except (OSError, ValueError):
            v = None
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


class Operating:
    """The supervisor's word to operators and systemd, its metrics and its configuration's
    reload. What it reads of the process table comes in: ``status`` (the serving STATUS= text),
    ``publish(cfg, version)`` (the supervisor puts a reloaded configuration where the workers
    read it, moves the version on its page and wakes the writers), the time and the silent
    workers at each call."""

    def __init__(self, source: Callable[[], Config], data_dir: str, status: Callable[[], str],
                 publish: Callable[[Config, int], None]) -> None:
        # What a SIGHUP re-reads: the file, the environment and the flags it started with.
        self.source = source
        self.data_dir = data_dir
        self.status = status
        self.publish = publish
        self.config_version = 0
        self.reload_hooks: list[Callable[[Config, Config], None]] = []
        self.serving = False
        self.watchdog = Watchdog()
        # Replaced by the runtime dir's table at set-up (Supervisor._setup).
        self.metrics = MetricsTable.anonymous(TABLE_CAPACITY[SUPERVISOR])

    # -- status ---------------------------------------------------------------------------------
    def notify_serving(self, *lines: str) -> None:
        """``lines`` (READY=1) with the serving STATUS= line; nothing before the appliance
        serves (recovery keeps its own line)."""
        if self.serving:
            sd_notify(*lines, f"STATUS={self.status()}")

    # -- watchdog -------------------------------------------------------------------------------
    def watchdog_turn(self, now: float, silent_workers: Callable[[int], Iterable]) -> None:
        """``silent_workers(ns)``: (spec, ns since its last beat) of the workers silent longer."""
        wd = self.watchdog
        if not wd.due(now):
            return
        stale = [(role_title(s.role, s.index), age / 1e9)
                 for s, age in silent_workers(int(wd.fresh_s * 1e9))]
        back = bool(wd.withheld) and not stale
        sent = wd.turn(now, stale)
        if back and sent and self.serving:
            sd_notify(f"STATUS={self.status()}")

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

    def recovery_progress(self, specs: list, now: float) -> RecoveryProgress:
        return RecoveryProgress(specs, self.data_dir, now)

    def recovery_finished(self, progress: RecoveryProgress, now: float) -> None:
        elapsed = progress.finished(now)
        self.metrics.set(key("appliance_recovery_seconds"), int(elapsed * 1e6))

    # -- reload ---------------------------------------------------------------------------------
    def reload(self, cfg: Config) -> Config:
        """SIGHUP (``systemctl reload``), through ``Supervisor.reload``: re-reads the
        configuration running as ``cfg``, applies the live keys (``appliance.reload``), runs
        ``reload_hooks``, then publishes the result for the workers; the appliance serves
        throughout. Returns the configuration now running."""
        if self.serving:
            sd_notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}",
                      "STATUS=reloading the configuration")
        t0 = time.monotonic()
        p = reload_config(cfg, self.source)
        if p is None:
            self.metrics.add(key("appliance_config_reloads", [("result", "failed")]))
        else:
            old = cfg
            cfg = p.config
            # Hooks first: what they publish for the workers (re-read certificates) is in place
            # before the version the workers follow moves.
            for hook in list(self.reload_hooks):
                try:
                    hook(old, cfg)
                except Exception:
                    log.exception("reload hook %r failed", hook)
            self.config_version += 1
            self.publish(cfg, self.config_version)
            self.metrics.add(key("appliance_config_reloads", [("result", "applied")]))
            log.info("reload done in %.0f ms: %d settings changed, %d need a restart",
                     (time.monotonic() - t0) * 1000, len(p.applied), len(p.refused))
        self.notify_serving("READY=1")
        return cfg
