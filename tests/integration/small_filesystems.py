"""Small file systems for the full-disk tests (runs in the pytest process): an ext4 file system on a loop device, or a tmpfs
with a size limit, mounted under the test's tmp dir and always taken down again.

Needs root (CI runs as root): without it, or without a loop device, the fixture fails the test
(it never skips). Cleanup runs in a ``finally`` and survives a failure halfway through the set-up:
what was mounted is unmounted (lazily if something still holds it), and a loop device this module
attached is detached.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from typing import Iterator

import pytest

MiB = 1 << 20


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True)


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root to mount a file system (CI runs as root)")


def _umount(mnt: str) -> None:
    if _run("umount", mnt).returncode != 0:
        _run("umount", "-l", mnt)


@contextlib.contextmanager
def ext4_loop(parent: str, size: int) -> Iterator[str]:
    """An ext4 file system of ``size`` bytes (no blocks reserved for root, so that a root
    process fills it like any other) mounted at ``parent/mnt``."""
    _need_root("an ext4 loop device")
    image, mnt = os.path.join(parent, "disk.img"), os.path.join(parent, "mnt")
    os.makedirs(mnt, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    r = _run("mkfs.ext4", "-q", "-F", "-m", "0", image)
    if r.returncode != 0:
        pytest.fail(f"mkfs.ext4 failed: {r.stderr.strip()}")
    loop = mounted = None
    try:
        r = _run("losetup", "--find", "--show", image)
        if r.returncode != 0:
            pytest.fail(f"no loop device: {r.stderr.strip()}")
        loop = r.stdout.strip()
        r = _run("mount", "-t", "ext4", loop, mnt)
        if r.returncode != 0:
            pytest.fail(f"cannot mount {loop}: {r.stderr.strip()}")
        mounted = mnt
        yield mnt
    finally:
        if mounted:
            _umount(mounted)
        if loop:
            _run("losetup", "-d", loop)
        with contextlib.suppress(OSError):
            os.unlink(image)


@contextlib.contextmanager
def small_tmpfs(parent: str, size: int, name: str = "tmpfs") -> Iterator[str]:
    """A tmpfs of ``size`` bytes mounted at ``parent/<name>``."""
    _need_root("a tmpfs")
    mnt = os.path.join(parent, name)
    os.makedirs(mnt, exist_ok=True)
    r = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", mnt)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        _umount(mnt)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def disk_full(path: str, probe_bytes: int = 4096) -> bool:
    """Whether a ``probe_bytes`` write (with its blocks) fails with ENOSPC."""
    probe = os.path.join(path, ".probe")
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, probe_bytes)
        finally:
            os.close(fd)
        return False
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)


def fill(path: str, leave: int = 0) -> int:
    """Take every block but ``leave`` bytes of the file system with a filler file; its size."""
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_RDWR | os.O_CREAT, 0o600)
    got = os.fstat(fd).st_size
    try:
        chunk = max(free_bytes(path) - leave, 0)
        while chunk >= 512:          # down to the last block (1 KiB on a small ext4)
            try:
                os.posix_fallocate(fd, got, chunk)
                got += chunk
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk //= 2
    finally:
        os.close(fd)
    return got
