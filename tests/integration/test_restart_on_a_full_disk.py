"""Regressions found by the chaos suite (loadtests/chaos.py): workers restarted while the data
dir's disk was full stopped the whole appliance.

* The coordinator crashed at once (``OSError: [Errno 28]`` persisting its new coordinator epoch,
  or rebuilding its logs' indexes after the kill), again at every restart, until the supervisor's
  crash-loop rule stopped the appliance (exit 4).
* A partition writer's recovery failed the same way (rewriting the unclean tail's indexes), which
  it reported as a boot error: the supervisor stopped the appliance at once (exit 4). (Whether
  that recovery needs new blocks depends on how the log's files got theirs; the test holds for
  both: recovered, or waiting.)

Both must wait for space instead, recovering (the coordinator beating its heartbeat: the
supervisor holds a starting coordinator to it, and used to kill the waiting one as hung), and
serve once space is back; the rest of the appliance serves meanwhile. And a stop
on a full disk is clean (the coordinator's group log used to raise ENOSPC sealing itself).

The data dir is a small ext4 file system on a loop device (root and a loop device needed, as in
CI; without them the test fails, it never skips), filled to the last block by a ballast file."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import psutil
from confluent_kafka import Consumer, Producer, TopicPartition

from appliance_harness import ROOT

sys.path.insert(0, os.path.join(ROOT, "loadtests"))

from chaos_nemesis import SmallDisk  # noqa: E402

HEARTBEAT_MS = 3000


def _commit_one(bootstrap: str, tid: str, value: bytes, partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("t", value=value, partition=partition)
    p.commit_transaction(60)


def _read_committed(bootstrap: str, partition: int = 0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("t", partition, 0)])
        got: list[bytes] = []
        _, high = c.get_watermark_offsets(TopicPartition("t", partition), timeout=30)
        while not c.position([TopicPartition("t", partition)])[0].offset >= high:
            got.extend(m.value() for m in c.consume(100, 1.0) if m.error() is None)
        return got
    finally:
        c.close()


def _waiting_or_gone(app, what: str):
    """Until the log says ``what`` waits for space, or the appliance has exited (the bug)."""
    app.wait_for(lambda: "waiting for space" in app.log_text() or app.proc.poll() is not None,
                 timeout=60, what=f"{what} to wait for space")
    assert app.proc.poll() is None, f"the appliance exited with {app.proc.returncode}:\n{app.log_tail()}"


def test_coordinator_restarted_on_a_full_disk_waits_for_space_instead_of_crash_looping(tmp_path, appliance_factory):
    disk = SmallDisk(str(tmp_path), "loop", 64)
    disk.mount()
    app = None
    try:
        app = appliance_factory(data_dir=os.path.join(disk.mnt, "data"), server={"frontends": 1},
                                topics={"default_partitions": 1},
                                supervisor={"heartbeat_timeout_ms": HEARTBEAT_MS})
        _commit_one(app.bootstrap, "before", b"before")
        co = app.workers("coordinator")[0]

        disk.fill()
        os.kill(co["pid"], signal.SIGKILL)
        # The new coordinator cannot persist its epoch: it says so and waits, alive.
        _waiting_or_gone(app, "the restarted coordinator")
        new = app.wait_for(lambda: [w for w in app.workers("coordinator") if w["pid"] != co["pid"]],
                           what="the restarted coordinator's pid")[0]
        # It outlives the heartbeat timeout by half: a wait, not a hang.
        app.wait_for(lambda: os.path.exists(f"/proc/{new['pid']}")
                     and time.time() - psutil.Process(new["pid"]).create_time() > 1.5 * HEARTBEAT_MS / 1000,
                     what="the waiting coordinator to outlive the heartbeat timeout")
        assert app.proc.poll() is None
        assert "co (pid gen 2)" not in app.log_text() and "missed its heartbeat" not in app.log_text()

        disk.free()
        app.wait_for(lambda: app.log_text().count("transaction coordinator ready") >= 2, timeout=60,
                     what="the coordinator to come up once space is back")
        assert [w["pid"] for w in app.workers("coordinator")] == [new["pid"]]   # no restart since
        _commit_one(app.bootstrap, "after", b"after")
        assert _read_committed(app.bootstrap) == [b"before", b"after"]
        assert app.terminate() == 0
    finally:
        if app is not None:
            app.terminate()               # before its data dir goes away
        disk.unmount()


def test_writer_restarted_on_a_full_disk_waits_for_space_instead_of_stopping_the_appliance(tmp_path, appliance_factory):
    disk = SmallDisk(str(tmp_path), "loop", 64)
    disk.mount()
    app = None
    try:
        app = appliance_factory(data_dir=os.path.join(disk.mnt, "data"), server={"frontends": 1},
                                topics={"default_partitions": 2})
        # Enough data for index entries (one per 4 KiB): recovery has indexes to rewrite.
        p = Producer({"bootstrap.servers": app.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for i in range(200):
            p.produce("t", value=b"x" * 1000, partition=0)
        assert p.flush(60) == 0
        _commit_one(app.bootstrap, "other", b"on partition 1", partition=1)
        w = app.writer("t", 0)

        disk.fill()
        os.kill(w["pid"], signal.SIGKILL)
        # The restarted writer recovers if its recovery finds the blocks it needs, or waits for
        # space; either way the appliance lives on (it stopped on a boot error).
        app.wait_for(lambda: app.log_text().count("t-0 ready") >= 2 or "waiting for space" in app.log_text()
                     or app.proc.poll() is not None, timeout=60, what="the restarted writer")
        assert app.proc.poll() is None, f"the appliance exited with {app.proc.returncode}:\n{app.log_tail()}"
        assert "boot error" not in app.log_text()
        # The rest of the appliance serves meanwhile: partition 1 is read.
        assert _read_committed(app.bootstrap, 1) == [b"on partition 1"]
        disk.free()
        app.wait_for(lambda: app.log_text().count("t-0 ready") >= 2, timeout=60,
                     what="the writer to recover once space is back")
        _commit_one(app.bootstrap, "after", b"after", partition=0)
        assert _read_committed(app.bootstrap, 0)[-1:] == [b"after"]
        assert len(_read_committed(app.bootstrap, 0)) == 201

        # A stop on a full disk: clean, no traceback. The group log holds enough commits for an
        # index entry, which sealing it at the stop rewrites (it raised ENOSPC).
        c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "g", "enable.auto.commit": False})
        for offset in range(1, 81):
            c.commit(offsets=[TopicPartition("t", 0, offset)], asynchronous=False)
        c.close()
        disk.fill()
        assert app.terminate() == 0
        assert "Traceback" not in app.log_text()
    finally:
        if app is not None:
            app.terminate()               # before its data dir goes away
        disk.unmount()
