"""The power-cut file system's rules (tests/integration/lazyfs.py), on its model, no mount: what a
cut keeps is exactly what was synced (file data by fsync, names by the directory's fsync)."""

import errno
import os

import pytest

from lazyfs import PAGE, FsError, LazyFS


def new_file(fs, path, data=b"", sync_dir=True):
    fh = fs.create(path, 0o644, os.O_WRONLY)
    if data:
        fs.write(path, data, 0, fh)
    if sync_dir:
        fs.fsyncdir(os.path.dirname(path) or "/", 0, 0)
    return fh


def read_all(fs, path):
    return fs.read(path, fs.getattr(path)["st_size"], 0, None)


def test_write_without_sync_is_gone_after_a_cut(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/a", b"hello")
    assert read_all(fs, "/a") == b"hello"
    fs.cut()
    assert fs.readdir("/", 0) == [".", "..", "a"]   # the name was synced, the data not
    assert read_all(fs, "/a") == b""
    del fh


def test_write_then_fsync_survives_a_cut(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/a", b"hello")
    fs.fsync("/a", 1, fh)
    fs.write("/a", b" world", 5, fh)                 # after the sync: lost
    fs.cut()
    assert read_all(fs, "/a") == b"hello"


def test_a_new_file_synced_in_a_directory_never_synced_is_gone(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/a", b"data", sync_dir=False)
    fs.fsync("/a", 0, fh)
    fs.cut()
    with pytest.raises(FsError) as e:
        fs.getattr("/a")
    assert e.value.errno == errno.ENOENT
    assert os.listdir(tmp_path / "objects") == []    # its object is garbage, collected


def test_rename_without_a_directory_sync_is_undone(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/old", b"v1")
    fs.fsync("/old", 0, fh)
    fs.rename("/old", "/new")
    assert fs.readdir("/", 0) == [".", "..", "new"]
    fs.cut()
    assert fs.readdir("/", 0) == [".", "..", "old"]
    assert read_all(fs, "/old") == b"v1"


def test_rename_over_a_file_then_directory_sync_replaces_it(tmp_path):
    fs = LazyFS(str(tmp_path))
    fs.fsync("/live", 0, new_file(fs, "/live", b"old"))
    tmp = new_file(fs, "/live.tmp", b"new", sync_dir=False)
    fs.fsync("/live.tmp", 0, tmp)
    fs.rename("/live.tmp", "/live")
    fs.fsyncdir("/", 0, 0)
    fs.cut()
    assert fs.readdir("/", 0) == [".", "..", "live"]
    assert read_all(fs, "/live") == b"new"


def test_unlink_without_a_directory_sync_comes_back(tmp_path):
    fs = LazyFS(str(tmp_path))
    fs.fsync("/a", 0, new_file(fs, "/a", b"keep"))
    fs.unlink("/a")
    fs.cut()
    assert read_all(fs, "/a") == b"keep"
    fs.unlink("/a")
    fs.fsyncdir("/", 0, 0)
    fs.cut()
    assert fs.readdir("/", 0) == [".", ".."]


def test_directories_need_their_parent_synced(tmp_path):
    fs = LazyFS(str(tmp_path))
    fs.mkdir("/d", 0o755)
    fs.fsync("/d/f", 0, new_file(fs, "/d/f", b"x"))   # /d/f's name synced, /d's not
    fs.cut()
    assert fs.readdir("/", 0) == [".", ".."]
    fs.mkdir("/d", 0o755)
    fs.fsyncdir("/", 0, 0)
    fs.fsync("/d/f", 0, new_file(fs, "/d/f", b"x"))
    fs.cut()
    assert read_all(fs, "/d/f") == b"x"


def test_a_shrink_then_an_extension_reads_zeros_before_and_after_a_cut(tmp_path):
    fs = LazyFS(str(tmp_path))
    data = bytes(range(256)) * (3 * PAGE // 256)
    fh = new_file(fs, "/a", data)
    fs.fsync("/a", 0, fh)
    fs.truncate("/a", PAGE + 10, fh)
    fs.truncate("/a", 3 * PAGE, fh)
    expect = data[:PAGE + 10] + bytes(3 * PAGE - PAGE - 10)
    assert read_all(fs, "/a") == expect
    fs.cut()
    assert read_all(fs, "/a") == data                 # the shrink was not synced
    fs.truncate("/a", PAGE + 10, fh)
    fs.truncate("/a", 3 * PAGE, fh)
    fs.fsync("/a", 1, fh)
    fs.cut()
    assert read_all(fs, "/a") == expect


def test_fallocate_extends_with_zeros_and_a_sync_keeps_the_size(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/seg", b"abc")
    fs.fallocate("/seg", 0, 0, 2 * PAGE, fh)
    assert fs.getattr("/seg")["st_size"] == 2 * PAGE
    assert read_all(fs, "/seg") == b"abc" + bytes(2 * PAGE - 3)
    fs.fsync("/seg", 1, fh)
    fs.cut()
    assert fs.getattr("/seg")["st_size"] == 2 * PAGE


def test_writes_across_pages_and_a_partial_sync_state(tmp_path):
    fs = LazyFS(str(tmp_path))
    fh = new_file(fs, "/a", b"x" * (PAGE + 100))
    fs.fsync("/a", 1, fh)
    fs.write("/a", b"y" * 200, PAGE - 100, fh)        # straddles two pages, unsynced
    assert read_all(fs, "/a") == b"x" * (PAGE - 100) + b"y" * 200
    fs.cut()
    assert read_all(fs, "/a") == b"x" * (PAGE + 100)


def test_hard_link_survives_when_its_directory_is_synced(tmp_path):
    fs = LazyFS(str(tmp_path))
    fs.fsync("/a", 0, new_file(fs, "/a", b"linked"))
    fs.link("/b", "/a")
    fs.fsyncdir("/", 0, 0)
    fs.unlink("/a")
    fs.cut()
    assert read_all(fs, "/a") == read_all(fs, "/b") == b"linked"
