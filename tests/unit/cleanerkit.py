"""A partition as its writer keeps it, for the log cleaner's unit tests (no fork): a
PartitionLog with a ProducerStateManager, appends and markers made the way
workers/partition_writer.py makes them, a cleaning round run as the cleaner worker runs it
(plan, Cleaner, the writer's replace_segments), and reads as a consumer filters them."""

from __future__ import annotations

import os
from typing import NamedTuple

from appliance.log.cleaner.clean import Cleaner, LastRecord, RoundStats
from appliance.log.cleaner.offset_map import OffsetMap
from appliance.log.cleaner.plan import cleanable, sealed_segments
from appliance.log.files import CLEANER_CHECKPOINT_FILE
from appliance.durable import read_checkpoint
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.reader import LogReader, SegmentViews
from appliance.log.txn_index import AbortedTxn
from appliance.protocol.records import (CONTROL_ABORT, Record, build_batch, decode_records,
                                        iter_batch_headers, parse_control_record)

T0 = 1_700_000_000_000


def settings(**kw) -> LogSettings:
    base = dict(segment_bytes=1200, index_interval_bytes=100, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1, cleanup_policy="compact",
                min_cleanable_ratio=0.0, delete_retention_ms=1000)
    base.update(kw)
    return LogSettings(**base)


class Rec(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class Part:
    def __init__(self, d: str, s: LogSettings | None = None, now: int = T0) -> None:
        self.d = d
        self.s = s or settings()
        self.now = now
        self.log = PartitionLog.open(d, self.s, now)
        self.psm = ProducerStateManager(d, 86_400_000)
        self.psm.load(self.log.log_end_offset, self.log.headers_from, now)
        self.seq: dict[int, int] = {}

    # -- appends ----------------------------------------------------------------------------
    def put(self, records, *, pid: int = -1, epoch: int = 0, txn: bool = False, ts: int | None = None,
            compression: int = 0) -> tuple[int, int]:
        """One batch of (key, value) records; idempotent when ``pid`` >= 0. (base, last)."""
        ts = self.now if ts is None else ts
        seq = -1
        if pid >= 0:
            seq = self.seq.get(pid, 0)
            self.seq[pid] = seq + len(records)
        b = bytearray(build_batch([Record(k, v, (), ts) for k, v in records], producer_id=pid,
                                  producer_epoch=epoch if pid >= 0 else -1, base_sequence=seq,
                                  transactional=txn, base_timestamp=ts, compression=compression))
        info = self.log.append(b, self.now)
        if pid >= 0:
            from appliance.protocol.records import read_header
            self.psm.update(read_header(b), info.base_offset, self.now)
        return info.base_offset, info.last_offset

    def end(self, pid: int, epoch: int = 0, commit: bool = True) -> int:
        info = self.log.append_control(pid, epoch, commit, 0, self.now)
        done = self.psm.complete_txn(pid, epoch, 0, info.base_offset, not commit, self.now)
        if done.aborted:
            self.log.append_aborted(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                               self.psm.last_stable_offset(self.log.log_end_offset)))
        return info.base_offset

    def roll(self) -> None:
        self.log._roll(self.now)

    # -- state --------------------------------------------------------------------------------
    @property
    def hw(self) -> int:
        return self.log.log_end_offset

    def lso(self) -> int:
        return self.psm.last_stable_offset(self.hw, self.log.log_start_offset)

    def producers(self) -> dict[int, LastRecord]:
        return {e.producer_id: LastRecord(e.last_offset if e.batches else -1, e.epoch)
                for e in self.psm.active()}

    def checkpoint(self) -> int | None:
        return read_checkpoint(os.path.join(self.d, CLEANER_CHECKPOINT_FILE))

    # -- cleaning -----------------------------------------------------------------------------
    def plan(self, now: int | None = None):
        now = self.now if now is None else now
        segs = sealed_segments(self.d, self.log.active_segment_base)
        c = cleanable(segs, log_start=self.log.log_start_offset, log_end=self.hw,
                      last_stable=self.lso(), active_base=self.log.active_segment_base,
                      checkpoint=self.checkpoint(),
                      min_compaction_lag_ms=self.s.min_compaction_lag_ms,
                      max_compaction_lag_ms=self.s.max_compaction_lag_ms, now_ms=now)
        return segs, c

    def clean(self, now: int | None = None, map_bytes: int = 1 << 20) -> RoundStats:
        now = self.now if now is None else now
        segs, c = self.plan(now)
        cl = Cleaner(self.d, self.s, OffsetMap(map_bytes))

        def swap(groups, checkpoint) -> bool:
            self.log.replace_segments([(g.base, [(x.base, x.ino, x.size) for x in g.old])
                                       for g in groups], checkpoint, 60.0)
            return True
        return cl.clean(segs, c, hw=self.hw, producers=self.producers(), swap=swap, now_ms=now)

    # -- reading ------------------------------------------------------------------------------
    def batches(self, upto: int | None = None) -> list[bytes]:
        hw = self.hw if upto is None else upto
        r = LogReader(self.d)
        try:
            res = r.read(self.log.log_start_offset, 1 << 30, high_watermark=hw,
                         log_start_offset=self.log.log_start_offset, min_one_batch=True)
            v = SegmentViews()
            data = b"".join(bytes(v.view(self.d, s.segment_base, s.position, s.length, s.inode))
                            for s in res.slices)
            self.aborted = r.collect_aborted(self.log.log_start_offset, res.next_offset, self.hw)
        finally:
            r.close()
        return [data[p:p + h.size] for p, h in iter_batch_headers(data)]

    def read(self, committed: bool = True) -> list[Rec]:
        """What a consumer returns from the log start (Kafka's fetcher filtering)."""
        out: list[Rec] = []
        batches = self.batches(self.lso() if committed else self.hw)
        aborted = sorted(self.aborted, key=lambda a: a[1])
        pids: set[int] = set()
        for b in batches:
            from appliance.protocol.records import read_header
            h = read_header(b)
            if committed and h.producer_id >= 0:
                while aborted and aborted[0][1] <= h.last_offset:
                    pids.add(aborted.pop(0)[0])
                if h.is_control and h.records_count and parse_control_record(b)[0] == CONTROL_ABORT:
                    pids.discard(h.producer_id)
                elif h.is_transactional and h.producer_id in pids:
                    continue
            if h.is_control:
                continue
            out += [Rec(r.offset, r.key, r.value, r.timestamp) for r in decode_records(b)]
        return out

    def table(self, committed: bool = True) -> dict[bytes, bytes]:
        t: dict[bytes, bytes] = {}
        for r in self.read(committed):
            if r.value is None:
                t.pop(r.key, None)
            else:
                t[r.key] = r.value
        return t

    def reopen(self, clean: bool = False) -> None:
        self.log.close(clean=clean)
        self.log = PartitionLog.open(self.d, self.s, self.now)
        self.psm = ProducerStateManager(self.d, 86_400_000)
        self.psm.load(self.log.log_end_offset, self.log.headers_from, self.now)

    def close(self) -> None:
        self.log.close()
