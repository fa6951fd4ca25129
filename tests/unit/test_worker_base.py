"""workers.base: the prologue, the registry dispatch, the loop and its hooks, the status page,
the heartbeat, signals and the listening socket, on real rings in a tmp runtime dir, no fork."""

from __future__ import annotations

import gc
import os
import signal
import socket

import pytest

from appliance import ipc
from appliance.config import Config
from appliance.errors import ErrorCode
from appliance.runtime import (DRAINING, HEARTBEAT_FILE, RECOVERING, STOPPED, SUPERVISOR,
                               SUPERVISOR_PAGE_FIELDS, WORKER_BOOT_ERROR, WORKER_PAGE_FIELDS,
                               WorkerContext)
from appliance.service import serves
from shm.doorbell import BellSender
from shm.heartbeat import HeartbeatTable
from shm.statepage import StatePage
from shm.topology import Outbox, Topology
from workers.base import AsyncWorker, Worker

NAME = "fx0"
SLOT = 5
GENERATION = 3


@pytest.fixture
def run_dir(tmp_path):
    """A runtime dir as the supervisor leaves it before forking fx0: heartbeats, the
    supervisor's page, fx0's page, and the rings between fx0 and the frontend fe0."""
    d = tmp_path / "run"
    d.mkdir()
    topo = Topology(str(d))
    HeartbeatTable.create(str(d / HEARTBEAT_FILE), 16).close()
    StatePage.create(topo.page_path(SUPERVISOR), SUPERVISOR_PAGE_FIELDS).close()
    StatePage.create(topo.page_path(NAME), WORKER_PAGE_FIELDS).close()
    topo.create_ring("fe0", NAME, 1 << 16).close()
    topo.create_ring(NAME, "fe0", 1 << 16).close()
    yield str(d)
    topo.close()


def context(run_dir: str, tmp_path, listen_fd: int = -1) -> WorkerContext:
    return WorkerContext(config=Config(), role="fetcher", name=NAME, index=0,
                         generation=GENERATION, heartbeat_slot=SLOT, run_dir=run_dir,
                         data_dir=str(tmp_path), frontends=["fe0"], fetchers=[NAME],
                         listen_fd=listen_fd)


MADE: list[Worker] = []     # every worker a test builds, released after it (no leaked sockets)


@pytest.fixture(autouse=True)
def release_workers():
    yield
    while MADE:
        MADE.pop().release()
    # Anything a test left open is reported by that test, not by whichever runs next.
    gc.collect()


class Recorder(Worker):
    """A small concrete worker: serves DescribeProducers, records every hook call, and stops
    after ``turns`` loop turns."""

    tick_s = 3600.0

    def __init__(self, ctx: WorkerContext, turns: int = 1, boot_error: bool = False) -> None:
        super().__init__(ctx)
        MADE.append(self)
        self.calls: list[str] = []
        self.turns = turns
        self.boot_error = boot_error
        self.serve(self)

    @serves(ipc.DescribeProducersRequest)
    def _describe(self, req: ipc.DescribeProducersRequest) -> ipc.DescribeProducersResult:
        self.calls.append("served")
        return ipc.DescribeProducersResult(ErrorCode.none)

    def setup(self):
        self.calls.append("setup")
        assert self.page.read().status == RECOVERING
        return WORKER_BOOT_ERROR if self.boot_error else None

    def on_tick(self, now):
        self.calls.append("tick")

    def on_turn(self, now):
        self.calls.append("turn")
        self.turns -= 1
        if self.turns <= 0:
            self.stop = True

    def on_stop(self):
        self.calls.append(f"stop:{self.page.read().status}")

    def close(self):
        self.calls.append("close")


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.fixture
def frontend_side(run_dir):
    """The frontend's end: its topology and its outbox to the worker (closed after the test)."""
    topo = Topology(run_dir)
    bells = BellSender()
    yield topo, Outbox(topo, "fe0", NAME, bells)
    bells.close()
    topo.close()


def test_a_request_in_a_ring_is_served_by_the_registry_and_answered(run_dir, tmp_path,
                                                                     frontend_side):
    w = Recorder(context(run_dir, tmp_path))
    topo, to_worker = frontend_side
    assert to_worker.send(ipc.encode(7, ipc.DescribeProducersRequest()))
    assert to_worker.send(ipc.encode(8, ipc.ListOffsetsRequest(0, [])))   # nobody serves it
    assert w.drain_inputs() is True
    assert w.drain_inputs() is False
    assert w.calls == ["served"]
    assert w.posted == {"fe0"}
    assert w.flush_outboxes() is False and not w.posted
    back = topo.open_ring(NAME, "fe0")
    assert ipc.decode(back.get()) == (7, ipc.DescribeProducersResult(ErrorCode.none))
    # A request without a handler is answered at once with its error reply.
    req_id, body = ipc.decode(back.get())
    assert req_id == 8 and body == ipc.ListOffsetsRequest(0, []).error_reply(
        ErrorCode.unknown_server_error)
    assert back.get() is None


def test_main_publishes_status_beats_and_runs_the_hooks_in_order(run_dir, tmp_path,
                                                                 restore_signals):
    w = Recorder(context(run_dir, tmp_path), turns=2)
    hb = HeartbeatTable.open(os.path.join(run_dir, HEARTBEAT_FILE))
    assert hb.last(SLOT) == 0
    assert w.main() == 0
    assert w.calls == ["setup", "tick", "turn", "turn", f"stop:{DRAINING}", "close"]
    st = StatePage.open(os.path.join(run_dir, f"page.{NAME}"), WORKER_PAGE_FIELDS,
                        readonly=True).read()
    assert (st.generation, st.status, st.pid) == (GENERATION, STOPPED, os.getpid())
    assert hb.last(SLOT) > 0


def test_a_boot_error_in_setup_is_the_exit_code_and_never_reaches_ready(run_dir, tmp_path,
                                                                       restore_signals):
    w = Recorder(context(run_dir, tmp_path), boot_error=True)
    assert w.main() == WORKER_BOOT_ERROR
    assert w.calls == ["setup"]
    assert w.page.read().status == RECOVERING


def test_sigterm_sets_stop_and_sigint_is_ignored(run_dir, tmp_path, restore_signals):
    w = Recorder(context(run_dir, tmp_path))
    w.install_signals()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    assert not w.stop
    os.kill(os.getpid(), signal.SIGTERM)
    assert w.stop


def test_exit_leaves_the_loop_with_its_code(run_dir, tmp_path, restore_signals):
    class Failing(Recorder):
        def on_turn(self, now):
            self.exit(1)

    w = Failing(context(run_dir, tmp_path))
    assert w.main() == 1
    assert w.page.read().status == STOPPED


def test_an_idle_turn_sleeps_on_the_mailbox_and_a_posted_message_wakes_it(run_dir, tmp_path):
    waits = []

    class Idle(Recorder):
        def wait_timeout(self, now):
            return 0.25

    w = Idle(context(run_dir, tmp_path), turns=2)
    real_wait = w.mailbox.wait
    w.mailbox.wait = lambda t: (waits.append(t), real_wait(0))
    w.loop()
    assert waits == [0.25]                     # only the last turn (after stop) does not wait
    # A reply that found its ring full waits in the outbox: the next idle wait is short.
    w.stop, w.turns = False, 2
    box = w.outboxes["fe0"]
    while box.ring.try_put(b"y" * 1000):
        pass
    box.post(b"x" * 1000)
    waits.clear()
    w.loop()
    assert waits and waits[0] <= 0.01


def test_workers_that_do_not_serve_clients_close_the_listening_socket(run_dir, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        fd = os.dup(listener.fileno())
        w = Recorder(context(run_dir, tmp_path, listen_fd=fd))
        w.close_listener()
        assert w.ctx.listen_fd == -1
        with pytest.raises(OSError):
            os.fstat(fd)

        class Serving(Recorder):
            serves_clients = True

        fd = os.dup(listener.fileno())
        s = Serving(context(run_dir, tmp_path, listen_fd=fd))
        s.close_listener()
        assert s.ctx.listen_fd == fd
        os.fstat(fd)
        os.close(fd)
    finally:
        listener.close()


def test_async_worker_drains_on_its_bell_ticks_and_stops_on_sigterm(run_dir, tmp_path,
                                                                  restore_signals, frontend_side):
    _, to_worker = frontend_side

    class Async(AsyncWorker):
        def __init__(self, ctx):
            super().__init__(ctx)
            self.drained = 0
            self.ticks = 0
            self.stopped = False

        async def start_async(self):
            # The mailbox is armed and in the event loop: a producer's post rings the bell.
            assert to_worker.ring.consumer_waiting
            to_worker.send(b"hello")

        def drain_inputs(self):
            ring = self.mailbox.inputs["fe0"]
            while ring.get() is not None:
                self.drained += 1
            return True

        def on_tick(self, now):
            self.ticks += 1
            if self.drained and self.ticks >= 2:
                os.kill(os.getpid(), signal.SIGTERM)

        def begin_stop(self):
            self.stopped = True
            self.finish()

    w = Async(context(run_dir, tmp_path))
    MADE.append(w)
    assert w.main() == 0
    assert w.drained == 1 and w.ticks >= 2 and w.stopped
    assert w.page.read().status == STOPPED
    assert w.hb.last(SLOT) > 0


def test_a_new_configuration_version_reaches_the_reload_hook_once(run_dir, tmp_path):
    from appliance import reload
    from appliance.config import LogConfig

    got = []

    class Reloading(Recorder):
        def reload(self, old, new):
            got.append((old.log.retention_ms, new.log.retention_ms, self.cfg is new))

    w = Reloading(context(run_dir, tmp_path), turns=1)
    sup = StatePage.open(os.path.join(run_dir, f"page.{SUPERVISOR}"), SUPERVISOR_PAGE_FIELDS)
    w.loop()
    assert got == []                      # the page moved (catalog), not the version
    new = Config(log=LogConfig(retention_ms=1000))
    reload.publish(new, reload.file_path(run_dir))
    sup.publish(config_version=1)
    w.stop, w.turns = False, 2
    w.loop()
    assert got == [(Config().log.retention_ms, 1000, True)]
    assert w.ctx.config is w.cfg and w.config_version == 1
    sup.close()
