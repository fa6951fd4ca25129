"""workers.base.WorkerProcess: one life cycle for a process of several workers (as a writer host's
members), on real pages and rings in a tmp runtime dir, no fork: READY only once every member has
recovered, SIGTERM stops them all, every member is closed and STOPPED even when one's close
fails, the exit code is the highest."""

from __future__ import annotations

import gc
import os
import signal

import pytest

from appliance.config import Config
from appliance.runtime import (HEARTBEAT_FILE, READY, RECOVERING, STOPPED, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR, WORKER_PAGE_FIELDS,
                               WorkerContext)
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Topology
from workers.base import Worker, WorkerProcess

NAMES = ("wa", "wb")


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    topo = Topology(str(d))
    HeartbeatTable.create(str(d / HEARTBEAT_FILE), 16).close()
    StatePage.create(topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS).close()
    for name in NAMES:
        StatePage.create(topo.page_path(name), WORKER_PAGE_FIELDS).close()
        topo.create_ring("fe0", name, 1 << 16).close()
        topo.create_ring(name, "fe0", 1 << 16).close()
    yield str(d)
    topo.close()


@pytest.fixture(autouse=True)
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    gc.collect()


class Member(Worker):
    def __init__(self, ctx: WorkerContext, log: list, mates: list) -> None:
        super().__init__(ctx)
        self.log = log
        self.mates = mates
        self.boot_error = False
        self.fail_close = False
        self.ready_seen = False
        self.serve(self)

    def setup(self):
        # Nobody is READY while any member recovers.
        assert all(m.page.read().status == RECOVERING for m in self.mates)
        self.log.append(f"setup:{self.name}")
        return WORKER_BOOT_ERROR if self.boot_error else None

    def on_turn(self, now):
        self.ready_seen = all(m.page.read().status == READY for m in self.mates)

    def on_stop(self):
        self.log.append(f"stop:{self.name}")

    def close(self):
        self.log.append(f"close:{self.name}")
        if self.fail_close:
            raise RuntimeError(self.name)


class Host(WorkerProcess):
    """Turns every member once per loop round, as a writer host does (without its poll)."""

    def __init__(self, members: list[Member], rounds: int = 1) -> None:
        self.members = members
        self.stop = False
        self.rounds = rounds

    def loop(self):
        while not self.stop:
            for m in self.members:
                m.turn()
                if m.stop:
                    self.stop = True
            self.rounds -= 1
            if self.rounds <= 0:
                os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def host(run_dir, tmp_path):
    log: list[str] = []
    mates: list[Member] = []
    for i, name in enumerate(NAMES):
        ctx = WorkerContext(config=Config(), role="writer", name=name, index=i, generation=2,
                            heartbeat_slot=i, run_dir=run_dir, data_dir=str(tmp_path),
                            frontends=["fe0"], fetchers=[], listen_fd=-1)
        mates.append(Member(ctx, log, mates))
    yield Host(mates), log
    for m in mates:
        m.release()


def test_members_recover_one_after_the_other_then_serve_and_drain_together(host):
    h, log = host
    assert h.main() == 0
    assert log == ["setup:wa", "setup:wb", "stop:wa", "stop:wb", "close:wa", "close:wb"]
    assert all(m.ready_seen for m in h.members)           # every member READY once all were
    assert all(m.stop for m in h.members)                 # SIGTERM stopped every member
    assert [m.page.read().status for m in h.members] == [STOPPED, STOPPED]


def test_a_boot_error_of_a_member_ends_the_process_before_ready(host):
    h, log = host
    h.members[1].boot_error = True
    assert h.main() == WORKER_BOOT_ERROR
    assert [m.page.read().status for m in h.members] == [RECOVERING, RECOVERING]


def test_every_member_is_closed_when_one_close_fails_and_the_exit_code_is_the_highest(host):
    h, log = host
    h.members[0].fail_close = True
    with pytest.raises(RuntimeError, match="wa"):
        h.main()
    assert log[-2:] == ["close:wa", "close:wb"]
    assert [m.page.read().status for m in h.members] == [STOPPED, STOPPED]
    h2 = Host(h.members)
    h.members[0].fail_close = False
    for m in h.members:
        m.stop = False
    h.members[1].exit(3)                                   # a member's exit stops the process
    assert h2.run() == 3
