"""The supervisor's rules for dead and silent workers, driven without forking: fork, waitpid,
kill and the clocks are the supervisor's attributes, replaced here by a fake system."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from types import SimpleNamespace

import pytest

from appliance.catalog.model import Catalog
from appliance.supervisor.catalog_store import CatalogStore
from appliance.config import Config, ServerConfig, SupervisorConfig, TopicsConfig
from appliance.runtime import (EXIT_CRASH_LOOP, HEARTBEAT_FILE, RECOVERING, STOPPED, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR, WORKER_PAGE_FIELDS,
                               WORKER_DATA_DIR_ERROR, EXIT_DATA_DIR)
from appliance.supervisor import Supervisor
from shm.heartbeat import HeartbeatTable
from shm.metrics import MetricsTable
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
    # A short path: a doorbell's socket path holds at most 107 bytes, and a writer's name is 34
    # characters (pytest's tmp_path under xdist left too few).
    s.run_dir = tempfile.mkdtemp(prefix="sup-", dir="/tmp")
    s._pid = os.getpid()
    s.topo = Topology(s.run_dir)
    s.writers.topo = s.topo
    s.hb = HeartbeatTable.create(os.path.join(s.run_dir, HEARTBEAT_FILE), 64)
    s.page = StatePage.create(s.topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS)
    os.makedirs(cfg.server.data_dir)
    s.store = CatalogStore(cfg.server.data_dir)
    s.store.load()
    yield s
    s.topo.close()
    shutil.rmtree(s.run_dir, ignore_errors=True)


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


def test_a_worker_with_damaged_state_stops_the_appliance_with_exit_3(sup):
    """A coordinator whose log is damaged (issue 34) exits WORKER_DATA_DIR_ERROR: not restarted
    into the same damage, and ``appliance run`` exits 3 as for a damaged catalog."""
    spec = start_fetcher(sup)
    sup.fake.exit(spec.pid, WORKER_DATA_DIR_ERROR)
    sup._reap()
    assert sup.stopping and sup.exit_code == EXIT_DATA_DIR == 3
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


# -- what the supervisor tells systemd (appliance.supervisor.operating) -------------------------

@pytest.fixture
def notify(tmp_path, monkeypatch):
    import socket
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)

    def received() -> list[str]:
        out = []
        while True:
            try:
                out.append(s.recv(4096).decode())
            except BlockingIOError:
                return out
    yield received
    s.close()


def test_the_watchdog_pings_only_while_every_heartbeat_is_fresh(sup, notify):
    from appliance.supervisor.systemd import Watchdog
    sup.operating.watchdog = Watchdog({"WATCHDOG_USEC": "4000000"})   # fresh: beaten within 2 s
    spec = start_fetcher(sup)
    sup.hb.beat(spec.heartbeat_slot, sup.fake.clock_ns())
    sup.operating.watchdog_turn(sup.clock(), sup.silent_workers)
    assert notify() == ["WATCHDOG=1"]
    sup.fake.now += 2.5                                         # the fetcher stopped beating
    sup.operating.watchdog_turn(sup.clock(), sup.silent_workers)
    got = notify()
    assert len(got) == 1 and got[0].startswith("STATUS=watchdog withheld: no heartbeat from "
                                               "fetcher 0 (2.5 s)")
    sup.fake.now += 1
    sup.operating.watchdog_turn(sup.clock(), sup.silent_workers)
    assert notify() == []                                       # still withheld, said once
    sup.hb.beat(spec.heartbeat_slot, sup.fake.clock_ns())
    sup.fake.now += 1
    sup.operating.watchdog_turn(sup.clock(), sup.silent_workers)
    assert notify() == ["WATCHDOG=1"]


def test_a_reload_publishes_the_new_configuration_and_runs_the_hooks(sup, notify, tmp_path):
    from appliance import reload
    from appliance.config import LogConfig
    from shm.metrics import MetricsTable
    sup.operating.metrics = MetricsTable.anonymous(64)
    new = Config(server=sup.cfg.server, supervisor=sup.cfg.supervisor,
                 log=LogConfig(retention_ms=5000))
    sup.operating.source = lambda: new
    seen = []
    sup.operating.reload_hooks.append(
        lambda old, cfg: seen.append((old.log.retention_ms, cfg.log.retention_ms)))
    sup.operating.serving = True
    sup.store = SimpleNamespace(catalog=Catalog())
    sup.bound_port = 9092
    sup.reload()
    assert sup.cfg.log.retention_ms == 5000 and sup.operating.config_version == 1
    assert sup.page.read().config_version == 1
    assert reload.read_published(reload.file_path(sup.run_dir)).log.retention_ms == 5000
    assert seen == [(Config().log.retention_ms, 5000)]
    got = notify()
    assert got[0].startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert got[-1].startswith("READY=1\nSTATUS=serving on ")
    assert dict(sup.operating.metrics.items())["appliance_config_reloads|result=applied"] == 1
    # A worker forked from now on gets the new configuration and its version.
    spec = start_fetcher(sup)
    ctx = sup._context(spec)
    assert ctx.config is sup.cfg and ctx.config_version == 1


def test_reload_hooks_run_before_the_version_the_workers_follow_moves(sup, notify):
    """What a hook publishes for the workers (re-read certificates, appliance.security) must be
    in place when a worker sees the new config_version and runs its reload."""
    from shm.metrics import MetricsTable
    sup.operating.metrics = MetricsTable.anonymous(64)
    sup.operating.source = lambda: sup.cfg
    seen = []
    sup.operating.reload_hooks.append(lambda old, cfg: seen.append(sup.page.read().config_version))
    sup.store = SimpleNamespace(catalog=Catalog())
    sup.reload()
    assert seen == [0] and sup.page.read().config_version == 1


def test_recovery_reports_partitions_ready_bytes_and_an_estimate(sup, notify, caplog, tmp_path):
    from appliance.catalog.model import TopicInfo
    from appliance.data_layout import partition_dir
    from appliance.metrics import key
    from appliance.supervisor.operating import PROGRESS_LOG_S
    from appliance.runtime import READY
    topic = TopicInfo(name="t", topic_id=bytes(16), partitions=2, configs={})
    entries = []
    for p in range(2):
        d = partition_dir(sup.data_dir, "t", p)
        os.makedirs(d)
        with open(os.path.join(d, "00000000000000000000.log"), "wb") as f:
            f.write(b"x" * 1000)
        entries.append(sup.add_partition(topic, p))
    sup.spawn_writers(sup.writers.processes)
    progress = sup.operating.recovery_progress(entries, sup.clock())
    assert progress.total_bytes == 2000
    import logging
    with caplog.at_level(logging.INFO, "appliance.supervisor"):
        progress.turn(sup.clock(), sup.partition_ready)
        assert notify() == ["STATUS=recovering 0/2 partitions"]
        page_of(sup, entries[0], generation=entries[0].process.generation, status=READY)
        with MetricsTable.open(sup.topo.metrics_path(entries[1].name)) as t:
            t.set(key("appliance_log_recovery_bytes", [("topic", "t"), ("partition", 1)]), 500)
        sup.fake.now += PROGRESS_LOG_S
        progress.turn(sup.clock(), sup.partition_ready)
        assert notify() == ["STATUS=recovering 1/2 partitions"]
        assert "recovery: 1/2 partitions ready, 1.5 KiB of 2.0 KiB of logs checked in 5 s, " \
               "about 2 s left" in caplog.text
        page_of(sup, entries[1], generation=entries[1].process.generation, status=READY)
        progress.turn(sup.clock(), sup.partition_ready)
        sup.operating.recovery_finished(progress, sup.clock())
    assert notify() == ["STATUS=recovering 2/2 partitions"]
    assert "recovered 2 partitions (2.0 KiB of logs) in 5.0 s" in caplog.text
    assert dict(sup.operating.metrics.items())["appliance_recovery_seconds"] == 5_000_000


# -- writer processes and the partitions they carry (issue 32) --------------------------------------

def page_of(s: Supervisor, entry, **fields) -> None:
    """Publish on a partition's state page as its writer process would."""
    from appliance.runtime import PARTITION_PAGE_FIELDS
    with StatePage.open(s.topo.page_path(entry.name), PARTITION_PAGE_FIELDS) as page:
        page.publish(**fields)


def topics(s: Supervisor, processes: int = 0, k: int = 1) -> None:
    s.cfg = Config(server=s.cfg.server, supervisor=s.cfg.supervisor,
                   topics=TopicsConfig(writer_processes=processes, partitions_per_writer=k))
    s.writers.configure(processes, k)


def partitions_of(s: Supervisor, name: str, tid: bytes, partitions: int) -> list:
    from appliance.catalog.model import TopicInfo
    t = TopicInfo(name, tid * 16, partitions)
    return [s.add_partition(t, p) for p in range(partitions)]


def carried(s: Supervisor) -> dict[str, list[str]]:
    return {spec.name: [f"{e.topic.name}-{e.index}" for e in spec.partitions]
            for spec in s.writers.processes}


def test_a_process_a_partition_up_to_the_budget_then_the_least_loaded(sup):
    topics(sup, processes=3)
    a = partitions_of(sup, "a", b"\x01", 5)
    b = partitions_of(sup, "b", b"\x02", 2)
    assert carried(sup) == {"wp0": ["a-0", "a-3", "b-1"], "wp1": ["a-1", "a-4"], "wp2": ["a-2", "b-0"]}
    sup.spawn_writers(sup.writers.processes)
    assert sorted(sup.by_pid) == [100, 101, 102]
    assert all(e.process.generation == 1 for e in a + b)


def test_explicit_writer_hosts_carry_k_partitions_each_across_topics(sup):
    topics(sup, processes=1, k=3)
    partitions_of(sup, "a", b"\x01", 5)
    partitions_of(sup, "b", b"\x02", 2)
    assert carried(sup) == {"wp0": ["a-0", "a-1", "a-2"], "wp1": ["a-3", "a-4", "b-0"], "wp2": ["b-1"]}


def test_a_writer_processs_partitions_restart_with_it(sup):
    topics(sup, processes=1)
    es = partitions_of(sup, "a", b"\x01", 4)
    sup.spawn_writers(sup.writers.processes)
    (spec,) = sup.writers.processes
    sup.fake.exits.append((100, signal.SIGKILL))
    sup._reap()
    assert spec.pid is None and not sup.stopping and sup.by_pid == {}
    sup.fake.now += BACKOFF_MS / 1000
    sup._respawn_due()
    assert spec.pid == 101 and spec.generation == 2 and [e.process for e in es] == [spec] * 4
    assert list(sup.by_pid) == [101]


def test_a_silent_writer_process_is_killed(sup):
    topics(sup, processes=2)
    partitions_of(sup, "a", b"\x01", 2)
    sup.spawn_writers(sup.writers.processes)
    w0, w1 = sup.writers.processes
    sup.hb.beat(w1.heartbeat_slot, sup.fake.clock_ns())
    sup.hb.beat(w0.heartbeat_slot, sup.fake.clock_ns() + int(HEARTBEAT_MS * 1e6))
    sup.fake.now += HEARTBEAT_MS / 1000 + 1              # the second one stopped beating
    assert [(s.name, age > 0) for s, age in sup.silent_workers(HEARTBEAT_MS * 1_000_000)] == \
        [("wp1", True)]
    sup._murder_stale()
    assert sup.fake.kills == [(101, signal.SIGKILL)]


def test_regression_a_worker_slow_to_its_first_beat_was_killed_by_a_short_heartbeat_timeout(sup):
    # Jepsen-sized chaos run 1 (issue 34): with a 5 s timeout on a loaded box every new
    # coordinator was killed before its first beat, until the crash-loop rule stopped the
    # appliance. A worker that has not beaten yet has FIRST_BEAT_GRACE_NS from its spawn.
    from appliance.supervisor.supervisor import FIRST_BEAT_GRACE_NS
    topics(sup, processes=1)
    partitions_of(sup, "a", b"\x01", 1)
    sup.spawn_writers(sup.writers.processes)
    short_ns = 5_000_000_000
    sup.fake.now += 6                                     # past the timeout, not yet beaten
    assert list(sup.silent_workers(short_ns)) == []
    sup._murder_stale()
    assert sup.fake.kills == []
    sup.fake.now += FIRST_BEAT_GRACE_NS / 1e9             # never beat: hung in its start
    assert [s.name for s, _ in sup.silent_workers(short_ns)] == ["wp0"]


def test_a_deleted_topic_leaves_its_processes_and_an_emptied_one_stops(sup):
    from appliance.runtime import READY, STOPPED
    topics(sup, processes=2)
    a = partitions_of(sup, "a", b"\x01", 1)
    partitions_of(sup, "b", b"\x02", 2)
    sup.spawn_writers(sup.writers.processes)
    for e in sup.writers.partitions.values():             # open in their processes
        page_of(sup, e, generation=e.process.generation, status=READY)
    assert carried(sup) == {"wp0": ["a-0", "b-1"], "wp1": ["b-0"]}
    gone = sup.stop_partitions(a[0].topic)
    assert gone == a and carried(sup) == {"wp0": ["b-1"], "wp1": ["b-0"]}
    assert not sup.partition_stopped(a[0])                # its process still has it open
    page_of(sup, a[0], generation=a[0].process.generation, status=STOPPED)
    assert sup.partition_stopped(a[0])
    b = [e for e in sup.writers.partitions.values()]
    gone_b = sup.stop_partitions(b[0].topic)
    assert carried(sup) == {"wp0": [], "wp1": []}
    assert sorted(sup.fake.kills) == [(100, signal.SIGTERM), (101, signal.SIGTERM)]
    sup.fake.exits += [(100, 0), (101, 0)]
    sup._reap()
    assert all(sup.partition_stopped(e) for e in gone_b)
    from shm.doorbell import BellSender
    sup.bells = BellSender()
    try:
        sup.release_partitions(gone_b + gone)
    finally:
        sup.bells.close()
    assert sup.writers.processes == [] and "wp0" not in sup.workers


def test_wake_writers_rings_the_bell_of_each_running_writer_process(sup):
    """A published catalog, assignment or configuration reaches an idle writer process now, not
    after its sleep of up to seconds (workers.writer_process, IDLE_WRITER_WAIT_S)."""
    from shm.doorbell import BellSender, Doorbell
    topics(sup, processes=3)
    partitions_of(sup, "a", b"\x01", 3)
    sup.spawn_writers(sup.writers.processes[:2])         # the third is not running
    bells = {s.name: Doorbell(sup.topo.bell_path(s.name)) for s in sup.writers.processes}
    sup.bells = BellSender()
    try:
        sup.wake_writers()
        assert {name: bell.drain() for name, bell in bells.items()} == \
            {"wp0": 1, "wp1": 1, "wp2": 0}
    finally:
        sup.bells.close()
        for bell in bells.values():
            bell.close()


def test_a_writer_whose_supervisor_page_moved_looks_at_the_catalog_in_that_turn(sup):
    """The other half of the wake-up: the rung writer process's turn sees the page move and
    follows the catalog at once, not at its next periodic look. Built in this process from the
    supervisor's own runtime files (no fork)."""
    from appliance.catalog.view import PUBLISHED_FILE, publish
    from appliance.catalog.model import TopicInfo
    from workers.writer_process import WriterProcess
    t = sup.store.add_topics([TopicInfo("a", b"\x01" * 16, 1)]).topics["a"]
    published = sup.topo.file_path(PUBLISHED_FILE)
    publish(sup.store.catalog, published)
    entry = sup.add_partition(t, 0)
    sup.writers.publish()
    spec = entry.process
    spec.generation = 1
    w = WriterProcess(sup._context(spec))
    try:
        assert w.setup() is None
        assert w.turn() is not None                     # idle; the first turn follows the catalog
        member = w.partitions[(t.topic_id, 0)]
        assert member.overrides == {}
        publish(sup.store.set_configs({"a": {"retention.ms": "60000"}}), published)
        w.next_catalog_check = float("inf")             # its periodic look would never come
        sup.page.publish(catalog_version=sup.store.catalog.version)
        w.turn()
        assert member.overrides == {"retention.ms": "60000"}
        assert member.log.settings.retention_ms == 60000
    finally:
        w.close()
        w.release()


def test_the_supervisor_implements_the_process_table_topic_admin_is_given(sup):
    """TopicAdmin reaches the process table only through ProcessTable (no private member of the
    supervisor), and the Supervisor has every method of it."""
    import inspect
    from appliance.supervisor import process_table, topic_admin
    methods = [n for n, v in vars(process_table.ProcessTable).items()
               if inspect.isfunction(v) and not n.startswith("_")]
    assert methods and all(callable(getattr(sup, n)) for n in methods)
    assert sup.topic_admin.table is sup
    assert "table._" not in inspect.getsource(topic_admin)
