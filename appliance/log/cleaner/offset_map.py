"""The cleaner's key -> offset map (the role of Kafka's SkimpyOffsetMap), bounded in memory.

Owned by one cleaning round in a cleaner process. Holds the offset of the latest record of each
key seen in the dirty section of a log; a round stops mapping once the map holds
``max_entries`` keys (``log.cleaner.dedupe.buffer.size`` divided among the cleaner processes, at
``ENTRY_BYTES`` a key, times Kafka's load factor 0.9) and cleans up to the last offset it mapped;
the next round goes on from there.

Keys shorter than 16 bytes are kept as they are; a longer key is kept as its MD5 digest (16 bytes,
Kafka's default hash for the same map), so one entry costs the same whatever the key's size. The
two kinds never meet (their lengths differ). Two long keys with the same digest would make the
older one look superseded: Kafka accepts the same 2^-128 risk.
"""

from __future__ import annotations

import hashlib

__all__ = ["OffsetMap", "ENTRY_BYTES", "LOAD_FACTOR"]

# What one entry costs in CPython: the dict's slot and index share, a bytes object of at most 16
# bytes and an int (measured with tracemalloc on 10^6 entries: 118-126 bytes).
ENTRY_BYTES = 128
LOAD_FACTOR = 0.9        # Kafka's log.cleaner.io.buffer.load.factor

_md5 = hashlib.md5


def map_key(key: bytes) -> bytes:
    return key if len(key) < 16 else _md5(key, usedforsecurity=False).digest()


class OffsetMap:
    def __init__(self, memory_bytes: int, load_factor: float = LOAD_FACTOR) -> None:
        self.slots = max(1, memory_bytes // ENTRY_BYTES)
        self.max_entries = max(1, int(self.slots * load_factor))
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1          # the last offset mapped (-1: nothing yet)

    def clear(self) -> None:
        self._map = {}
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._map)

    @property
    def full(self) -> bool:
        return len(self._map) >= self.max_entries

    def put(self, key: bytes, offset: int) -> None:
        self._map[map_key(key)] = offset

    def get(self, key: bytes) -> int:
        """The latest offset of ``key``, -1 when it is not in the map."""
        return self._map.get(map_key(key), -1)

    def update_latest_offset(self, offset: int) -> None:
        if offset > self.latest_offset:
            self.latest_offset = offset

    @property
    def utilization(self) -> float:
        return len(self._map) / self.slots
