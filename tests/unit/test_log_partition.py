"""PartitionLog: offsets, LogAppendTime, rolls, indexes, retention, timestamp lookup, settings."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from appliance.config import LogConfig
from appliance.errors import ErrorCode, KafkaError
from appliance.log.files import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE, index_path, log_path,
                                 timeindex_path)
from appliance.durable import read_checkpoint
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.reader import LogReader
from appliance.log.segment import build_index_entries
from appliance.protocol.records import (Record, build_batch, decode_records, iter_batch_headers,
                                        read_header, scan_valid)

T0 = 1_700_000_000_000


def settings(**kw) -> LogSettings:
    base = dict(segment_bytes=4096, index_interval_bytes=200, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)
    base.update(kw)
    return LogSettings(**base)


def batch(n: int = 2, size: int = 50, ts: int = T0, **kw) -> bytearray:
    return bytearray(build_batch([Record(b"k", b"v" * size, [], ts + i) for i in range(n)],
                                 base_timestamp=ts, **kw))


def all_bytes(d: str, hw: int, lso: int = 0) -> bytes:
    r = LogReader(d)
    out = bytearray()
    off = lso
    while off < hw:
        res = r.read(off, 1 << 30, high_watermark=hw, log_start_offset=lso, min_one_batch=True)
        for s in res.slices:
            with open(log_path(d, s.segment_base), "rb") as f:
                f.seek(s.position)
                out += f.read(s.length)
        off = read_header(out, len(out) - read_size_of_last(out)).last_offset + 1
    r.close()
    return bytes(out)


def read_size_of_last(buf: bytes) -> int:
    pos, size = 0, 0
    for pos, h in iter_batch_headers(buf):
        size = h.size
    return size


def test_settings_from_config_and_topic_overrides():
    cfg = LogConfig(segment_bytes=2_000_000, retention_ms=1000, message_timestamp_type="LogAppendTime")
    s = LogSettings.from_config(cfg)
    assert (s.segment_bytes, s.retention_ms, s.log_append_time, s.max_message_bytes) == (
        2_000_000, 1000, True, cfg.message_max_bytes)
    s = LogSettings.from_config(cfg, {"segment.bytes": "1048576", "retention.ms": "-1",
                                      "retention.bytes": "5000", "segment.ms": "60000",
                                      "max.message.bytes": "2048", "segment.index.bytes": "8192",
                                      "index.interval.bytes": "100",
                                      "message.timestamp.type": "CreateTime",
                                      "cleanup.policy": "compact", "no.such.config": "x"})
    assert (s.segment_bytes, s.retention_ms, s.retention_bytes, s.segment_ms, s.max_message_bytes,
            s.segment_index_bytes, s.index_interval_bytes, s.log_append_time) == (
        1048576, -1, 5000, 60000, 2048, 8192, 100, False)


def test_append_assigns_contiguous_offsets_and_copies_bytes(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 20), T0)
    assert (log.log_end_offset, log.log_start_offset, log.segment_bases()) == (0, 0, [0])
    infos = []
    originals = []
    for n in (1, 3, 5):
        b = batch(n)
        originals.append(bytes(b))
        infos.append(log.append(b, T0))
        assert read_header(b).base_offset == infos[-1].base_offset     # patched in place
    assert [(i.base_offset, i.last_offset, i.log_append_time, i.segment_base) for i in infos] == [
        (0, 0, -1, 0), (1, 3, -1, 0), (4, 8, -1, 0)]
    assert infos[1].position == len(originals[0])
    assert log.log_end_offset == 9 and log.active_end_position == sum(map(len, originals))
    data = all_bytes(d, 9)
    assert [h.base_offset for _, h in iter_batch_headers(data)] == [0, 1, 4]
    # the producer sent no leader epoch (-1); the append stamps this node's, as Kafka's leader
    assert read_header(originals[0]).partition_leader_epoch == -1
    assert [h.partition_leader_epoch for _, h in iter_batch_headers(data)] == [0, 0, 0]
    assert scan_valid(data)[1] == len(data)                           # CRCs intact
    # only the base offset and the leader epoch differ from what the producer sent
    assert data[8:12] == originals[0][8:12] and data[16:len(originals[0])] == originals[0][16:]
    log.close()


def test_append_from_a_writable_memoryview_slice(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(), T0)
    ring = bytearray(100) + batch(2) + bytearray(50)
    mv = memoryview(ring)[100:len(ring) - 50]
    info = log.append(mv, T0)
    assert info.base_offset == 0 and log.log_end_offset == 2
    log.close()


def test_log_append_time_stamps_batch_and_crc(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(message_timestamp_type="LogAppendTime"), T0)
    b = batch(3, ts=5)
    info = log.append(b, T0 + 77)
    assert info.log_append_time == T0 + 77
    data = all_bytes(d, log.log_end_offset)
    h = read_header(data)
    assert h.timestamp_type == 1 and h.max_timestamp == T0 + 77 and h.base_timestamp == 5
    assert scan_valid(data)[1] == len(data)
    assert [r.timestamp for r in decode_records(data)] == [T0 + 77] * 3
    log.close()


def test_batch_larger_than_segment_is_record_list_too_large(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1024), T0)
    with pytest.raises(KafkaError) as e:
        log.append(batch(1, size=2000), T0)
    assert e.value.code == ErrorCode.record_list_too_large
    assert log.log_end_offset == 0 and log.segment_bases() == [0]
    log.close()


def test_roll_by_size_seals_segments_to_exact_size(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    v0 = log.segments_version
    sent = []
    for i in range(40):
        b = batch(2, size=40 + i)
        log.append(b, T0)
        sent.append(bytes(b))
    bases = log.segment_bases()
    assert len(bases) > 5 and log.segments_version == v0 + len(bases) - 1
    assert log.active_segment_base == bases[-1]
    for b0, b1 in zip(bases, bases[1:]):
        size = os.path.getsize(log_path(d, b0))
        assert size <= 1000
        headers = list(iter_batch_headers(Path(log_path(d, b0)).read_bytes()))
        assert headers[0][1].base_offset == b0 and headers[-1][1].last_offset + 1 == b1
        assert headers[-1][0] + headers[-1][1].size == size      # trimmed to the real size
        # sealed indexes are trimmed to their entries; the last time entry holds the max
        assert os.path.getsize(index_path(d, b0)) % 8 == 0
        raw_t = Path(timeindex_path(d, b0)).read_bytes()
        assert struct.unpack_from(">q", raw_t, len(raw_t) - 12)[0] == max(h.max_timestamp for _, h in headers)
    assert os.path.getsize(log_path(d, bases[-1])) == 1000       # active: preallocated
    assert all_bytes(d, log.log_end_offset) == b"".join(sent)
    log.close()


def test_index_entries_follow_kafkas_interval_rule(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 16, index_interval_bytes=300), T0)
    for i in range(30):
        log.append(batch(1 + i % 3, size=60, ts=T0 + (i * 7) % 50), T0)
    log.close()
    data = Path(log_path(d, 0)).read_bytes()
    headers = list(iter_batch_headers(data))
    want = build_index_entries(headers, 300)
    # Hand check of the rule: an entry for the batch at position p when more than 300 bytes
    # were appended since the previous entry; the first batch never gets one.
    expect, last = [], 0
    for pos, h in headers:
        if pos - last > 300:
            expect.append((h.last_offset, pos))
            last = pos
    assert want.offsets == expect and expect
    raw = Path(index_path(d, 0)).read_bytes()
    assert [struct.unpack_from(">II", raw, i) for i in range(0, len(raw), 8)] == [
        (o, p) for o, p in expect]
    times = Path(timeindex_path(d, 0)).read_bytes()
    got_t = [struct.unpack_from(">qI", times, i) for i in range(0, len(times), 12)]
    assert [t for t, _ in got_t] == sorted(set(t for t, _ in got_t))   # strictly increasing
    assert got_t[-1][0] == max(h.max_timestamp for _, h in headers)     # final entry at close


def test_roll_when_index_is_full(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 20, index_interval_bytes=0,
                                        segment_index_bytes=48), T0)
    for _ in range(20):
        log.append(batch(1), T0)
    assert len(log.segment_bases()) > 2          # 6 offset entries / 3 time entries per segment
    assert all_bytes(d, log.log_end_offset).count(b"v" * 50) == 20
    log.close()


def test_roll_by_time_uses_batch_timestamps_like_kafka(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1 << 20, segment_ms=1000), T0)
    log.append(batch(1, ts=T0), T0)
    log.append(batch(1, ts=T0 + 1000), T0)          # waited exactly segment_ms: no roll
    assert log.segment_bases() == [0]
    log.append(batch(1, ts=T0 + 1001), T0)          # the broker clock does not matter here
    assert log.segment_bases() == [0, 2]
    log.close()


def test_maybe_roll_on_the_clock(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1 << 20, segment_ms=1000), T0)
    assert not log.maybe_roll(T0 + 10**6)           # empty segments never roll
    log.append(batch(1, ts=T0), T0)
    assert not log.maybe_roll(T0 + 1000)
    assert log.maybe_roll(T0 + 1001)
    assert log.segment_bases() == [0, 1] and log.log_end_offset == 1
    log.close()


def test_time_roll_without_timestamps_uses_segment_age(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1 << 20, segment_ms=1000), T0)
    log.append(batch(1, ts=-1), T0)                 # no timestamp: age since creation counts
    log.append(batch(1, ts=-1), T0 + 1000)
    assert log.segment_bases() == [0]
    log.append(batch(1, ts=-1), T0 + 1001)
    assert log.segment_bases() == [0, 2]
    log.close()


def fill(log: PartitionLog, n: int, ts_of=lambda i: T0 + i) -> None:
    for i in range(n):
        log.append(batch(2, size=300, ts=ts_of(i)), T0)


def test_retention_by_size_advances_and_persists_log_start(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1000, retention_bytes=2500), T0)
    fill(log, 30)
    bases = log.segment_bases()
    v = log.segments_version
    assert log.enforce_retention(T0)
    kept = log.segment_bases()
    assert kept == bases[-len(kept):] and log.log_start_offset == kept[0] > 0
    assert log.size_in_bytes() <= 2500 + 1000 and log.segments_version == v + 1
    for b in bases[:-len(kept)]:
        assert not os.path.exists(log_path(d, b)) and not os.path.exists(index_path(d, b))
    assert read_checkpoint(os.path.join(d, LOG_START_OFFSET_FILE)) == kept[0]
    assert not log.enforce_retention(T0)
    log.close()
    log = PartitionLog.open(d, settings(segment_bytes=1000, retention_bytes=2500), T0)
    assert log.log_start_offset == kept[0] and log.segment_bases() == kept
    log.close()


@pytest.mark.parametrize("remove", ["retention", "delete_records"])
def test_removed_segments_are_kept_as_deleted_files_for_file_delete_delay_ms(tmp_path, remove):
    """Kafka's asyncDeleteSegment: retention and DeleteRecords rename a segment's log .deleted
    and remove it file.delete.delay.ms later; 0 removes it at once."""
    import time
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1000, retention_bytes=2500,
                                        file_delete_delay_ms=60_000), T0)
    fill(log, 30)
    bases = log.segment_bases()
    if remove == "retention":
        assert log.enforce_retention(T0)
    else:
        assert log.delete_records(bases[3])
    gone = [b for b in bases if b not in log.segment_bases()]
    deleted = sorted(n for n in os.listdir(d) if n.endswith(".deleted"))
    assert len(deleted) == len(gone) > 0 and log.has_retired
    assert [int(n[:20]) for n in deleted] == gone
    assert not any(os.path.exists(index_path(d, b)) or os.path.exists(log_path(d, b))
                   for b in gone)
    assert log.delete_retired(time.monotonic()) == 0          # not yet
    assert log.delete_retired(time.monotonic() + 61) == len(gone)
    assert not [n for n in os.listdir(d) if n.endswith(".deleted")] and not log.has_retired
    log.close()
    log = PartitionLog.open(d, settings(segment_bytes=1000, retention_bytes=0,
                                        file_delete_delay_ms=0), T0)
    fill(log, 10)
    assert log.enforce_retention(T0)
    assert not [n for n in os.listdir(d) if n.endswith(".deleted")] and not log.has_retired
    log.close()


def test_delete_records_moves_the_log_start_and_deletes_whole_segments_below_it(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    fill(log, 30)
    bases = log.segment_bases()
    assert len(bases) >= 4
    # inside the third segment: the first two go, the third stays (it holds the new start)
    target = bases[2] + 1
    v = log.segments_version
    assert log.delete_records(target)
    assert log.log_start_offset == target and log.segment_bases() == bases[2:]
    assert log.segments_version == v + 1
    for b in bases[:2]:
        assert not os.path.exists(log_path(d, b))
    assert read_checkpoint(os.path.join(d, LOG_START_OFFSET_FILE)) == target
    # below or at the start: nothing changes; past the log end: refused
    assert not log.delete_records(target) and not log.delete_records(0)
    with pytest.raises(ValueError):
        log.delete_records(log.log_end_offset + 1)
    # a reader refuses offsets below the new start (the fetch path's OFFSET_OUT_OF_RANGE)
    r = LogReader(d)
    with pytest.raises(KafkaError) as ei:
        r.read(target - 1, 1 << 20, high_watermark=log.log_end_offset, log_start_offset=target,
               min_one_batch=True)
    assert ei.value.code == ErrorCode.offset_out_of_range
    r.close()
    end = log.log_end_offset
    log.close()
    # the low watermark survives a restart (Kafka's log-start-offset checkpoint)
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    assert log.log_start_offset == target and log.segment_bases() == bases[2:]
    # up to the log end: the active segment stays, empty of readable records
    assert log.delete_records(end)
    assert log.log_start_offset == end and log.segment_bases() == [log.active_segment_base]
    log.close()
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    assert (log.log_start_offset, log.log_end_offset) == (end, end)
    log.close()


def test_retention_never_deletes_the_active_segment(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1000, retention_bytes=0,
                                                    retention_ms=0), T0)
    fill(log, 10)
    assert log.enforce_retention(T0 + 10**9)
    assert log.segment_bases() == [log.active_segment_base]
    assert log.log_start_offset == log.active_segment_base
    log.close()


def test_retention_by_time_uses_largest_timestamp(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1000, retention_ms=10_000), T0)
    fill(log, 12, ts_of=lambda i: T0 + i * 1000)
    bases = log.segment_bases()
    assert not log.enforce_retention(T0 + 10_000)       # nothing older than 10 s yet
    # A segment goes when now - its largest timestamp > retention.ms, oldest first.
    now = T0 + 5_000 + 10_001
    log.enforce_retention(now)
    for b in log.segment_bases()[:-1]:
        hs = list(iter_batch_headers(Path(log_path(log.directory, b)).read_bytes()))
        assert now - max(h.max_timestamp for _, h in hs) <= 10_000
    assert log.segment_bases()[0] > bases[0]
    assert log.log_start_offset == log.segment_bases()[0]
    log.close()


def test_offset_for_timestamp_kafka_semantics(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=700, index_interval_bytes=50), T0)
    # timestamps: each batch has 3 records at ts, ts+1, ts+2 with ts = T0 + 10*i; one batch
    # goes back in time (out-of-order timestamps are allowed with CreateTime).
    stamps = [T0 + 10 * i for i in range(30)]
    stamps[15] = T0 + 5
    for ts in stamps:
        log.append(bytearray(build_batch([Record(b"k", b"v" * 30, [], ts + j) for j in range(3)])), T0)
    assert len(log.segment_bases()) > 3
    assert log.offset_for_timestamp(0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 1) == (1, T0 + 1)
    assert log.offset_for_timestamp(T0 + 3) == (3, T0 + 10)            # first record >= target
    assert log.offset_for_timestamp(T0 + 142) == (44, T0 + 142)
    assert log.offset_for_timestamp(T0 + 155) == (48, T0 + 160)        # skips the old batch at 45
    assert log.offset_for_timestamp(T0 + 292) == (89, T0 + 292)
    assert log.offset_for_timestamp(T0 + 293) is None
    log.close()


def test_offset_for_timestamp_respects_log_start_after_retention(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1000, retention_bytes=1500), T0)
    fill(log, 20)
    log.enforce_retention(T0)
    off, ts = log.offset_for_timestamp(0)
    assert off == log.log_start_offset
    log.close()


def test_offset_for_timestamp_log_append_time(tmp_path):
    log = PartitionLog.open(str(tmp_path), settings(message_timestamp_type="LogAppendTime",
                                                    segment_bytes=1 << 16), T0)
    for i in range(5):
        log.append(batch(2, ts=1), T0 + 100 * i)
    assert log.offset_for_timestamp(T0 + 150) == (4, T0 + 200)
    log.close()


def test_clean_close_leaves_marker_and_reopen_removes_it(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    fill(log, 7)
    leo, bases = log.log_end_offset, log.segment_bases()
    log.flush()
    log.close()
    assert os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE))
    assert os.path.getsize(log_path(d, bases[-1])) < 1000           # trimmed
    log = PartitionLog.open(d, settings(segment_bytes=1000), T0)
    assert not os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE))
    assert (log.log_end_offset, log.segment_bases()) == (leo, bases)
    assert os.path.getsize(log_path(d, bases[-1])) < 1000           # no blocks before an append
    log.append(batch(1), T0)
    assert log.log_end_offset == leo + 1
    assert os.path.getsize(log_path(d, bases[-1])) == 1000          # then ahead of the appends
    log.close()


def test_segments_version_differs_across_restarts(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(), T0)
    v = log.segments_version
    log.close()
    log = PartitionLog.open(d, settings(), T0)
    assert log.segments_version != v
    log.close()


# -- transaction markers --------------------------------------------------------------------------

from appliance.protocol.records import (CONTROL_ABORT, CONTROL_COMMIT,  # noqa: E402
                                        parse_control_record)


def stored_batch(d: str, info) -> bytes:
    with open(log_path(d, info.segment_base), "rb") as f:
        f.seek(info.position)
        head = f.read(12)
        size = struct.unpack(">q i", head)[1] + 12
        return head + f.read(size - 12)


def test_append_control_writes_kafkas_marker_batch(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 20), T0)
    log.append(batch(2), T0)
    info = log.append_control(77, 3, True, 9, T0 + 5)
    assert (info.base_offset, info.last_offset, info.log_append_time) == (2, 2, -1)
    raw = stored_batch(d, info)
    h = read_header(raw)
    # MemoryRecords.withEndTransactionMarker: CreateTime with the broker's clock, transactional +
    # control, no sequence, one record; the leader stamps its epoch (0 here)
    assert h.is_control and h.is_transactional and h.timestamp_type == 0 and h.compression == 0
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count) == (77, 3, -1, 1)
    assert (h.base_timestamp, h.max_timestamp, h.partition_leader_epoch) == (T0 + 5, T0 + 5, 0)
    assert parse_control_record(raw) == (CONTROL_COMMIT, 9)
    assert scan_valid(raw)[1] == len(raw)                          # CRC is right
    abort = log.append_control(77, 3, False, 9, T0 + 6)
    assert parse_control_record(stored_batch(d, abort)) == (CONTROL_ABORT, 9)
    assert log.log_end_offset == 4
    log.close()


def test_append_control_on_a_log_append_time_topic_is_stamped(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 20, message_timestamp_type="LogAppendTime"), T0)
    info = log.append_control(5, 0, False, 1, T0 + 123)
    assert info.log_append_time == T0 + 123
    h = read_header(stored_batch(d, info))
    assert h.timestamp_type == 1 and h.max_timestamp == T0 + 123
    assert scan_valid(stored_batch(d, info))[1] > 0
    log.close()


def test_append_control_rolls_like_any_batch(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=400), T0)
    rolled = []
    log.roll_listener = rolled.append
    while log.active_end_position + 78 <= 400:     # a marker batch is 78 bytes
        log.append(batch(1, size=10), T0)
    info = log.append_control(5, 0, True, 1, T0)
    assert rolled == [info.base_offset] and info.segment_base == info.base_offset
    log.close()


def test_append_aborted_refuses_entries_out_of_order_or_past_the_end(tmp_path):
    from appliance.log.txn_index import AbortedTxn
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(segment_bytes=1 << 20), T0)
    m = log.append_control(5, 0, False, 1, T0)
    with pytest.raises(ValueError):
        log.append_aborted(AbortedTxn(5, 1, 1, 2))               # no marker there yet
    log.append_aborted(AbortedTxn(5, 0, 0, 1))
    with pytest.raises(ValueError):
        log.append_aborted(AbortedTxn(5, 0, 0, 1))               # twice
    assert log.aborted_entries() == [AbortedTxn(5, 0, 0, 1)]
    assert m.base_offset == 0
    log.close()


# -- cleanup.policy and the compaction settings --------------------------------------------------

def test_compaction_settings_from_broker_defaults_and_topic_overrides():
    from appliance.config import LogCleanerConfig
    cfg = LogConfig(cleanup_policy="compact", cleaner=LogCleanerConfig(
        min_cleanable_ratio=0.25, min_compaction_lag_ms=5, max_compaction_lag_ms=50_000,
        delete_retention_ms=7))
    s = LogSettings.from_config(cfg)
    assert (s.compact, s.delete, s.min_cleanable_ratio, s.min_compaction_lag_ms,
            s.max_compaction_lag_ms, s.delete_retention_ms) == (True, False, 0.25, 5, 50_000, 7)
    s = LogSettings.from_config(cfg, {"cleanup.policy": "delete, compact",
                                      "min.cleanable.dirty.ratio": "0",
                                      "min.compaction.lag.ms": "1", "max.compaction.lag.ms": "99",
                                      "delete.retention.ms": "0"})
    assert (s.compact, s.delete, s.min_cleanable_ratio, s.min_compaction_lag_ms,
            s.max_compaction_lag_ms, s.delete_retention_ms) == (True, True, 0.0, 1, 99, 0)
    assert LogSettings.from_config(LogConfig()).compact is False


def test_compact_only_topic_deletes_nothing_by_retention(tmp_path):
    # Kafka's LogConfig.delete: with cleanup.policy=compact, retention.ms/bytes delete nothing.
    log = PartitionLog.open(str(tmp_path), settings(segment_bytes=1000, retention_bytes=0,
                                                    retention_ms=0, cleanup_policy="compact"), T0)
    fill(log, 10)
    bases = log.segment_bases()
    assert len(bases) > 1 and not log.enforce_retention(T0 + 10**9)
    assert log.segment_bases() == bases
    log.update_settings(settings(segment_bytes=1000, retention_bytes=0, retention_ms=0,
                                 cleanup_policy="compact,delete"))
    assert log.enforce_retention(T0 + 10**9) and log.segment_bases() == [log.active_segment_base]
    log.close()


def test_compacted_topic_rolls_by_max_compaction_lag(tmp_path):
    # Kafka's LogConfig.maxSegmentMs: min(segment.ms, max.compaction.lag.ms) when compacted, so
    # that no record waits longer than the lag in the active segment, which is never cleaned.
    log = PartitionLog.open(str(tmp_path), settings(segment_ms=10**9, max_compaction_lag_ms=1000,
                                                    cleanup_policy="compact"), T0)
    log.append(batch(ts=T0), T0)                 # its largest timestamp is T0 + 1
    assert not log.maybe_roll(T0 + 1001)
    assert log.maybe_roll(T0 + 1002)
    log.update_settings(settings(segment_ms=10**9, max_compaction_lag_ms=1000))   # delete policy
    log.append(batch(ts=T0 + 2000), T0 + 2000)
    assert not log.maybe_roll(T0 + 100_000)
    log.close()


@pytest.mark.parametrize("preallocate", [False, True])
def test_preallocate_gives_the_active_segment_all_of_segment_bytes(tmp_path, preallocate):
    """Kafka's preallocate: a preallocated segment's file is segment.bytes long from the start;
    without it the file grows 1 MiB ahead of the appends. A sealed segment is cut to its size."""
    d = str(tmp_path)
    seg = 8 << 20
    log = PartitionLog.open(d, settings(segment_bytes=seg, segment_index_bytes=1 << 20,
                                        preallocate=preallocate), T0)
    log.append(batch(2, size=300), T0)
    st = os.stat(log_path(d, 0))
    assert st.st_size == (seg if preallocate else 1 << 20)
    assert st.st_blocks * 512 >= st.st_size            # blocks taken, not a sparse file
    log.close()
    assert os.path.getsize(log_path(d, 0)) < 4096      # the clean close cut it
    log = PartitionLog.open(d, settings(segment_bytes=seg, segment_index_bytes=1 << 20), T0)
    log.update_settings(settings(segment_bytes=seg, segment_index_bytes=1 << 20, preallocate=True))
    log.append(batch(2, size=300), T0)
    assert os.path.getsize(log_path(d, 0)) == seg      # a live change applies to the active segment
    log.close()
