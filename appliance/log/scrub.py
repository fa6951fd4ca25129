"""The background scrub of sealed segments (issue 34, bit rot): walk every batch of every sealed
segment of the partitions it is given, check its CRC-32C, report the ones that fail.

Runs in the cleaner processes (``workers/cleaner.py``: SCHED_IDLE with the idle I/O class, so it
reads with spare CPU and disk only), each over the partitions of the writer processes it serves
(``runtime.cleaner_of``). A ``Scrubber`` owns its cursor (partition, segment, position) and what
it has reported; it owns nothing durable and tells nobody but its metrics and its log: the fetch
path checks the CRC of what it serves by itself (``appliance.log.reader``), so a corrupt range
needs no shared state to be refused. What the scrub adds is finding damage nobody reads, while
there is still a good copy to restore from.

Files are read with ``pread``, never mapped: a writer that restarts may truncate a segment under
a reader at recovery, and a map read past the new end is a SIGBUS where a ``pread`` is a short
read. Only segments below the partition's published active segment are read, and only while its
writer is READY. A batch's length field is outside its CRC: a header that cannot be walked
(magic other than 2, a length below the v2 header or past the file's end) ends the walk of that
segment, reported at its position.

The rate: ``step(budget)`` reads at most ``budget`` bytes (whole batches, at least one) and says
how many it read; the caller spaces steps so that the bytes per second stay under
``[log.scrub] bytes_per_second``. A pass over every partition ends with ``passes`` counted; the
next starts ``pass_interval_s`` later.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from crc32c import crc32c

from appliance.log.files import list_segment_bases, log_path
from appliance.protocol.records import ATTRIBUTES_OFFSET, HEADER_SIZE, MAGIC

__all__ = ["ScrubTarget", "Damage", "Scrubber", "scan_segment"]

WINDOW = 1 << 20          # bytes read by one pread (more for a larger batch)
MAX_TARGETS_A_STEP = 256  # partitions one step looks at, at most (a page and a listing each)


class ScrubTarget(NamedTuple):
    name: str             # the partition's writer name (its page)
    topic: str
    partition: int
    directory: str


class Damage(NamedTuple):
    path: str
    position: int
    offset: int           # the batch's base offset as stored (-1: header unreadable)
    reason: str


def scan_segment(path: str, start: int, budget: int) -> tuple[int, int, list[Damage], bool]:
    """Check the batches of ``path`` from ``start``, about ``budget`` bytes of them (whole
    batches, at least one). Returns (next position, bytes read, damage found, segment done)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return start, 0, [], True          # deleted (retention) or replaced: nothing to check
    found: list[Damage] = []
    read = 0
    pos = start
    try:
        size = os.fstat(fd).st_size
        while pos < size and read < budget:
            buf = os.pread(fd, max(WINDOW, HEADER_SIZE), pos)
            if len(buf) < HEADER_SIZE:
                if buf.strip(b"\0"):
                    found.append(Damage(path, pos, -1, "a torn batch header at the end"))
                return pos, read, found, True
            off = 0
            while off + HEADER_SIZE <= len(buf):
                base, length = struct.unpack_from(">qi", buf, off)
                magic = buf[off + 16]
                n = length + 12
                if magic != MAGIC or n < HEADER_SIZE or pos + off + n > size:
                    found.append(Damage(path, pos + off, base if magic == MAGIC else -1,
                                        "a batch header that cannot be read (length or magic)"))
                    return pos + off, read, found, True
                if off + n > len(buf):
                    if off == 0:                 # one batch larger than the window
                        buf = os.pread(fd, n, pos)
                        if len(buf) < n:
                            return pos, read, found, True      # cut under us: the writer decides
                    else:
                        break
                (crc,) = struct.unpack_from(">I", buf, off + 17)
                with memoryview(buf) as mv, mv[off + ATTRIBUTES_OFFSET:off + n] as body:
                    if crc32c(body) != crc:
                        found.append(Damage(path, pos + off, base, "the batch fails its CRC"))
                off += n
                read += n
                if read >= budget:
                    break
            if off == 0:
                break
            pos += off
        return pos, read, found, pos >= size
    finally:
        os.close(fd)


@dataclass
class Scrubber:
    """One cleaner's scrub: its cursor over ``targets`` and what it has reported."""

    pass_interval_s: float
    targets: list[ScrubTarget] = field(default_factory=list)
    passes: int = 0
    bytes_read: int = 0
    _i: int = 0                      # the target being scrubbed
    _segment: int = -1               # its segment (base offset), -1: the next one to pick
    _pos: int = 0
    _ino: int = 0
    _reported: set = field(default_factory=set)    # (path, inode, position) logged already
    next_pass_at: float = 0.0

    def set_targets(self, targets: list[ScrubTarget]) -> None:
        """The partitions to scrub now (the catalog and the assignment changed); the cursor
        stays on its partition when it is still one of them."""
        cur = self.targets[self._i].name if self._i < len(self.targets) else None
        self.targets = targets
        names = [t.name for t in targets]
        if cur in names:
            self._i = names.index(cur)
        else:
            self._i, self._segment, self._pos, self._ino = min(self._i, len(targets)), -1, 0, 0

    def due(self, now: float) -> bool:
        return bool(self.targets) and now >= self.next_pass_at

    def step(self, now: float, budget: int, active_base: Callable[[ScrubTarget], int | None]
             ) -> tuple[int, list[tuple[ScrubTarget, Damage]]]:
        """Scrub about ``budget`` bytes from the cursor on. ``active_base(target)`` is the base
        offset of the partition's active segment, None while its writer is not READY (the
        partition is skipped this pass). Returns (bytes read, new damage)."""
        out: list[tuple[ScrubTarget, Damage]] = []
        read = 0
        looked = 0                     # partitions looked at: a step stays short at 10,000 of them
        while read < budget and self.targets and looked < MAX_TARGETS_A_STEP:
            if self._i >= len(self.targets):
                self._i, self._segment, self._pos = 0, -1, 0
                self.passes += 1
                self.next_pass_at = now + self.pass_interval_s
                break
            t = self.targets[self._i]
            looked += 1
            active = active_base(t)
            seg = self._next_segment(t, active) if active is not None else None
            if seg is None:
                self._i, self._segment, self._pos = self._i + 1, -1, 0
                continue
            path = log_path(t.directory, seg)
            try:
                ino = os.stat(path).st_ino
            except FileNotFoundError:
                self._segment, self._pos, self._ino = -(seg + 2), 0, 0   # gone: the one after it
                continue
            if ino != self._ino:
                self._ino, self._pos = ino, 0               # a cleaner swap: the new file anew
            pos, n, damage, done = scan_segment(path, self._pos, budget - read)
            read += n
            for d in damage:
                k = (d.path, ino, d.position)
                if k not in self._reported:
                    self._reported.add(k)
                    out.append((t, d))
            if done:
                self._segment, self._pos, self._ino = -(seg + 2), 0, 0   # after seg next
            else:
                self._segment, self._pos = seg, pos
        self.bytes_read += read
        return read, out

    def _next_segment(self, t: ScrubTarget, active: int) -> int | None:
        """The sealed segment the cursor is in, or the first after it (None: none left)."""
        if self._segment >= 0:
            return self._segment if self._segment < active else None
        after = -self._segment - 2          # -1 -> -1 (from the start); -(b+2) -> b
        try:
            bases = list_segment_bases(t.directory)
        except FileNotFoundError:
            return None
        for b in bases:
            if b > after and b < active:
                return b
        return None
