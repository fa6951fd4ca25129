"""Issue 17, point 1: no fault of the disk kills a process.

Before: on a full tmpfs data dir a fetcher died of SIGBUS (a timestamp lookup read a sparse index
page, which tmpfs allocates on first touch), and on a full ext4 disk a writer died (a roll, or a
store into a sparse index page); a full runtime dir (tmpfs) let CreateTopics make sparse rings
that the first produce then faulted on. Now every file the appliance maps or appends to gets its
blocks before it is used, so a full disk is an ENOSPC answered KAFKA_STORAGE_ERROR.

Each run here: a real appliance with its data dir on a small ext4 loop device or a small tmpfs
(``small_filesystems``), an acks=all idempotent confluent-kafka producer until the disk is full, then
reads, group and transaction requests on the full disk, DeleteTopics to free space, produce
resuming with the same producer and no restart, and kill -9 of everything and a restart that
reads back every acknowledged record exactly once. The numbers the README quotes are printed (``-s`` shows them).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from raw_wire import NONE, NOT_COORDINATOR, RawClient, produce
from small_filesystems import MiB, disk_full, ext4_loop, fill as fill_rest, free_bytes, small_tmpfs
from txn_wire import describe, init_pid

from appliance.protocol.records import Record, build_batch

KAFKA_STORAGE_ERROR = 56
TRANSACTIONAL_ID_NOT_FOUND = 105
BAD_LOG_LINES = re.compile(r"killed by signal|restarting in|Traceback|crash-looping|worker crashed")


@pytest.fixture(params=["ext4", "tmpfs"])
def small_fs(request, tmp_path):
    """The data dir's file system: 40 MiB of ext4 on a loop device, or a 40 MiB tmpfs."""
    make = ext4_loop if request.param == "ext4" else small_tmpfs
    with make(str(tmp_path), 40 * MiB) as mnt:
        yield request.param, mnt


def _pids(app) -> dict[str, int]:
    return {w["name"]: w["pid"] for w in app.workers()}


def _read_all(bootstrap: str, topic: str, end: int) -> list[bytes]:
    """Every record value of partition 0 below offset ``end``, in offset order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 100})
    out: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                out.append((m.offset(), m.value()))
    finally:
        c.close()
    assert out and out[-1][0] >= end - 1, f"read up to {out[-1][0] if out else None}, want {end - 1}"
    return [v for off, v in out if off < end]


def _commit_until_refused(raw: RawClient, group: str, topic: str, limit: int = 3000):
    """OffsetCommit v8 with 4000 bytes of metadata each time (offset i) until the group log
    refuses one: (last offset committed, the error code of the refused commit)."""
    last = -1
    for i in range(limit):
        r = raw.request(8, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                               "group_instance_id": None,
                               "topics": [{"name": topic, "partitions": [{
                                   "partition_index": 0, "committed_offset": i,
                                   "committed_leader_epoch": -1,
                                   "committed_metadata": f"{i}:" + "m" * 4000}]}]})
        err = r.topics[0].partitions[0].error_code
        if err != NONE:
            return last, err
        last = i
    pytest.fail(f"{limit} commits of 4 KB were all stored on a full disk")


def _committed(raw: RawClient, group: str, topic: str) -> int:
    r = raw.request(9, 7, {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}],
                           "require_stable": False})
    p = r.topics[0].partitions[0]
    assert r.error_code == NONE and p.error_code == NONE, r
    return p.committed_offset


def _init_until_refused(raw: RawClient, limit: int = 400):
    """InitProducerId for new transactional ids of 10,000 characters until the transaction log
    refuses one: (the ids stored, the refused id, its error code)."""
    stored = []
    for i in range(limit):
        txn_id = f"full-{i:04d}-" + "t" * 10000
        r = init_pid(raw, txn_id)
        if r.error_code != NONE:
            return stored, txn_id, r.error_code
        stored.append(txn_id)
    pytest.fail(f"{limit} InitProducerId of 10 KB ids were all stored on a full disk")


def test_full_data_disk_answers_kafka_storage_error_and_kills_no_process(small_fs, appliance_factory):
    kind, small_fs = small_fs
    data_dir = os.path.join(small_fs, "data")
    app = appliance_factory(
        data_dir=data_dir,
        server={"frontends": 1, "fetchers": 1, "disk_reserve_bytes": 1 * MiB},
        log={"segment_bytes": 1 * MiB, "retention_check_interval_ms": 500})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    # "fill" rolls by time too (segment.ms): a roll on the full disk must not stop its writer.
    for f in admin.create_topics([NewTopic("ballast", 1, 1), NewTopic("keep", 1, 1),
                                  NewTopic("fill", 1, 1, config={"segment.ms": "2000"})]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": app.bootstrap, "linger.ms": 5})
    for i in range(100):
        p.produce("ballast", value=b"b" * 100 * 1024)
    assert p.flush(60) == 0
    for i in range(10):
        p.produce("keep", value=b"keep-%d" % i)
    assert p.flush(30) == 0
    pids = _pids(app)
    assert len(pids) == 7          # three writers, coordinator, cleaner, fetcher, frontend
    spare = os.path.join(small_fs, "spare")       # an operator's file, deleted later
    fd = os.open(spare, os.O_RDWR | os.O_CREAT, 0o600)
    os.posix_fallocate(fd, 0, MiB)
    os.close(fd)

    # An acks=all idempotent producer until the disk is full. Retries are few, so that a batch the
    # broker refuses reaches the delivery report with the broker's error instead of a timeout.
    # Its queue holds 2,000 records, not librdkafka's 100,000: every record still queued when the
    # disk is full is refused (and retried) before flush returns, and 100,000 of them took longer
    # than the flush's minute, proving nothing more than 2,000 do.
    acked: dict[bytes, int] = {}
    errors: list[str] = []

    def delivered(err, msg):
        if err is None:
            acked[msg.value()[:9]] = msg.offset()
        else:
            errors.append(err.name())

    fill = Producer({"bootstrap.servers": app.bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 5, "retries": 2, "retry.backoff.ms": 50,
                     "message.timeout.ms": 60000, "queue.buffering.max.messages": 2000})
    start = time.monotonic()
    sent = 0
    while errors.count("KAFKA_STORAGE_ERROR") < 20:
        assert time.monotonic() - start < 180, f"disk never reported full: {len(acked)} acked, {errors[:5]}"
        try:
            fill.produce("fill", value=b"%09d" % sent + b"f" * 4000, on_delivery=delivered)
            sent += 1
        except BufferError:
            fill.poll(0.05)
        fill.poll(0)
    assert fill.flush(60) == 0, "records still queued a minute after the disk was full"
    acked_when_full = len(acked)
    # Full for the producer's batches (up to 1 MB each): less than two of them fit. What is left
    # goes to a file of the operator's, so that even the smallest batch finds no room.
    left = free_bytes(small_fs)
    assert left < 2 * MiB, f"{left} bytes free"
    os.unlink(spare)
    with RawClient(app.bootstrap) as raw:
        # One more small record, in the room the spare file left; then the disk is full with it
        # in the active segment, which segment.ms rolls two seconds later: a roll with no room.
        assert produce(raw, "fill", 0, build_batch([Record(key=None, value=b"small-one")])).error_code == NONE
    fill_rest(small_fs)
    assert disk_full(small_fs)
    app.wait_for(lambda: "time-based roll failed" in app.log_text() or _pids(app) != pids,
                 timeout=30, what="the time-based roll on the full disk")
    assert _pids(app) == pids

    # The broker's own answer, at the wire: KAFKA_STORAGE_ERROR for the partition. (A small batch
    # may still fit the blocks the segment was given ahead of its appends; a batch of nearly a
    # segment's size needs new ones.)
    with RawClient(app.bootstrap) as raw:
        pr = produce(raw, "fill", 0, build_batch([Record(key=None, value=b"r" * 1_000_000)]))
        assert pr.error_code == KAFKA_STORAGE_ERROR, pr

    # Reads on the full disk: every acknowledged record, no duplicates, and timestamp lookups (a
    # fetcher used to die of SIGBUS on them); the consumer group's earlier offsets.
    end = max(acked.values()) + 1
    values = [v[:9] for v in _read_all(app.bootstrap, "fill", end)]
    assert len(values) == len(set(values)), "duplicates in the log"
    assert set(acked) <= set(values), f"{len(set(acked) - set(values))} acknowledged records missing"
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "times"})
    try:
        got = c.offsets_for_times([TopicPartition("fill", 0, int(time.time() * 1000) - 3_600_000)], 30)
        assert got[0].error is None and got[0].offset == 0, got
    finally:
        c.close()
    assert _read_all(app.bootstrap, "keep", 10) == [b"keep-%d" % i for i in range(10)]

    # Group and transaction requests that must write: refused with Kafka's error for a failed
    # append of its coordinator (KAFKA_STORAGE_ERROR -> NOT_COORDINATOR), state left as it was.
    with RawClient(app.bootstrap) as raw:
        last_commit, err = _commit_until_refused(raw, "full-group", "keep")
        assert err == NOT_COORDINATOR, err
        assert _committed(raw, "full-group", "keep") == last_commit
        stored_ids, refused_id, err = _init_until_refused(raw)
        assert err == NOT_COORDINATOR, err
        assert describe(raw, refused_id).error_code == TRANSACTIONAL_ID_NOT_FOUND
        assert all(describe(raw, t).error_code == NONE for t in stored_ids[-2:])

    # Nothing died: the same pids, no signal, no restart, no traceback.
    assert _pids(app) == pids
    assert not BAD_LOG_LINES.search(app.log_text()), app.log_tail(40)

    # DeleteTopics on the full disk frees the ballast; the same producer's appends resume.
    acked_before = len(acked)
    t0 = time.monotonic()
    for f in admin.delete_topics(["ballast"], operation_timeout=60).values():
        f.result(60)
    more = 0
    while len(acked) < acked_before + 200:
        assert time.monotonic() - t0 < 120, "produce did not resume after DeleteTopics"
        if more < 400:
            try:
                fill.produce("fill", value=b"%09d" % sent + b"f" * 4000, on_delivery=delivered)
                sent += 1
                more += 1
            except BufferError:
                pass
        fill.poll(0.01)
    resumed_s = time.monotonic() - t0
    assert fill.flush(60) == 0
    with RawClient(app.bootstrap) as raw:
        assert raw.request(8, 8, {"group_id": "full-group", "generation_id_or_member_epoch": -1,
                                  "member_id": "", "group_instance_id": None,
                                  "topics": [{"name": "keep", "partitions": [{
                                      "partition_index": 0, "committed_offset": 99999,
                                      "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
                           ).topics[0].partitions[0].error_code == NONE
        assert init_pid(raw, refused_id).error_code == NONE
    survivors = {k: v for k, v in pids.items() if k in _pids(app)}
    assert len(survivors) == 6 and all(_pids(app)[k] == v for k, v in survivors.items())
    assert not BAD_LOG_LINES.search(app.log_text()), app.log_tail(40)

    # After kill -9 of the whole appliance and a restart (recovery of segments whose files hold
    # blocks past their last batch): every acknowledged record once, the group's and the
    # transaction's state.
    app.kill9_all()
    app.start()
    end = max(acked.values()) + 1
    values = [v[:9] for v in _read_all(app.bootstrap, "fill", end)]
    assert len(values) == len(set(values)), "duplicates in the log"
    assert set(acked) <= set(values)
    with RawClient(app.bootstrap) as raw:
        assert _committed(raw, "full-group", "keep") == 99999
        assert describe(raw, refused_id).error_code == NONE
    print(f"\n[{kind}] 40 MiB data dir: {acked_when_full} records of 4 KB "
          f"acknowledged before the disk was full ({sent} sent, {left} bytes left), "
          f"{errors.count('KAFKA_STORAGE_ERROR')} delivery reports with KAFKA_STORAGE_ERROR; "
          f"DeleteTopics of 10 MiB to 200 more acknowledged: {resumed_s:.1f} s")


# -- the runtime dir (tmpfs) -------------------------------------------------------------------

RUNTIME_CONFIG = {"frontends": 1, "fetchers": 1}
SMALL_SHM = {"produce_ring_bytes": 512 * 1024, "small_ring_bytes": 64 * 1024,
             "partition_ring_bytes": 64 * 1024}


def _create(admin: AdminClient, name: str, partitions: int) -> Exception | None:
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
        return None
    except Exception as e:        # the KafkaException of the topic's error
        return e


def _roundtrip(bootstrap: str, topic: str, n: int, before: int = 0) -> None:
    """Produce ``n`` records to a partition that holds ``before``, read them back."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=b"%d" % i)
    assert p.flush(30) == 0
    assert _read_all(bootstrap, topic, before + n)[before:] == [b"%d" % i for i in range(n)]


@pytest.fixture
def short_tmpfs():
    """small_tmpfs(size) -> a tmpfs mounted under a short path (a doorbell is a Unix socket,
    whose path may not exceed 107 bytes), unmounted after the test's appliance has stopped."""
    with contextlib.ExitStack() as stack:
        parent = tempfile.mkdtemp(prefix="i17-", dir="/tmp")
        stack.callback(shutil.rmtree, parent, True)
        yield lambda size: stack.enter_context(small_tmpfs(parent, size, name="shm"))


def _fixed_metrics_bytes() -> int:
    """What the metrics tables of the one frontend, fetcher, coordinator and the supervisor take
    in the runtime dir (appliance.metrics), on top of the rings this test is sized for."""
    from appliance.supervisor.process_table import TABLE_CAPACITY
    from shm.metrics import MetricsTable
    with tempfile.TemporaryDirectory() as d:
        total = 0
        for role in ("frontend", "fetcher", "coordinator", "supervisor"):
            path = os.path.join(d, role)
            MetricsTable.create(path, TABLE_CAPACITY[role if role != "supervisor" else "sup"]).close()
            total += os.path.getsize(path)
    return total


def test_full_runtime_dir_refuses_create_topics_and_kills_no_process(short_tmpfs, appliance_factory):
    """The runtime dir's tmpfs has room for the appliance and one partition's rings, not for
    four more: CreateTopics answers KAFKA_STORAGE_ERROR and leaves nothing behind (a one-partition
    topic fits afterwards); nothing restarts, and produce to the existing topic goes on. Before,
    the sparse rings were made, and the first produce into them faulted."""
    shm = short_tmpfs(4 * MiB + _fixed_metrics_bytes())
    app = appliance_factory(server={**RUNTIME_CONFIG, "runtime_dir": os.path.join(shm, "run")},
                            shm=SMALL_SHM, log={"message_max_bytes": 100000})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    assert _create(admin, "a", 1) is None
    _roundtrip(app.bootstrap, "a", 10)
    pids = _pids(app)
    err = _create(admin, "big", 4)
    assert err is not None and err.args[0].code() == KAFKA_STORAGE_ERROR, err
    assert "the runtime dir has room for 2 MiB; 4 more partitions need" in err.args[0].str(), err
    assert "big" not in admin.list_topics(timeout=10).topics
    assert not [n for n in os.listdir(os.path.join(shm, "run")) if n.startswith(".")]
    _roundtrip(app.bootstrap, "a", 20, before=10)
    assert _create(admin, "small", 1) is None
    _roundtrip(app.bootstrap, "small", 10)
    assert all(_pids(app)[k] == v for k, v in pids.items())
    assert not BAD_LOG_LINES.search(app.log_text()), app.log_tail(40)


def test_start_with_a_full_runtime_dir_exits_with_its_status(short_tmpfs, appliance_factory):
    """A runtime dir without room for the heartbeat table (512 KiB) is a start failure with
    the runtime dir's exit status (7), not a start that faults later."""
    shm = short_tmpfs(256 * 1024)
    app = appliance_factory(server={**RUNTIME_CONFIG, "runtime_dir": os.path.join(shm, "run")},
                            shm=SMALL_SHM, log={"message_max_bytes": 100000}, start=False)
    app.start(wait=False)
    assert app.proc.wait(60) == 7
    assert "has no room for its shared memory files" in app.log_text()
