"""Power cuts (issue 34): the appliance's data dir on lazyfs (tests/integration/lazyfs.py), a file
system that loses whatever was not synced, and ``[log.flush] policy = "batch"``'s promise checked
across cuts at random moments: zero acknowledged records lost, no duplicates, no aborted data
visible to read_committed, no committed transaction or offset lost, no transaction left hanging.

A cut is kill -9 of the whole appliance group, then kill -9 of the file system (its unsynced
state and the kernel's page cache of the mount go with it), a new mount over what was durable
and a restart. The clients keep running through it. A few cuts here; ``--soak`` runs 200.
"""

import os
import random

import pytest

from appliance.durable import fsync_dir
from lazyfs import LazyMount
from power_cut_workload import Workload, anomalies, create_topics

pytestmark = pytest.mark.timeout(1800)

BATCH = {"log": {"flush": {"policy": "batch"}},
         "transactions": {"abort_timed_out_interval_ms": 1000},
         "groups": {"initial_rebalance_delay_ms": 0}}


@pytest.fixture
def batch_appliance(appliance_factory, lazy_mount):
    """An appliance with policy batch whose data dir is on lazyfs; stopped before the mount goes
    (a mount gone under a running appliance is an I/O error in every worker)."""
    app = appliance_factory(data_dir=durable_data_dir(lazy_mount), **BATCH)
    yield app
    app.terminate()


def durable_data_dir(mount: LazyMount) -> str:
    """The operator's part: the data dir exists, and its name is durable, before the start."""
    d = os.path.join(mount.mountpoint, "data")
    os.mkdir(d)
    fsync_dir(mount.mountpoint)
    return d


def power_cut(app, mount: LazyMount) -> None:
    app.kill9_all()
    mount.cut()
    mount.mount()
    app.start(timeout=120)


def run_cuts(app, mount, cuts: int, seed: int) -> dict:
    rng = random.Random(seed)
    create_topics(app.bootstrap)
    work = Workload(app.bootstrap, seed).start()
    try:
        for _ in range(cuts):
            # A random moment: after a random count of new acks and transactions.
            acks, txns = work.acked_count() + rng.randint(20, 400), work.txn_count() + rng.randint(1, 6)
            app.wait_for(lambda: work.acked_count() >= acks and work.txn_count() >= txns,
                         timeout=180, what="the workload moving")
            power_cut(app, mount)
        # The clients see the appliance back before the check begins.
        acks = work.acked_count() + 50
        app.wait_for(lambda: work.acked_count() >= acks, timeout=180, what="acks after the last cut")
    finally:
        work.finish()
    assert not work.seen.errors, work.seen.errors
    found = anomalies(app.bootstrap, work.seen)
    s = work.seen
    assert s.acked and s.committed_txns and s.offsets
    print(f"POWER-CUTS {cuts}: {len(s.acked)} records acknowledged ({len(s.failed)} failed), "
          f"{len(s.committed_txns)} transactions committed, {len(s.aborted_txns)} aborted, "
          f"{len(s.unknown_txns)} unknown, {len(s.offsets)} partitions' offsets committed; "
          f"anomalies: {sum(map(len, found.values()))}")
    return found


@pytest.mark.soak
def test_batch_policy_loses_nothing_acknowledged_across_power_cuts(batch_appliance, lazy_mount,
                                                                   request):
    cuts = request.config.getoption("--power-cuts") or (
        200 if request.config.getoption("--soak") else 3)
    found = run_cuts(batch_appliance, lazy_mount, cuts, seed=34)
    assert found == {k: [] for k in found}, found


def test_a_new_partitions_acknowledged_records_survive_a_power_cut(batch_appliance, lazy_mount):
    """The bug: a fresh partition's first open synced no directory (fast CreateTopics), and the
    flusher's fdatasync made the segment's bytes durable but not its name nor the partition
    directory's: after a power cut every record acknowledged under policy batch was gone."""
    app = batch_appliance
    create_topics(app.bootstrap)
    assert_acknowledged_records_survive_a_cut(app, lazy_mount)


def test_a_partition_restarted_before_its_first_flush_keeps_acknowledged_records_at_a_power_cut(
        batch_appliance, lazy_mount):
    """The bug: only a partition's fresh first open marked its names for the first flush's sync.
    Killed -9 (no power cut) before any flush, the next open found its files and synced nothing:
    the partition directory's name in the data dir was never made durable, and a power cut after
    records acknowledged under policy batch took the whole partition."""
    app = batch_appliance
    create_topics(app.bootstrap)
    app.kill9_all()                    # a crash, not a power cut: the page cache keeps all
    app.start(timeout=120)
    assert_acknowledged_records_survive_a_cut(app, lazy_mount)


def assert_acknowledged_records_survive_a_cut(app, mount: LazyMount) -> None:
    """30 records acknowledged (idempotent, acks=all), a power cut, every one read back at the
    partition and offset its acknowledgement named."""
    from confluent_kafka import Producer
    from power_cut_workload import EVENTS, PARTITIONS, read_values

    acked = {}
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(30):
        p.produce(EVENTS, value=f"v{i}".encode(), partition=i % PARTITIONS,
                  on_delivery=lambda err, m: err or acked.__setitem__(m.value().decode(),
                                                                      (m.partition(), m.offset())))
    assert p.flush(30) == 0 and len(acked) == 30
    power_cut(app, mount)
    got = {v: (part, off) for part, rows in read_values(app.bootstrap, EVENTS, "read_committed").items()
           for off, v in rows}
    assert got == acked
