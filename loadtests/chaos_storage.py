"""The chaos suite's storage faults (issue 34): the power cut and the bit flip.

Used by ``loadtests/chaos_nemesis.py`` (in the chaos tool's process, the nemesis thread). Owns:

* ``LazyDisk``: the data dir's file system for power cuts: ``tests/integration/lazyfs.py`` (a FUSE
  file system, its own process, that keeps written data in memory until the file's fsync and a
  name until its directory's fsync). ``cut()`` is the power cut: the file system is killed with
  what it held unsynced, and mounted again over its durable store.
* ``flip_sealed_batch``: one byte changed in one record batch of a sealed segment (not the
  active one, which recovery scans anyway) of a partition, in the batch's records (past its
  61-byte header, so that the header still parses and exactly that batch fails its CRC-32C).
  The byte is written and fsynced: rot on the medium survives a power cut too. It returns the
  batch's offsets, which the checker needs: the records of a damaged batch are given up (never
  counted lost), and must never be read after the damage (``queue_checker``: corrupt-read).
"""

from __future__ import annotations

import glob
import os
import random
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))

from appliance.data_layout import partition_dir  # noqa: E402
from appliance.protocol.records import HEADER_SIZE, LOG_OVERHEAD, iter_batch_headers  # noqa: E402


class LazyDisk:
    """The data dir on lazyfs, at ``<workdir>/disk`` over ``<workdir>/lazy-backing``."""

    kind = "lazyfs"

    def __init__(self, workdir: str) -> None:
        from lazyfs import LazyMount, available
        why = available()
        if why:
            raise SystemExit(f"--disk lazyfs: {why}")
        self.mnt = os.path.join(workdir, "disk")
        self.mount_ = LazyMount(os.path.join(workdir, "lazy-backing"), self.mnt)
        self.mounted = False
        self.cuts = 0

    def mount(self) -> None:
        self.mount_.mount()
        self.mounted = True

    def make_data_dir(self) -> str:
        """The operator's part: the data dir exists, and its name is durable, before the start."""
        d = os.path.join(self.mnt, "data")
        os.makedirs(d, exist_ok=True)
        fd = os.open(self.mnt, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return d

    def cut(self) -> None:
        """The power cut (the appliance is already dead): unsynced data gone, mounted again."""
        self.mount_.cut()
        self.mount_.mount()
        self.cuts += 1

    def unmount(self) -> None:
        if self.mounted:
            self.mount_.unmount()
            self.mounted = False

    # disk-full does not apply: lazyfs has no size limit.
    def free(self) -> None:
        pass


@dataclass
class Damage:
    """One batch made to fail its CRC: the checker's record of what was damaged on purpose."""
    key: str             # "<topic>-<partition>"
    first: int           # the batch's base offset
    last: int            # its last offset
    at: float            # seconds since the run started (the flip written)
    running: bool        # written under the running appliance (else while it was down)
    file: str
    position: int        # of the byte changed

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def sealed_segments(directory: str) -> list[str]:
    """The partition's segment files but the newest (the active segment)."""
    logs = sorted(glob.glob(os.path.join(directory, "*.log")),
                  key=lambda p: int(os.path.basename(p).split(".")[0]))
    return logs[:-1]


def flip_sealed_batch(data_dir: str, topic: str, partitions: int, rng: random.Random,
                      done: list[Damage], at: float, running: bool) -> Damage | None:
    """Change one byte of a random batch of a random sealed segment (a batch not damaged yet);
    None when no partition has a sealed segment with such a batch yet."""
    order = list(range(partitions))
    rng.shuffle(order)
    taken = {(d.key, d.first) for d in done}
    for p in order:
        segments = sealed_segments(partition_dir(data_dir, topic, p))
        rng.shuffle(segments)
        for path in segments:
            with open(path, "rb") as f:
                content = f.read()
            batches = [(pos, h) for pos, h in iter_batch_headers(content)
                       if h.batch_length + LOG_OVERHEAD > HEADER_SIZE and (f"{topic}-{p}", h.base_offset) not in taken]
            if not batches:
                continue
            pos, h = rng.choice(batches)
            size = h.batch_length + LOG_OVERHEAD
            at_byte = pos + HEADER_SIZE + rng.randrange(size - HEADER_SIZE)
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes([content[at_byte] ^ (1 << rng.randrange(8))]), at_byte)
                os.fsync(fd)
            finally:
                os.close(fd)
            return Damage(f"{topic}-{p}", h.base_offset, h.last_offset, at, running, path, at_byte)
    return None
