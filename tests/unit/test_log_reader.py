"""LogReader / SegmentViews: fetch semantics, high-watermark safety, staleness, property test."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from appliance.errors import ErrorCode, KafkaError
from appliance.log.files import index_path, log_path
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.reader import LogReader, ReadResult, SegmentViews, Slice
from appliance.protocol.records import Record, build_batch, iter_batch_headers, read_header

T0 = 1_700_000_000_000


def S(**kw) -> LogSettings:
    base = dict(segment_bytes=1500, index_interval_bytes=120, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)
    base.update(kw)
    return LogSettings(**base)


def batch(nrec: int, size: int, ts: int = T0) -> bytearray:
    return bytearray(build_batch([Record(b"k", b"x" * size, [], ts + i) for i in range(nrec)],
                                 base_timestamp=ts))


def fill(d: str, spec: list[tuple[int, int]], **kw) -> tuple[PartitionLog, list[bytes]]:
    log = PartitionLog.open(d, S(**kw), T0)
    out = []
    for n, size in spec:
        b = batch(n, size)
        log.append(b, T0)
        out.append(bytes(b))
    return log, out


def gather(views: SegmentViews, d: str, res: ReadResult) -> bytes:
    return b"".join(bytes(views.view(d, s.segment_base, s.position, s.length)) for s in res.slices)


def offsets(data: bytes) -> list[int]:
    return [h.base_offset for _, h in iter_batch_headers(data)]


@pytest.fixture
def filled(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1 + i % 4, 30 + (i * 37) % 200) for i in range(40)])
    yield d, log, sent
    log.close()


def test_read_everything_spans_segments(filled):
    d, log, sent = filled
    assert len(log.segment_bases()) > 3
    r = LogReader(d)
    res = r.read(0, 1 << 30, high_watermark=log.log_end_offset, log_start_offset=0, min_one_batch=False)
    assert res.first_batch_offset == 0 and res.bytes == sum(map(len, sent))
    assert len(res.slices) == len(log.segment_bases())           # one slice per segment
    assert [s.segment_base for s in res.slices] == log.segment_bases()
    assert gather(SegmentViews(), d, res) == b"".join(sent)
    r.close()


def test_fetch_offset_inside_a_batch_returns_the_whole_batch(filled):
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    for b in sent:
        h = read_header(b)
        for off in range(h.base_offset, h.last_offset + 1):
            res = r.read(off, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)
            assert res.first_batch_offset == h.base_offset
            assert gather(SegmentViews(), d, res) == b
    r.close()


def test_max_bytes_returns_whole_batches_only(filled):
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    limit = len(sent[0]) + len(sent[1]) + len(sent[2]) - 1
    res = r.read(0, limit, high_watermark=hw, log_start_offset=0, min_one_batch=False)
    assert res.bytes == len(sent[0]) + len(sent[1])
    assert gather(SegmentViews(), d, res) == sent[0] + sent[1]
    r.close()


def test_min_one_batch_progress_rule(filled):
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    assert r.read(0, 10, high_watermark=hw, log_start_offset=0, min_one_batch=False) == ReadResult([], 0, -1, 0)
    res = r.read(0, 10, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.bytes == len(sent[0]) and res.first_batch_offset == 0
    res = r.read(0, 0, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.bytes == len(sent[0])
    r.close()


def test_offset_out_of_range_and_at_high_watermark(filled):
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    for off in (-1, hw + 1):
        with pytest.raises(KafkaError) as e:
            r.read(off, 100, high_watermark=hw, log_start_offset=0, min_one_batch=True)
        assert e.value.code == ErrorCode.offset_out_of_range
    assert r.read(hw, 100, high_watermark=hw, log_start_offset=0, min_one_batch=True) == ReadResult([], 0, -1, hw)
    with pytest.raises(KafkaError) as e:
        r.read(3, 100, high_watermark=hw, log_start_offset=5, min_one_batch=True)
    assert e.value.code == ErrorCode.offset_out_of_range
    r.close()


def test_max_offset_bounds_the_read_not_the_range(filled):
    """read_committed: batches stop before max_offset (the LSO); a fetch offset between it and
    the high watermark is an empty read, not OFFSET_OUT_OF_RANGE (Kafka's LocalLog.read)."""
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    lso = read_header(sent[5]).base_offset
    res = r.read(0, 1 << 30, high_watermark=hw, max_offset=lso, log_start_offset=0, min_one_batch=True)
    assert gather(SegmentViews(), d, res) == b"".join(sent[:5]) and res.next_offset == lso
    for off in range(lso, hw + 1):
        assert r.read(off, 100, high_watermark=hw, max_offset=lso, log_start_offset=0,
                      min_one_batch=True) == ReadResult([], 0, -1, off)
    with pytest.raises(KafkaError) as e:
        r.read(hw + 1, 100, high_watermark=hw, max_offset=lso, log_start_offset=0, min_one_batch=True)
    assert e.value.code == ErrorCode.offset_out_of_range
    r.close()


def test_never_returns_bytes_at_or_after_the_high_watermark(filled):
    d, log, sent = filled
    r = LogReader(d)
    views = SegmentViews()
    boundaries = [read_header(b).base_offset for b in sent]
    for hw in boundaries[1:]:
        for start in range(0, hw, 3):
            res = r.read(start, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
            data = gather(views, d, res)
            assert all(h.last_offset < hw for _, h in iter_batch_headers(data))
            assert list(iter_batch_headers(data))[-1][1].last_offset == hw - 1
    r.close()


def test_unpublished_bytes_after_high_watermark_are_never_touched(tmp_path):
    """A batch being copied (or garbage) right after the HW must not confuse the reader."""
    d = str(tmp_path)
    log, sent = fill(d, [(2, 50)] * 5, segment_bytes=1 << 16)
    hw = log.log_end_offset
    end = log.active_end_position
    with open(log_path(d, log.active_segment_base), "r+b") as f:   # a torn next batch
        f.seek(end)
        f.write(b"\x00\x00\x00\x00\x00\x00\x00" + bytes([hw - 3]) + b"\x00\x00\x01\x00" + b"\xAB" * 20)
    r = LogReader(d)
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert gather(SegmentViews(), d, res) == b"".join(sent)
    log.close(clean=False)
    r.close()


def test_reader_sees_appends_and_new_segments_after_refresh(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 100)])
    r = LogReader(d)
    views = SegmentViews()
    for i in range(30):
        b = batch(2, 100 + i)
        log.append(b, T0)
        sent.append(bytes(b))
        if i % 5 == 0:
            r.refresh()           # as a fetcher does when segments_version changed
    r.refresh()
    res = r.read(0, 1 << 30, high_watermark=log.log_end_offset, log_start_offset=0, min_one_batch=True)
    assert gather(views, d, res) == b"".join(sent)
    # without a refresh the active segment's growth is visible too
    b = batch(1, 10)
    log.append(b, T0)
    res = r.read(log.log_end_offset - 1, 1 << 30, high_watermark=log.log_end_offset,
                 log_start_offset=0, min_one_batch=True)
    assert gather(views, d, res) == bytes(b)
    log.close()
    r.close()


def test_stale_segment_list_is_refreshed_on_demand(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 100)])
    r = LogReader(d)                       # knows only segment 0
    for i in range(20):
        b = batch(1, 200)
        log.append(b, T0)
        sent.append(bytes(b))
    assert len(log.segment_bases()) > 2
    res = r.read(0, 1 << 30, high_watermark=log.log_end_offset, log_start_offset=0, min_one_batch=True)
    got = gather(SegmentViews(), d, res)
    assert got == b"".join(sent)[:len(got)] and got  # stopped at the end of what it knew, or refreshed
    res = r.read(log.log_end_offset - 1, 100, high_watermark=log.log_end_offset, log_start_offset=0,
                 min_one_batch=True)
    assert gather(SegmentViews(), d, res) == sent[-1]
    log.close()
    r.close()


def test_regression_corrupt_message_when_two_swaps_land_during_one_read(tmp_path, monkeypatch):
    """A fetch that found the files changed under its segment list twice in a row (two cleaner
    swaps between its listing and its read, on a loaded machine) answered CORRUPT_MESSAGE, which
    a consumer reading across swaps got as INVALID_MSG at offset 0. Each stale view is listed
    again; only a log that stays inconsistent is corrupt."""
    import appliance.log.reader as reader_mod
    d = str(tmp_path)
    log, sent = fill(d, [(1, 200)] * 12)
    r = LogReader(d)
    real = LogReader._read
    stale_left = [3]

    def swapped_under_us(self, *a, **kw):
        if stale_left[0]:
            stale_left[0] -= 1
            raise reader_mod._Stale
        return real(self, *a, **kw)
    monkeypatch.setattr(LogReader, "_read", swapped_under_us)
    res = r.read(0, 1 << 30, high_watermark=log.log_end_offset, log_start_offset=0, min_one_batch=True)
    assert gather(SegmentViews(), d, res) == b"".join(sent)
    stale_left[0] = reader_mod.STALE_RETRIES + 1      # never consistent: that is corruption
    with pytest.raises(KafkaError) as e:
        r.read(0, 1 << 30, high_watermark=log.log_end_offset, log_start_offset=0, min_one_batch=True)
    assert e.value.code == ErrorCode.corrupt_message
    log.close()
    r.close()


def test_read_after_retention_deleted_segments(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 200)] * 30, retention_bytes=2000)
    r = LogReader(d)
    views = SegmentViews()
    hw = log.log_end_offset
    first = r.read(0, 100, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    kept_view = views.view(d, 0, first.slices[0].position, first.slices[0].length)
    assert log.enforce_retention(T0)
    lso = log.log_start_offset
    assert not os.path.exists(log_path(d, 0))
    assert bytes(kept_view) == sent[0]                 # an old view outlives the unlink
    r.refresh()
    with pytest.raises(KafkaError) as e:
        r.read(0, 100, high_watermark=hw, log_start_offset=lso, min_one_batch=True)
    assert e.value.code == ErrorCode.offset_out_of_range
    # a caller with a stale log start offset gets OFFSET_OUT_OF_RANGE, not garbage
    with pytest.raises(KafkaError) as e:
        r.read(0, 100, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert e.value.code == ErrorCode.offset_out_of_range
    res = r.read(lso, 1 << 30, high_watermark=hw, log_start_offset=lso, min_one_batch=True)
    assert res.first_batch_offset == lso
    views.forget(d)                              # re-lists: segment 0 is gone
    assert (d, 0) not in views._maps and bytes(kept_view) == sent[0]
    with pytest.raises(KafkaError):
        views.view(d, 0, 0, 10)
    log.close()
    r.close()


def test_wrong_index_entry_is_only_a_hint(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 100)] * 10, segment_bytes=1 << 16)
    log.close()
    with open(index_path(d, 0), "r+b") as f:             # entries pointing at the wrong place
        f.write(struct.pack(">II", 1, 5) + struct.pack(">II", 2, 10**7))
    r = LogReader(d)
    for off in range(10):
        res = r.read(off, 1, high_watermark=10, log_start_offset=0, min_one_batch=True)
        assert gather(SegmentViews(), d, res) == sent[off]
    r.close()


def test_reader_offset_for_timestamp_bounded_by_high_watermark(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, S(), T0)
    for i in range(20):
        log.append(batch(2, 60, ts=T0 + 10 * i), T0)
    r = LogReader(d)
    assert r.offset_for_timestamp(T0 + 31, 40) == (7, T0 + 31)
    assert r.offset_for_timestamp(T0 + 32, 40) == (8, T0 + 40)
    assert r.offset_for_timestamp(T0 + 185, 38) is None          # at/after HW: not visible
    assert r.offset_for_timestamp(T0 + 185, 40) == (38, T0 + 190)
    assert r.offset_for_timestamp(0, 40, log_start_offset=13) == (13, T0 + 61)
    log.close()
    r.close()


def test_segment_views_remap_when_file_grew(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 100)] * 3, segment_bytes=1 << 16)
    log.close()                                 # trimmed: file is just the 3 batches
    views = SegmentViews()
    v = views.view(d, 0, 0, len(sent[0]))
    assert bytes(v) == sent[0]
    log = PartitionLog.open(d, S(segment_bytes=1 << 16), T0)
    b = batch(1, 50)
    info = log.append(b, T0)
    assert bytes(views.view(d, 0, info.position, len(b))) == bytes(b)
    with pytest.raises(ValueError):
        views.view(d, 0, 1 << 16, 10)
    log.close()
    views.close()


def test_slice_type():
    assert Slice(0, 1, 2).length == 2


# ---------------------------------------------------------------------------------------------
# property: fetch loops reproduce exactly the appended batches
# ---------------------------------------------------------------------------------------------

@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 400)), min_size=1, max_size=60),
       seg=st.sampled_from([2300, 3000, 8192]),
       interval=st.sampled_from([0, 64, 300, 4096]),
       fetches=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3000), st.booleans()),
                        min_size=1, max_size=8))
def test_reads_concatenate_to_the_appended_batches(tmp_path_factory, spec, seg, interval, fetches):
    d = str(tmp_path_factory.mktemp("prop"))
    log = PartitionLog.open(d, S(segment_bytes=seg, index_interval_bytes=interval), T0)
    sent = []
    for n, size in spec:
        b = batch(n, size)
        log.append(b, T0)
        sent.append(bytes(b))
    hw = log.log_end_offset
    ends = [read_header(b).last_offset for b in sent]
    event(f"segments: {min(len(log.segment_bases()), 5)}")
    r = LogReader(d)
    views = SegmentViews()
    for frac, max_bytes, min_one in fetches:
        off = min(int(frac * hw), hw - 1)
        first = next(i for i, last in enumerate(ends) if last >= off)   # batch containing off
        got = bytearray()
        cur = off
        while cur < hw:
            res = r.read(cur, max_bytes, high_watermark=hw, log_start_offset=0, min_one_batch=min_one)
            if not res.slices:
                # only allowed when the next batch alone is larger than max_bytes
                containing = next(i for i, last in enumerate(ends) if last >= cur)
                assert not min_one and len(sent[containing]) > max_bytes
                break
            data = gather(views, d, res)
            assert res.bytes == len(data) and (res.bytes <= max_bytes or len(offsets(data)) == 1)
            got += data
            cur = list(iter_batch_headers(data))[-1][1].last_offset + 1
        if cur >= hw:
            assert bytes(got) == b"".join(sent[first:])
        else:
            assert b"".join(sent[first:]).startswith(bytes(got))
    r.close()
    log.close()


def _exact_batch(size: int) -> bytearray:
    for v in range(size):
        b = build_batch([Record(b"k", b"x" * v, [], T0)], base_timestamp=T0)
        if len(b) == size:
            return bytearray(b)
    raise AssertionError(size)


def test_regression_sigbus_reading_past_sealed_segment_with_stale_list(tmp_path):
    """A reader that missed a roll must not read past the real end of the segment it mapped
    while it was preallocated: with the sealed size page-aligned, that read was a SIGBUS
    (verified in a separate process before the fix). If this regresses, pytest dies."""
    d = str(tmp_path)
    log = PartitionLog.open(d, S(segment_bytes=4096 + 500, index_interval_bytes=4096), T0)
    for _ in range(3):
        log.append(_exact_batch(1024), T0)
    r = LogReader(d)
    r.read(0, 1 << 20, high_watermark=3, log_start_offset=0, min_one_batch=True)   # maps segment 0
    log.append(_exact_batch(1024), T0)
    log.append(_exact_batch(1024), T0)            # rolls: segment 0 is cut to exactly 4096 bytes
    assert log.segment_bases() == [0, 4] and os.path.getsize(log_path(d, 0)) == 4096
    res = r.read(0, 1 << 20, high_watermark=5, log_start_offset=0, min_one_batch=True)   # no refresh
    assert res.bytes == 5 * 1024 and [s.segment_base for s in res.slices] == [0, 4]
    log.close()
    r.close()


def _mapped_files(directory: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if directory in line)


def test_reader_keeps_a_bounded_number_of_segments_mapped(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 300)] * 40)
    assert len(log.segment_bases()) >= 10
    log.close()
    r = LogReader(d, max_open_segments=2)
    hw = 40
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.bytes == sum(map(len, sent))
    for off in range(0, hw, 3):
        r.read(off, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert r.offset_for_timestamp(T0, hw) == (0, T0)
    assert _mapped_files(d) <= 2 * 3                    # log + 2 indexes per open segment
    r.close()
    assert _mapped_files(d) == 0


def test_segment_views_cache_is_bounded(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 300)] * 40)
    log.close()
    r = LogReader(d)
    res = r.read(0, 1 << 30, high_watermark=40, log_start_offset=0, min_one_batch=True)
    views = SegmentViews(max_maps=3)
    assert gather(views, d, res) == b"".join(sent)       # every view released after use
    assert _mapped_files(d) <= 3 + 3 * 8
    views.close()
    r.close()
    assert _mapped_files(d) == 0


def test_update_settings_applies_to_the_active_segment(tmp_path):
    d = str(tmp_path)
    log, sent = fill(d, [(1, 100)] * 3, segment_bytes=1 << 16)
    assert log.segment_bases() == [0]
    log.update_settings(S(segment_bytes=600))
    log.append(batch(1, 100), T0)
    log.append(batch(1, 100), T0)
    assert len(log.segment_bases()) == 2
    log.close()


# -- read_committed support -----------------------------------------------------------------------

def test_next_offset_is_just_past_the_last_returned_batch(filled):
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    for off in range(0, hw, 3):
        for limit in (1, 300, 1 << 30):
            res = r.read(off, limit, high_watermark=hw, log_start_offset=0, min_one_batch=False)
            if not res.slices:
                assert res.next_offset == off
                continue
            data = gather(SegmentViews(), d, res)
            last = list(iter_batch_headers(data))[-1][1]
            assert res.next_offset == last.last_offset + 1
    r.close()


def _aborted_log(d):
    from appliance.log.txn_index import AbortedTxn
    log = PartitionLog.open(d, S(), T0)
    marks = []
    for pid in (1, 2, 3):
        b = bytearray(build_batch([Record(b"k", b"x" * 400)], producer_id=pid, producer_epoch=0,
                                  base_sequence=0, transactional=True, base_timestamp=T0))
        first = log.append(b, T0).base_offset
        log.append(batch(1, 500), T0)
        m = log.append_control(pid, 0, False, 0, T0).base_offset
        log.append_aborted(AbortedTxn(pid, first, m, m + 1))
        marks.append((pid, first, m))
    return log, marks


def test_collect_aborted_over_segments_and_high_watermark(tmp_path):
    d = str(tmp_path)
    log, marks = _aborted_log(d)
    assert len(log.segment_bases()) >= 3
    hw = log.log_end_offset
    r = LogReader(d)
    assert r.collect_aborted(0, hw, hw) == [(p, f) for p, f, _ in marks]
    (p1, f1, m1), (p2, f2, m2), (p3, f3, m3) = marks
    assert r.collect_aborted(m1 + 1, hw, hw) == [(p2, f2), (p3, f3)]
    assert r.collect_aborted(m1, m1 + 1, hw) == [(p1, f1)]        # only its marker in range
    assert r.collect_aborted(0, hw, m2) == [(p1, f1)]            # marker 2 not published yet
    r.close()
    log.close()


def test_collect_aborted_sees_rebuilt_files_after_refresh(tmp_path):
    from appliance.log.files import txnindex_path
    d = str(tmp_path)
    log, marks = _aborted_log(d)
    hw = log.log_end_offset
    r = LogReader(d)
    assert len(r.collect_aborted(0, hw, hw)) == 3
    for b in log.segment_bases():
        try:
            os.unlink(txnindex_path(d, b))
        except FileNotFoundError:
            pass
    r.refresh()
    assert r.collect_aborted(0, hw, hw) == []
    r.close()
    log.close()


def test_regression_mmap_of_a_segment_cut_by_a_roll_between_fstat_and_mmap(tmp_path, monkeypatch):
    """A roll cuts the active segment to its size between a reader's fstat and its mmap: the
    map failed with "mmap length is greater than file size" and the fetch was answered
    UNKNOWN_SERVER_ERROR. The reader looks again."""
    import appliance.log.reader as reader_mod
    d = str(tmp_path)
    log, sent = fill(d, [(2, 100)] * 3)
    real = os.fstat
    lied = []

    def fstat(fd):
        st = real(fd)
        if not lied and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):   # the size before the cut
            lied.append(1)
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid,
                                   st.st_gid, st.st_size + 4096, st.st_atime, st.st_mtime,
                                   st.st_ctime))
        return st
    monkeypatch.setattr(reader_mod.os, "fstat", fstat)
    r = LogReader(d)
    res = r.read(0, 1 << 20, high_watermark=log.log_end_offset, log_start_offset=0,
                 min_one_batch=True)
    assert lied and res.first_batch_offset == 0
    lied.clear()
    assert bytes(SegmentViews().view(d, 0, 0, len(sent[0]))) == sent[0]
    assert lied
    r.close()
    log.close()


def test_a_batch_that_fails_its_crc_is_never_handed_out(filled):
    """Bit rot (issue 34): the read stops before the damaged batch; a read starting at it is
    CorruptBatch (KAFKA_STORAGE_ERROR) naming the file, position and offset; the batches after
    it are still read from past it; with verify_crc off it is served (the old behaviour)."""
    from appliance.log.reader import CorruptBatch
    d, log, sent = filled
    hw = log.log_end_offset
    h = read_header(sent[5])
    base = log.segment_bases()
    r = LogReader(d)
    res = r.read(h.base_offset, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    seg, pos = res.slices[0].segment_base, res.slices[0].position
    r.close()
    with open(log_path(d, seg), "r+b") as f:
        f.seek(pos + h.batch_length + 12 - 1)
        c = f.read(1)
        f.seek(pos + h.batch_length + 12 - 1)
        f.write(bytes([c[0] ^ 0x10]))
    r = LogReader(d)
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.next_offset == h.base_offset                 # everything before it, nothing after
    for _ in range(2):                                      # the checked ranges do not hide it
        with pytest.raises(CorruptBatch) as e:
            r.read(h.base_offset, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
        assert e.value.code == ErrorCode.kafka_storage_error
        assert (e.value.path, e.value.position, e.value.offset) == (log_path(d, seg), pos, h.base_offset)
    after = r.read(h.last_offset + 1, 1 << 30, high_watermark=hw, log_start_offset=0,
                   min_one_batch=True)
    assert after.first_batch_offset == h.last_offset + 1 and after.next_offset == hw
    r.verify_crc = False
    res = r.read(h.base_offset, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.first_batch_offset == h.base_offset
    r.close()
    assert base == log.segment_bases()


def test_a_batch_damaged_after_it_was_read_is_caught_once_the_checked_range_expires(filled):
    """A range checked once is trusted for crc_trust_s only: a page read back from a disk that
    rotted meanwhile (here: bytes changed under the reader's map) is checked again."""
    from appliance.log.reader import CorruptBatch
    d, log, sent = filled
    hw = log.log_end_offset
    r = LogReader(d)
    res = r.read(0, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)   # one batch
    s = res.slices[0]
    with open(log_path(d, s.segment_base), "r+b") as f:
        f.seek(s.position + 70)
        c = f.read(1)
        f.seek(s.position + 70)
        f.write(bytes([c[0] ^ 0x01]))
    assert r.read(0, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True) == res  # trusted
    r.crc_trust_s = 0.0
    with pytest.raises(CorruptBatch):
        r.read(0, 1, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    r.close()


def test_regression_the_segment_map_sweep_looked_at_every_directory_in_one_tick(tmp_path) -> None:
    """A frontend's sweep of deleted segments' maps (every 5 s) listed every cached directory and
    walked every map for each in one event-loop tick: at 1,024 partitions a stall that was the
    produce latency's tail (issue 32 goal 5). With a budget a call looks at that many
    directories, the round going on at the next call; a deleted segment's map is gone by the
    round's end, the others stay."""
    from appliance.log.files import log_path
    from appliance.log.reader import SegmentViews
    views = SegmentViews()
    dirs = []
    for i in range(3):
        d = str(tmp_path / f"t-{i}")
        os.makedirs(d)
        for base in (0, 100):
            with open(log_path(d, base), "wb") as f:
                f.write(b"x" * 64)
            assert bytes(views.view(d, base, 0, 8)) == b"x" * 8
        dirs.append(d)
    os.unlink(log_path(dirs[0], 0))
    os.unlink(log_path(dirs[2], 100))
    assert views.sweep(budget=1) is False and views.sweep(budget=1) is False
    # two of the three directories looked at: one deleted map gone, the other not yet
    assert ((dirs[0], 0) in views._maps) != ((dirs[2], 100) in views._maps) and len(views._maps) == 5
    assert views.sweep(budget=1) is True
    assert sorted(views._maps) == sorted([(dirs[0], 100), (dirs[1], 0), (dirs[1], 100), (dirs[2], 0)])
    assert views.sweep() is True and len(views._maps) == 4          # a new round, all at once


def test_regression_every_share_fetch_read_walked_the_log_to_max_bytes(filled):
    # A ShareFetch read from the first acquired offset was bounded by the client's max_bytes
    # (librdkafka's fetch.max.bytes, 50 MB) only: the fetcher walked every batch header of the
    # log on each ShareFetch (64-75 % of a core for 90,000 records/s with 16 KiB batches).
    # ``through`` ends the read with the batch holding it and at most ``ahead`` batches after.
    d, log, sent = filled
    r = LogReader(d)
    hw = log.log_end_offset
    heads = [read_header(b) for b in sent]
    for k in (0, 3, 17, len(sent) - 1):
        for ahead in (0, 2, 100):
            for off in (heads[k].base_offset, heads[k].last_offset):
                res = r.read(heads[0].base_offset, 1 << 30, high_watermark=hw, log_start_offset=0,
                             min_one_batch=True, through=off, ahead=ahead)
                end = min(k + 1 + ahead, len(sent))
                assert gather(SegmentViews(), d, res) == b"".join(sent[:end])
                assert res.next_offset == heads[end - 1].last_offset + 1
    # max_bytes still ends it first; no ``through``: bytes only, as Fetch reads.
    res = r.read(0, len(sent[0]), high_watermark=hw, log_start_offset=0, min_one_batch=True,
                 through=heads[5].base_offset, ahead=3)
    assert gather(SegmentViews(), d, res) == sent[0]
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    assert res.bytes == sum(map(len, sent))
    r.close()
