"""Ready map: which of a consumer's input rings were published to since it last looked.

Owns: one file per consuming endpoint, ``<run_dir>/ready.<endpoint>`` (see ``shm.topology``). The
supervisor makes it before it forks the consumer, as every runtime file (``create``); the consumer
(its ``Mailbox``) opens it, making one only where nobody did (the supervisor's own mailbox,
tests), and a restarted consumer reuses what its dead predecessor left. It hands each input ring a
slot, stored in the ring's header (``Ring.ready_slot``); every producer, after it
publishes a record, stores 1 into its ring's slot (``mark``). The consumer then finds the rings to
read with one ``mmap.find`` over the map instead of looking at every ring: with hundreds of
partition writers answering one frontend, or asking the coordinator, a wake-up used to cost a
look at every ring (O(inputs) in Python, about 2 us each), now it costs the rings that have
something.

Layout: ``SLOTS`` bytes (one page). Byte 0 is unused (slot 0 means "no slot"); byte i is 1 when
the producer of the ring holding slot i published since the consumer last took that slot, else
0. A consumer with more inputs than slots leaves the rest without a slot and looks at those
every time (``Mailbox``).

Memory ordering: the producer stores the ring's tail, then the flag (x86-64 keeps two stores in
order; elsewhere see below). The consumer clears the flags it takes, puts a full barrier
(``shm.topology._fence``), and only then reads those rings' tails: a producer whose flag store
the clear overwrote had published its tail before its flag, so the read after the barrier sees
the record, and a producer publishing after the read sets the flag again. A flag is a hint: a
set flag over an empty ring (a record already read through a full look) costs one look; the
sleep protocol does not rest on flags alone (``Mailbox.pending`` looks at the ring behind each
flag, and a bell always wakes), and a consumer that reads through the map should also look at
every ring now and then, which bounds what anything unforeseen (a store reordering on a weakly
ordered machine) can cost.

The file's blocks are allocated at creation (``Region.create``), so a full runtime directory is
an error there, never a SIGBUS at a later store; a consumer that cannot create its map works
without one (every ring looked at every time).
"""

from __future__ import annotations

import mmap

from .region import PAGE_SIZE, Region

__all__ = ["ReadyMap", "SLOTS"]

SLOTS = PAGE_SIZE
_ONE = b"\x01"


class ReadyMap:
    """The mapping of one ready file, for the consumer (``take``) or a producer (``mark``)."""

    __slots__ = ("region", "_mm")

    def __init__(self, region: Region) -> None:
        self.region = region
        self._mm: mmap.mmap = region.buf

    @classmethod
    def open_or_create(cls, path: str) -> "ReadyMap":
        """The consumer's map: the existing file (a restarted consumer's predecessor left it;
        stale flags only cost a look each) or a new one."""
        try:
            region = Region.open(path)
        except FileNotFoundError:
            region = Region.create(path, SLOTS)
        if region.size < SLOTS:
            region.close()
            raise ValueError(f"{path}: {region.size} bytes, a ready map has {SLOTS}")
        return cls(region)

    @classmethod
    def create(cls, path: str) -> "ReadyMap":
        """A new (or atomically replaced) map, every slot clear."""
        return cls(Region.create(path, SLOTS))

    @classmethod
    def open(cls, path: str) -> "ReadyMap":
        """A producer's map of an existing file."""
        return cls(Region.open(path))

    def mark(self, slot: int) -> None:
        """Producer: the ring holding ``slot`` has a new record (after the tail store)."""
        self._mm[slot] = 1

    def take(self, end: int) -> list[int]:
        """Consumer: the flagged slots below ``end``, cleared. The caller fences before it reads
        the rings (see the module docstring: a mark a producer stored between the find and the
        clear is lost, but its record is read after the fence)."""
        out = self.flagged(end)
        mm = self._mm
        for i in out:
            mm[i] = 0
        return out

    def flagged(self, end: int) -> list[int]:
        """Consumer: the flagged slots below ``end``, left as they are."""
        mm = self._mm
        out = []
        i = mm.find(_ONE, 1, end)
        while i >= 0:
            out.append(i)
            i = mm.find(_ONE, i + 1, end)
        return out

    def clear(self, slot: int) -> None:
        self._mm[slot] = 0

    def close(self) -> None:
        self.region.close()
