"""Metrics tables: the counters, gauges and histogram buckets one process publishes.

Owns: nothing by itself. The supervisor creates ``metrics.<endpoint>`` in the runtime directory for
every worker (and ``metrics.sup`` for itself) before it forks the worker; the worker is the only
writer of its table; the metrics server (``workers/metrics_server.py``) and ``appliance metrics``
read every table without locking anything. A table outlives the restarts of its worker (the
supervisor removes it with the endpoint), so a restarted worker's counters continue where its
predecessor's stopped instead of dropping to zero, and a sum over workers never goes backwards.

A table is a list of series, each a key (``name|label=value|...``, fixed once written) and one
signed 64-bit integer. Series are appended by the owner and never removed, so a reader can cache
the keys it has seen and only read values afterwards. Layout (little-endian)::

    0     magic u32 "SHMM" | version u16 | zero u16 | capacity u32 | key_bytes u32
    64    count u64: series in use (stored by the owner after the series' key)
    128   values: capacity x i64 (series i at 128 + 8 i)
    K     keys: capacity x key_bytes, each: length u16 | zero u16 | CRC-32C of the key u32 | key

The owner's update is one aligned 8-byte store (``values[i] += n`` on a memoryview), so a reader
never sees half a value, and costs no lock and no system call: the hot paths (a partition writer's
append, a frontend's request) pay one or two such adds. A new series is written key first, count
last; a reader stops at a key whose CRC does not match (a weakly ordered machine may show the count
before the key) and tries again at its next read.

The last slot is a sink that is never listed: when the table is full, ``slot`` hands it out for
every new key (the owner's updates then go nowhere) and ``dropped`` counts those keys.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

from .region import Region

__all__ = ["MetricsTable", "DEFAULT_CAPACITY", "KEY_BYTES"]

MAGIC = 0x4D4D4853           # b"SHMM" little-endian
VERSION = 1
_HDR = struct.Struct("<IHHII")
_KEYHDR = struct.Struct("<HHI")
_COUNT = 64 // 8             # index of count in the u64 view of the header
_VALUES = 128
DEFAULT_CAPACITY = 256
# A topic name is at most 249 characters; a metric name and a few short labels fit beside it.
KEY_BYTES = 384


def _align64(n: int) -> int:
    return (n + 63) & ~63


def _size(capacity: int, key_bytes: int) -> tuple[int, int]:
    keys = _align64(_VALUES + 8 * capacity)
    return keys, keys + capacity * key_bytes


class MetricsTable:
    """One process's series; ``values`` is the owner's view for its updates."""

    __slots__ = ("capacity", "key_bytes", "readonly", "values", "dropped", "_region", "_mv",
                 "_hdr", "_keys_off", "_index", "_keys")

    def __init__(self, region: Region) -> None:
        magic, version, _, capacity, key_bytes = _HDR.unpack_from(region.buf, 0)
        where = region.path or "anonymous region"
        if magic != MAGIC:
            raise ValueError(f"{where}: not a metrics table (bad magic {magic:#x})")
        if version != VERSION:
            raise ValueError(f"{where}: metrics table version {version}, expected {VERSION}")
        keys_off, size = _size(capacity, key_bytes)
        if region.size < size:
            raise ValueError(f"{where}: truncated metrics table")
        self.capacity = capacity
        self.key_bytes = key_bytes
        self.readonly = region.readonly
        self.dropped = 0
        self._region = region
        self._mv = memoryview(region.buf)[:size]
        self._hdr = self._mv[:_VALUES].cast("Q")
        self.values = self._mv[_VALUES:_VALUES + 8 * capacity].cast("q")
        self._keys_off = keys_off
        self._keys: list[str] = []           # keys of series 0..n-1 as read so far
        self._index: dict[str, int] = {}     # the owner's key -> series
        self._load_keys()
        self._index = {k: i for i, k in enumerate(self._keys)}

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, capacity: int = DEFAULT_CAPACITY,
               key_bytes: int = KEY_BYTES) -> "MetricsTable":
        """Create (or replace) an empty table file."""
        if capacity < 2:
            raise ValueError(f"a metrics table needs at least 2 slots, got {capacity}")
        if key_bytes < 16 or key_bytes % 8:
            raise ValueError(f"key_bytes must be a multiple of 8 and >= 16, got {key_bytes}")
        size = _size(capacity, key_bytes)[1]
        region = Region.create(path, size, init=lambda buf: _HDR.pack_into(
            buf, 0, MAGIC, VERSION, 0, capacity, key_bytes))
        return cls._wrap(region)

    @classmethod
    def open(cls, path: str, *, readonly: bool = False) -> "MetricsTable":
        """The owner opens its table read-write (and finds its predecessor's series); readers
        read-only."""
        return cls._wrap(Region.open(path, readonly=readonly))

    @classmethod
    def anonymous(cls, capacity: int = DEFAULT_CAPACITY) -> "MetricsTable":
        """A table in private memory (a worker whose table file is missing still counts)."""
        size = _size(capacity, KEY_BYTES)[1]
        region = Region.anonymous(size)
        _HDR.pack_into(region.buf, 0, MAGIC, VERSION, 0, capacity, KEY_BYTES)
        return cls._wrap(region)

    @classmethod
    def _wrap(cls, region: Region) -> "MetricsTable":
        try:
            return cls(region)
        except BaseException:
            region.close()
            raise

    # -- owner -----------------------------------------------------------------------------
    def slot(self, key: str) -> int:
        """The series of ``key`` (appended if new): ``values[slot(key)] += n`` updates it."""
        i = self._index.get(key)
        if i is not None:
            return i
        if self.readonly:
            raise ValueError("slot() of a new key on a read-only metrics table")
        raw = key.encode()
        if len(raw) > self.key_bytes - _KEYHDR.size or not raw:
            raise ValueError(f"metrics key of {len(raw)} bytes does not fit: {key[:60]!r}")
        n = self._hdr[_COUNT]
        if n >= self.capacity - 1:
            self.dropped += 1
            return self.capacity - 1             # the sink
        off = self._keys_off + n * self.key_bytes
        self.values[n] = 0
        end = off + _KEYHDR.size + len(raw)
        self._mv[off + _KEYHDR.size:end] = raw
        _KEYHDR.pack_into(self._mv, off, len(raw), 0, crc32c(raw))
        self._hdr[_COUNT] = n + 1                 # publish, after the key
        self._keys.append(key)
        self._index[key] = n
        return n

    def add(self, key: str, n: int = 1) -> None:
        self.values[self.slot(key)] += n

    def set(self, key: str, value: int) -> None:
        self.values[self.slot(key)] = value

    # -- readers ---------------------------------------------------------------------------
    def _load_keys(self) -> None:
        count = min(self._hdr[_COUNT], self.capacity - 1)
        mv = self._mv
        for i in range(len(self._keys), count):
            off = self._keys_off + i * self.key_bytes
            length, _, crc = _KEYHDR.unpack_from(mv, off)
            if not 0 < length <= self.key_bytes - _KEYHDR.size:
                return
            raw = bytes(mv[off + _KEYHDR.size:off + _KEYHDR.size + length])
            if crc32c(raw) != crc:
                return                           # not visible yet: the next read retries
            self._keys.append(raw.decode())

    def items(self) -> list[tuple[str, int]]:
        """Every listed series and its current value."""
        self._load_keys()
        values = self.values
        return [(k, values[i]) for i, k in enumerate(self._keys)]

    def get(self, key: str, default: int | None = None) -> int | None:
        self._load_keys()
        try:
            return self.values[self._keys.index(key)]
        except ValueError:
            return default

    # -- life cycle ------------------------------------------------------------------------
    @property
    def path(self) -> str | None:
        return self._region.path

    def close(self) -> None:
        for v in (self.values, self._hdr, self._mv):
            v.release()
        self._region.close()

    def __enter__(self) -> "MetricsTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetricsTable({self.path!r}, {len(self._keys)}/{self.capacity - 1} series)"
