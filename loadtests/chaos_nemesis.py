"""The chaos suite's nemesis: runs the appliance and injects faults into it on a schedule.

Used by ``loadtests/chaos.py`` (in its process, one thread for the schedule). Owns:

* ``Appliance``: one ``appliance run`` in its own process group (its own session), on a fixed
  port, data dir and runtime dir, so that a restart after ``kill -9`` of everything comes back
  where the clients expect it. Worker pids come from the runtime dir's ``processes.json`` (the
  supervisor rewrites it on every spawn and death), as the integration harness reads them.
* ``SmallDisk``: the data dir's file system when disk-full faults are wanted: a small ext4 image
  on a loop device (``mkfs.ext4 -m 0``: no blocks reserved for root, so a full disk is full for
  the appliance too) or a small tmpfs; filled by a ballast file and freed again.
* ``Nemesis``: the fault schedule. Every ``interval`` (seeded uniform) it injects the next fault
  of a seeded shuffle of the enabled kinds (so every kind comes up once per cycle) and prints it.
  Faults that last (a pause, a full disk) end on their own clock while the next ones come, so
  they overlap: a writer killed while the disk is full, a pause across a kill-all.

    kill-<role>   kill -9 of one worker of that role (frontend, writer, fetcher, coordinator),
                  or of the supervisor alone (its workers get SIGTERM from the kernel and drain;
                  then the appliance is started again on the same data dir, as systemd would);
    pause-<role>  SIGSTOP, a seeded pause (some beyond the heartbeat timeout, so the supervisor
                  kills the hung worker), then SIGCONT;
    kill-all      kill -9 of the whole process group, then a restart on the same data dir;
    disk-full     the data dir's file system filled to the last block, held, then freed;
    power-cut     (data dir on lazyfs, ``chaos_storage.LazyDisk``) kill -9 of the whole group and
                  the file system's death with every write not yet synced, mounted again over
                  what was durable, the appliance restarted on it;
    bit-flip      one bit of one batch of a sealed segment of the workload's topic changed
                  (``chaos_storage.flip_sealed_batch``), at random under the running appliance
                  or while the whole group is down (kill -9, the flip, a restart); the damaged
                  batch's offsets go to ``damaged`` for the checker.

  A worker is killed or paused at most ``per_worker_budget`` times a minute (the supervisor
  stops the appliance when one worker dies more than ``crash_loop_restarts`` times a minute, by
  design): when every worker of the drawn role is over budget, the fault is skipped and says so.
  The appliance exiting on its own (not by a fault) is recorded as a finding and the appliance is
  started again.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from appliance.runtime import read_processes

from chaos_storage import Damage, LazyDisk, flip_sealed_batch, sealed_segments
from ports import free_port

MiB = 1 << 20
ROLES = ("frontend", "writer", "fetcher", "coordinator", "supervisor")
FAULT_KINDS = tuple([f"kill-{r}" for r in ROLES] + [f"pause-{r}" for r in ROLES]
                    + ["kill-all", "disk-full", "power-cut", "bit-flip"])
_PR_SET_CHILD_SUBREAPER = 36
MAX_RETRIES = 10         # a skipped fault is tried again this often within its cycle


def become_subreaper() -> None:
    """Adopt the appliance's orphans: after kill -9 of its supervisor, the workers (which drain
    and exit on their own) become our children, so that ``reap_group`` can wait for them."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def appliance_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "appliance")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "appliance.cli"]


def _toml(sections: dict) -> str:
    lines: list[str] = []

    def emit(prefix: str, table: dict) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars:
            lines.append(f"[{prefix}]")
            for k, v in scalars.items():
                lines.append(f"{k} = {json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else v}")
        for k, v in table.items():
            if isinstance(v, dict):
                emit(f"{prefix}.{k}" if prefix else k, v)

    for name, table in sections.items():
        emit(name, table)
    return "\n".join(lines) + "\n"


class Appliance:
    """``appliance run`` in its own session; started again on the same port and data dir."""

    def __init__(self, workdir: str, data_dir: str, config: dict, port: int = 0) -> None:
        self.workdir, self.data_dir = workdir, data_dir
        self.port = port or free_port()
        self.run_dir = f"/dev/shm/appliance-chaos-{os.getpid()}-{self.port}"
        config = {k: dict(v) for k, v in config.items()}
        config.setdefault("server", {})["runtime_dir"] = self.run_dir
        self.config_path = os.path.join(workdir, "appliance.toml")
        with open(self.config_path, "w") as f:
            f.write("# written by loadtests/chaos.py\n" + _toml(config))
        self.log_path = os.path.join(workdir, "appliance.log")
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[int] = []       # exit statuses of earlier incarnations, in order

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0, waiting: Callable[[], None] = lambda: None) -> None:
        """Start and wait until it serves; ``waiting`` is called while it is not ready yet."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
        with open(self.log_path, "ab") as log:
            log.write(f"--- chaos: start {self.starts + 1} ---\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                appliance_command() + ["run", "--config", self.config_path, "--listen", self.bootstrap,
                                       "--data-dir", self.data_dir],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env)
        self.starts += 1
        self.wait_ready(timeout, waiting)

    def wait_ready(self, timeout: float, waiting: Callable[[], None] = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ApplianceExited(self.proc.returncode)
            if self._api_versions_ok() and self._workers_up():
                return
            waiting()
            time.sleep(0.1)
        raise TimeoutError(f"the appliance was not ready within {timeout:.0f} s")

    def _api_versions_ok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                body = struct.pack(">hhih", 18, 0, 7, 5) + b"chaos"
                s.sendall(struct.pack(">i", len(body)) + body)
                s.settimeout(2.0)
                head = s.recv(8)
                return len(head) == 8 and struct.unpack(">ii", head)[1] == 7
        except OSError:
            return False

    def _workers_up(self) -> bool:
        try:
            return all(w["pid"] for w in self.processes()["workers"])
        except (OSError, ValueError, KeyError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> dict:
        return read_processes(self.run_dir)

    def workers(self, role: str) -> list[dict]:
        """Live workers of a role: [{"name", "pid", ...}]; the supervisor as one row."""
        if role == "supervisor":
            return [{"name": "supervisor", "pid": self.proc.pid}] if self.alive() else []
        try:
            rows = self.processes()["workers"]
        except (OSError, ValueError, KeyError):
            return []
        return [w for w in rows if w["role"] == role and w["pid"]]

    def group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def reap_group(self, timeout: float) -> bool:
        """Wait (reaping the orphans we adopted) until no process of the group is left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.poll()
            try:
                while os.waitpid(-self.proc.pid, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            if not self.group_alive():
                return True
            time.sleep(0.05)
        return False

    def record_exit(self) -> int:
        code = self.proc.wait()
        self.exits.append(code)
        return code

    def kill_all(self) -> int:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = self.record_exit()
        self.reap_group(30)
        return code

    def after_supervisor_death(self, grace: float) -> int:
        """The supervisor is gone: its workers drain on the kernel's SIGTERM; kill -9 whatever
        is left after ``grace`` (as systemd's stop of the unit's cgroup would). Its status."""
        code = self.record_exit()
        if not self.reap_group(grace):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.reap_group(30)
        return code

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM (the supervisor drains its workers); the exit status, or None if it had to
        be killed."""
        if not self.alive():
            return None
        self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.reap_group(30)
        return code


class ApplianceExited(RuntimeError):
    def __init__(self, code: int) -> None:
        super().__init__(f"the appliance exited with status {code}")
        self.code = code


class SmallDisk:
    """A small file system for the data dir: ext4 on a loop device or tmpfs, mounted at
    ``<workdir>/disk``; ``fill()`` writes a ballast file until ENOSPC, ``free()`` removes it."""

    def __init__(self, workdir: str, kind: str, size_mb: int) -> None:
        self.kind, self.size_mb = kind, size_mb
        self.mnt = os.path.join(workdir, "disk")
        self.image = os.path.join(workdir, "disk.img")
        self.ballast = os.path.join(self.mnt, "ballast")
        self.mounted = False

    def mount(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit(f"--disk {self.kind} needs root (mount); use --disk none")
        os.makedirs(self.mnt, exist_ok=True)
        if self.kind == "loop":
            with open(self.image, "wb") as f:
                f.truncate(self.size_mb * MiB)
            subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", self.image], check=True)
            cmd = ["mount", "-o", "loop", self.image, self.mnt]
        else:
            cmd = ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", self.mnt]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cannot mount the {self.kind} file system: {r.stderr.strip()}")
        self.mounted = True

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", self.mnt], check=False)
            self.mounted = False
        if os.path.exists(self.image):
            os.unlink(self.image)

    def fill(self) -> int:
        """Write the ballast until the file system has no block left; its size."""
        written = 0
        chunk = b"\xa5" * MiB
        with open(self.ballast, "ab", buffering=0) as f:
            while len(chunk) >= 512:
                try:
                    written += f.write(chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    chunk = chunk[:len(chunk) // 2]
            try:
                os.fsync(f.fileno())
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        return written

    def free(self) -> None:
        try:
            os.unlink(self.ballast)
        except FileNotFoundError:
            pass

    def free_bytes(self) -> int:
        st = os.statvfs(self.mnt)
        return st.f_bavail * st.f_frsize


@dataclass
class FaultEvent:
    at: float            # seconds since the run started
    kind: str
    target: str = ""
    detail: str = ""
    skipped: bool = False

    def line(self) -> str:
        what = f"{self.kind} {self.target}".strip()
        return f"[{self.at:7.1f}s] {what}{' (skipped)' if self.skipped else ''}{': ' + self.detail if self.detail else ''}"


@dataclass
class NemesisOptions:
    kinds: list[str]
    interval: tuple[float, float] = (2.0, 6.0)
    pause: tuple[float, float] = (0.3, 4.0)
    disk_hold: tuple[float, float] = (1.0, 4.0)
    per_worker_budget: int = 3
    restart_timeout: float = 90.0
    topic: str = "chaos"                 # the bit flip's topic and its partition count
    partitions: int = 1
    # The schedule starts once this holds (chaos.py: a first transaction committed), so that
    # the first fault, a power cut above all, has acknowledged data to lose.
    ready: Callable[[], bool] = lambda: True
    # Jepsen's calm windows: (faulty, calm) seconds: after ``faulty`` seconds of faults every
    # fault in force ends and none comes for ``calm`` seconds (the system must recover and serve
    # in them); None: faults all the time.
    calm: tuple[float, float] | None = None


@dataclass
class Findings:
    """What the appliance did on its own: exits nobody asked for."""
    unexpected_exits: list[str] = field(default_factory=list)


class Nemesis(threading.Thread):
    def __init__(self, app: Appliance, disk: SmallDisk | None, opts: NemesisOptions,
                 rng: random.Random, t0: float, out=sys.stdout) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.app, self.disk, self.opts, self.rng, self.t0, self.out = app, disk, opts, rng, t0, out
        self.stop_event = threading.Event()
        self.events: list[FaultEvent] = []
        self.findings = Findings()
        self.cycles = 0                     # complete passes over the enabled kinds
        self._order: list[str] = []
        self._retries: dict[str, int] = {}  # skipped kinds tried again in this cycle
        self._hits: dict[str, list[float]] = {}
        self._paused: dict[int, str] = {}   # pid -> name, while SIGSTOPped
        self._pending: list[tuple[float, str, Callable[[], None]]] = []   # (due, what, end)
        self.lock = threading.Lock()        # held while the appliance is down on purpose
        self.damaged: list[Damage] = []     # batches a bit flip damaged, for the checker
        self.cuts: list[dict] = []          # power cuts: at, ready, the appliance start after it
        self.error: BaseException | None = None

    # -- the schedule -----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.opts.ready():
                if self._wait(0.1):
                    return
            phase = time.monotonic()
            while not self.stop_event.is_set():
                if self._wait(self.rng.uniform(*self.opts.interval)):
                    break
                if self.opts.calm and time.monotonic() - phase >= self.opts.calm[0]:
                    if self._calm_window():
                        break
                    phase = time.monotonic()
                if not self._order:
                    self._order = list(self.opts.kinds)
                    self.rng.shuffle(self._order)
                    self._retries = {}
                kind = self._order.pop()
                before = len(self.events)
                self.inject(kind)
                skipped = any(ev.skipped for ev in self.events[before:])
                if skipped and self._retries.get(kind, 0) < MAX_RETRIES:
                    # Its targets were paused or over budget: again at the end of this cycle,
                    # so that a cycle holds every kind.
                    self._retries[kind] = self._retries.get(kind, 0) + 1
                    self._order.insert(0, kind)
                if not self._order:
                    self.cycles += 1
        except BaseException as e:          # reported by chaos.py, which then stops the run
            self.error = e

    def _calm_window(self) -> bool:
        """End every fault in force and inject none for the calm window; True when told to stop."""
        self._end_due(everything=True)
        for pid in list(self._paused):
            self._resume(pid, _start_time(pid))
        if self.disk is not None:
            self.disk.free()
        seconds = self.opts.calm[1]
        self.record(FaultEvent(self.now(), "calm", detail=f"every fault healed; none for {seconds:g}s"))
        return self._wait(seconds)

    def _wait(self, seconds: float) -> bool:
        """Wait, watching the appliance; True when the nemesis is told to stop."""
        end = time.monotonic() + seconds
        while True:
            self._end_due()
            self.watch()
            left = end - time.monotonic()
            if left <= 0:
                return self.stop_event.is_set()
            if self.stop_event.wait(min(left, 0.2)):
                return True

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, ev: FaultEvent) -> None:
        self.events.append(ev)
        print(f"nemesis {ev.line()}", file=self.out, flush=True)

    def watch(self) -> None:
        """The appliance exited without a fault asking it to: a finding; start it again."""
        with self.lock:
            if self.app.alive():
                return
            code = self.app.record_exit()
            self.app.reap_group(30)
            msg = f"the appliance exited with status {code} at {self.now():.1f}s"
            self.findings.unexpected_exits.append(msg)
            self.record(FaultEvent(self.now(), "appliance-exit", detail=msg + "; starting it again"))
            self._restart()

    def _restart(self) -> None:
        deadline = time.monotonic() + self.opts.restart_timeout
        while True:
            try:
                # Faults in force end on their clock meanwhile: a full disk the start waits for
                # is freed when its time is up.
                self.app.start(timeout=max(1.0, deadline - time.monotonic()), waiting=self._end_due)
                return
            except ApplianceExited as e:
                self.app.exits.append(e.code)
                self.app.reap_group(30)
                self.findings.unexpected_exits.append(f"a restart exited with status {e.code} at {self.now():.1f}s")
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    # -- faults ---------------------------------------------------------------------------------
    def _budget_ok(self, name: str) -> bool:
        now = time.monotonic()
        hits = [t for t in self._hits.get(name, []) if now - t < 60]
        self._hits[name] = hits
        return len(hits) < self.opts.per_worker_budget

    def _pick(self, role: str) -> dict | None:
        ws = [w for w in self.app.workers(role) if self._budget_ok(w["name"]) and w["pid"] not in self._paused]
        return self.rng.choice(ws) if ws else None

    def inject(self, kind: str) -> None:
        if kind == "kill-all":
            self._kill_all()
        elif kind == "disk-full":
            self._disk_full()
        elif kind == "power-cut":
            self._power_cut()
        elif kind == "bit-flip":
            self._bit_flip()
        else:
            action, role = kind.split("-", 1)
            (self._kill if action == "kill" else self._pause)(kind, role)

    def _kill(self, kind: str, role: str) -> None:
        with self.lock:
            w = self._pick(role)
            if w is None:
                self.record(FaultEvent(self.now(), kind, detail="every worker of the role is paused or over its budget", skipped=True))
                return
            self._hits.setdefault(w["name"], []).append(time.monotonic())
            try:
                os.kill(w["pid"], signal.SIGKILL)
            except ProcessLookupError:
                self.record(FaultEvent(self.now(), kind, w["name"], f"pid {w['pid']} already gone", skipped=True))
                return
            if role != "supervisor":
                self.record(FaultEvent(self.now(), kind, w["name"], f"pid {w['pid']}"))
                return
            at, t = self.now(), time.monotonic()
            self._end_due(what="pause")      # stopped orphans could not drain: SIGCONT them
            code = self.app.after_supervisor_death(grace=30.0)
            if code != -signal.SIGKILL:
                self.findings.unexpected_exits.append(
                    f"the supervisor had exited with status {code} before kill -9 at {at:.1f}s")
            drained = time.monotonic() - t
            self._restart()
            self.record(FaultEvent(at, kind, "supervisor", f"pid {w['pid']}; workers gone after "
                                   f"{drained:.1f}s; restarted in {time.monotonic() - t:.1f}s"))

    def _pause(self, kind: str, role: str) -> None:
        w = self._pick(role)
        if w is None:
            self.record(FaultEvent(self.now(), kind, detail="every worker of the role is paused or over its budget", skipped=True))
            return
        self._hits.setdefault(w["name"], []).append(time.monotonic())
        seconds = self.rng.uniform(*self.opts.pause)
        start = _start_time(w["pid"])
        try:
            os.kill(w["pid"], signal.SIGSTOP)
        except ProcessLookupError:
            self.record(FaultEvent(self.now(), kind, w["name"], f"pid {w['pid']} already gone", skipped=True))
            return
        self._paused[w["pid"]] = w["name"]
        self.record(FaultEvent(self.now(), kind, w["name"], f"pid {w['pid']} SIGSTOP for {seconds:.1f}s"))
        self._later(seconds, "pause", lambda: self._resume(w["pid"], start))

    def _resume(self, pid: int, start: str | None) -> None:
        self._paused.pop(pid, None)
        if start is not None and _start_time(pid) == start:   # the same process, not a reused pid
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def _later(self, seconds: float, what: str, end: Callable[[], None]) -> None:
        """End a fault after ``seconds`` while the schedule goes on (faults overlap)."""
        self._pending.append((time.monotonic() + seconds, what, end))

    def _end_due(self, everything: bool = False, what: str | None = None) -> None:
        now = time.monotonic()
        due = [p for p in self._pending if everything or p[0] <= now or p[1] == what]
        for p in due:
            self._pending.remove(p)
            p[2]()

    def _kill_all(self) -> None:
        self._kill_group_and_restart("kill-all", "kill -9", "restarted on the same data dir in {:.1f}s")

    def _power_cut(self) -> None:
        if not isinstance(self.disk, LazyDisk):
            self.record(FaultEvent(self.now(), "power-cut", detail="the data dir is not on lazyfs (--disk lazyfs)",
                                   skipped=True))
            return
        self._kill_group_and_restart("power-cut", "the power cut", "unsynced writes dropped; restarted in {:.1f}s",
                                     between=self.disk.cut)
        self.cuts.append({"at": self.events[-1].at, "ready": self.now(), "start": self.app.starts})

    def history_entries(self, policy: str) -> list[dict]:
        """What the checker must know of the storage faults: each damaged batch (``damage``) and
        each power cut (``power-cut``: its time, the flush policy, and every partition's log end
        after recovery, from the writers' "<key> ready: log start S, log end E" lines of the
        appliance's start after the cut; ``queue_power_cuts``)."""
        out = [{"process": "nemesis", "type": "ok", "f": "damage", "value": d.as_dict(), "time": d.at}
               for d in self.damaged]
        starts = _log_sections(self.app.log_path)
        for c in self.cuts:
            ends: dict[str, int] = {}
            for line in starts.get(c["start"], ()):
                m = _READY_LINE.search(line)
                if m and m.group(1) not in ends:
                    ends[m.group(1)] = int(m.group(2))
            out.append({"process": "nemesis", "type": "ok", "f": "power-cut", "time": c["at"],
                        "value": {"at": c["at"], "ready": c["ready"], "policy": policy, "ends": ends}})
        return out

    def _kill_group_and_restart(self, kind: str, what: str, detail: str,
                                between: Callable[[], None] | None = None) -> None:
        """kill -9 of the whole process group, ``between`` (the power cut's loss of unsynced
        writes), a restart on the same data dir; ``detail`` gets the seconds it took."""
        with self.lock:
            pid = self.app.proc.pid
            at, t = self.now(), time.monotonic()
            code = self.app.kill_all()
            if code != -signal.SIGKILL:
                self.findings.unexpected_exits.append(
                    f"the supervisor had exited with status {code} before {what} at {at:.1f}s")
            if between is not None:
                between()
            self._restart()
            self.record(FaultEvent(at, kind, f"group {pid}", detail.format(time.monotonic() - t)))

    def _bit_flip(self) -> None:
        o = self.opts
        if not any(sealed_segments(os.path.join(self.app.data_dir, f"{o.topic}-{p}")) for p in range(o.partitions)):
            self.record(FaultEvent(self.now(), "bit-flip", detail="no sealed segment yet", skipped=True))
            return
        running = self.rng.random() < 0.5
        with self.lock:
            at, t = self.now(), time.monotonic()
            if not running:
                code = self.app.kill_all()
                if code != -signal.SIGKILL:
                    self.findings.unexpected_exits.append(
                        f"the supervisor had exited with status {code} before kill -9 at {at:.1f}s")
            d = flip_sealed_batch(self.app.data_dir, o.topic, o.partitions, self.rng, self.damaged,
                                  self.now(), running)
            if not running:
                self._restart()
        if d is None:
            self.record(FaultEvent(at, "bit-flip", detail="no undamaged batch in a sealed segment", skipped=True))
            return
        self.damaged.append(d)
        how = "under the running appliance" if running else \
            f"while it was down (restarted in {time.monotonic() - t:.1f}s)"
        self.record(FaultEvent(at, "bit-flip", d.key, f"offsets {d.first}-{d.last}, byte {d.position} of "
                               f"{os.path.basename(d.file)}, {how}"))

    def _disk_full(self) -> None:
        if self.disk is None or isinstance(self.disk, LazyDisk):
            self.record(FaultEvent(self.now(), "disk-full", detail="no small disk (--disk loop or tmpfs)",
                                   skipped=True))
            return
        if any(p[1] == "disk-full" for p in self._pending):
            self.record(FaultEvent(self.now(), "disk-full", detail="the disk is full already", skipped=True))
            return
        seconds = self.rng.uniform(*self.opts.disk_hold)
        at = self.now()
        size = self.disk.fill()
        self.record(FaultEvent(at, "disk-full", self.disk.kind,
                               f"ballast {size / MiB:.1f} MiB, {self.disk.free_bytes()} bytes left, held {seconds:.1f}s"))
        self._later(seconds, "disk-full", self.disk.free)

    def heal(self) -> None:
        """End every fault in force: SIGCONT what is paused, free the disk, the appliance up."""
        self._end_due(everything=True)
        for pid in list(self._paused):
            self._resume(pid, _start_time(pid))
        if self.disk is not None:
            self.disk.free()
        try:
            self.watch()
        except Exception as e:              # reported with the run's results
            self.error = self.error or e

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ev in self.events:
            if not ev.skipped and ev.kind in FAULT_KINDS:
                out[ev.kind] = out.get(ev.kind, 0) + 1
        return out


_READY_LINE = re.compile(r"\] appliance\.writer: (\S+) ready: log start \d+, log end (\d+)")
_START_MARK = re.compile(r"^--- chaos: start (\d+) ---$")


def _log_sections(path: str) -> dict[int, list[str]]:
    """The appliance log's lines per start (``Appliance.start`` writes the marker)."""
    out: dict[int, list[str]] = {}
    n = 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = _START_MARK.match(line.rstrip("\n"))
                if m:
                    n = int(m.group(1))
                    continue
                out.setdefault(n, []).append(line)
    except OSError:
        pass
    return out


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
