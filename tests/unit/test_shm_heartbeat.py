"""shm.heartbeat and shm.region basics."""

from __future__ import annotations

import os
import time

import pytest

from shm.heartbeat import HeartbeatTable
from shm.region import Region


def test_heartbeat_table_file(tmp_path):
    path = str(tmp_path / "heartbeats")
    sup = HeartbeatTable.create(path, 4)
    worker = HeartbeatTable.open(path)
    assert sup.slots == worker.slots == 4
    assert [sup.last(i) for i in range(4)] == [0, 0, 0, 0]
    before = time.monotonic_ns()
    worker.beat(2)
    assert sup.last(2) >= before
    worker.beat(3, now_ns=123)
    assert sup.last(3) == 123 and sup.last(1) == 0
    sup.clear(2)
    assert worker.last(2) == 0
    for bad in (-1, 4):
        with pytest.raises(IndexError):
            worker.beat(bad)
    reader = HeartbeatTable.open(path, readonly=True)
    assert reader.last(3) == 123
    with pytest.raises(TypeError):
        reader.beat(0)
    for t in (sup, worker, reader):
        t.close()


def test_heartbeat_table_anonymous_and_validation(tmp_path):
    table = HeartbeatTable.anonymous(2)
    table.beat(1, 7)
    assert table.last(1) == 7 and table.path is None
    table.close()
    junk = tmp_path / "junk"
    junk.write_bytes(bytes(256))
    with pytest.raises(ValueError):
        HeartbeatTable.open(str(junk))


def test_region_create_is_atomic_and_replaces(tmp_path):
    path = str(tmp_path / "r")
    seen_during_init: list[bool] = []
    a = Region.create(path, 4096, init=lambda buf: seen_during_init.append(os.path.exists(path)))
    assert seen_during_init == [False]           # the name appears only after init
    assert os.listdir(tmp_path) == ["r"]          # no temp file left behind
    a.buf[0] = 1
    b = Region.create(path, 8192)                 # replace: new file, zeroed
    assert b.size == 8192 and b.buf[0] == 0 and a.buf[0] == 1
    c = Region.open(path, readonly=True)
    assert c.size == 8192 and c.readonly
    with pytest.raises(TypeError):
        c.buf[0] = 1
    b.unlink()
    b.unlink()                                    # missing: ignored
    for r in (a, b, c):
        r.close()
        r.close()


def test_region_failed_init_leaves_nothing(tmp_path):
    def boom(buf) -> None:
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError):
        Region.create(str(tmp_path / "r"), 4096, init=boom)
    assert os.listdir(tmp_path) == []


def test_region_close_with_a_live_view_is_deferred():
    region = Region.anonymous(4096)
    view = memoryview(region.buf)[0:10]
    region.close()                                # no BufferError; unmapped when the view goes
    view[0] = 5
    assert view[0] == 5
    view.release()
