"""Regression (found by the chaos suite, loadtests/chaos.py): a coordinator restarted while the
data dir's disk was full crashed at once (``OSError: [Errno 28]`` persisting its new coordinator
epoch), again at every restart, until the supervisor's crash-loop rule stopped the whole
appliance (exit 4). It must wait for space instead, recovering (which the supervisor does not
hold to the heartbeat), and serve transactions once space is back.

The data dir is a small ext4 file system on a loop device (root and a loop device needed, as in
CI; without them the test fails, it never skips), filled to the last block by a ballast file."""

from __future__ import annotations

import os
import signal
import sys
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from harness import ROOT

sys.path.insert(0, os.path.join(ROOT, "loadtests"))

from chaos_nemesis import SmallDisk  # noqa: E402


def _commit_one(bootstrap: str, tid: str, value: bytes) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("t", value=value, partition=0)
    p.commit_transaction(60)


def _read_committed(bootstrap: str) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition("t", 0, 0)])
        got: list[bytes] = []
        _, high = c.get_watermark_offsets(TopicPartition("t", 0), timeout=30)
        while not c.position([TopicPartition("t", 0)])[0].offset >= high:
            got.extend(m.value() for m in c.consume(100, 1.0) if m.error() is None)
        return got
    finally:
        c.close()


def test_coordinator_restarted_on_a_full_disk_waits_for_space_instead_of_crash_looping(tmp_path, appliance_factory):
    disk = SmallDisk(str(tmp_path), "loop", 64)
    disk.mount()
    try:
        app = appliance_factory(data_dir=os.path.join(disk.mnt, "data"), server={"frontends": 1},
                                topics={"default_partitions": 1})
        _commit_one(app.bootstrap, "before", b"before")
        co = app.workers("coordinator")[0]

        disk.fill()
        os.kill(co["pid"], signal.SIGKILL)
        # The new coordinator cannot persist its epoch: it says so and waits, alive.
        app.wait_for(lambda: "waiting for space" in app.log_text(), timeout=60,
                     what="the restarted coordinator to wait for space")
        new = app.wait_for(lambda: [w for w in app.workers("coordinator") if w["pid"] != co["pid"]],
                           what="the restarted coordinator's pid")[0]
        assert app.proc.poll() is None
        assert os.path.exists(f"/proc/{new['pid']}")
        assert "co (pid gen 2) exited" not in app.log_text()

        disk.free()
        app.wait_for(lambda: app.log_text().count("transaction coordinator ready") >= 2, timeout=60,
                     what="the coordinator to come up once space is back")
        assert [w["pid"] for w in app.workers("coordinator")] == [new["pid"]]   # no restart since
        _commit_one(app.bootstrap, "after", b"after")
        assert _read_committed(app.bootstrap) == [b"before", b"after"]
        assert app.terminate() == 0
    finally:
        disk.unmount()
