"""The data dir's disk reserve: ``<data_dir>/.reserve`` (``DiskReserve``).

Runs in the supervisor only (``appliance.supervisor``), at its start, and when a DeleteTopics needs
room or has freed it (``appliance.supervisor.topic_admin``); single-threaded.

A full data dir must not stop the start: Kafka starts on a full log dir and serves the deletes
that free it, and an appliance that cannot start cannot free its own disk. What a start writes
(recovered indexes, checkpoints, producer snapshots, the coordinator's epoch, the catalog a
DeleteTopics commits) needs a little space, so the supervisor keeps ``server.disk_reserve_bytes``
of it set aside in a file while the disk has room, and gives it back to the file system when a
start finds the disk full (as CockroachDB's emergency ballast does). It makes the file again once
deletes have freed twice its size.
"""

from __future__ import annotations

import errno
import logging
import os

from appliance.data_layout import CATALOG_FILE
from appliance.durable import NO_SPACE

log = logging.getLogger("appliance.supervisor")

RESERVE_FILE = ".reserve"
# The disk reserve is at most a RESERVE_SHARE-th of the data dir's file system, at least
# RESERVE_MIN_BYTES (reserve_size).
RESERVE_SHARE = 16
RESERVE_MIN_BYTES = 1 << 20


def free_bytes(path: str) -> int:
    """Bytes a write may still take (the supervisor's view: root also gets the blocks the file
    system reserves for root)."""
    st = os.statvfs(path)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def reserve_size(configured: int, fs_bytes: int, catalog_bytes: int) -> int:
    """The disk reserve for a file system of ``fs_bytes``: ``server.disk_reserve_bytes`` where
    the file system is large, a sixteenth of it where that is less (a 64 MiB reserve cannot exist
    on a 32 MiB disk, and without one a full disk could not commit the DeleteTopics that frees
    it), and never less than what a catalog commit needs (its copy, twice over) or
    RESERVE_MIN_BYTES. 0 stays 0: no reserve."""
    if configured == 0:
        return 0
    floor = max(RESERVE_MIN_BYTES, 2 * catalog_bytes)
    return min(configured, max(fs_bytes // RESERVE_SHARE, floor))


class DiskReserve:
    """``<data_dir>/.reserve``: ``size`` bytes of the data dir's file system set aside for the
    writes a start and a DeleteTopics need when everything else is full (``reserve_size``)."""

    def __init__(self, data_dir: str, configured: int) -> None:
        self.path = os.path.join(data_dir, RESERVE_FILE)
        self.data_dir = data_dir
        st = os.statvfs(data_dir)
        try:
            catalog_bytes = os.path.getsize(os.path.join(data_dir, CATALOG_FILE))
        except OSError:
            catalog_bytes = 0
        self.size = reserve_size(configured, st.f_blocks * st.f_frsize, catalog_bytes)
        if 0 < self.size < configured:
            log.info("data dir %s: a disk reserve of %d bytes, a share of its %d-byte file system "
                     "(server.disk_reserve_bytes is %d)", data_dir, self.size,
                     st.f_blocks * st.f_frsize, configured)

    def held(self) -> int:
        try:
            return os.stat(self.path).st_blocks * 512
        except FileNotFoundError:
            return 0

    def at_start(self) -> None:
        """Give the reserve back when the disk is full; else make sure it is there."""
        if self.size == 0:
            self.release("server.disk_reserve_bytes is 0")
            return
        held, free = self.held(), free_bytes(self.data_dir)
        if free < self.size:
            if held:
                self.release(f"the data dir's file system is full ({free} bytes free)")
            else:
                log.warning("data dir %s: file system full (%d bytes free) and no reserve to give "
                            "back: recovery may fail; delete topics or free space", self.data_dir,
                            free)
            return
        self.restore()

    def release(self, why: str) -> bool:
        held = self.held()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        if held:
            log.warning("data dir %s: %s: gave back the %d-byte reserve so that recovery and "
                        "deletes can write; delete topics (or free space) to get it back",
                        self.data_dir, why, held)
        return bool(held)

    def restore(self, need_free: int = 0) -> None:
        """Make the reserve whole, if the file system has ``need_free`` bytes beyond it."""
        if self.size == 0 or self.held() >= self.size:
            return
        if free_bytes(self.data_dir) < self.size + need_free:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)   # real blocks, not a sparse file
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno not in NO_SPACE and e.errno != errno.EOPNOTSUPP:
                raise
            try:
                os.unlink(self.path)     # a partial reserve would only hide the full disk
            except FileNotFoundError:
                pass
            return
        log.info("data dir %s: %d-byte disk reserve in place", self.data_dir, self.size)
