"""The supervisor: restarts dead workers, kills hung ones, stops a crash loop, guards the data dir,
and talks to systemd."""

import os
import signal
import socket
import subprocess
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from appliance_harness import APPLIANCE, Appliance, free_port


def roundtrip(app, topic="sv", n=50):
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "x", "enable.auto.commit": False})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.close()
    assert hi - lo >= n


def test_dead_workers_of_every_role_are_restarted(appliance):
    roundtrip(appliance)
    for role in ("frontend", "fetcher", "coordinator", "writer"):
        victim = appliance.workers(role)[0]
        os.kill(victim["pid"], signal.SIGKILL)
        appliance.wait_for(
            lambda: any(w["name"] == victim["name"] and w["pid"] and w["pid"] != victim["pid"]
                        for w in appliance.workers(role)), what=f"{role} restart")
    roundtrip(appliance)


def test_hung_worker_is_killed_and_restarted(appliance_factory):
    app = appliance_factory(supervisor={"heartbeat_timeout_ms": 1500})
    victim = app.workers("fetcher")[0]
    os.kill(victim["pid"], signal.SIGSTOP)        # alive but no longer beating
    app.wait_for(lambda: any(w["pid"] != victim["pid"] for w in app.workers("fetcher")),
                 what="hung fetcher replaced")
    assert "missed its heartbeat" in app.log_text()
    roundtrip(app)


def test_crash_loop_stops_the_appliance_with_status_4(appliance_factory):
    app = appliance_factory(supervisor={"crash_loop_restarts": 2, "crash_loop_window_ms": 60000,
                                        "restart_backoff_initial_ms": 10})
    for _ in range(3):
        victim = app.workers("coordinator")[0]
        os.kill(victim["pid"], signal.SIGKILL)
        if _ < 2:
            app.wait_for(lambda: app.workers("coordinator") and
                         app.workers("coordinator")[0]["pid"] != victim["pid"], what="coordinator back")
    assert app.proc.wait(60) == 4
    assert "crash-looping" in app.log_text()


def test_sigterm_right_after_ready_reaches_workers_still_starting(appliance_factory):
    """Regression: a SIGTERM that reached a worker between its fork and the reset of its signal
    handlers ran the supervisor's inherited handler there and was lost; that worker never
    drained, and the stop waited for the shutdown timeout's SIGKILL. The frontends here pause
    right after their fork (as a busy machine may make them), while the supervisor already
    says ready and is told to stop."""
    app = appliance_factory(start=False, env={"TESTHOOK_PAUSE": "frontend:forked:1.5"})
    app.start(wait=False)
    app.wait_for(lambda: "appliance ready" in app.log_text(), timeout=60, what="the supervisor to be ready")
    app.proc.send_signal(signal.SIGTERM)
    assert app.proc.wait(60) == 0
    text = app.log_text()
    assert "appliance stopped" in text
    assert "did not stop in time" not in text, app.log_tail()


def _run_expecting_failure(tmp_path, data_dir):
    log = tmp_path / "fail.log"
    with open(log, "wb") as f:
        rc = subprocess.run([APPLIANCE, "run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                             str(data_dir)], stdout=f, stderr=subprocess.STDOUT, timeout=60).returncode
    return rc, log.read_text()


def test_unusable_data_dir_exits_nonzero(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    rc, out = _run_expecting_failure(tmp_path, not_a_dir)
    assert rc == 3 and "unusable" in out


def test_second_appliance_on_same_data_dir_is_refused(appliance, tmp_path):
    rc, out = _run_expecting_failure(tmp_path, appliance.data_dir)
    assert rc == 3 and "locked by another appliance" in out
    roundtrip(appliance)       # the first one is untouched


def test_node_id_change_is_refused(appliance_factory, tmp_path):
    app = appliance_factory()
    app.terminate()
    other = Appliance(data_dir=app.data_dir, log_path=str(tmp_path / "other.log"),
                      config={"server": {"node_id": 7}})
    other.start(wait=False)
    assert other.proc.wait(60) == 3
    assert "belongs to node.id 1" in other.log_text()


def test_bad_config_exits_2(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[server]\nlisten = 5\n")
    r = subprocess.run([APPLIANCE, "run", "--config", str(cfg)], capture_output=True, timeout=30)
    assert r.returncode == 2 and b"server.listen" in r.stderr


class NotifySocket:
    """A fake $NOTIFY_SOCKET: what systemd would read from the supervisor."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.seen: list[str] = []

    def next(self, timeout: float) -> str | None:
        self.sock.settimeout(timeout)
        try:
            msg = self.sock.recv(4096).decode()
        except TimeoutError:
            return None
        self.seen.append(msg)
        return msg

    def wait_for(self, prefix: str, timeout: float = 60.0) -> str:
        """The next datagram that starts with ``prefix`` (others are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            msg = self.next(left)
            if msg is not None and msg.startswith(prefix):
                return msg
        raise TimeoutError(f"no {prefix!r} on the notify socket; got {self.seen[-10:]}")

    def close(self) -> None:
        self.sock.close()


# systemd's WatchdogSec= in the test: pings every 0.75 s while every heartbeat is younger than
# 1.5 s. heartbeat_timeout_ms is long, so the supervisor does not kill the stopped fetcher itself.
WATCHDOG_USEC = 3_000_000


def test_systemd_notify_status_watchdog_reload_and_stopping(appliance_factory, tmp_path):
    """The notify protocol, from a fake NOTIFY_SOCKET: STATUS= while recovering, READY=1 with the
    serving status once the listener is served, WATCHDOG=1 only while every worker beats (not
    while one is SIGSTOPped, again after SIGCONT), RELOADING=1 (MONOTONIC_USEC=) then READY=1
    around a SIGHUP, STOPPING=1 on SIGTERM."""
    first = appliance_factory()
    p = Producer({"bootstrap.servers": first.bootstrap})
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic("notify", 3)])["notify"].result(30)
    for i in range(30):
        p.produce("notify", value=b"%d" % i, partition=i % 3)
    assert p.flush(30) == 0
    del p, admin
    first.terminate()

    notify = NotifySocket(str(tmp_path / "notify.sock"))
    app = appliance_factory(data_dir=first.data_dir, start=False,
                            supervisor={"heartbeat_timeout_ms": 120000},
                            env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    try:
        app.start(wait=False)
        notify.wait_for("STATUS=recovering 3/3 partitions")
        ready = notify.wait_for("READY=1")
        assert ready == f"READY=1\nSTATUS=serving on PLAINTEXT://127.0.0.1:{app.port}: 1 topics, " \
                        f"3 partitions, 2 frontends", ready
        # Before READY: recovery status lines (and watchdog pings: the loop runs meanwhile).
        assert all(m.startswith(("STATUS=recovering ", "WATCHDOG=1")) for m in notify.seen[:-1]), \
            notify.seen
        # READY is sent only once the listener is served.
        socket.create_connection(("127.0.0.1", app.port), timeout=5).close()
        assert "recovered 3 partitions" in app.log_text()
        notify.wait_for("WATCHDOG=1")

        fetcher = app.workers("fetcher")[0]
        os.kill(fetcher["pid"], signal.SIGSTOP)
        try:
            # On a loaded machine a withheld status may first name idle writers whose beat came
            # late; the stopped fetcher is named once its own heartbeat is stale.
            withheld = notify.wait_for("STATUS=watchdog withheld")
            while "no heartbeat from fetcher 0" not in withheld:
                withheld = notify.wait_for("STATUS=watchdog withheld")
            # No ping for two watchdog periods (a ping would come every quarter period).
            deadline = time.monotonic() + 2 * WATCHDOG_USEC / 1e6
            while (left := deadline - time.monotonic()) > 0:
                msg = notify.next(left)
                assert msg is None or not msg.startswith("WATCHDOG=1"), notify.seen
        finally:
            os.kill(fetcher["pid"], signal.SIGCONT)
        notify.wait_for("WATCHDOG=1")
        assert "watchdog: every worker beats again" in app.log_text()

        app.proc.send_signal(signal.SIGHUP)
        reloading = notify.wait_for("RELOADING=1")
        assert reloading.split("\n")[1].startswith("MONOTONIC_USEC="), reloading
        assert int(reloading.split("\n")[1].split("=")[1]) > 0
        assert notify.wait_for("READY=1").startswith("READY=1\nSTATUS=serving on ")
        roundtrip(app, "notify", 1)

        app.proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1")
        assert app.proc.wait(60) == 0
    finally:
        notify.close()


def test_orphaned_workers_exit_when_supervisor_dies(appliance):
    """kill -9 of the supervisor alone: its workers get SIGTERM from the kernel and exit, which
    releases the data-dir lock so the appliance can be started again."""
    pids = [w["pid"] for w in appliance.workers()]
    os.kill(appliance.proc.pid, signal.SIGKILL)
    appliance.proc.wait(10)
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    appliance.start()
    roundtrip(appliance)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_supervisor_idles_after_admin_requests(appliance):
    """Regression: the supervisor never drained its doorbell, so after the first CreateTopics
    its loop spun at 100% CPU."""
    import psutil
    roundtrip(appliance, topic="idle-check")        # auto-creates: an admin request
    sup = psutil.Process(appliance.proc.pid)
    before = sup.cpu_times()
    time.sleep(2.0)
    after = sup.cpu_times()
    busy = (after.user + after.system) - (before.user + before.system)
    assert busy < 0.5, f"supervisor used {busy:.2f} s of CPU in 2 s while idle"


def test_long_poll_held_by_a_killed_fetcher_is_answered_promptly(appliance):
    """Regression: a fetcher's parked long-polls died with it and the frontend waited for its
    30 s internal timeout. Now the fetcher's new generation fails them at once with a
    retriable error."""
    import threading
    from raw_wire import RawClient
    roundtrip(appliance, topic="lp-kill")
    out = {}
    with RawClient(appliance.bootstrap) as raw:
        def poll():
            t0 = time.monotonic()
            r = raw.request(1, 11, {"max_wait_ms": 20000, "min_bytes": 10**9, "max_bytes": 1 << 20,
                                    "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                    "topics": [{"topic": "lp-kill", "partitions": [
                                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
                                    "forgotten_topics_data": [], "rack_id": ""})
            out["err"] = r.responses[0].partitions[0].error_code
            out["elapsed"] = time.monotonic() - t0
        t = threading.Thread(target=poll)
        t.start()
        # Kill the fetcher only once it holds the long-poll (its flag on the partition's page).
        appliance.wait_for(lambda: appliance.fetch_parked("lp-kill"), 30, "the fetch to be parked")
        victim = appliance.workers("fetcher")[0]
        os.kill(victim["pid"], signal.SIGKILL)
        t.join(40)
    assert out["err"] == 6                       # NOT_LEADER_OR_FOLLOWER: the client retries
    assert out["elapsed"] < 15                   # not the 20 s max_wait, not the 30 s timeout
    roundtrip(appliance, topic="lp-kill")


def test_only_frontends_hold_the_listening_socket(appliance):
    """Regression: every worker inherited the listening socket, so with the frontends gone the
    kernel kept accepting connections that no process served. Besides the supervisor (which
    hands it to restarted frontends), only frontends may hold it."""
    import psutil

    roundtrip(appliance)                              # a writer exists
    procs = appliance.processes()
    roles = {w["pid"]: w["role"] for w in procs["workers"] if w["pid"]}
    assert {"writer", "fetcher", "coordinator", "frontend"} <= set(roles.values())

    def listening(pid):
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == appliance.port
                   for c in psutil.Process(pid).net_connections(kind="tcp"))

    holders = {pid for pid in roles if listening(pid)}
    assert holders == {pid for pid, role in roles.items() if role == "frontend"}
    assert listening(procs["supervisor"])


def test_process_titles_name_each_worker_role_and_partition(appliance):
    """ps, top and systemd-cgls tell the workers apart: ``appliance: writer <n> <topic>-<partition>``
    and the role (and index) of every other worker."""
    import psutil
    roundtrip(appliance, topic="orders")
    titles = {w["name"]: " ".join(psutil.Process(w["pid"]).cmdline()).rstrip()
              for w in appliance.workers()}
    by_role = {}
    for w in appliance.workers():
        by_role.setdefault(w["role"], []).append(titles[w["name"]])
    assert "appliance: writer 0 orders-0" in by_role["writer"]      # what the process carries
    assert by_role["coordinator"] == ["appliance: coordinator"]
    assert by_role["cleaner"] == ["appliance: cleaner"]
    assert "appliance: frontend 0" in by_role["frontend"]
    assert "appliance: fetcher 0" in by_role["fetcher"]
    assert " ".join(psutil.Process(appliance.proc.pid).cmdline()).rstrip() == "appliance: supervisor"
    # The kernel's 15-character name says the role too (ps -o comm, psutil's name()).
    assert psutil.Process(appliance.writer("orders", 0)["pid"]).name() == "writer 0"
