"""The share-state log: the durable state of every share partition (KIP-932), Kafka's
``__share_group_state`` for one node.

Run by the coordinator worker (``workers/coordinator.py``, through ``appliance.group.share_group``);
single-threaded. Lives in ``<data_dir>/__coordinator/share-state-log/`` as a ``CompactedLog``
(``appliance.log.compacted_log``: crash repair, the flush policy's syncs, compaction by rewrite).

One record per share partition and write, keyed by (group id, topic id, partition) as Kafka's
ShareGroupStateKey is (record type 0, ShareSnapshot), its value the fields of Kafka's
ShareSnapshotValue: snapshot epoch, state epoch, leader epoch (-1 here: one node), start offset,
create and write timestamps, and the state batches (first offset, last offset, delivery state,
delivery count). Every write is a full snapshot of the partition (Kafka writes ShareUpdate deltas
between snapshots to keep records small; a later session may add them: the key's record type
leaves room); a tombstone removes the partition (its group was deleted). The layout is
fixed-width big-endian, not Kafka's flexible-version encoding: nothing outside reads this log.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Callable, Iterable

from appliance.config import FlushPolicy
from appliance.group.share_partition import StateBatch
from appliance.log.compacted_log import CompactedLog, CompactedLogCorrupt, CompactedLogWriteError, LiveRecord
from appliance.protocol.records import BatchHeader

__all__ = ["ShareStateStore", "ShareSnapshot", "ShareKey", "ShareLogCorrupt",
           "ShareLogWriteError", "encode_key", "decode_key", "encode_value", "decode_value"]

log = logging.getLogger("appliance.group.share_store")

SHARE_SNAPSHOT = 0                      # CoordinatorRecordType ShareSnapshot
VALUE_VERSION = 0
RECORD_OVERHEAD = 16
DEFAULT_SEGMENT_BYTES = 104857600
DEFAULT_COMPACT_BYTES = 16 * 1024 * 1024

_key_head = struct.Struct(">hh")
_key_tail = struct.Struct(">16si")
_value_head = struct.Struct(">hiiiqqqi")
_batch = struct.Struct(">qqbh")

ShareKey = tuple[str, bytes, int]       # (group, topic id, partition)


class ShareLogCorrupt(CompactedLogCorrupt):
    pass


class ShareLogWriteError(CompactedLogWriteError):
    pass


@dataclass(slots=True)
class ShareSnapshot:
    snapshot_epoch: int
    state_epoch: int
    start_offset: int
    create_timestamp: int
    write_timestamp: int
    batches: list[StateBatch]
    record_offset: int = -1
    size: int = 0


def encode_key(key: ShareKey) -> bytes:
    group, topic_id, partition = key
    g = group.encode()
    return _key_head.pack(SHARE_SNAPSHOT, len(g)) + g + _key_tail.pack(bytes(topic_id), partition)


def decode_key(data) -> ShareKey:
    data = bytes(data)
    rtype, n = _key_head.unpack_from(data, 0)
    if rtype != SHARE_SNAPSHOT or len(data) != 4 + n + 20:
        raise ValueError(f"share-state key of record type {rtype}, {len(data)} bytes")
    tid, partition = _key_tail.unpack_from(data, 4 + n)
    return data[4:4 + n].decode(), tid, partition


def encode_value(s: ShareSnapshot) -> bytes:
    out = [_value_head.pack(VALUE_VERSION, s.snapshot_epoch, s.state_epoch, -1, s.start_offset,
                            s.create_timestamp, s.write_timestamp, len(s.batches))]
    out += [_batch.pack(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
            for b in s.batches]
    return b"".join(out)


def decode_value(data) -> ShareSnapshot:
    data = bytes(data)
    version, sne, ste, _leader, start, ct, wt, n = _value_head.unpack_from(data, 0)
    if version != VALUE_VERSION or len(data) != _value_head.size + n * _batch.size:
        raise ValueError(f"share snapshot value version {version}, {len(data)} bytes")
    batches = [StateBatch(*_batch.unpack_from(data, _value_head.size + i * _batch.size))
               for i in range(n)]
    return ShareSnapshot(sne, ste, start, ct, wt, batches)


class ShareStateStore(CompactedLog):
    """``snapshots``: (group, topic id, partition) -> the last ShareSnapshot written (read-only
    for callers; ``load`` rebuilds it)."""

    WHAT = "share-state log"
    DIRS = ("log", "log.compacting", "log.old")
    LOGGER = log
    Corrupt = ShareLogCorrupt
    WriteError = ShareLogWriteError

    def __init__(self, directory: str, flush_policy: FlushPolicy | str = FlushPolicy.OS,
                 now_ms: int = 0, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES,
                 compact_bytes: int = DEFAULT_COMPACT_BYTES,
                 crash_hook: Callable[[str], None] | None = None) -> None:
        self.snapshots: dict[ShareKey, ShareSnapshot] = {}
        super().__init__(directory, flush_policy, now_ms, segment_bytes=segment_bytes,
                         compact_bytes=compact_bytes, crash_hook=crash_hook)

    def load(self) -> dict[ShareKey, ShareSnapshot]:
        self.snapshots.clear()
        self._replay(self._apply_batch)
        return self.snapshots

    def _apply_batch(self, h: BatchHeader, batch: memoryview) -> None:
        if h.is_control:
            return
        for rec in self._decode(h, batch):
            where = f" at offset {rec.offset}"
            if rec.key is None:
                self._anomaly(f"record without a key{where} skipped")
                continue
            try:
                key = decode_key(rec.key)
                snap = None if rec.value is None else decode_value(rec.value)
            except (ValueError, struct.error, UnicodeDecodeError) as e:
                raise ShareLogCorrupt(f"undecodable share-state record{where}: {e}") from None
            if snap is not None:
                snap.record_offset = rec.offset
                snap.size = len(rec.key) + len(rec.value) + RECORD_OVERHEAD
            self._put(key, snap)

    def _put(self, key: ShareKey, snap: ShareSnapshot | None) -> None:
        old = self.snapshots.pop(key, None)
        if old is not None:
            self._live_bytes -= old.size
        if snap is not None:
            self.snapshots[key] = snap
            self._live_bytes += snap.size

    def write(self, items: list[tuple[ShareKey, ShareSnapshot | None]], now_ms: int) -> None:
        """Append the snapshots (None: a tombstone) as one batch, synced as the flush policy
        says, then make them current. ``ShareLogWriteError``: memory unchanged."""
        if not items:
            return
        records = [(encode_key(k), None if s is None else encode_value(s)) for k, s in items]
        base = self._append(records, now_ms).base_offset
        for i, ((k, s), (kb, vb)) in enumerate(zip(items, records)):
            if s is not None:
                s.record_offset = base + i
                s.size = len(kb) + len(vb) + RECORD_OVERHEAD
            self._put(k, s)
        self._maybe_compact(now_ms)

    def live_records(self) -> Iterable[LiveRecord]:
        out = [LiveRecord(encode_key(k), encode_value(s), entry=s)
               for k, s in self.snapshots.items()]
        out.sort(key=lambda r: r.entry.record_offset)       # type: ignore[union-attr]
        return out
