"""What a start checks before it serves, in the supervisor process and without forking: the
memory estimate of the catalog's partitions (one estimate with CreateTopics, and a warning, never
a refusal, at start) and the data dir's lock (held by a live appliance: refused at once; held
only by the exiting workers of an appliance whose supervisor is gone: waited for)."""

from __future__ import annotations

import fcntl
import logging
import os
import threading

import psutil
import pytest

from appliance.config import Config, ServerConfig
from appliance.errors import ErrorCode
from appliance.runtime import DataDirUnusable, RuntimeDirUnusable
from appliance.supervisor import Supervisor
from appliance.supervisor import dirs, memory
from appliance.supervisor.dirs import SupervisorDirs

MiB = 1 << 20


# -- the memory estimate ----------------------------------------------------------------------------

def fake_room(monkeypatch, free: int, available: int) -> None:
    monkeypatch.setattr(memory, "memory_room", lambda run_dir: (free, available))


def supervisor(tmp_path) -> Supervisor:
    sup = Supervisor(Config(server=ServerConfig(frontends=2, data_dir=str(tmp_path / "data"))))
    sup.run_dir = str(tmp_path)
    return sup


def need(sup, partitions: int, ring: int | None = None) -> tuple[int, int]:
    """(runtime-dir bytes, memory bytes) of ``partitions`` laid out at start: one writer
    process each up to the budget, then spread over the budget's processes."""
    procs = min(partitions, sup.writers.budget)
    p_shm, p_mem = memory.process_cost(sup.cfg, 2, ring)
    t_shm, t_mem = memory.partition_cost()
    return procs * p_shm + partitions * t_shm, procs * p_mem + partitions * t_mem


def test_start_after_a_crash_with_900_partitions_warns_and_serves(tmp_path, monkeypatch, caplog):
    """Regression: 900 partitions accepted one CreateTopics of 100 at a time, then after a kill -9
    the start exited 7: at run time the partitions already there count by what they really take,
    at start by the estimate. A start serves what the broker accepted, with smaller produce rings
    where the configured ones do not fit."""
    sup = supervisor(tmp_path)
    shm, mem = need(sup, 900)
    fake_room(monkeypatch, free=2 * shm, available=mem - 1)          # 900 by the estimate: no
    with caplog.at_level(logging.WARNING, "appliance.supervisor"):
        sup._check_start_memory(900)                                  # no StartFailure
    assert "starting them all with produce rings of 4194304 bytes" in caplog.text
    assert sup.produce_ring_bytes == 4 * MiB == memory.smallest_produce_ring(sup.cfg)
    assert memory.room_problem(sup.cfg, 2, str(tmp_path), 900, sup.produce_ring_bytes,
                               min(900, sup.writers.budget)) is None


def test_start_whose_rings_fit_only_without_the_process_estimate_serves(tmp_path, monkeypatch, caplog):
    sup = supervisor(tmp_path)
    shm, mem = need(sup, 900, memory.smallest_produce_ring(sup.cfg))
    fake_room(monkeypatch, free=2 * shm, available=shm + 1)
    with caplog.at_level(logging.WARNING, "appliance.supervisor"):
        sup._check_start_memory(900)
    assert "starting them all" in caplog.text


def test_start_whose_smallest_rings_cannot_be_held_exits_7_not_oom_killed(tmp_path, monkeypatch):
    sup = supervisor(tmp_path)
    shm, mem = need(sup, 900, memory.smallest_produce_ring(sup.cfg))
    fake_room(monkeypatch, free=2 * shm, available=shm - 1)
    with pytest.raises(RuntimeDirUnusable, match="even at the smallest size"):
        sup._check_start_memory(900)


def test_create_and_start_use_one_estimate(tmp_path, monkeypatch):
    cfg = Config(server=ServerConfig(frontends=2))
    p_shm, p_mem = memory.process_cost(cfg, 2)
    t_shm, t_mem = memory.partition_cost()
    fake_room(monkeypatch, free=1 << 40, available=2 * p_mem + 100 * t_mem)
    assert memory.room_problem(cfg, 2, str(tmp_path), 100, processes=2) is None
    code, why = memory.room_problem(cfg, 2, str(tmp_path), 101, processes=2)
    assert code == ErrorCode.policy_violation and "101 more partitions" in why
    fake_room(monkeypatch, free=2 * p_shm + 10 * t_shm, available=1 << 40)
    code, why = memory.room_problem(cfg, 2, str(tmp_path), 11, processes=2)
    assert code == ErrorCode.kafka_storage_error and "11 more partitions" in why


# -- the data dir's lock ----------------------------------------------------------------------------

def lock_dirs(data_dir: str, wait_s: float) -> SupervisorDirs:
    d = SupervisorDirs(data_dir, os.path.join(data_dir, "run"), node_id=1, lock_wait_s=wait_s)
    d._lock_fd = os.open(os.path.join(data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    return d


@pytest.fixture
def held(tmp_path):
    """The lock file, held through another open file description (as an old appliance's
    processes hold theirs), naming ``pid`` as the supervisor that wrote it."""
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def name(pid: int) -> int:
        os.pwrite(fd, f"{pid}\n".encode(), 0)
        return fd
    yield name
    os.close(fd)


def dead_pid() -> int:
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


def test_lock_held_by_a_live_supervisor_is_refused_at_once(tmp_path, held, monkeypatch):
    held(os.getpid())
    monkeypatch.setattr(dirs, "lock_holders", lambda path: [psutil.Process()])
    d = lock_dirs(str(tmp_path), wait_s=60)
    with pytest.raises(DataDirUnusable, match="locked by another appliance process"):
        d._take_lock()


def test_start_right_after_kill9_waits_for_the_dying_workers(tmp_path, held, monkeypatch, caplog):
    """Regression: a start right after a kill -9 of the group exited 3 ("locked by another
    appliance process") while the old workers, each holding the lock, were still dying."""
    fd = held(dead_pid())
    monkeypatch.setattr(dirs, "lock_holders", lambda path: [psutil.Process()])
    monkeypatch.setattr(dirs, "is_supervisor", lambda p: False)
    d = lock_dirs(str(tmp_path), wait_s=60)
    released = threading.Event()

    def release_when_waiting():
        # The last old worker exits once the start says it waits.
        while "waiting up to" not in caplog.text:
            if released.wait(0.01):
                return
        fcntl.flock(fd, fcntl.LOCK_UN)
    t = threading.Thread(target=release_when_waiting)
    with caplog.at_level(logging.INFO, "appliance.supervisor"):
        t.start()
        try:
            d._take_lock()
        finally:
            released.set()
            t.join()
    assert "whose supervisor (pid" in caplog.text and "processes are gone" in caplog.text
    with pytest.raises(BlockingIOError):      # ours now
        fcntl.flock(os.open(tmp_path / ".lock", os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_dying_workers_that_never_exit_are_waited_for_a_bounded_time(tmp_path, held, monkeypatch):
    held(dead_pid())
    monkeypatch.setattr(dirs, "lock_holders", lambda path: [psutil.Process()])
    monkeypatch.setattr(dirs, "is_supervisor", lambda p: False)
    d = lock_dirs(str(tmp_path), wait_s=0.2)
    with pytest.raises(DataDirUnusable, match=r"whose supervisor is gone \(pid \d+\), still running 0.2 s"):
        d._take_lock()


def test_regression_a_start_after_kill9_was_refused_while_the_last_worker_was_in_its_exit(
        tmp_path, held, monkeypatch):
    """Regression (CI): the last old worker, in its exit, had dropped its file table (no holder
    seen in /proc) while the kernel still held its lock; three immediate retries fell in that
    window and the start exited 3 ("locked by another appliance process")."""
    fd = held(dead_pid())
    monkeypatch.setattr(dirs, "lock_holders", lambda path: [])      # the holder, invisible
    d = lock_dirs(str(tmp_path), wait_s=60)
    tries = 0
    real_flock = fcntl.flock

    def flock(f, op):
        nonlocal tries
        tries += 1
        if tries == 5:                     # the exit ends: the kernel releases the lock
            real_flock(fd, fcntl.LOCK_UN)
        return real_flock(f, op)
    monkeypatch.setattr(dirs.fcntl, "flock", flock)
    d._take_lock()
    assert tries == 5
    with pytest.raises(BlockingIOError):      # ours now
        real_flock(os.open(tmp_path / ".lock", os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_lock_held_by_no_process_we_can_see_is_refused_after_a_grace(tmp_path, held, monkeypatch):
    held(dead_pid())                       # another user's appliance, say: never seen
    monkeypatch.setattr(dirs, "lock_holders", lambda path: [])
    monkeypatch.setattr(dirs, "UNSEEN_GRACE_S", 0.2)
    d = lock_dirs(str(tmp_path), wait_s=60)
    with pytest.raises(DataDirUnusable, match="locked by another appliance process"):
        d._take_lock()


def test_lock_holders_sees_every_process_with_the_lock_file_open(tmp_path):
    path = tmp_path / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # Our own process is left out (the start looking for others).
        assert dirs.lock_holders(str(path)) == []
        assert dirs.is_supervisor(psutil.Process()) is False
    finally:
        os.close(fd)
