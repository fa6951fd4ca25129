"""Partitions beyond the machine's memory are refused, not created into the OOM killer.

Every partition's rings get their memory when made (``shm.produce_ring_bytes`` per frontend and
the small rings, in the runtime dir's tmpfs), so a CreateTopics of 1,024 partitions with the
default 8 MiB rings asked for about 22 GiB: the supervisor was OOM-killed while making them
and the whole appliance went down. Now CreateTopics and CreatePartitions refuse with
POLICY_VIOLATION what the machine's available memory cannot hold. A start serves the catalog
that ran here: where its rings do not fit it makes its produce rings smaller, and only a catalog
whose smallest rings cannot be held exits with the runtime dir's status (7), saying why.

The runtime dir here is a tmpfs twice the size of the machine's memory (a tmpfs's size is a
limit, not an allocation), so that memory, not the file system, is what runs out; the rings are
256 MiB each, so the refused request allocates nothing and the accepted one 512 MiB. Produce rings
belong to writer processes (issue 32), not partitions: the first test gives every partition a
process of its own (a writer-process budget above any partition count) so that partitions, each
with its own rings, are what outgrow the memory.
"""

from __future__ import annotations

import os
import tempfile

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from small_filesystems import small_tmpfs

from appliance.metrics import COORDINATOR_SNAPSHOT
from appliance.runtime import EXIT_RUNTIME_DIR

POLICY_VIOLATION = 44
RING = 256 << 20


@pytest.fixture
def big_tmpfs():
    with tempfile.TemporaryDirectory(prefix="mem-", dir="/tmp") as parent, \
            small_tmpfs(parent, 2 * psutil.virtual_memory().total, name="shm") as mnt:
        yield mnt


def _runtime_files(run_dir: str) -> dict[str, int]:
    """Each file of the runtime dir and the blocks it holds, but the coordinator's group-metrics
    snapshot, which it replaces once a second from its start on (made after the appliance is
    ready, it grew the dir by a page in a CI run), and the hidden temporary names such a
    replacement goes through."""
    out = {}
    for name in os.listdir(run_dir):
        if name == COORDINATOR_SNAPSHOT or name.startswith("."):
            continue
        try:
            out[name] = os.stat(os.path.join(run_dir, name)).st_blocks
        except FileNotFoundError:
            pass
    return out


def _refused(futures) -> Exception:
    (future,) = futures.values()
    with pytest.raises(Exception) as e:
        future.result(120)
    return e.value.args[0]


def test_partitions_beyond_the_machines_memory_are_refused_not_oom_killed(big_tmpfs,
                                                                          appliance_factory):
    run_dir = os.path.join(big_tmpfs, "run")
    app = appliance_factory(server={"frontends": 1, "fetchers": 1, "runtime_dir": run_dir},
                            shm={"produce_ring_bytes": RING},
                            topics={"writer_processes": 100000})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    # More than the whole memory (not merely what is available now, which other processes
    # change): refused whatever the machine does meanwhile, and it fits the tmpfs.
    too_many = psutil.virtual_memory().total // RING + 2
    # Every worker's files made first (regression: the fetcher's doorbell appeared between the
    # two readings, the appliance answering before its last worker was ready).
    app.wait_for(app.all_workers_ready, 30, "every worker READY")
    pids = {w["name"]: w["pid"] for w in app.workers()}
    before = _runtime_files(run_dir)

    err = _refused(admin.create_topics([NewTopic("huge", too_many, 1)], request_timeout=120))
    assert err.code() == POLICY_VIOLATION, err
    assert "the machine has memory for" in err.str() and f"{too_many} were asked for" in err.str()
    assert "huge" not in admin.list_topics(timeout=10).topics
    # Refused before anything was made: the runtime dir holds what it held.
    assert _runtime_files(run_dir) == before

    (f,) = admin.create_topics([NewTopic("one", 1, 1)]).values()
    assert f.result(120) is None
    err = _refused(admin.create_partitions([NewPartitions("one", too_many)], request_timeout=120))
    assert err.code() == POLICY_VIOLATION, err
    assert len(admin.list_topics(timeout=10).topics["one"].partitions) == 1
    # Nothing was killed or restarted on the way.
    now = {w["name"]: w["pid"] for w in app.workers()}
    assert all(now[k] == v for k, v in pids.items()), (pids, now)


def test_start_whose_rings_the_memory_cannot_hold_starts_with_smaller_rings(big_tmpfs,
                                                                           appliance_factory):
    """The same catalog restarted with produce rings too large for the machine: it serves, with
    the smallest produce rings the configuration allows and a warning that says so, instead of
    refusing a catalog that ran here (or an OOM kill in the start)."""
    run_dir = os.path.join(big_tmpfs, "run")
    app = appliance_factory(server={"frontends": 1, "fetchers": 1, "runtime_dir": run_dir},
                            shm={"produce_ring_bytes": 4 << 20})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    (f,) = admin.create_topics([NewTopic("t", 4, 1)]).values()
    assert f.result(120) is None
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all"})
    for i in range(40):
        p.produce("t", value=b"r%d" % i, partition=i % 4)
    assert p.flush(30) == 0
    assert app.terminate() == 0
    huge = 1 << (psutil.virtual_memory().total // 2).bit_length()     # > half the memory each
    app.config["shm"] = {"produce_ring_bytes": huge}
    app.start()
    text = app.log_text()
    assert "starting them all with produce rings of" in text, text[-2000:]
    assert psutil.disk_usage(big_tmpfs).used < 256 << 20      # no ring of the new size was made
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "mem", "enable.auto.commit": False})
    c.assign([TopicPartition("t", q, 0) for q in range(4)])
    got = []
    while len(got) < 40:
        got += [m.value() for m in c.consume(100, 10) if not m.error()]
    c.close()
    assert sorted(got) == sorted(b"r%d" % i for i in range(40))


def test_start_whose_smallest_rings_the_memory_cannot_hold_exits_7(big_tmpfs, appliance_factory):
    """Partition rings (which a start does not shrink) too large for the machine: exit 7, and the
    message names the memory and the keys to change, instead of an OOM kill in the start."""
    run_dir = os.path.join(big_tmpfs, "run")
    app = appliance_factory(server={"frontends": 1, "fetchers": 1, "runtime_dir": run_dir},
                            shm={"produce_ring_bytes": 4 << 20})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    (f,) = admin.create_topics([NewTopic("t", 4, 1)]).values()
    assert f.result(120) is None
    assert app.terminate() == 0
    huge = 1 << (psutil.virtual_memory().total // 8).bit_length()     # 6 of them > the memory
    app.config["shm"] = {"produce_ring_bytes": 4 << 20, "partition_ring_bytes": huge}
    app.start(wait=False)
    assert app.proc.wait(60) == EXIT_RUNTIME_DIR
    text = app.log_text()
    assert "even at the smallest size the configuration allows" in text, text[-2000:]
    assert "shm.partition_ring_bytes" in text
    assert psutil.disk_usage(big_tmpfs).used < 64 << 20      # no ring of the new size was made
