"""kill -9 a writer, or the whole appliance, under load; SIGTERM drains. Nothing acknowledged is lost.

Producers run with acks=-1 and retries, without idempotence, so a retried batch may be stored
twice: the checks are "every acknowledged record is present", not "exactly once".
"""

import os
import select
import signal
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from appliance.protocol.records import Record, build_batch
from raw_wire import RawClient


def create_topic(bootstrap, name, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})   # must outlive the future
    fs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    fs[name].result(30)


def read_all(bootstrap, topic, partitions, expect_at_least, timeout=60):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        msgs = c.consume(1000, 0.5)
        for m in msgs:
            assert not m.error(), m.error()
            seen.append(m.value())
        if len(seen) >= expect_at_least and not msgs:
            break
    c.close()
    return seen


class AckingProducer:
    """Produces numbered records until stopped; remembers which the broker acknowledged."""

    def __init__(self, bootstrap, topic, partitions):
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2,
                           "retries": 1000000, "retry.backoff.ms": 50, "message.timeout.ms": 120000,
                           "enable.idempotence": False, "socket.timeout.ms": 5000})
        self.topic, self.partitions = topic, partitions
        self.acked: set[bytes] = set()
        self.failed = []
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        if err is None:
            self.acked.add(msg.value())
        else:
            self.failed.append(err)

    def _run(self):
        i = 0
        while not self.stop.is_set():
            try:
                self.p.produce(self.topic, value=b"rec-%08d" % i, partition=i % self.partitions,
                               on_delivery=self._cb)
                i += 1
            except BufferError:
                self.p.poll(0.05)
                continue
            if i % 200 == 0:
                self.p.poll(0)
                time.sleep(0.002)
        self.sent = i
        self.p.flush(120)

    def start(self):
        self.thread.start()
        return self

    def wait_acked(self, n, timeout=60):
        deadline = time.time() + timeout
        while len(self.acked) < n and time.time() < deadline:
            time.sleep(0.05)
        assert len(self.acked) >= n, f"only {len(self.acked)} acked"

    def finish(self):
        self.stop.set()
        self.thread.join(180)
        assert not self.thread.is_alive()


def test_kill9_writer_under_load_loses_nothing_acknowledged(appliance):
    create_topic(appliance.bootstrap, "crash-w", 2)
    before = appliance.writer("crash-w", 0)
    prod = AckingProducer(appliance.bootstrap, "crash-w", 2).start()
    prod.wait_acked(3000)
    os.kill(before["pid"], signal.SIGKILL)
    after = appliance.wait_for(
        lambda: (w := appliance.writer("crash-w", 0))["pid"] != before["pid"] and w["pid"] and w,
        what="writer restart")
    assert after["generation"] == before["generation"] + 1
    prod.wait_acked(len(prod.acked) + 3000)       # the partition takes writes again
    prod.finish()
    assert not prod.failed, prod.failed[:3]
    seen = set(read_all(appliance.bootstrap, "crash-w", 2, len(prod.acked)))
    missing = prod.acked - seen
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    assert "restarting in" in appliance.log_text()


def test_kill9_whole_appliance_then_restart_loses_nothing_acknowledged(appliance_factory):
    app = appliance_factory()
    create_topic(app.bootstrap, "crash-all", 3)
    prod = AckingProducer(app.bootstrap, "crash-all", 3).start()
    prod.wait_acked(5000)
    app.kill9_all()
    acked_at_kill = set(prod.acked)
    app.start()
    prod.finish()       # retries reach the restarted appliance
    assert not prod.failed, prod.failed[:3]
    seen = set(read_all(app.bootstrap, "crash-all", 3, len(prod.acked)))
    assert not (acked_at_kill - seen), "records acknowledged before kill -9 were lost"
    assert not (prod.acked - seen)


def test_start_right_after_kill9_of_the_group_waits_for_the_dying_workers(appliance_factory):
    """Regression: a start right after a kill -9 of the process group exited 3 ("data dir ... is
    locked by another appliance process") while the old workers, each holding the data dir's
    lock, were still dying. A SIGSTOPped writer stands for a worker slow to die: the new start
    waits for it, saying so, and serves once it is gone."""
    app = appliance_factory()
    create_topic(app.bootstrap, "dying", 2)
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all"})
    for i in range(100):
        p.produce("dying", value=b"d%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    slow = app.writer("dying", 0)["pid"]
    os.kill(slow, signal.SIGSTOP)
    try:
        os.kill(app.proc.pid, signal.SIGKILL)
        app.proc.wait(30)
        nxt = appliance_factory(data_dir=app.data_dir, start=False)
        nxt.start(wait=False)
        nxt.wait_for(lambda: "waiting up to" in nxt.log_text() or nxt.proc.poll() is not None,
                     what="the new start to wait for the old workers")
        assert nxt.proc.poll() is None, nxt.log_tail()
    finally:
        os.kill(slow, signal.SIGCONT)          # it runs its pending SIGTERM and exits
    nxt.wait_ready()
    got = read_all(nxt.bootstrap, "dying", 2, 100)
    assert sorted(got) == sorted(b"d%d" % i for i in range(100))
    assert "processes are gone" in nxt.log_text()


def test_restart_after_clean_stop_keeps_everything(appliance_factory):
    app = appliance_factory()
    create_topic(app.bootstrap, "clean", 1)
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all"})
    for i in range(2000):
        p.produce("clean", value=b"c%d" % i)
    assert p.flush(30) == 0
    assert app.terminate() == 0
    app.start()
    assert read_all(app.bootstrap, "clean", 1, 2000) == [b"c%d" % i for i in range(2000)]


def test_sigterm_drains_inflight_acks_all_produce(appliance_factory):
    """Requests already read when SIGTERM arrives are answered (here they wait for an interval
    flush), and their data is there after a restart."""
    # The first interval flush comes after SIGTERM (the test reaches it well within 4 s of the
    # topic's creation) and inside the frontends' 5 s drain grace period.
    app = appliance_factory(log={"flush": {"policy": "interval", "interval_ms": 4000}})
    with RawClient(app.bootstrap) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "drain", "num_partitions": 1, "replication_factor": 1,
                                            "assignments": [], "configs": []}], "timeout_ms": 10000})
        assert r.topics[0].error_code == 0
        n = 20
        for i in range(n):
            raw.correlation += 1
            batch = build_batch([Record(key=None, value=b"d%02d" % i)])
            raw.send_frame(raw.header(0, 9, raw.correlation) + raw.encode(0, 9, {
                "transactional_id": None, "acks": -1, "timeout_ms": 30000,
                "topic_data": [{"name": "drain", "partition_data": [{"index": 0, "records": batch}]}]}))
        # All appended (the writer published them), none answered: they wait for the flush.
        app.wait_for(lambda: app.high_watermark("drain") == n, 30, "the batches to be appended")
        assert not select.select([raw.sock], [], [], 0)[0], "answered before the flush"
        app.proc.send_signal(signal.SIGTERM)
        offsets = []
        for i in range(n):
            resp = raw.read_response(0, 9, i + 2)
            p = resp.responses[0].partition_responses[0]
            assert p.error_code == 0
            offsets.append(p.base_offset)
        assert offsets == list(range(n))
    assert app.proc.wait(60) == 0
    app.start()
    assert read_all(app.bootstrap, "drain", 1, n) == [b"d%02d" % i for i in range(n)]


def test_writer_waiting_for_a_long_flush_interval_stops_on_sigterm(appliance_factory):
    """Regression: with data waiting for an interval flush, a writer slept until the flush was
    due (up to ``interval_ms``) instead of its usual bounded wait, so it missed SIGTERM (killed
    at the shutdown timeout, its log left unclean) and, past 30 s, its heartbeat."""
    app = appliance_factory(log={"flush": {"policy": "interval", "interval_ms": 600000}})
    with RawClient(app.bootstrap) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "long-interval", "num_partitions": 1,
                                            "replication_factor": 1, "assignments": [], "configs": []}],
                                "timeout_ms": 10000})
        assert r.topics[0].error_code == 0
        r = raw.request(0, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 10000, "topic_data": [
            {"name": "long-interval", "partition_data": [
                {"index": 0, "records": build_batch([Record(key=None, value=b"unflushed")])}]}]})
        assert r.responses[0].partition_responses[0].error_code == 0   # acks=1: not held for the flush
    assert app.terminate() == 0
    assert "did not stop in time" not in app.log_text()
    app.start()
    assert read_all(app.bootstrap, "long-interval", 1, 1) == [b"unflushed"]
