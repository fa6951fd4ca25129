"""Issue 19 item 6: the appliance starts on a full disk and serves the DeleteTopics that frees it.

Kafka starts on a full log dir and serves deletes; an appliance that refused to start there
(its start wrote a probe file, a pointer, checkpoints, index rebuilds, the coordinator's epoch)
could not be used to free its own disk. The supervisor's disk reserve (``server.disk_reserve_bytes``,
made while there is room, given back when a start finds the disk full) is what lets recovery,
the coordinator and the DeleteTopics commit write there. The data dir here is a small ext4 file system on a loop
device, filled to the last block by a filler file, with the appliance stopped and started again
on it. Needs root and a loop device (CI has both): without them the test fails, it never skips.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB ext4 file system mounted at tmp_path/mnt; unmounted in a finally."""
    if os.geteuid() != 0:
        pytest.fail("test_full_disk needs root to mount a loop device (CI runs as root)")
    if not os.path.exists("/dev/loop-control") and not os.path.exists("/dev/loop0"):
        pytest.fail("test_full_disk needs a loop device (/dev/loop-control)")
    image, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(32 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    r = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a loop device: {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: str) -> int:
    """Write a filler file until the file system has no block left; its size."""
    written = 0
    chunk = b"\xa5" * MiB
    with open(path, "wb", buffering=0) as f:
        while len(chunk) >= 512:
            try:
                written += f.write(chunk)
                os.fsync(f.fileno())
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk = chunk[:len(chunk) // 2]
    return written


def _free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def _disk_full(path: str) -> bool:
    """A 4 KiB write (as root, who may use every block) fails with ENOSPC."""
    probe = os.path.join(path, "probe")
    try:
        with open(probe, "wb", buffering=0) as f:
            f.write(b"p" * 4096)
            os.fsync(f.fileno())
        return False
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        return True
    finally:
        os.unlink(probe)


def _produce(bootstrap: str, topic: str, count: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 60000})
    failed = []
    for i in range(count):
        p.produce(topic, value=bytes([i % 251]) * size, key=str(i).encode(),
                  on_delivery=lambda err, msg: failed.append(err) if err else None)
        p.poll(0)
    assert p.flush(60) == 0
    assert not failed, failed


def _count(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        return high - low
    finally:
        c.close()


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def test_starts_on_a_full_disk_and_delete_topics_frees_it(small_disk, appliance_factory):
    data_dir = os.path.join(small_disk, "data")
    app = appliance_factory(data_dir=data_dir, server={"frontends": 1, "disk_reserve_bytes": 1 * MiB},
                            log={"segment_bytes": 2 * MiB, "segment_index_bytes": 65536})
    admin = _admin(app.bootstrap)
    for f in admin.create_topics([NewTopic("big", 1, 1), NewTopic("keep", 1, 1)]).values():
        f.result(30)
    _produce(app.bootstrap, "big", 600, 16 * 1024)         # ~10 MiB in sealed segments
    _produce(app.bootstrap, "keep", 10, 100)
    # A transactional id, so that the coordinator's logs hold something to recover.
    tp = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "full-disk"})
    tp.init_transactions(30)
    tp.begin_transaction()
    tp.produce("keep", value=b"in a transaction")
    tp.commit_transaction(30)
    tp.flush(10)

    filler = os.path.join(small_disk, "filler")
    assert os.path.getsize(os.path.join(data_dir, ".reserve")) == 1 * MiB
    # The disk fills while the appliance is stopped: a clean stop gives back the blocks the
    # active segments held ahead of their appends, so a disk filled before it would not be full.
    assert app.terminate() == 0
    _fill(filler)
    assert _disk_full(small_disk)

    app.start()                       # on the full disk: it must become ready
    assert "gave back the 1048576-byte reserve" in app.log_text()
    assert not os.path.exists(os.path.join(data_dir, ".reserve"))
    assert _count(app.bootstrap, "keep") == 12
    before = _free(small_disk)
    admin = _admin(app.bootstrap)
    for f in admin.delete_topics(["big"], operation_timeout=60).values():
        f.result(60)
    # ~9.4 MiB of segments freed, 1 MiB of it taken back by the reserve.
    app.wait_for(lambda: _free(small_disk) > before + 6 * MiB, timeout=60,
                 what="DeleteTopics to free the topic's segments")
    assert os.path.getsize(os.path.join(data_dir, ".reserve")) == 1 * MiB   # made again
    _produce(app.bootstrap, "keep", 10, 100)
    assert _count(app.bootstrap, "keep") == 22
    tp = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "full-disk"})
    tp.init_transactions(30)
    assert app.terminate() == 0


def test_delete_topics_frees_a_full_disk_smaller_than_the_default_reserve(small_disk, appliance_factory):
    """Regression: on a 32 MiB data dir the default 64 MiB reserve could not exist, so once an
    idempotent producer had filled the disk, DeleteTopics of the only topic was answered
    KAFKA_STORAGE_ERROR, nothing was freed and produce never resumed. The reserve is sized to
    the file system (a sixteenth of it here), so the catalog commit of the delete has its room."""
    data_dir = os.path.join(small_disk, "data")
    app = appliance_factory(data_dir=data_dir,
                            server={"frontends": 1, "disk_reserve_bytes": 64 * MiB},
                            log={"segment_bytes": 4 * MiB})
    st = os.statvfs(small_disk)
    assert os.path.getsize(os.path.join(data_dir, ".reserve")) == st.f_blocks * st.f_frsize // 16
    assert "a share of its" in app.log_text()
    admin = _admin(app.bootstrap)
    admin.create_topics([NewTopic("fill", 1, 1)])["fill"].result(30)
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 15000})
    acked, failed = [], []
    i = 0
    while not failed:
        p.produce("fill", value=bytes([i % 251]) * 1024, key=str(i).encode(),
                  on_delivery=lambda err, msg: (failed if err else acked).append(err or msg.offset()))
        i += 1
        if i % 1000 == 0:
            p.flush(60)
        assert i < 200_000, "the disk never filled"
    p.flush(60)
    assert _disk_full(small_disk)
    before = _free(small_disk)
    for f in admin.delete_topics(["fill"], operation_timeout=60).values():
        f.result(60)                     # KAFKA_STORAGE_ERROR before the fix
    app.wait_for(lambda: _free(small_disk) > before + len(acked) * 1024 // 2, timeout=60,
                 what="DeleteTopics to free the topic's segments")
    admin.create_topics([NewTopic("after", 1, 1)])["after"].result(30)
    _produce(app.bootstrap, "after", 100, 1024)
    assert _count(app.bootstrap, "after") == 100
    app.wait_for(lambda: os.path.exists(os.path.join(data_dir, ".reserve")), timeout=30,
                 what="the reserve made again")
