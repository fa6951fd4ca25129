"""The supervisor's disk reserve: made while the file system has room, given back when a start
finds it full, made again only once twice its size is free."""

import pytest

from appliance.supervisor import reserve
from appliance.supervisor.reserve import DiskReserve

SIZE = 1 << 20


@pytest.fixture
def free(monkeypatch):
    space = {"bytes": 100 * SIZE}
    monkeypatch.setattr(reserve, "free_bytes", lambda path: space["bytes"])
    return space


def test_made_at_start_when_there_is_room(tmp_path, free):
    r = DiskReserve(str(tmp_path), SIZE)
    r.at_start()
    assert (tmp_path / ".reserve").stat().st_size == SIZE
    assert r.held() >= SIZE          # real blocks, not a sparse file


def test_given_back_at_start_when_the_disk_is_full(tmp_path, free, caplog):
    r = DiskReserve(str(tmp_path), SIZE)
    r.at_start()
    free["bytes"] = 4096
    r.at_start()
    assert not (tmp_path / ".reserve").exists()
    assert "gave back the" in caplog.text


def test_full_disk_without_reserve_is_logged_not_fatal(tmp_path, free, caplog):
    free["bytes"] = 0
    DiskReserve(str(tmp_path), SIZE).at_start()
    assert "no reserve to give back" in caplog.text


def test_restore_waits_for_twice_its_size(tmp_path, free):
    r = DiskReserve(str(tmp_path), SIZE)
    free["bytes"] = SIZE + SIZE // 2
    r.restore(need_free=SIZE)
    assert not (tmp_path / ".reserve").exists()
    free["bytes"] = 2 * SIZE
    r.restore(need_free=SIZE)
    assert (tmp_path / ".reserve").stat().st_size == SIZE


def test_release_says_whether_it_freed_anything(tmp_path, free):
    r = DiskReserve(str(tmp_path), SIZE)
    assert r.release("test") is False
    r.restore()
    assert r.release("test") is True


def test_zero_size_removes_an_old_reserve(tmp_path, free):
    DiskReserve(str(tmp_path), SIZE).at_start()
    DiskReserve(str(tmp_path), 0).at_start()
    assert not (tmp_path / ".reserve").exists()


def test_reserve_is_sized_to_a_small_file_system():
    """A 64 MiB reserve cannot exist on a 32 MiB disk: it is a sixteenth of it there, at least
    what a catalog commit needs, and never more than configured (0: none)."""
    MiB = 1 << 20
    assert reserve.reserve_size(64 * MiB, 250_000 * MiB, 0) == 64 * MiB
    assert reserve.reserve_size(64 * MiB, 32 * MiB, 0) == 2 * MiB
    assert reserve.reserve_size(64 * MiB, 4 * MiB, 0) == reserve.RESERVE_MIN_BYTES
    assert reserve.reserve_size(64 * MiB, 32 * MiB, 3 * MiB) == 6 * MiB
    assert reserve.reserve_size(SIZE, 32 * MiB, 0) == SIZE
    assert reserve.reserve_size(0, 32 * MiB, 0) == 0
