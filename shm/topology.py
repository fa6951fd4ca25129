"""Naming and opening of channels in the runtime directory.

Owns: the file names in the runtime directory and each process's cache of opened rings and pages.
The supervisor creates the files (``create_ring``/``create_page``) before it forks the process that
consumes them and removes an endpoint's files when it retires that endpoint (``remove_endpoint``);
every process opens what it needs by name (``open_ring``/``open_page``). See docs/architecture.md,
"Runtime directory and channels".

Names (endpoints are ``sup``, ``co``, ``fe<i>``, ``fx<i>``, ``w<topic_id_hex>.<partition>``; they
must not contain ``-`` or ``/``, because ``-`` separates the two ends of a ring)::

    <run_dir>/ring.<src>-<dst>    SPSC ring, producer src -> consumer dst   (shm.ring)
    <run_dir>/bell.<endpoint>     the endpoint's doorbell socket             (shm.doorbell)
    <run_dir>/ready.<endpoint>    which of its input rings have records      (shm.ready)
    <run_dir>/page.<name>         a state page                               (shm.statepage)
    <run_dir>/metrics.<name>      the endpoint's metrics table               (shm.metrics)
    <run_dir>/conns.<frontend>    a frontend's connections per IP address    (shm.conntable)
    <run_dir>/<name>              anything else (heartbeats, catalog.msgpack)

    <run_dir>/spill.<pid>.<n>     one record too large for its ring          (Outbox.post, unspill)

A record larger than its ring's ``max_payload`` could never be put (a JoinGroup answer carrying
every member's subscription, a request near ``socket_request_max_bytes``): ``Outbox.post`` writes
its bytes to a spill file (tmpfs, like the rings) and puts ``SPILLED`` + the file's path into the
ring instead, in order with the other records. The consumer's decoder (``appliance.ipc.decode``)
reads the file back and removes it (``unspill``). Only messages whose consumer decodes them with
it may spill: the produce fast path's records are kept below the limit by their sender.

``Outbox`` and ``Mailbox`` implement the wake-up protocol on top: the producer rings the
consumer's bell only when the ring's ``consumer_waiting`` flag is set; the consumer sets the flag
on all its input rings, re-checks them, and only then sleeps on its bell, with a bounded timeout.
Which rings to read is the ready map's answer (``shm.ready``): the producer marks its ring's slot
after each publish, the consumer takes the marked slots (``Mailbox.take_ready``) and re-checks
through them (``Mailbox.pending``), so neither costs a look at every input.

The flag protocol is a store-then-load on each side (producer: store tail, load flag; consumer:
store flag, load tail). Even x86-64 may reorder a store with a later load (the store buffer), which
could lose a wake-up. Both sides therefore put a full barrier between the two: ``_fence()`` takes
and releases an uncontended lock, which in CPython on Linux is a semaphore operation, i.e. a
``lock``-prefixed instruction (a full barrier on x86-64) - no C extension needed. On other machines
that is not guaranteed to be a full barrier; there, and for anything else we did not foresee, the
bounded wait caps what a lost wake-up costs at the timeout.
"""

from __future__ import annotations

import collections

import os
import threading
from typing import Iterable, Sequence

from .doorbell import BellSender, Doorbell
from .ready import SLOTS, ReadyMap
from .ring import Buffer, RecordTooLarge, Ring
from .statepage import StatePage

__all__ = ["Topology", "Outbox", "Mailbox", "SPILLED", "unspill"]

# First byte of a spilled record: 0xC1 is the one byte msgpack never uses, so no envelope starts
# with it, and it is no KIND_* of the produce path.
# How often ``Mailbox.to_read`` also returns every input, not only the marked ones.
FULL_LOOK_S = 1.0
SPILLED = 0xC1
_spilled_count = 0

_fence_lock = threading.Lock()


def _fence() -> None:
    """Full memory barrier, as far as CPython lets us have one (see the module docstring)."""
    _fence_lock.acquire()
    _fence_lock.release()


def _owned(parts: tuple[Buffer, ...]) -> tuple[Buffer, ...]:
    """``parts`` with every ``memoryview`` copied: what it shows may be reused once post()
    returns (a connection's receive buffer)."""
    if any(type(p) is memoryview for p in parts):
        return tuple(bytes(p) if type(p) is memoryview else p for p in parts)
    return parts


def _check_endpoint(name: str) -> str:
    if not name or "-" in name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"bad endpoint name {name!r} (no '-', '/', NUL; not empty)")
    return name


class Topology:
    """File names of one runtime directory plus this process's open rings and pages."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = os.fspath(run_dir)
        self._rings: dict[tuple[str, str], Ring] = {}
        self._pages: dict[tuple[str, bool], StatePage] = {}

    # -- names -----------------------------------------------------------------------------
    def ring_path(self, src: str, dst: str) -> str:
        return f"{self.run_dir}/ring.{_check_endpoint(src)}-{_check_endpoint(dst)}"

    def bell_path(self, endpoint: str) -> str:
        return f"{self.run_dir}/bell.{_check_endpoint(endpoint)}"

    def ready_path(self, endpoint: str) -> str:
        return f"{self.run_dir}/ready.{_check_endpoint(endpoint)}"

    def page_path(self, name: str) -> str:
        return f"{self.run_dir}/page.{_check_endpoint(name)}"

    def metrics_path(self, name: str) -> str:
        return f"{self.run_dir}/metrics.{_check_endpoint(name)}"
    def conns_path(self, frontend: str) -> str:
        return f"{self.run_dir}/conns.{_check_endpoint(frontend)}"

    def file_path(self, name: str) -> str:
        if not name or "/" in name:
            raise ValueError(f"bad runtime file name {name!r}")
        return f"{self.run_dir}/{name}"

    # -- rings -----------------------------------------------------------------------------
    def create_ring(self, src: str, dst: str, capacity: int, *,
                    checksums: bool | None = None) -> Ring:
        """Create (or replace) ring src -> dst, empty. Not cached: the creator (the supervisor)
        usually does not use it and should close it (every mapping holds a file descriptor)."""
        self._drop_ring((src, dst))   # a cached mapping would be of the replaced file
        return Ring.create(self.ring_path(src, dst), capacity, checksums=checksums)

    def open_ring(self, src: str, dst: str) -> Ring:
        """Open ring src -> dst (once per process; later calls return the same object)."""
        key = (src, dst)
        ring = self._rings.get(key)
        if ring is None:
            ring = self._rings[key] = Ring.open(self.ring_path(src, dst))
        return ring

    def _drop_ring(self, key: tuple[str, str]) -> None:
        ring = self._rings.pop(key, None)
        if ring is not None:
            ring.close()

    # -- pages -----------------------------------------------------------------------------
    def create_page(self, name: str, fields: Sequence[tuple[str, str]],
                    flag_slots: int = 64) -> StatePage:
        """Create (or replace) page ``name``; not cached (see ``create_ring``)."""
        for key in [k for k in self._pages if k[0] == name]:
            self._pages.pop(key).close()
        return StatePage.create(self.page_path(name), fields, flag_slots)

    def open_page(self, name: str, fields: Sequence[tuple[str, str]], readonly: bool = False,
                  flag_slots: int = 64) -> StatePage:
        """Open page ``name`` (cached per process and access mode)."""
        key = (name, readonly)
        page = self._pages.get(key)
        if page is None:
            page = self._pages[key] = StatePage.open(self.page_path(name), fields, readonly,
                                                     flag_slots)
        return page

    # -- retiring --------------------------------------------------------------------------
    def forget(self, endpoint: str, bells: BellSender | None = None) -> None:
        """Close and drop this process's cached rings and pages touching ``endpoint`` (e.g. when
        it was removed or re-created), and ``bells``' socket connected to its bell.
        Outboxes/mailbox inputs holding them must be dropped too."""
        if bells is not None:
            bells.forget(self.bell_path(endpoint))
        for key in [k for k in self._rings if endpoint in k]:
            self._drop_ring(key)
        for key in [k for k in self._pages if k[0] == endpoint]:
            self._pages.pop(key).close()

    def remove_endpoint(self, endpoint: str, bells: BellSender | None = None) -> None:
        """Unlink every ring whose src or dst is ``endpoint``, its bell, its page, its metrics
        table and its connection table (``forget`` first)."""
        _check_endpoint(endpoint)
        self.forget(endpoint, bells)
        try:
            names = os.listdir(self.run_dir)
        except FileNotFoundError:
            return
        for name in names:
            if not name.startswith("ring."):
                continue
            src, sep, dst = name[5:].partition("-")
            if sep and (src == endpoint or dst == endpoint):
                _unlink(f"{self.run_dir}/{name}")
        _unlink(self.bell_path(endpoint))
        _unlink(self.ready_path(endpoint))
        _unlink(self.page_path(endpoint))
        _unlink(self.conns_path(endpoint))
        _unlink(self.metrics_path(endpoint))

    def close(self) -> None:
        """Close every cached ring and page."""
        for ring in self._rings.values():
            ring.close()
        for page in self._pages.values():
            page.close()
        self._rings.clear()
        self._pages.clear()

    def __repr__(self) -> str:
        return f"Topology({self.run_dir!r})"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Outbox:
    """Producer end of ring src -> dst, ringing dst's bell when dst says it is waiting."""

    __slots__ = ("src", "dst", "ring", "bell", "sender", "queued", "run_dir", "ready_path",
                 "_ready")

    def __init__(self, topology: Topology, src: str, dst: str, sender: BellSender) -> None:
        self.src = src
        self.dst = dst
        self.run_dir = topology.run_dir
        self.ring = topology.open_ring(src, dst)
        self.bell = topology.bell_path(dst)
        self.ready_path = topology.ready_path(dst)
        # The consumer's ready map: opened now when the consumer has made it, else at the first
        # mark (None until then; False: there is none to open). Every mapping holds a file
        # descriptor, so each destination costs one more.
        self._ready: ReadyMap | None | bool = self._open_ready(missing=None)
        self.sender = sender
        sender.connect(self.bell)       # its descriptor now, with the channel's others
        # Messages that found the ring full, oldest first; see post() and flush().
        self.queued: collections.deque[tuple[Buffer, ...]] = collections.deque()

    def post(self, *parts: Buffer) -> int:
        """Put one record now if it fits and nothing is queued, else queue it behind the others:
        records reach the consumer in post() order. Does not ring: call flush() after a group.
        A ``memoryview`` part is copied when the record is queued (the memory it shows, e.g. a
        connection's receive buffer, may be reused before the queue drains); other parts must
        stay unchanged until they leave the queue.

        Returns the record's end position in the ring (see ``Ring.head``), or -1 if it was
        queued (``is_queued`` tells whether it still is). A record larger than the ring can
        ever hold is spilled to a file (see the module docstring)."""
        if self.queued:
            if sum(len(memoryview(p)) for p in parts) > self.ring.max_payload:
                parts = (self._spill(parts),)
            self.queued.append(_owned(parts))
            return -1
        try:
            put = self.ring.try_put(*parts)
        except RecordTooLarge:
            parts = (self._spill(parts),)
            put = self.ring.try_put(*parts)
        if not put:
            self.queued.append(_owned(parts))
            return -1
        self._mark()
        return self.ring.tail

    def _mark(self) -> None:
        """After a publish: mark the ring's slot in the consumer's ready map (``shm.ready``)."""
        slot = self.ring.ready_slot
        if slot:
            ready = self._ready
            if ready is None:
                # The consumer gave the ring a slot, so it has made its map by now; if there is
                # none, it could not make one, and it looks at every ring anyway.
                ready = self._ready = self._open_ready(missing=False)
            if ready:
                ready.mark(slot)

    def _open_ready(self, missing: None | bool) -> ReadyMap | None | bool:
        """The consumer's ready map; ``missing`` if there is no such file; False if it cannot
        be mapped (a full runtime dir, a short file): never looked for again."""
        try:
            return ReadyMap.open(self.ready_path)
        except FileNotFoundError:
            return missing
        except (OSError, ValueError):
            return False

    def _spill(self, parts: tuple[Buffer, ...]) -> bytes:
        global _spilled_count
        _spilled_count += 1
        path = f"{self.run_dir}/spill.{os.getpid()}.{_spilled_count}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                for p in parts:
                    f.write(p)
        finally:
            os.close(fd)
        return bytes([SPILLED]) + path.encode()

    def is_queued(self, first_part: Buffer) -> bool:
        """Whether the record posted with this very object as its first part still waits here."""
        return any(parts[0] is first_part for parts in self.queued)

    def flush(self) -> bool:
        """Move queued records into the ring while they fit, then ring the consumer's bell once
        if it waits. Returns True while records remain queued (call again later)."""
        ring = self.ring
        queued = self.queued
        if queued:
            moved = False
            while queued and ring.try_put(*queued[0]):
                queued.popleft()
                moved = True
            if moved:
                self._mark()
        _fence()                       # tail store before the flag load (see module docstring)
        if ring.consumer_waiting:
            self.sender.ring(self.bell)
        return bool(queued)

    def send(self, *parts: Buffer) -> bool:
        """Put one record (``parts`` back to back); False if the ring is full right now.

        The bell is rung whenever the consumer is waiting, even when the put failed: a full ring
        whose consumer sleeps is exactly a lost wake-up to repair."""
        ring = self.ring
        ok = ring.try_put(*parts)
        if ok:
            self._mark()
        _fence()                       # tail store before the flag load (see module docstring)
        if ring.consumer_waiting:
            self.sender.ring(self.bell)
        return ok


def unspill(record: Buffer) -> bytes:
    """The record a ``SPILLED`` reference stands for; its file is removed (read once)."""
    path = bytes(memoryview(record)[1:]).decode()
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    return data


class Mailbox:
    """Consumer end of all rings into ``endpoint``; owns the endpoint's doorbell and ready map."""

    def __init__(self, topology: Topology, endpoint: str) -> None:
        self.topology = topology
        self.endpoint = _check_endpoint(endpoint)
        self._next_full_look = 0.0      # to_read's schedule of looks at every input
        self.doorbell = Doorbell(topology.bell_path(endpoint))
        self.inputs: dict[str, Ring] = {}
        try:
            self.ready_map: ReadyMap | None = ReadyMap.open_or_create(topology.ready_path(endpoint))
        except (OSError, ValueError):
            self.ready_map = None       # a full runtime dir: every ring is looked at every time
        self._slot_of: dict[str, int] = {}
        self._src_of: dict[int, str] = {}
        self._free_slots: list[int] = []
        self._slot_end = 1              # one past the highest slot handed out
        self._unslotted: dict[str, Ring] = {}   # inputs beyond the map's slots (or no map)
        # Between arm() and disarm(): every input's flag is set, an input added meanwhile too.
        # Only this process writes the flags, so an armed mailbox need not set them again (an
        # asyncio worker arms once and stays armed: a re-arm at each bell cost a store per input).
        self.armed = False

    def add(self, src: str) -> Ring:
        """Open ring src -> endpoint and take it as an input, with a slot in the ready map,
        marked: records put before this are looked for at the next take."""
        ring = self.topology.open_ring(src, self.endpoint)
        self.inputs[src] = ring
        if self.armed:
            ring.consumer_waiting = True
            _fence()                   # before the caller's look at the ring (see arm)
        slot = self._slot_of.get(src) or self._new_slot()
        if slot:
            self._slot_of[src] = slot
            self._src_of[slot] = src
            ring.ready_slot = slot
            self.ready_map.mark(slot)   # type: ignore[union-attr]
        else:
            ring.ready_slot = 0
            self._unslotted[src] = ring
        return ring

    def _new_slot(self) -> int:
        if self.ready_map is None:
            return 0
        if self._free_slots:
            return self._free_slots.pop()
        if self._slot_end >= SLOTS:
            return 0
        self._slot_end += 1
        return self._slot_end - 1

    def remove(self, src: str) -> Ring | None:
        """Stop consuming from src (the ring stays open in the topology cache)."""
        ring = self.inputs.pop(src, None)
        if ring is not None:
            ring.consumer_waiting = False
        self._unslotted.pop(src, None)
        slot = self._slot_of.pop(src, 0)
        if slot:
            del self._src_of[slot]
            self._free_slots.append(slot)
            if ring is not None:
                ring.ready_slot = 0
            self.ready_map.clear(slot)  # type: ignore[union-attr]
        return ring

    def take_ready(self) -> list[tuple[str, Ring]]:
        """The inputs marked since the last take (their marks cleared, then a barrier: see
        ``shm.ready``), and every input without a slot. The caller reads each to its end."""
        out: list[tuple[str, Ring]] = []
        ready = self.ready_map
        if ready is not None:
            slots = ready.take(self._slot_end)
            if slots:
                _fence()               # mark stores before the tail loads of the reads
                src_of = self._src_of
                inputs = self.inputs
                for slot in slots:
                    src = src_of.get(slot)
                    if src is not None:
                        out.append((src, inputs[src]))
        if self._unslotted:
            out.extend(self._unslotted.items())
        return out

    def to_read(self, now: float) -> Iterable[tuple[str, Ring]]:
        """The inputs to read in this turn (``now``: a monotonic clock): ``take_ready``'s, and
        every input once each ``FULL_LOOK_S``, the bound on what a record nobody marked (what
        ``shm.ready`` did not foresee) can wait. The caller reads each to its end."""
        rings = self.take_ready()
        if now >= self._next_full_look:
            self._next_full_look = now + FULL_LOOK_S
            return list(self.inputs.items())
        return rings

    def arm(self) -> None:
        """Set consumer_waiting on every input (and on inputs added later, until ``disarm``):
        producers ring from now on. Re-check the rings (``pending()``) after this and before
        sleeping. Nothing to do when already armed."""
        if self.armed:
            return
        self.armed = True
        for ring in self.inputs.values():
            ring.consumer_waiting = True
        _fence()                       # flag stores before the tail loads of the re-check

    def disarm(self) -> None:
        self.armed = False
        for ring in self.inputs.values():
            ring.consumer_waiting = False

    def pending(self) -> bool:
        """True if any input ring holds a record: those behind a mark (a mark over an empty ring,
        left by a consumer that read every ring, is cleared, and the ring looked at again after
        a barrier) and those without a slot."""
        ready = self.ready_map
        if ready is not None:
            cleared: list[tuple[int, Ring]] = []
            for slot in ready.flagged(self._slot_end):
                src = self._src_of.get(slot)
                ring = self.inputs.get(src) if src is not None else None
                if ring is not None and not ring.empty():
                    return True
                ready.clear(slot)
                if ring is not None:
                    cleared.append((slot, ring))
            if cleared:
                _fence()               # clears before the tail loads (see shm.ready)
                for slot, ring in cleared:
                    if not ring.empty():
                        ready.mark(slot)        # for the caller's next take
                        return True
        for ring in self._unslotted.values():
            if not ring.empty():
                return True
        return False

    def ready(self) -> list[str]:
        """Sources whose rings hold records (a look at every input)."""
        return [src for src, ring in self.inputs.items() if not ring.empty()]

    def wait(self, timeout: float) -> None:
        """Sleep until a producer rings or ``timeout`` seconds pass; return at once if any input
        already holds data. Flags are set only for the duration of the call."""
        self.arm()
        try:
            if self.pending():
                return
            self.doorbell.wait(timeout)
        finally:
            self.disarm()

    def drain(self) -> int:
        """Consume pending wake-ups (asyncio users, after their reader callback fired)."""
        return self.doorbell.drain()

    def fileno(self) -> int:
        return self.doorbell.fileno()

    def close(self) -> None:
        self.disarm()
        self.doorbell.close()
        if self.ready_map is not None:
            self.ready_map.close()
            self.ready_map = None

    def __enter__(self) -> "Mailbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
