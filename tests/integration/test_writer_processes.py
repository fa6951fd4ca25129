"""Writer processes carrying several partitions (issue 32: past the process budget,
``topics.writer_processes``; or explicit hosts, ``topics.partitions_per_writer`` > 1).

The same guarantees as one process per partition, driven with real clients: transactions and
read_committed across the partitions of a process, a SIGKILL of a process (every partition it
carries restarts with it, no acknowledged record lost), CreateTopics and CreatePartitions past
the budget (the new partitions join the running processes, opened live), DeleteTopics (the
partitions are closed live; a process left with none exits), a drain and a restart."""

import os
import signal
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from appliance.runtime import READY

TOPIC = "hosted"
PER_WRITER = 4
BUDGET = 2


@pytest.fixture
def app(appliance_factory):
    return appliance_factory(topics={"writer_processes": BUDGET, "auto_create": False})


def create(app, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(60)


def hosts(app, topic: str) -> dict[int, list[int]]:
    """pid -> the partitions of ``topic`` its writer process carries."""
    return {w["pid"]: sorted(p for t, p in w["partitions"] if t == topic)
            for w in app.workers("writer", topic)}


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
    assert sorted(h.values()) == [[0, 2, 4], [1, 3, 5]], h          # spread over the budget
    assert len({w["generation"] for w in app.workers("writer", TOPIC)}) == 1

    produce_txn(app, TOPIC, 6, 50, commit=True, tag=b"c1")
    produce_txn(app, TOPIC, 6, 20, commit=False, tag=b"ab")
    produce_idempotent(app, TOPIC, 6, 30, tag=b"i1")
    got = read_committed(app, TOPIC, 6)
    assert sorted(got) == sorted(expected(b"c1", 6, 50) | expected(b"i1", 6, 30))
    before = [app.high_watermark(TOPIC, p) for p in range(6)]

    # SIGKILL of a writer process: every partition it carries restarts with it (a new
    # generation), nothing acknowledged is lost, and the other process is untouched.
    first = next(pid for pid, ps in h.items() if ps[0] == 0)
    other = next(pid for pid in h if pid != first)
    os.kill(first, signal.SIGKILL)
    app.wait_for(lambda: all(app.partition_state(TOPIC, p).generation == 2 and
                             app.partition_state(TOPIC, p).status == READY for p in (0, 2, 4)),
                 timeout=60, what="the process's partitions back")
    after = hosts(app, TOPIC)
    assert sorted(after.values()) == [[0, 2, 4], [1, 3, 5]] and other in after
    assert first not in after
    assert [app.high_watermark(TOPIC, p) for p in range(6)] == before
    produce_idempotent(app, TOPIC, 6, 10, tag=b"i2")
    produce_txn(app, TOPIC, 6, 10, commit=True, tag=b"c2")
    assert sorted(read_committed(app, TOPIC, 6)) == sorted(
        expected(b"c1", 6, 50) | expected(b"i1", 6, 30) | expected(b"i2", 6, 10)
        | expected(b"c2", 6, 10))

    # CreatePartitions and CreateTopics past the budget: the new partitions are opened in the
    # running processes (no new process, no restart).
    pids = set(after)
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.create_partitions([NewPartitions(TOPIC, 9)])[TOPIC].result(60)
    create(app, "second", 3)
    grown = hosts(app, TOPIC)
    assert set(grown) == pids and sorted(sum(grown.values(), [])) == list(range(9)), grown
    assert set(hosts(app, "second")) <= pids
    assert all(w["generation"] <= 2 for w in app.workers("writer"))
    produce_idempotent(app, TOPIC, 9, 5, tag=b"i3")
    produce_idempotent(app, "second", 3, 5, tag=b"s")
    assert all(app.high_watermark(TOPIC, p) >= 5 for p in range(6, 9))
    assert sorted(read_committed(app, "second", 3)) == sorted(expected(b"s", 3, 5))

    # DeleteTopics: the partitions are closed live; the processes go on with the other topic.
    admin.delete_topics([TOPIC])[TOPIC].result(60)
    assert set(hosts(app, "second")) <= pids and all(_alive(pid) for pid in pids)
    assert app.log_text().count("closed (its topic deleted)") == 9
    produce_idempotent(app, "second", 3, 5, tag=b"s2")
    # ... and a process left with no partition exits.
    admin.delete_topics(["second"])["second"].result(60)
    app.wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=60,
                 what="the emptied writer processes to exit")


def test_explicit_writer_hosts_carry_k_partitions(appliance_factory):
    app = appliance_factory(topics={"partitions_per_writer": PER_WRITER, "auto_create": False})
    create(app, TOPIC, 6)
    assert sorted(hosts(app, TOPIC).values()) == [[0, 1, 2, 3], [4, 5]]
    produce_txn(app, TOPIC, 6, 10, commit=True, tag=b"k")
    assert sorted(read_committed(app, TOPIC, 6)) == sorted(expected(b"k", 6, 10))


def test_a_drained_writer_process_restarts_clean(app, appliance_factory):
    create(app, TOPIC, 3)
    produce_txn(app, TOPIC, 3, 40, commit=True, tag=b"c")
    assert app.terminate() == 0
    assert "did not stop in time" not in app.log_text()
    again = appliance_factory(data_dir=app.data_dir,
                              topics={"writer_processes": 1, "auto_create": False})
    assert sorted(hosts(again, TOPIC).values()) == [[0, 1, 2]]     # a start lays them out again
    assert sorted(read_committed(again, TOPIC, 3)) == sorted(expected(b"c", 3, 40))
    assert again.log_text().count("ready: log start 0") == 3      # each member recovered


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_regression_a_host_recovering_longer_than_the_heartbeat_timeout_was_killed(appliance_factory):
    """A writer process's partitions recover one after the other; a process that published
    READY before all had recovered, or did not beat between them, was SIGKILLed when its
    recoveries took longer than heartbeat_timeout_ms together, again at every restart. Here
    every partition's recovery takes 0.8 s (a test hook) and the timeout is 1.5 s: three
    partitions need 2.4 s."""
    app = appliance_factory(topics={"writer_processes": 1, "auto_create": False},
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


def _crashes(app) -> list[str]:
    return [line for line in app.log_text().splitlines()
            if "worker crashed" in line or "missed its heartbeat" in line]


def test_regression_delete_topics_of_many_partitions_missed_the_writer_processs_heartbeat(
        appliance_factory):
    """bench_produce at 10,000 partitions: a DeleteTopics closed a writer process's 1,250
    partitions in one turn, each with a snapshot, a seal and three fsyncs, and no heartbeat
    between them; the supervisor SIGKILLed the process after 392 s. A deleted partition's files
    are removed anyway: it is now let go without syncing, and every close beats. Here 600
    partitions in one process and a heartbeat timeout of 1 s."""
    app = appliance_factory(topics={"writer_processes": 1, "auto_create": False},
                            supervisor={"heartbeat_timeout_ms": 1000})
    create(app, "many", 600)
    produce_idempotent(app, "many", 600, 1, tag=b"d")
    (pid,) = hosts(app, "many")
    create(app, "kept", 1)                       # joins the same process, which must outlive the delete
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.delete_topics(["many"])["many"].result(120)
    app.wait_for(lambda: app.log_text().count("closed (its topic deleted)") == 600,
                 timeout=120, what="every partition of the deleted topic closed")
    assert _crashes(app) == [], _crashes(app)
    assert list(hosts(app, "kept")) == [pid]
    produce_idempotent(app, "kept", 1, 5, tag=b"k")
    assert sorted(read_committed(app, "kept", 1)) == sorted(expected(b"k", 1, 5))


ROUNDS = 4


def test_regression_delete_topics_during_its_create_crashed_the_writer_process(appliance_factory):
    """bench_produce at 10,000 partitions: a CreateTopics timed out at the client, which then
    deleted the topic while the writer processes were still opening its partitions; a process
    that read the assignment before the delete found a partition's page gone and crashed
    (FileNotFoundError), taking every partition it carried down; and the supervisor, looking
    whether the pending create's partitions were READY, read a page the delete had removed and
    died with the whole appliance. A partition deleted before it opened is now skipped by its
    process and not waited for by the create."""
    # Two processes carry "kept"; each brief topic gets two new ones (the bench's case: a
    # process forked for the create, the delete before it has opened anything).
    app = appliance_factory(topics={"writer_processes": 4, "auto_create": False})
    create(app, "kept", 2)
    pids = set(hosts(app, "kept"))
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    for round_ in range(ROUNDS):
        name = f"brief{round_}"
        # Not waited for: the delete goes in while the partitions are being opened.
        admin.create_topics([NewTopic(name, 800)], operation_timeout=0.1)
        app.wait_for(lambda: f"creating topic {name}" in app.log_text(), timeout=60,
                     what=f"the create of {name} begun")
        app.wait_for(lambda: _delete(admin, name), timeout=120, what=f"{name} deleted")
    app.wait_for(lambda: not any(f"brief{r}" in admin.list_topics(timeout=10).topics
                                 for r in range(ROUNDS)), timeout=120, what="the brief topics gone")
    assert _crashes(app) == [], _crashes(app)
    assert set(hosts(app, "kept")) == pids
    produce_idempotent(app, "kept", 2, 5, tag=b"b")
    assert sorted(read_committed(app, "kept", 2)) == sorted(expected(b"b", 2, 5))


def _delete(admin, name: str) -> bool:
    try:
        admin.delete_topics([name], operation_timeout=60)[name].result(120)
        return True
    except Exception:                           # not in the catalog yet: asked again
        return False
