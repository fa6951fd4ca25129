"""The Overview's facts: the processes (role, pid, state, restarts, memory), the listeners, disk
use and the reserve, and what is wrong, in words.

Runs in the console worker; owns nothing but its cache of read-only state pages. It reads what
the supervisor and every worker publish (``processes.json``, the state pages, the heartbeat
table), as ``appliance.metrics.collector`` does, never asking a worker anything: a stalled or
restarting worker shows as such instead of stalling the page.
"""

from __future__ import annotations

import os
import shutil
import time

import psutil

from appliance.config import Config
from appliance.runtime import (DRAINING, HEARTBEAT_FILE, READY, RECOVERING, STOPPED, page_fields,
                               read_processes, role_title)
from shm.heartbeat import HeartbeatTable
from shm.statepage import StalePage, StatePage
from shm.topology import Topology

STATUS = {RECOVERING: "recovering", READY: "ready", DRAINING: "draining", STOPPED: "stopped"}
# A ready worker whose heartbeat is older than this is named as stalling (the supervisor kills it
# at heartbeat_timeout_ms).
STALL_S = 5.0


class Overview:
    def __init__(self, run_dir: str, data_dir: str) -> None:
        self.run_dir = run_dir
        self.data_dir = data_dir
        self.topo = Topology(run_dir)
        self.pages: dict[str, StatePage] = {}
        self.hb: HeartbeatTable | None = None

    def close(self) -> None:
        for p in self.pages.values():
            p.close()
        self.pages.clear()
        if self.hb is not None:
            self.hb.close()
            self.hb = None

    def _page(self, name: str, role: str) -> StatePage | None:
        p = self.pages.get(name)
        if p is None:
            try:
                p = self.pages[name] = StatePage.open(self.topo.page_path(name), page_fields(role),
                                                      readonly=True)
            except (FileNotFoundError, ValueError):
                return None
        return p

    def _heartbeat_age(self, slot: int | None) -> float | None:
        if self.hb is None:
            try:
                self.hb = HeartbeatTable.open(os.path.join(self.run_dir, HEARTBEAT_FILE),
                                              readonly=True)
            except (FileNotFoundError, ValueError):
                return None
        if slot is None:
            return None
        last = self.hb.last(slot)
        return max(0.0, (time.monotonic_ns() - last) / 1e9) if last else None

    def processes(self) -> list[dict]:
        procs = read_processes(self.run_dir)
        rows = [{"role": "supervisor", "title": "supervisor", "name": "sup",
                 "pid": procs.get("supervisor"), "state": "ready", "restarts": 0,
                 "rss": _rss(procs.get("supervisor")), "heartbeat_age": None}]
        for w in procs.get("workers", []):
            st = None
            page = self._page(w["name"], w["role"])
            if page is not None:
                try:
                    st = page.read()
                except StalePage:
                    st = None
            state = "starting"
            if w.get("pid") is None:
                state = "down"
            elif st is not None and st.generation == w.get("generation") and st.pid == w["pid"]:
                state = STATUS.get(st.status, str(st.status))
            rows.append({"role": w["role"], "title": role_title(w["role"], w.get("index", 0)),
                         "name": w["name"], "pid": w.get("pid"), "state": state,
                         "restarts": max(0, int(w.get("generation", 1)) - 1),
                         "rss": _rss(w.get("pid")),
                         "heartbeat_age": self._heartbeat_age(w.get("slot"))
                         if state == "ready" else None,
                         "partitions": len(w.get("partitions", ()))})
        return rows

    def listeners(self, cfg: Config) -> list[dict]:
        procs = read_processes(self.run_dir)
        bound = procs.get("listeners", {})
        out = [{"name": lst.name, "protocol": lst.protocol, "host": lst.host,
                "port": bound.get(lst.name, lst.port)} for lst in cfg.listeners]
        if cfg.metrics.listen:
            out.append({"name": "metrics", "protocol": "HTTP", "host": cfg.metrics.listen,
                        "port": ""})
        if cfg.console.listen:
            out.append({"name": "console", "protocol": "HTTPS" if cfg.console.tls else "HTTP",
                        "host": cfg.console.listen, "port": ""})
        return out

    def disk(self, cfg: Config) -> dict:
        try:
            u = shutil.disk_usage(self.data_dir)
        except OSError:
            return {"total": 0, "used": 0, "free": 0, "reserve": cfg.server.disk_reserve_bytes}
        return {"total": u.total, "used": u.used, "free": u.free,
                "reserve": cfg.server.disk_reserve_bytes}


def problems(procs: list[dict], disk: dict, crash_loop_restarts: int) -> list[str]:
    """What is wrong, in words, worst first."""
    out = []
    for p in procs:
        if p["state"] == "down":
            out.append(f"{p['title']} is down (the supervisor restarts it)")
        elif p["state"] in ("starting", "recovering"):
            out.append(f"{p['title']} is {p['state']}")
        elif p["heartbeat_age"] is not None and p["heartbeat_age"] > STALL_S:
            out.append(f"{p['title']} has not beaten its heartbeat for "
                       f"{p['heartbeat_age']:.0f} s: it is stalling")
        if p["restarts"] >= max(1, crash_loop_restarts - 1):
            out.append(f"{p['title']} restarted {p['restarts']} times: near a crash loop")
        elif p["restarts"]:
            out.append(f"{p['title']} restarted {p['restarts']} time"
                       f"{'s' if p['restarts'] > 1 else ''}")
    if disk["total"]:
        if disk["free"] <= disk["reserve"]:
            out.insert(0, "the disk is full: only the reserve is left, produce is refused")
        elif disk["free"] < 0.05 * disk["total"]:
            out.insert(0, f"the disk is {100 * disk['used'] / disk['total']:.0f}% full")
    return out


def _rss(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, OSError):
        return None
