"""lazyfs mounted (tests/integration/lazyfs.py), through the kernel: what the appliance's own
calls (pwrite, fdatasync, mmap and msync, posix_fallocate, rename over a file, a directory's
fsync) keep across a cut, and what they do not."""

import mmap
import os

from appliance.durable import fsync_dir


def cut(m):
    m.cut()
    m.mount()


def test_unsynced_writes_go_synced_ones_stay(lazy_mount):
    d = lazy_mount.mountpoint
    fd = os.open(f"{d}/seg", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 1 << 20)
    os.pwrite(fd, b"synced", 0)
    os.fdatasync(fd)
    os.pwrite(fd, b"-lost", 6)
    os.close(fd)
    fsync_dir(d)
    with open(f"{d}/never-synced-name", "wb") as f:
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())
    cut(lazy_mount)
    with open(f"{d}/seg", "rb") as f:
        data = f.read()
    assert data[:11] == b"synced\0\0\0\0\0" and len(data) == 1 << 20
    assert sorted(os.listdir(d)) == ["seg"]


def test_msync_of_a_shared_map_is_a_sync(lazy_mount):
    d = lazy_mount.mountpoint
    fd = os.open(f"{d}/index", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 8192)
    fsync_dir(d)
    m = mmap.mmap(fd, 8192, mmap.MAP_SHARED)
    m[0:4] = b"kept"
    m.flush(0, 4096)                  # msync(MS_SYNC)
    m[4096:4100] = b"gone"            # written back perhaps, never synced
    m.close()
    os.close(fd)
    cut(lazy_mount)
    with open(f"{d}/index", "rb") as f:
        data = f.read()
    assert data[:4] == b"kept" and data[4096:4100] == b"\0\0\0\0"


def test_replace_without_the_directory_sync_keeps_the_old_file(lazy_mount):
    d = lazy_mount.mountpoint
    for name, body in (("live", b"old"), ("live.tmp", b"new")):
        with open(f"{d}/{name}", "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if name == "live":
            fsync_dir(d)
    os.replace(f"{d}/live.tmp", f"{d}/live")
    cut(lazy_mount)
    with open(f"{d}/live", "rb") as f:
        assert f.read() == b"old"
    assert not os.path.exists(f"{d}/live.tmp")   # its name was never synced either
    with open(f"{d}/live.tmp", "wb") as f:
        f.write(b"new")
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{d}/live.tmp", f"{d}/live")
    fsync_dir(d)
    cut(lazy_mount)
    with open(f"{d}/live", "rb") as f:
        assert f.read() == b"new"
