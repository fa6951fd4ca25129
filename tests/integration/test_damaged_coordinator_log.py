"""A byte flipped in the coordinator's logs (issue 34: bit rot in the transaction-state log and
the group log). It used to stop the coordinator's load, so the supervisor restarted it into the
same bytes until its crash-loop rule stopped the appliance (exit 4, and systemd restarts that).
Now, as Kafka recovers any log: a damaged batch in the tail (the active segment) is truncated and
the appliance serves; a damaged batch in a sealed segment stops the start with exit status 3 and
a message naming the file and the offset (as a damaged catalog does), and nothing is truncated.

The logs' segments are 100 MB, so the test lays the state a real appliance wrote out again in
small segments (the stores' own compaction, offline, with a small ``segment_bytes``): several
sealed segments and an active one, as a long-lived coordinator has them."""

from __future__ import annotations

import glob
import os
import re
import shutil

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from appliance.data_layout import COORDINATOR_DIR, GROUP_LOG_DIR
from appliance.group.store import GroupStateStore, LOG_DIR as GROUP_LOG
from appliance.runtime import EXIT_DATA_DIR
from appliance.txn.state_manager import LOG_DIR as TXN_LOG, TransactionStateManager
from appliance_harness import Appliance
from test_bit_rot import create, scrub_found, scrub_passes
from test_damaged_state_files import run, tree

GROUPS = [f"group-{i}" for i in range(4)]
TXN_IDS = [f"txn-{i}" for i in range(4)]
SMALL_SEGMENT = 400              # bytes: a batch or two a segment (and more than any batch)


def txn_log_dir(data: str) -> str:
    return os.path.join(data, COORDINATOR_DIR, TXN_LOG)


def group_log_dir(data: str) -> str:
    return os.path.join(data, COORDINATOR_DIR, GROUP_LOG_DIR, GROUP_LOG)


def segments(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "*.log")))


def relay_in_small_segments(data: str) -> None:
    """Rewrite both logs of a stopped appliance into one-batch segments (the stores' compaction,
    so the records are exactly those a load keeps)."""
    txn = TransactionStateManager(os.path.join(data, COORDINATOR_DIR), "os", 0,
                                  segment_bytes=SMALL_SEGMENT)
    txn.load()
    txn.compact()
    txn.close()
    groups = GroupStateStore(os.path.join(data, COORDINATOR_DIR, GROUP_LOG_DIR), "os", 0,
                             segment_bytes=SMALL_SEGMENT)
    groups.REWRITE_BATCH_RECORDS = 1
    groups.load()
    groups.compact()
    groups.close()
    for d in (txn_log_dir(data), group_log_dir(data)):
        assert len(segments(d)) >= 2, segments(d)


def flip_last_byte(path: str) -> None:
    """One bit of the last byte of the segment's (last) batch: inside what its CRC covers."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A data dir whose coordinator holds transactional ids and committed offsets of groups,
    cleanly stopped, its logs laid out in small segments."""
    d = tmp_path_factory.mktemp("coordinator")
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"))
    a.start()
    try:
        create(a, "orders", partitions=1)
        for tid in TXN_IDS:
            p = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": tid})
            p.init_transactions(30)
            p.begin_transaction()
            p.produce("orders", value=tid.encode(), partition=0)
            p.commit_transaction(30)
        for n, group in enumerate(GROUPS):
            c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": group})
            c.commit(offsets=[TopicPartition("orders", 0, n + 1)], asynchronous=False)
            c.close()
    finally:
        assert a.terminate() == 0
    relay_in_small_segments(a.data_dir)
    return a.data_dir


def committed(app: Appliance, group: str) -> int:
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition("orders", 0)], timeout=30)
        return tp.offset
    finally:
        c.close()


@pytest.mark.parametrize("log_dir", [txn_log_dir, group_log_dir], ids=["txn-log", "group-log"])
def test_regression_a_flipped_byte_in_a_sealed_coordinator_segment_exits_3_naming_it(
        seeded, tmp_path, log_dir):
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    path = segments(log_dir(data))[0]
    flip_last_byte(path)
    before = tree(data)
    r = run(data, tmp_path)
    assert r.returncode == EXIT_DATA_DIR == 3, r.stderr[-3000:]
    assert re.search(rf"the batch at offset \d+ \(position \d+ of {re.escape(path)}\) fails its "
                     rf"CRC", r.stderr), r.stderr[-3000:]
    assert "crash-looping" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    after = tree(data)
    for d in (txn_log_dir(data), group_log_dir(data)):     # no segment truncated or removed
        for p in segments(d):
            rel = os.path.relpath(p, data)
            assert after[rel] == before[rel], rel


@pytest.mark.parametrize("log_dir", [txn_log_dir, group_log_dir], ids=["txn-log", "group-log"])
def test_regression_a_flipped_byte_in_the_coordinator_logs_tail_is_truncated_and_it_serves(
        seeded, tmp_path, log_dir):
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    path = segments(log_dir(data))[-1]                      # the active segment: the tail
    flip_last_byte(path)
    a = Appliance(data_dir=data, log_path=str(tmp_path / "appliance.log"))
    a.start()
    try:
        text = a.log_text()
        assert f"of {path}) fails its CRC: the log is truncated there" in text, a.log_tail()
        assert "crash-looping" not in text and "restarting in" not in text, a.log_tail()
        # Everything before the damaged batch loaded: at most the tail's one record is lost.
        kept = sum(committed(a, g) == n + 1 for n, g in enumerate(GROUPS))
        assert kept >= len(GROUPS) - (log_dir is group_log_dir), kept
        # The coordinator serves transactions and commits again, the damaged ids included.
        for tid in TXN_IDS:
            p = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": tid})
            p.init_transactions(30)
            p.begin_transaction()
            p.produce("orders", value=b"again", partition=0)
            p.commit_transaction(30)
        c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": GROUPS[-1]})
        c.commit(offsets=[TopicPartition("orders", 0, 7)], asynchronous=False)
        c.close()
        assert committed(a, GROUPS[-1]) == 7
    finally:
        assert a.terminate() == 0
    # The truncated log is a good log: it starts cleanly with what was written after the cut.
    a = Appliance(data_dir=data, log_path=str(tmp_path / "again.log"))
    a.start()
    try:
        assert committed(a, GROUPS[-1]) == 7
        assert "fails its CRC" not in a.log_text()
    finally:
        assert a.terminate() == 0


@pytest.mark.parametrize("log_dir,topic", [(txn_log_dir, "__transaction_state"),
                                           (group_log_dir, "__consumer_offsets")],
                         ids=["txn-log", "group-log"])
def test_the_scrub_finds_a_byte_changed_in_a_sealed_coordinator_segment(
        seeded, tmp_path, appliance_factory, log_dir, topic):
    """The coordinator reads its logs only at a start: the background scrub (issue 34) covers
    their sealed segments too, with the partitions' metric and log line, named by the internal
    topic Kafka keeps that state in."""
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    app = appliance_factory(data_dir=data, log={"scrub": {"bytes_per_second": 64 << 20,
                                                          "pass_interval_ms": 200}})
    app.wait_for(lambda: scrub_passes(app) >= 1, what="a first scrub pass")
    assert scrub_found(app, topic) == 0
    path = segments(log_dir(data))[0]
    flip_last_byte(path)                                     # the page cache has it at once
    app.wait_for(lambda: scrub_found(app, topic) == 1, what="the scrub to find the damage")
    lines = [ln for ln in app.log_text().splitlines() if "scrub:" in ln]
    assert len(lines) == 1 and f"{topic}-0: scrub: the batch fails its CRC" in lines[0], lines
    assert f"of {path}" in lines[0] and "restore the file" in lines[0], lines
    passes = scrub_passes(app)
    app.wait_for(lambda: scrub_passes(app) >= passes + 2, what="two more passes")
    assert scrub_found(app, topic) == 1                      # counted once, not every pass
