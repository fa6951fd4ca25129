"""Idempotent producers: every record exactly once and in order, whatever is lost or killed.

Producers of all three Python clients write through ``proxy.FaultyProxy``, which loses some
Produce responses after the broker appended the batch and cuts the connection: the client retries
the same batch (same producer id, epoch and sequence) and the partition writer must answer it as a
duplicate. The same producers then run while a partition writer, or the whole appliance, is killed
with SIGKILL: a retry of a batch written before the crash must still be recognised (producer-state
snapshot plus log replay).
"""

import asyncio
import os
import signal
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fault_proxy import FaultyProxy, drop_some_produce
from raw_wire import RawClient

N = 3000
PARTS = 2


def create_topic(bootstrap, name, partitions=PARTS):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)


def read_values(bootstrap, topic, partitions=PARTS, expect=N, timeout=60):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    per_part: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    deadline = time.time() + timeout
    total = 0
    while time.time() < deadline:
        msgs = c.consume(1000, 0.5)
        for m in msgs:
            assert not m.error(), m.error()
            per_part[m.partition()].append(m.value())
            total += 1
        if total >= expect and not msgs:
            break
    c.close()
    return per_part


def assert_exactly_once_in_order(per_part, produced: list[bytes]):
    seen = [v for vs in per_part.values() for v in vs]
    dups = [v for v, n in Counter(seen).items() if n > 1]
    assert not dups, f"{len(dups)} duplicated records, e.g. {dups[:3]}"
    missing = set(produced) - set(seen)
    assert not missing, f"{len(missing)} records missing, e.g. {sorted(missing)[:3]}"
    for p, vs in per_part.items():
        nums = [int(v.rsplit(b"-", 1)[1]) for v in vs]
        assert nums == sorted(nums), f"partition {p} out of order"


@pytest.fixture
def behind_proxy(appliance_factory):
    """An appliance whose advertised address is a FaultyProxy losing 4% of Produce responses."""
    def make(policy=None):
        app = appliance_factory(start=False)
        proxy = FaultyProxy(app.port, policy or drop_some_produce(0.04, delay=0.05))
        app.config.setdefault("server", {})["advertised_listener"] = proxy.bootstrap
        app.start()
        return app, proxy
    return make


def produce_confluent(bootstrap, topic, values, idempotent=True):
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": idempotent, "acks": "all",
                  "linger.ms": 2, "batch.num.messages": 50, "retries": 1000000,
                  "message.timeout.ms": 120000, "retry.backoff.ms": 20})
    errors = []
    for i, v in enumerate(values):
        while True:
            try:
                p.produce(topic, value=v, partition=i % PARTS,
                          on_delivery=lambda e, m: errors.append(e) if e else None)
                break
            except BufferError:
                p.poll(0.05)
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    assert not errors, errors[:3]


def produce_kafka_python(bootstrap, topic, values):
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                      linger_ms=2, batch_size=4096, retries=1000000, request_timeout_ms=30000,
                      retry_backoff_ms=20)
    futures = [p.send(topic, value=v, partition=i % PARTS) for i, v in enumerate(values)]
    p.flush(120)
    for f in futures:
        f.get(60)
    p.close()


def produce_aiokafka(bootstrap, topic, values):
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             linger_ms=2, max_batch_size=4096, request_timeout_ms=30000,
                             retry_backoff_ms=20)
        await p.start()
        try:
            futs = [await p.send(topic, value=v, partition=i % PARTS) for i, v in enumerate(values)]
            await p.flush()
            for f in futs:
                await f
        finally:
            await p.stop()
    asyncio.run(run())


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka}


@pytest.mark.parametrize("client", PRODUCERS)
def test_lost_produce_responses_leave_every_record_exactly_once(behind_proxy, client):
    app, proxy = behind_proxy()
    topic = f"idem-{client}"
    create_topic(proxy.bootstrap, topic)
    values = [b"%s-%06d" % (client.encode(), i) for i in range(N)]
    PRODUCERS[client](proxy.bootstrap, topic, values)
    assert proxy.dropped > 0, "the proxy lost no response: the test proved nothing"
    assert_exactly_once_in_order(read_values(app.bootstrap, topic), values)


def test_without_idempotence_lost_responses_do_duplicate(behind_proxy):
    """The control: the same faults without idempotence store some records twice, so the
    exactly-once tests above can fail."""
    app, proxy = behind_proxy()
    create_topic(proxy.bootstrap, "plain")
    values = [b"plain-%06d" % i for i in range(N)]
    produce_confluent(proxy.bootstrap, "plain", values, idempotent=False)
    assert proxy.dropped > 0
    seen = [v for vs in read_values(app.bootstrap, "plain", expect=N).values() for v in vs]
    assert len(seen) > len(set(seen)) == N


class Background:
    """An idempotent confluent producer writing numbered records until told to stop."""

    def __init__(self, bootstrap, topic):
        self.p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                           "linger.ms": 2, "batch.num.messages": 100, "message.timeout.ms": 180000,
                           "retry.backoff.ms": 50, "socket.timeout.ms": 5000})
        self.topic = topic
        self.values: list[bytes] = []
        self.acked = 0
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cb(self, err, msg):
        if err:
            self.errors.append(err)
        else:
            self.acked += 1

    def _run(self):
        i = 0
        while not self.stop.is_set():
            v = b"bg-%08d" % i
            try:
                self.p.produce(self.topic, value=v, partition=i % PARTS, on_delivery=self._cb)
            except BufferError:
                self.p.poll(0.05)
                continue
            self.values.append(v)
            i += 1
            if i % 100 == 0:
                self.p.poll(0)
                time.sleep(0.002)
        assert self.p.flush(180) == 0

    def start(self):
        self.thread.start()
        return self

    def wait_acked(self, n, timeout=60):
        deadline = time.time() + timeout
        while self.acked < n and time.time() < deadline:
            time.sleep(0.05)
        assert self.acked >= n

    def finish(self):
        self.stop.set()
        self.thread.join(240)
        assert not self.thread.is_alive()
        assert not self.errors, self.errors[:3]


def crash_on_lost_response(app, topic, every, crashes, whole=False):
    """A proxy policy: every ``every``-th Produce response is swallowed, and just before that the
    partition writer (or the whole appliance) is killed with SIGKILL. The batch of that response
    is in the log but unacknowledged, so the client's retry reaches a restarted writer that can
    only recognise it from its producer-state snapshot and the log after it."""
    state = {"n": 0, "crashes": 0}
    lock = threading.Lock()

    def decide(api_key):
        if api_key != 0:
            return None
        with lock:
            state["n"] += 1
            if state["crashes"] >= crashes or state["n"] % every:
                return None
            state["crashes"] += 1
            if whole:
                app.kill9_all()
                app.start()
            else:
                victim = app.writer(topic, 0)
                os.kill(victim["pid"], signal.SIGKILL)
                app.wait_for(lambda: app.writer(topic, 0)["pid"] != victim["pid"], what="restart")
            return "drop"
    return decide, state


@pytest.mark.parametrize("whole", [False, True], ids=["writer", "whole-appliance"])
def test_retry_of_a_batch_written_before_kill9_is_a_duplicate(appliance_factory, whole):
    app = appliance_factory(start=False)
    policy, state = crash_on_lost_response(app, "idem-crash", every=15, crashes=3, whole=whole)
    proxy = FaultyProxy(app.port, policy)
    app.config.setdefault("server", {})["advertised_listener"] = proxy.bootstrap
    app.start()
    create_topic(proxy.bootstrap, "idem-crash", 1)
    values = [b"crash-%06d" % i for i in range(1500)]
    p = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 2, "batch.num.messages": 20, "message.timeout.ms": 180000,
                  "retry.backoff.ms": 50})
    errors = []
    for v in values:
        p.produce("idem-crash", value=v, partition=0, on_delivery=lambda e, m: errors.append(e) if e else None)
        p.poll(0)
    assert p.flush(180) == 0 and not errors, errors[:3]
    assert state["crashes"] == 3
    assert_exactly_once_in_order(read_values(app.bootstrap, "idem-crash", 1, len(values)), values)


def test_kill9_whole_appliance_mid_stream_retries_are_duplicates(appliance_factory):
    app = appliance_factory()
    create_topic(app.bootstrap, "idem-ka")
    bg = Background(app.bootstrap, "idem-ka").start()
    bg.wait_acked(4000)
    app.kill9_all()
    app.start()
    bg.wait_acked(bg.acked + 2000, timeout=120)
    bg.finish()
    assert_exactly_once_in_order(read_values(app.bootstrap, "idem-ka", expect=len(bg.values)),
                                 bg.values)


def test_describe_producers_and_ids_survive_restart(appliance_factory):
    app = appliance_factory()
    create_topic(app.bootstrap, "dp")          # 10 records over 2 partitions: 5 each
    produce_confluent(app.bootstrap, "dp", [b"dp-%06d" % i for i in range(10)])
    with RawClient(app.bootstrap) as raw:
        r = raw.request(61, 0, {"topics": [{"name": "dp", "partition_indexes": [0]}]})
        p = r.topics[0].partitions[0]
        assert p.error_code == 0 and len(p.active_producers) == 1
        ap = p.active_producers[0]
        assert ap.producer_epoch == 0 and ap.last_sequence == 4 and ap.current_txn_start_offset == -1
        ids = {raw.request(22, 4, {"transactional_id": None, "transaction_timeout_ms": 1000,
                                   "producer_id": -1, "producer_epoch": -1}).producer_id for _ in range(5)}
    app.kill9_all()
    app.start()
    with RawClient(app.bootstrap) as raw:
        again = raw.request(22, 4, {"transactional_id": None, "transaction_timeout_ms": 1000,
                                    "producer_id": -1, "producer_epoch": -1}).producer_id
        assert again not in ids | {ap.producer_id}
        # the producer state came back from the log after kill -9
        r = raw.request(61, 0, {"topics": [{"name": "dp", "partition_indexes": [0]}]})
        assert r.topics[0].partitions[0].active_producers[0].last_sequence == 4
