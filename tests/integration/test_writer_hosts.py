"""Writer hosts ([topics] partitions_per_writer > 1): several partitions' writers in one process.

The same guarantees as one process per partition, driven with real clients: transactions and
read_committed across the partitions of a host, a SIGKILL of a host (every member restarts, no
acknowledged record lost), CreatePartitions (a new host for the new partitions), DeleteTopics
(the hosts exit), a drain and a restart."""

import os
import signal
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from appliance.runtime import READY

TOPIC = "hosted"
PER_WRITER = 4


@pytest.fixture
def app(appliance_factory):
    return appliance_factory(topics={"partitions_per_writer": PER_WRITER, "auto_create": False})


def create(app, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(60)


def hosts(app, topic: str) -> dict[int, list[int]]:
    """pid -> the partitions its writer process serves."""
    out: dict[int, list[int]] = {}
    for w in app.workers("writer", topic):
        out.setdefault(w["pid"], []).append(w["partition"])
    return {pid: sorted(ps) for pid, ps in out.items()}


def produce_txn(app, topic: str, partitions: int, n: int, *, commit: bool, tag: bytes) -> None:
    p = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": f"h-{uuid.uuid4().hex[:8]}",
                  "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    for part in range(partitions):
        for i in range(n):
            p.produce(topic, value=tag + b"-%d-%d" % (part, i), partition=part)
    if commit:
        p.commit_transaction(30)
    else:
        p.flush(30)
        p.abort_transaction(30)


def produce_idempotent(app, topic: str, partitions: int, n: int, tag: bytes) -> None:
    p = Producer({"bootstrap.servers": app.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for part in range(partitions):
        for i in range(n):
            p.produce(topic, value=tag + b"-%d-%d" % (part, i), partition=part)
    assert p.flush(60) == 0


def read_committed(app, topic: str, partitions: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, eof = [], set()
    try:
        while len(eof) < partitions:
            m = c.poll(10)
            assert m is not None, f"no record or end of partition within 10 s ({len(got)} read)"
            if m.error():
                assert m.error().code() == -191, m.error()      # _PARTITION_EOF
                eof.add(m.partition())
                continue
            got.append(m.value())
    finally:
        c.close()
    return got


def expected(tag: bytes, partitions: int, n: int) -> set[bytes]:
    return {tag + b"-%d-%d" % (p, i) for p in range(partitions) for i in range(n)}


def test_partitions_share_writer_processes_with_every_guarantee_kept(app):
    create(app, TOPIC, 6)
    h = hosts(app, TOPIC)
    assert sorted(h.values()) == [[0, 1, 2, 3], [4, 5]], h
    assert len({w["generation"] for w in app.workers("writer", TOPIC)}) == 1

    produce_txn(app, TOPIC, 6, 50, commit=True, tag=b"c1")
    produce_txn(app, TOPIC, 6, 20, commit=False, tag=b"ab")
    produce_idempotent(app, TOPIC, 6, 30, tag=b"i1")
    got = read_committed(app, TOPIC, 6)
    assert sorted(got) == sorted(expected(b"c1", 6, 50) | expected(b"i1", 6, 30))
    before = [app.high_watermark(TOPIC, p) for p in range(6)]

    # SIGKILL of a host: every member restarts (a new generation each), nothing acknowledged
    # is lost, and the other host is untouched.
    first = next(pid for pid, ps in h.items() if ps[0] == 0)
    other = next(pid for pid in h if pid != first)
    os.kill(first, signal.SIGKILL)
    app.wait_for(lambda: all(app.partition_state(TOPIC, p).generation == 2 and
                             app.partition_state(TOPIC, p).status == READY for p in range(4)),
                 timeout=60, what="the host's partitions back")
    after = hosts(app, TOPIC)
    assert sorted(after.values()) == [[0, 1, 2, 3], [4, 5]] and other in after
    assert first not in after
    assert [app.high_watermark(TOPIC, p) for p in range(6)] == before
    produce_idempotent(app, TOPIC, 6, 10, tag=b"i2")
    produce_txn(app, TOPIC, 6, 10, commit=True, tag=b"c2")
    assert sorted(read_committed(app, TOPIC, 6)) == sorted(
        expected(b"c1", 6, 50) | expected(b"i1", 6, 30) | expected(b"i2", 6, 10)
        | expected(b"c2", 6, 10))

    # CreatePartitions: the new partitions get a host of their own.
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.create_partitions([NewPartitions(TOPIC, 9)])[TOPIC].result(60)
    grown = hosts(app, TOPIC)
    assert sorted(grown.values()) == [[0, 1, 2, 3], [4, 5], [6, 7, 8]], grown
    produce_idempotent(app, TOPIC, 9, 5, tag=b"i3")
    assert all(app.high_watermark(TOPIC, p) >= 5 for p in range(6, 9))

    # DeleteTopics: the hosts' processes exit.
    pids = set(grown)
    admin.delete_topics([TOPIC])[TOPIC].result(60)
    app.wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=60,
                 what="the deleted topic's writer hosts to exit")


def test_a_drained_host_restarts_clean(app, appliance_factory):
    create(app, TOPIC, 3)
    produce_txn(app, TOPIC, 3, 40, commit=True, tag=b"c")
    assert app.terminate() == 0
    assert "did not stop in time" not in app.log_text()
    again = appliance_factory(data_dir=app.data_dir,
                              topics={"partitions_per_writer": PER_WRITER, "auto_create": False})
    assert sorted(hosts(again, TOPIC).values()) == [[0, 1, 2]]
    assert sorted(read_committed(again, TOPIC, 3)) == sorted(expected(b"c", 3, 40))
    assert again.log_text().count("ready: log start 0") == 3      # each member recovered


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_regression_a_host_recovering_longer_than_the_heartbeat_timeout_was_killed(appliance_factory):
    """Each member recovers after the other; a member published READY as soon as its own
    recovery ended and then did not beat while its mates recovered, so a host whose recoveries
    took longer than heartbeat_timeout_ms together was SIGKILLed, again at every restart. Here
    every member's recovery takes 0.8 s (a test hook) and the timeout is 1.5 s: three members
    need 2.4 s."""
    app = appliance_factory(topics={"partitions_per_writer": PER_WRITER, "auto_create": False},
                            supervisor={"heartbeat_timeout_ms": 1500},
                            env={"TESTHOOK_PAUSE": "writer:recovering:0.8"})
    create(app, TOPIC, 3)
    produce_idempotent(app, TOPIC, 3, 10, tag=b"r")
    pid = next(iter(hosts(app, TOPIC)))
    os.kill(pid, signal.SIGKILL)
    app.wait_for(lambda: all(app.partition_state(TOPIC, p).generation == 2 and
                             app.partition_state(TOPIC, p).status == READY for p in range(3)),
                 timeout=60, what="the host's partitions back")
    assert sorted(read_committed(app, TOPIC, 3)) == sorted(expected(b"r", 3, 10))
    assert "missed its heartbeat" not in app.log_text(), app.log_tail()
    assert all(w["generation"] == 2 for w in app.workers("writer", TOPIC))
