"""State pages: a single-writer, many-reader record of fixed fields, protected by a seqlock.

Owns: nothing by itself. The owner of a page (a partition writer for ``page.w...``, the supervisor
for ``page.sup``) is its only writer; any process may read it. See docs/architecture.md,
"State pages", for what the partition page holds.

Layout (offsets from the page start; little-endian; ``F = align64(80 + payload_size)``)::

    0    +----------------------------------------------------------------------+
         | magic u32 "SHMP" | version u16 | flag_slots u16 | payload_size u32    |  line 0,
         | schema u32 (CRC-32C of "name:code;..." of the fields) | zero ...      |  written once
    64   +----------------------------------------------------------------------+
         | seq u64: even = stable, odd = a publish is in progress                 |  seqlock
    72   | crc u32: CRC-32C over (seq u64 after the publish, payload) | zero u32  |
    80   | payload: the fields packed with struct "<" + codes, in order          |
    F    +----------------------------------------------------------------------+
         | flags: flag_slots bytes, outside the seqlock; byte i written only by   |
         | reader process i (e.g. "fetcher j waits on this partition")            |
         +---------------------------------------------------- padded to 64 ----+

Writer (``publish``): store seq+1 (odd), copy crc + payload (one memcpy), store seq+2 (even). The
two seq stores are single aligned 8-byte stores. The writer keeps the values it last published
(``current``); a new writer object starts from what the page holds, so a restarted writer can read
its predecessor's values and carry on.

Reader (``read``): load seq; if even, unpack the payload and load seq again; equal = consistent.
On x86-64 (TSO) that is a correct seqlock without fences. On weakly ordered machines the reader
also checks the CRC, which covers the final seq value, so a payload that is stale (older
publish) or torn relative to the seq it was read under is rejected and retried; the writer always
writes the CRC, the reader checks it when ``checksums`` is on (auto: not on x86-64, see
``shm.ring``).

A writer that dies mid-publish leaves seq odd forever. Readers then retry with backoff and raise
``StalePage`` after ``SPIN_LIMIT`` attempts (64 tight spins, then sleeps growing from 1 us to 1 ms:
about 0.13 s in all), rather than hang. The new owner repairs the page: ``reset_seq()`` makes seq
even again (readers may then see the half-written payload, so the owner should ``publish`` the
full set of values right after), and ``publish`` itself also repairs an odd seq it finds.

The flags are plain bytes because each has exactly one writer and carries a level ("waiting"), not
an event; the page writer reads them with ``any_flag()`` after publishing to decide whether to
ring doorbells.
"""

from __future__ import annotations

import struct
import time
from collections import namedtuple
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

from crc32c import crc32c

from .region import Region
from .ring import default_checksums

__all__ = ["StatePage", "StalePage"]

MAGIC = 0x504D4853          # b"SHMP" little-endian
VERSION = 1
_HDR = struct.Struct("<IHHII")   # magic, version, flag_slots, payload_size, schema
_SEQ_OFF = 64
_SEQ = _SEQ_OFF // 8             # index of seq in the u64 view
_CRC_OFF = 72
_PAYLOAD_OFF = 80
_CRCPAD = struct.Struct("<II")
_U64 = struct.Struct("<Q")
MAX_FLAG_SLOTS = 0xFFFF


class StalePage(RuntimeError):
    """The page's seq stayed odd (or kept changing) for the whole spin budget: its writer probably
    died in the middle of a publish. The next owner repairs it with ``reset_seq``/``publish``."""


def _align64(n: int) -> int:
    return (n + 63) & ~63


@lru_cache(maxsize=None)
def _compile(fields: tuple[tuple[str, str], ...]) -> tuple[struct.Struct, type, int]:
    for name, code in fields:
        try:
            one = struct.Struct("<" + code)
        except struct.error as e:
            raise ValueError(f"state page field {name!r}: bad struct code {code!r}: {e}") from None
        if len(one.unpack(bytes(one.size))) != 1:
            raise ValueError(f"state page field {name!r}: code {code!r} must hold exactly one value")
    st = struct.Struct("<" + "".join(code for _, code in fields))
    tup = namedtuple("State", [name for name, _ in fields])  # validates the names
    schema = crc32c(";".join(f"{n}:{c}" for n, c in fields).encode())
    return st, tup, schema


class _Layout(NamedTuple):
    st: struct.Struct
    tup: type
    schema: int
    flags_off: int
    size: int
    fields: tuple[tuple[str, str], ...]
    index: dict[str, int]          # field name -> position (shared by the pages: read only)


# Layouts by (fields, flag_slots): a process opening 10,000 partitions' pages built the same
# layout 10,000 times (9 % of a fetcher's first read of 10,000 partitions, issue 32). Fields come
# as lists (the runtime's constants), which cannot be keys: the key is their tuple (regression:
# only tuples were cached, so no caller's layout ever was: still 6 % of a fetcher reopening
# handles at 10,000 partitions).
_LAYOUTS: dict[tuple[Any, int], _Layout] = {}


def _layout(fields: Sequence[tuple[str, str]], flag_slots: int) -> _Layout:
    if not isinstance(fields, tuple):
        fields = tuple(tuple(f) for f in fields)
    try:
        return _LAYOUTS[fields, flag_slots]
    except (KeyError, TypeError):
        pass
    if not 0 <= flag_slots <= MAX_FLAG_SLOTS:
        raise ValueError(f"flag_slots must be within 0..{MAX_FLAG_SLOTS}, got {flag_slots}")
    key = tuple((str(n), str(c)) for n, c in fields)
    st, tup, schema = _compile(key)
    flags_off = _align64(_PAYLOAD_OFF + st.size)
    size = _align64(flags_off + flag_slots)
    layout = _Layout(st, tup, schema, flags_off, size, key,
                     {name: i for i, (name, _) in enumerate(key)})
    try:
        _LAYOUTS[fields, flag_slots] = layout
    except TypeError:                          # an unhashable field spec: not cached
        pass
    return layout


class StatePage:
    """One seqlock page at ``offset`` in ``buf`` (any writable or read-only buffer)."""

    SPIN_LIMIT = 200      # read() attempts before StalePage
    TIGHT_SPINS = 64      # attempts before read() starts sleeping between attempts

    __slots__ = ("fields", "flag_slots", "size", "checksums", "readonly", "spin_limit", "_st",
                 "_tuple", "_mv", "_q", "_flags", "_zero_flags", "_cur", "_region", "_unpack_from",
                 "_payload_end", "_index")

    def __init__(self, buf: Any, offset: int, fields: Sequence[tuple[str, str]], *,
                 flag_slots: int = 64, init: bool = False, checksums: bool | None = None,
                 region: Region | None = None) -> None:
        layout = _layout(fields, flag_slots)
        st, tup, flags_off, size = layout.st, layout.tup, layout.flags_off, layout.size
        schema = layout.schema
        self.fields = layout.fields
        self.flag_slots = flag_slots
        self.size = size
        self.checksums = default_checksums() if checksums is None else bool(checksums)
        self.spin_limit = self.SPIN_LIMIT
        self._st = st
        self._tuple = tup
        self._region = region
        self._unpack_from = st.unpack_from
        self._payload_end = _PAYLOAD_OFF + st.size
        self._index = layout.index
        whole = memoryview(buf)
        if whole.format != "B" or whole.ndim != 1:
            whole = whole.cast("B")
        if offset < 0 or offset % 64 or offset + size > whole.nbytes:
            raise ValueError(f"state page of {size} bytes does not fit at offset {offset} "
                             f"of a {whole.nbytes}-byte buffer (offset must be 64-byte aligned)")
        self._mv = whole[offset:offset + size]
        whole.release()
        self.readonly = self._mv.readonly
        if init:
            if self.readonly:
                raise ValueError("cannot format a read-only state page")
            _format(self._mv, st, schema, flag_slots)
        else:
            magic, version, slots, psize, sch = _HDR.unpack_from(self._mv, 0)
            if magic != MAGIC:
                raise ValueError(f"no state page here (bad magic {magic:#x})")
            if version != VERSION:
                raise ValueError(f"state page version {version}, expected {VERSION}")
            if sch != schema or psize != st.size:
                raise ValueError("state page fields differ from the ones it was created with")
            if slots != flag_slots:
                raise ValueError(f"state page has {slots} flag slots, expected {flag_slots}")
        self._q = self._mv[:_PAYLOAD_OFF].cast("Q")
        self._flags = self._mv[flags_off:flags_off + flag_slots]
        self._zero_flags = bytes(flag_slots)
        try:
            self._cur = self.read(max_spins=self.TIGHT_SPINS)
        except StalePage:
            # Predecessor died mid-publish: start from whatever is there; the owner repairs.
            self._cur = self._raw()

    # -- constructors ----------------------------------------------------------------------
    @staticmethod
    def size_for(fields: Sequence[tuple[str, str]], flag_slots: int = 64) -> int:
        """Bytes a page with these fields and flag slots occupies (a multiple of 64)."""
        return _layout(fields, flag_slots).size

    @classmethod
    def create(cls, path: str, fields: Sequence[tuple[str, str]], flag_slots: int = 64, *,
               checksums: bool | None = None) -> "StatePage":
        """Create (or replace) the page file; all fields zero, seq 0."""
        layout = _layout(fields, flag_slots)
        st, schema, size = layout.st, layout.schema, layout.size
        region = Region.create(path, size, init=lambda buf: _format(buf, st, schema, flag_slots))
        try:
            return cls(region.buf, 0, fields, flag_slots=flag_slots, checksums=checksums,
                       region=region)
        except BaseException:
            region.close()
            raise

    @classmethod
    def open(cls, path: str, fields: Sequence[tuple[str, str]], readonly: bool = False,
             flag_slots: int = 64, *, checksums: bool | None = None) -> "StatePage":
        """Open an existing page; its header must match ``fields`` and ``flag_slots``.

        Readers that set a flag need ``readonly=False``."""
        region = Region.open(path, readonly=readonly)
        try:
            return cls(region.buf, 0, fields, flag_slots=flag_slots, checksums=checksums,
                       region=region)
        except BaseException:
            region.close()
            raise

    # -- writer ----------------------------------------------------------------------------
    @property
    def current(self) -> NamedTuple:
        """What this writer last published (initially: what the page held when opened)."""
        return self._cur

    def publish(self, **changes: Any) -> NamedTuple:
        """Publish the current values with ``changes`` applied; return the published tuple."""
        if self.readonly:
            raise ValueError("publish() on a read-only state page")
        vals = self._cur
        if changes:
            new_vals = list(vals)
            index = self._index
            for name, value in changes.items():
                try:
                    new_vals[index[name]] = value
                except KeyError:
                    raise ValueError(f"state page has no field {name!r}") from None
            vals = tuple.__new__(self._tuple, new_vals)   # namedtuple._replace, minus its cost
        packed = self._st.pack(*vals)
        q = self._q
        seq = q[_SEQ]
        if seq & 1:
            seq += 1      # left odd by a predecessor that died mid-publish: the page is ours
        new = seq + 2
        blob = _CRCPAD.pack(crc32c(packed, crc32c(_U64.pack(new))), 0) + packed
        q[_SEQ] = seq + 1                            # odd: readers back off
        self._mv[_CRC_OFF:self._payload_end] = blob  # one memcpy: crc, pad, payload
        q[_SEQ] = new                                # even: stable again
        self._cur = vals
        return vals

    def reset_seq(self) -> None:
        """Repair a page whose previous writer died mid-publish (seq left odd): make seq even and
        the CRC match the payload as it stands. The caller should publish full values next."""
        if self.readonly:
            raise ValueError("reset_seq() on a read-only state page")
        q = self._q
        seq = q[_SEQ]
        if not seq & 1:
            return
        new = seq + 1
        payload = self._mv[_PAYLOAD_OFF:self._payload_end].tobytes()
        _CRCPAD.pack_into(self._mv, _CRC_OFF, crc32c(payload, crc32c(_U64.pack(new))), 0)
        q[_SEQ] = new
        self._cur = self._tuple._make(self._st.unpack(payload))

    # -- readers ---------------------------------------------------------------------------
    @property
    def seq(self) -> int:
        """The sequence number (even when stable); a cheap "did anything change" probe."""
        return self._q[_SEQ]

    def read(self, *, max_spins: int | None = None) -> NamedTuple:
        """A consistent snapshot of the fields (see the module docstring); StalePage if none
        could be had within ``max_spins`` attempts (default ``self.spin_limit``)."""
        q = self._q
        mv = self._mv
        limit = self.spin_limit if max_spins is None else max_spins
        tight = self.TIGHT_SPINS
        checks = self.checksums
        for spin in range(limit):
            s1 = q[_SEQ]
            if not s1 & 1:
                if checks:
                    raw = mv[_CRC_OFF:self._payload_end].tobytes()
                    if q[_SEQ] == s1:
                        crc = _CRCPAD.unpack_from(raw, 0)[0]
                        body = raw[_PAYLOAD_OFF - _CRC_OFF:]
                        if crc == crc32c(body, crc32c(_U64.pack(s1))):
                            return self._tuple._make(self._st.unpack(body))
                else:
                    vals = self._unpack_from(mv, _PAYLOAD_OFF)
                    if q[_SEQ] == s1:
                        return self._tuple._make(vals)
            if spin >= tight:
                # The writer may be descheduled mid-publish (or, in a thread, waiting for the
                # GIL we hold): give it the CPU instead of burning the budget.
                time.sleep(min(1e-3, 1e-6 * (1 << min(spin - tight, 10))))
        raise StalePage(f"state page seq stayed odd or kept changing for {limit} attempts "
                        f"(seq={q[_SEQ]}); its writer probably died mid-publish")

    def _raw(self) -> NamedTuple:
        return self._tuple._make(self._unpack_from(self._mv, _PAYLOAD_OFF))

    # -- flags -----------------------------------------------------------------------------
    def set_flag(self, i: int, value: int) -> None:
        """Store ``value`` (0..255) into flag byte ``i``; each byte has exactly one writer."""
        if not 0 <= i < self.flag_slots:
            raise IndexError(f"flag slot {i} out of range 0..{self.flag_slots - 1}")
        self._flags[i] = value

    def flag(self, i: int) -> int:
        if not 0 <= i < self.flag_slots:
            raise IndexError(f"flag slot {i} out of range 0..{self.flag_slots - 1}")
        return self._flags[i]

    def flags(self) -> bytes:
        return self._flags.tobytes()

    def any_flag(self) -> bool:
        return self._flags.tobytes() != self._zero_flags

    # -- life cycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Release the views; unmap if this page owns its region (create/open). Idempotent."""
        for v in (self._flags, self._q, self._mv):
            v.release()
        if self._region is not None:
            self._region.close()

    def __enter__(self) -> "StatePage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._region.path if self._region is not None else "buffer"
        return f"StatePage({where!r}, fields={[n for n, _ in self.fields]})"


def _format(buf: Any, st: struct.Struct, schema: int, flag_slots: int) -> None:
    """Write an empty page (all fields zero, seq 0, CRC valid for seq 0) at the start of ``buf``."""
    flags_off = _align64(_PAYLOAD_OFF + st.size)
    size = _align64(flags_off + flag_slots)
    mv = memoryview(buf)
    try:
        mv[0:size] = bytes(size)
        _HDR.pack_into(mv, 0, MAGIC, VERSION, flag_slots, st.size, schema)
        zero = bytes(st.size)
        _CRCPAD.pack_into(mv, _CRC_OFF, crc32c(zero, crc32c(_U64.pack(0))), 0)
    finally:
        mv.release()
