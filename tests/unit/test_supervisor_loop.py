"""The supervisor's rules for dead and silent workers, driven without forking: fork, waitpid,
kill and the clocks are the supervisor's attributes, replaced here by a fake system."""

from __future__ import annotations

import os
import signal

import pytest

from appliance.config import Config, ServerConfig, SupervisorConfig
from appliance.runtime import (EXIT_CRASH_LOOP, HEARTBEAT_FILE, RECOVERING, STOPPED, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR, WORKER_PAGE_FIELDS)
from appliance.supervisor import Supervisor
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Topology

BACKOFF_MS = 100
RESTARTS = 3
WINDOW_MS = 60_000
HEARTBEAT_MS = 30_000


class FakeSystem:
    """Children that exist only as pids; a clock that moves when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pids = iter(range(100, 10_000))
        self.exits: list[tuple[int, int]] = []          # (pid, wait status) to reap
        self.kills: list[tuple[int, int]] = []

    def fork(self) -> int:
        return next(self.pids)

    def waitpid(self, pid: int, options: int) -> tuple[int, int]:
        if not self.exits:
            return 0, 0
        return self.exits.pop(0)

    def kill(self, pid, sig) -> None:
        self.kills.append((pid, sig))

    def clock(self) -> float:
        return self.now

    def clock_ns(self) -> int:
        return int(self.now * 1e9)

    def exit(self, pid: int, code: int) -> None:
        self.exits.append((pid, code << 8))           # a wait status, as waitpid reports it


@pytest.fixture
def sup(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    cfg = Config(server=ServerConfig(frontends=1, fetchers=1, data_dir=str(tmp_path / "data")),
                 supervisor=SupervisorConfig(restart_backoff_initial_ms=BACKOFF_MS,
                                             restart_backoff_max_ms=10 * BACKOFF_MS,
                                             crash_loop_restarts=RESTARTS,
                                             crash_loop_window_ms=WINDOW_MS,
                                             heartbeat_timeout_ms=HEARTBEAT_MS))
    s = Supervisor(cfg)
    fake = FakeSystem()
    s.fork, s.waitpid, s.kill, s.clock, s.clock_ns = (fake.fork, fake.waitpid, fake.kill,
                                                      fake.clock, fake.clock_ns)
    s.fake = fake
    # What _setup leaves behind, minus the listening socket and the rings.
    s.run_dir = str(tmp_path / "run")
    os.makedirs(s.run_dir)
    s._pid = os.getpid()
    s.topo = Topology(s.run_dir)
    s.hb = HeartbeatTable.create(os.path.join(s.run_dir, HEARTBEAT_FILE), 64)
    s.page = StatePage.create(s.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS)
    yield s
    s.topo.close()


def start_fetcher(s: Supervisor):
    spec = s._add_worker("fetcher", "fx0", 0, lambda ctx: 0)
    s._spawn(spec)
    return spec


def test_a_dead_worker_restarts_after_a_backoff_that_doubles(sup):
    spec = start_fetcher(sup)
    first = spec.pid
    assert (first, spec.generation) == (100, 1) and sup.by_pid[first] is spec
    sup.fake.exit(first, 1)
    sup._reap()
    assert spec.pid is None and not sup.stopping
    sup._respawn_due()
    assert spec.pid is None                            # not before the backoff
    sup.fake.now += BACKOFF_MS / 1000
    sup._respawn_due()
    assert spec.pid == 101 and spec.generation == 2
    sup.fake.exit(spec.pid, 1)
    sup._reap()
    sup.fake.now += BACKOFF_MS / 1000
    sup._respawn_due()
    assert spec.pid is None                            # second death: twice the backoff
    sup.fake.now += BACKOFF_MS / 1000
    sup._respawn_due()
    assert spec.pid == 102 and spec.generation == 3


def test_more_restarts_than_allowed_within_the_window_stop_the_appliance(sup):
    spec = start_fetcher(sup)
    for _ in range(RESTARTS):
        sup.fake.exit(spec.pid, 1)
        sup._reap()
        sup.fake.now += 10.0                           # past any backoff, inside the window
        sup._respawn_due()
        assert spec.pid is not None and not sup.stopping
    sup.fake.exit(spec.pid, 1)
    sup._reap()
    assert sup.stopping and sup.exit_code == EXIT_CRASH_LOOP
    assert sup.page.read().status == STOPPED


def test_deaths_outside_the_window_are_not_a_crash_loop(sup):
    spec = start_fetcher(sup)
    for _ in range(RESTARTS * 3):
        sup.fake.exit(spec.pid, 1)
        sup._reap()
        sup.fake.now += WINDOW_MS / 1000 / RESTARTS + 1
        sup._respawn_due()
        assert not sup.stopping and spec.pid is not None


def test_a_boot_error_stops_the_appliance_without_restarting(sup):
    spec = start_fetcher(sup)
    sup.fake.exit(spec.pid, WORKER_BOOT_ERROR)
    sup._reap()
    assert sup.stopping and sup.exit_code == EXIT_CRASH_LOOP
    assert spec.next_start == 0.0 and spec.pid is None


def test_a_worker_killed_by_a_signal_is_restarted(sup):
    spec = start_fetcher(sup)
    sup.fake.exits.append((spec.pid, signal.SIGKILL))   # wait status of a SIGKILLed child
    sup._reap()
    assert not sup.stopping and spec.next_start > 0


def test_a_stale_heartbeat_is_answered_with_sigkill(sup):
    spec = start_fetcher(sup)
    sup.hb.beat(spec.heartbeat_slot, sup.fake.clock_ns())
    sup.fake.now += HEARTBEAT_MS / 1000 - 1
    sup._murder_stale()
    assert sup.fake.kills == []
    sup.fake.now += 2
    sup._murder_stale()
    assert sup.fake.kills == [(spec.pid, signal.SIGKILL)]


def test_a_worker_that_never_beat_is_timed_from_its_start(sup):
    spec = start_fetcher(sup)
    sup.fake.now += HEARTBEAT_MS / 1000 + 1
    sup._murder_stale()
    assert sup.fake.kills == [(spec.pid, signal.SIGKILL)]


def test_a_recovering_worker_is_not_killed_for_silence(sup):
    spec = start_fetcher(sup)
    spec.page = StatePage.open(sup.topo.page_path(spec.name), WORKER_PAGE_FIELDS)
    spec.page.publish(generation=spec.generation, status=RECOVERING, pid=spec.pid)
    sup.fake.now += HEARTBEAT_MS / 1000 * 10
    sup._murder_stale()
    assert sup.fake.kills == []
    # A predecessor's RECOVERING does not count.
    spec.page.publish(generation=spec.generation - 1)
    sup._murder_stale()
    assert sup.fake.kills == [(spec.pid, signal.SIGKILL)]
