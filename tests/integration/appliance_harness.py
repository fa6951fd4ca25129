"""The appliance process harness: start, drive and stop the real appliance in integration tests.

Every test gets its own appliance: ``appliance run`` as a subprocess (its own process group, so
that the whole appliance can be killed with one signal), on a free port, with a temporary data dir
and a config file written by the test. Nothing is mocked. Tests that need to act at a precise
moment (a long-poll parked, a request queued in a ring) wait on the runtime directory's state
pages and rings, read only, through the white-box helpers of ``Appliance``.

Also here: the paths tests run things by (``ROOT``, the ``appliance`` executable, ``PROGRAMS``:
the Python programs a test runs as their own process), a module-scoped appliance
(``shared_appliance``, configured by the module's ``APPLIANCE_CONFIG``, and ``module_appliance``
for fixtures of their own) with the guard that fails a test when the appliance logged an error
or died during it (``watch_shared_appliance``, ``watching``), and the signal helpers that stop a
worker for a while. Runs in the pytest process; the per-test fixtures (``appliance``,
``appliance_factory``) are in conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from appliance.catalog.view import PUBLISHED_FILE, read_published
from appliance.runtime import (FRONTEND_PAGE_FIELDS, PARTITION_PAGE_FIELDS, READY, page_fields,
                               read_processes, run_dir_of, writer_name)
from shm.ring import Ring
from shm.statepage import StatePage
from shm.topology import Topology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "loadtests"))
import ports  # noqa: E402  (loadtests/ports.py: one port picker for tests and benchmarks)
APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")
# The Python programs tests run by path as processes of their own (never imported).
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


def free_port() -> int:
    """A port nothing is bound to, below the kernel's ephemeral range, from this pytest
    process's share of it (``loadtests/ports.py`` says why)."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0) % workers
    return ports.free_port("127.0.0.1", worker, workers)


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(v)


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def write_config(path: str, sections: dict) -> None:
    lines = []

    def emit(prefix, table):
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars or not prefix:
            if prefix:
                lines.append(f"[{prefix}]")
            lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                emit(f"{prefix}.{k}" if prefix else k, v)

    emit("", sections)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


@dataclass
class Appliance:
    data_dir: str
    log_path: str
    config: dict = field(default_factory=dict)
    port: int = 0
    proc: subprocess.Popen | None = None
    # With server.listeners: protocol -> port, and the SSL context the readiness check uses on a
    # TLS listener (use_listeners).
    listener_ports: dict = field(default_factory=dict)
    ready_ssl: object = None
    args: list = field(default_factory=list)     # more `appliance run` flags (--log-format)
    env: dict = field(default_factory=dict)      # more environment (NOTIFY_SOCKET)

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port()
        self.config_path = os.path.join(os.path.dirname(self.log_path), f"appliance-{self.port}.toml")

    def use_listeners(self, ports: dict, ssl_context=None) -> None:
        """The configuration names server.listeners: no --listen flag; ``port`` (bootstrap) is
        the PLAINTEXT listener's if there is one, and readiness is checked on a listener that
        serves ApiVersions before authentication (through TLS with ``ssl_context``)."""
        self.listener_ports = dict(ports)
        for proto in ("PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"):
            if proto in ports:
                self.port = ports[proto]
                self.ready_ssl = ssl_context if proto in ("SSL", "SASL_SSL") else None
                break

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, wait: bool = True, timeout: float = 60.0) -> "Appliance":
        # No disk reserve: every test's data dir would hold 64 MiB of real blocks in the tmp dir.
        self._write_config()
        with open(self.log_path, "ab") as log:      # the child keeps its own copy of the fd
            listen = [] if self.listener_ports else ["--listen", self.bootstrap]
            self.proc = subprocess.Popen(
                [APPLIANCE, "run", "--config", self.config_path, *listen,
                 "--data-dir", self.data_dir, *self.args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**{k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")},
                     **self.env})
        if wait:
            self.wait_ready(timeout)
        return self

    def _write_config(self) -> None:
        cfg = {"server": {"frontends": 2, "fetchers": 1, "disk_reserve_bytes": 0},
               "supervisor": {"shutdown_timeout_ms": 20000}}
        for section, values in self.config.items():
            cfg.setdefault(section, {})
            for k, v in values.items():
                if isinstance(v, dict):
                    cfg[section].setdefault(k, {}).update(v)
                else:
                    cfg[section][k] = v
        write_config(self.config_path, cfg)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"appliance exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._api_versions_ok():
                return
            time.sleep(0.05)
        raise TimeoutError(f"appliance not ready after {timeout}s:\n{self.log_tail()}")

    def _api_versions_ok(self) -> bool:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=1.0)
            try:
                if self.ready_ssl is not None:
                    s = self.ready_ssl.wrap_socket(s, server_hostname="127.0.0.1")
                # ApiVersions v0: header v1 (key, version, correlation id, client id), empty body.
                body = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
                s.sendall(struct.pack(">i", len(body)) + body)
                s.settimeout(2.0)
                head = s.recv(8)
                return len(head) == 8 and struct.unpack(">ii", head)[1] == 7
            finally:
                s.close()
        except OSError:
            return False

    def log_tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    # -- processes ------------------------------------------------------------------------------
    @property
    def run_dir(self) -> str:
        return run_dir_of(self.data_dir)

    def processes(self) -> dict:
        return read_processes(self.run_dir)

    def workers(self, role: str | None = None, topic: str | None = None) -> list[dict]:
        """The running workers (of ``role``; with ``topic``: the writer processes that carry a
        partition of it)."""
        return [w for w in self.processes()["workers"]
                if (role is None or w["role"] == role) and w["pid"]
                and (topic is None or any(t == topic for t, _ in w.get("partitions", ())))]

    def all_workers_ready(self) -> bool:
        """Whether every worker in the process table has published READY on its state page. The
        harness takes the appliance as ready once it answers ApiVersions, which can be before the
        last worker (a fetcher, say) has made its files."""
        topo = Topology(self.run_dir)
        for w in self.workers():
            with StatePage.open(topo.page_path(w["name"]), page_fields(w["role"]), readonly=True) as page:
                if page.read().status != READY:
                    return False
        return True

    def writer(self, topic: str, partition: int) -> dict:
        """The row of the writer process that carries the partition (pid, generation, name)."""
        for w in self.workers("writer", topic):
            if [topic, partition] in w["partitions"]:
                return w
        raise KeyError((topic, partition))

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = predicate()
            except (OSError, KeyError, ValueError):
                got = None
            if got:
                return got
            time.sleep(0.05)
        raise TimeoutError(f"timed out waiting for {what}:\n{self.log_tail()}")

    # -- white box: the runtime directory's pages and rings, to wait on what the workers do --------
    def writer_endpoint(self, topic: str, partition: int) -> str:
        """The endpoint of the writer process that carries a partition (its rings' name)."""
        return self.writer(topic, partition)["name"]

    def partition_name(self, topic: str, partition: int) -> str:
        """A partition's name in the runtime dir (its state page's and metrics table's)."""
        cat = read_published(os.path.join(self.run_dir, PUBLISHED_FILE))
        return writer_name(cat.topics[topic].topic_id, partition)

    def _partition_page(self, topic: str, partition: int) -> StatePage:
        path = Topology(self.run_dir).page_path(self.partition_name(topic, partition))
        return StatePage.open(path, PARTITION_PAGE_FIELDS, readonly=True)

    def fetch_parked(self, topic: str, partition: int = 0) -> bool:
        """Whether a fetcher holds a long-poll parked on this partition: while it does, it keeps its
        flag byte set on the partition's state page (the writer rings it after an append)."""
        with self._partition_page(topic, partition) as page:
            return page.any_flag()

    def partition_state(self, topic: str, partition: int = 0):
        """The partition's state page as its writer last published it (high watermark, LSO,
        log start, active segment base, segments version, status, generation...)."""
        with self._partition_page(topic, partition) as page:
            return page.read()

    def high_watermark(self, topic: str, partition: int = 0) -> int:
        """The high watermark the partition's writer last published on its state page."""
        with self._partition_page(topic, partition) as page:
            return page.read().high_watermark

    def frontend_connections(self) -> dict[str, tuple[int, int]]:
        """frontend name -> (client connections open, connections refused), from the
        frontends' state pages."""
        out = {}
        topo = Topology(self.run_dir)
        for w in self.workers("frontend"):
            with StatePage.open(topo.page_path(w["name"]), FRONTEND_PAGE_FIELDS, readonly=True) as page:
                st = page.read()
                out[w["name"]] = (st.connections, st.refused_connections)
        return out

    def ring_pending(self, src: str, dst: str) -> bool:
        """Whether ring src -> dst holds records its consumer has not taken yet."""
        with Ring.open(Topology(self.run_dir).ring_path(src, dst)) as ring:
            return not ring.empty()

    # -- stopping -------------------------------------------------------------------------------
    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reap_group()

    def kill9_all(self) -> None:
        """kill -9 the whole process group (supervisor and every worker) at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self._reap_group()

    def _reap_group(self) -> None:
        # Make sure no worker outlives the test, whatever happened to the supervisor.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)

    def reload(self, **changes) -> None:
        """Rewrite the config file with ``changes`` merged in (as ``config``), then SIGHUP."""
        for section, values in changes.items():
            self.config.setdefault(section, {}).update(values)
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)

    def restart(self, **kw) -> "Appliance":
        return self.start(**kw)


# -- one appliance for a whole test module ------------------------------------------------------------

def module_appliance(tmp_path_factory, name: str, config: dict, start: bool = True) -> Appliance:
    """An appliance in a fresh temporary folder named after ``name``, started unless told not to;
    the module-scoped fixture that asked for it terminates it."""
    d = tmp_path_factory.mktemp(name)
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"), config=config)
    return a.start() if start else a


@pytest.fixture(scope="module")
def shared_appliance(tmp_path_factory, request):
    """One appliance for the whole test module (config from the module's APPLIANCE_CONFIG)."""
    a = module_appliance(tmp_path_factory, request.module.__name__.rsplit(".", 1)[-1],
                         getattr(request.module, "APPLIANCE_CONFIG", {}))
    yield a
    a.terminate()


ERROR_MARKERS = (" ERROR ", " CRITICAL ", "Traceback")


def log_errors(a: Appliance, since: int) -> list[str]:
    with open(a.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if any(m in line for m in ERROR_MARKERS)]


@contextmanager
def watching(request, a: Appliance):
    """Around one test on an appliance shared by its module: print the log tail when the test
    fails, and fail a test that passed while the appliance logged an error or died (clients
    retry, and a retry must not hide a crashed worker)."""
    since = os.path.getsize(a.log_path)
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"\n--- appliance log {a.log_path} (tail) ---\n{a.log_tail(120)}")
        return
    if request.node.get_closest_marker("xfail") is not None:
        return
    errors = log_errors(a, since)
    alive = a.proc is not None and a.proc.poll() is None
    if errors or not alive:
        pytest.fail(f"appliance {'died' if not alive else 'logged errors'} during the test "
                    f"(log {a.log_path}):\n" + "\n".join(errors[:20]) + "\n" + a.log_tail(60))


@pytest.fixture(autouse=True)
def watch_shared_appliance(request):
    """``watching`` for every test of the module on ``shared_appliance`` (a module opts in by
    importing this fixture)."""
    if "shared_appliance" not in request.fixturenames:
        yield
        return
    with watching(request, request.getfixturevalue("shared_appliance")):
        yield


# -- workers stopped for a while ------------------------------------------------------------------------

@contextmanager
def stopped(pid):
    """The process ``pid`` stopped with SIGSTOP for the duration of the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def coordinator_pid(app):
    (w,) = app.workers("coordinator")
    return w["pid"]


def eventually(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
