"""The log cleaner without fork: planning, rewriting and the writer's swap over real files,
checked by reading back as a consumer would (cleanerkit.Part), one KIP-98 rule a test."""

from __future__ import annotations

import os

import pytest

from appliance.log.cleaner.plan import group_segments, sealed_segments
from appliance.log.files import CLEANED_SUFFIX, list_segment_bases
from appliance.protocol.records import read_header
from cleanerkit import T0, Part, settings


def kv(i: int, v: str = "v") -> tuple[bytes, bytes]:
    return b"k%d" % i, f"{v}{i}".encode()


@pytest.fixture
def part(tmp_path):
    p = Part(str(tmp_path))
    yield p
    p.close()


def headers(p: Part):
    return [read_header(b) for b in p.batches()]


def test_latest_value_per_key_kept_offsets_and_batch_ranges_preserved(part):
    p = part
    for rnd in range(6):                       # every key written six times over several segments
        p.put([kv(i, f"r{rnd}-") for i in range(5)])
    p.roll()
    before = p.read()
    before_batches = {(h.base_offset, h.last_offset_delta) for h in headers(p)}
    st = p.clean()
    after = p.read()
    assert st.end_offset == p.log.active_segment_base
    # The last record of each key, at its original offset, nothing else.
    last = {}
    for r in before:
        last[r.key] = r
    assert after == sorted(last.values())
    # Offsets increase with gaps; each kept batch has its original base offset and range.
    kept = headers(p)
    assert all((h.base_offset, h.last_offset_delta) in before_batches for h in kept)
    assert [h.base_offset for h in kept] == sorted(h.base_offset for h in kept)
    assert p.checkpoint() == st.end_offset
    assert not [n for n in os.listdir(p.d) if n.endswith(CLEANED_SUFFIX)]


def test_partly_superseded_batch_keeps_its_offset_range(part):
    p = part
    base, last = p.put([kv(1), kv(2), kv(3)])
    p.put([kv(2, "new")])
    p.roll()
    p.clean()
    h = headers(p)[0]
    assert (h.base_offset, h.base_offset + h.last_offset_delta, h.records_count) == (base, last, 2)
    assert [(r.offset, r.key) for r in p.read()] == [(base, b"k1"), (base + 2, b"k3"), (base + 3, b"k2")]


def test_a_consumer_positioned_in_a_removed_range_moves_to_the_next_offset(part):
    from appliance.log.reader import LogReader
    p = part
    p.put([kv(i) for i in range(10)])
    p.put([kv(i, "w") for i in range(10)])     # supersedes the whole first batch
    p.roll()
    p.clean()
    r = LogReader(p.d)
    res = r.read(3, 1 << 20, high_watermark=p.hw, log_start_offset=0, min_one_batch=True)
    assert res.first_batch_offset == 10                  # the next batch, past the gap
    r.close()


def test_aborted_transaction_data_removed_using_the_aborted_index(part):
    p = part
    p.put([kv(1, "committed")])
    p.put([kv(2, "aborted"), kv(3, "aborted")], pid=7, txn=True)
    p.put([kv(4, "plain")])
    abort_at = p.end(7, commit=False)
    p.roll()
    assert {r.value for r in p.read(committed=False)} >= {b"aborted2", b"aborted3"}
    p.clean()
    assert all(b"aborted" not in r.value for r in p.read(committed=False))
    assert p.table() == {b"k1": b"committed1", b"k4": b"plain4"}
    # The marker stays (its transaction's data was seen in this round), with its index entry in
    # the cleaned segment.
    assert [h.base_offset for h in headers(p) if h.is_control] == [abort_at]
    from appliance.log.reader import LogReader
    r = LogReader(p.d)
    assert r.collect_aborted(0, p.hw, p.hw) == [(7, 1)]
    r.close()


def test_aborted_data_never_makes_a_committed_record_go(part):
    p = part
    p.put([kv(1, "committed")])
    p.put([kv(1, "aborted")], pid=7, txn=True)
    p.end(7, commit=False)
    p.roll()
    p.clean()
    p.clean()
    assert p.table() == {b"k1": b"committed1"}
    assert [r.value for r in p.read(committed=False)] == [b"committed1"]


def test_committed_transaction_supersedes_and_its_marker_stays_while_its_data_does(part):
    p = part
    p.put([kv(1, "old")])
    p.put([kv(1, "txn")], pid=7, txn=True)
    commit_at = p.end(7, commit=True)
    p.roll()
    p.clean()
    assert p.table() == {b"k1": b"txn1"}
    assert commit_at in [h.base_offset for h in headers(p) if h.is_control]


def test_nothing_at_or_beyond_the_last_stable_offset_is_cleaned(part):
    p = part
    p.put([kv(1, "a")])
    p.roll()
    p.put([kv(9, "open")], pid=7, txn=True)        # open transaction from here
    p.put([kv(1, "b")])
    p.roll()
    p.put([kv(1, "c")])
    p.roll()
    lso = p.lso()
    segs, c = p.plan()
    assert c.first_uncleanable <= lso and c.first_uncleanable in list_segment_bases(p.d)
    before = [(r.offset, r.value) for r in p.read(committed=False) if r.offset >= c.first_uncleanable]
    p.clean()
    after = [(r.offset, r.value) for r in p.read(committed=False) if r.offset >= c.first_uncleanable]
    assert after == before                     # k1=b and k1=c, past the LSO, still there
    p.end(7, commit=False)
    p.roll()
    p.clean()
    assert p.table() == {b"k1": b"c1"}
    assert all(r.value != b"open9" for r in p.read(committed=False))


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path):
    p = Part(str(tmp_path), settings(min_compaction_lag_ms=10_000))
    p.put([kv(1, "a")], ts=T0)
    p.roll()
    p.put([kv(1, "b")], ts=T0 + 9_000)
    p.roll()
    p.put([kv(1, "c")], ts=T0 + 9_500)
    p.roll()
    segs, c = p.plan(now=T0 + 10_000)
    # The second segment's largest timestamp is within the lag: cleaning stops before it.
    assert c.first_uncleanable == segs[1].base
    p.clean(now=T0 + 10_000)
    assert [r.value for r in p.read()] == [b"a1", b"b1", b"c1"]   # nothing past the first segment
    p.clean(now=T0 + 30_000)
    assert [r.value for r in p.read()] == [b"c1"]
    p.close()


def test_tombstones_kept_for_delete_retention_then_removed(part):
    p = part
    p.put([kv(1), kv(2)])
    p.put([(b"k1", None)])                       # tombstone
    p.roll()
    p.clean(now=T0)
    recs = p.read()
    assert [(r.key, r.value) for r in recs] == [(b"k2", b"v2"), (b"k1", None)]
    tomb = [h for h in headers(p) if h.records_count and h.base_offset == recs[-1].offset][0]
    assert tomb.delete_horizon_ms == T0 + p.s.delete_retention_ms    # KIP-534 bit and horizon
    assert [r.timestamp for r in recs][-1] == T0                       # record time unchanged
    p.put([kv(3)])
    p.roll()
    p.clean(now=T0 + 500)                        # before the horizon: stays
    assert (b"k1", None) in [(r.key, r.value) for r in p.read()]
    p.put([kv(4)])
    p.roll()
    p.clean(now=T0 + 1000)                       # at the horizon: goes
    assert [(r.key, r.value) for r in p.read()] == [(b"k2", b"v2"), (b"k3", b"v3"), (b"k4", b"v4")]


def test_markers_go_only_after_their_data_and_the_delete_horizon_two_passes(part):
    p = part
    p.put([kv(1, "aborted")], pid=7, txn=True)
    m = p.end(7, commit=False)
    p.put([kv(2)], pid=8, txn=True)
    c = p.end(8, commit=True)
    p.put([kv(2, "w")])                          # supersedes the committed record
    p.roll()
    # Producers expired: no last batch to keep.
    p.psm.entries.clear()
    p.clean(now=T0)
    ctrl = {h.base_offset: h for h in headers(p) if h.is_control}
    # Pass 1: the aborted data goes, its marker stays (data was seen); the COMMIT marker stays
    # (its data was seen), neither has a horizon yet.
    assert set(ctrl) == {m, c} and all(h.delete_horizon_ms is None for h in ctrl.values())
    p.put([kv(3)])
    p.roll()
    p.clean(now=T0 + 10)
    ctrl = {h.base_offset: h for h in headers(p) if h.is_control}
    # Pass 2: no data of either transaction left: both may go, so both get a delete horizon.
    assert set(ctrl) == {m, c}
    assert {h.delete_horizon_ms for h in ctrl.values()} == {T0 + 10 + p.s.delete_retention_ms}
    from appliance.log.reader import LogReader
    r = LogReader(p.d)
    assert r.collect_aborted(0, p.hw, p.hw) == []      # no entry: nothing of it to filter
    r.close()
    p.put([kv(4)])
    p.roll()
    p.clean(now=T0 + 10 + p.s.delete_retention_ms)
    assert not [h for h in headers(p) if h.is_control]


def test_every_producers_last_batch_is_kept_until_it_expires(part):
    p = part
    base, last = p.put([kv(1)], pid=5)
    p.put([kv(1, "other")])                       # supersedes producer 5's only record
    p.roll()
    p.clean()
    kept = [h for h in headers(p) if h.producer_id == 5]
    assert [(h.base_offset, h.last_offset_delta, h.records_count, h.base_sequence) for h in kept] == \
        [(base, 0, 0, 0)]                           # an empty batch: id, epoch, last sequence
    assert p.table() == {b"k1": b"other1"}
    # Replayed from the log alone (no snapshot), the producer's sequence is still known: a retry
    # of its batch is a duplicate.
    for n in os.listdir(p.d):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(p.d, n))
    p.reopen()
    e = p.psm.entries[5]
    assert (e.last_seq, e.last_offset) == (0, base)
    # Once the producer expired, the next round removes it.
    p.psm.entries.clear()
    p.put([kv(2)])
    p.roll()
    p.clean()
    assert not [h for h in headers(p) if h.producer_id == 5]


def test_the_last_batch_before_the_uncleanable_offset_is_kept(part):
    p = part
    p.put([kv(1)])
    p.put([kv(1, "w")])
    b, last = p.put([kv(2)])
    p.put([kv(2, "x")])
    p.roll()
    p.put([kv(2, "y")])                 # in the active segment: supersedes the last sealed record
    p.clean()
    hs = headers(p)
    sealed = [h for h in hs if h.base_offset < p.log.active_segment_base]
    # The round's last batch survives empty, so that the log's offsets still reach the active segment.
    assert sealed[-1].base_offset + sealed[-1].last_offset_delta + 1 == p.log.active_segment_base


def test_map_overflow_cleans_up_to_where_the_map_stopped(tmp_path):
    p = Part(str(tmp_path), settings(segment_bytes=100_000))
    for rnd in range(3):
        for i in range(0, 2000, 100):
            p.put([kv(j, f"r{rnd}-") for j in range(i, i + 100)])
    p.roll()
    st = p.clean(map_bytes=1 << 20)         # 8192 slots, 7372 keys a round: all 2000 fit
    assert st.end_offset == p.log.active_segment_base
    q = Part(str(tmp_path / "small"), settings(segment_bytes=100_000))
    for rnd in range(3):
        for i in range(0, 2000, 100):
            q.put([kv(j, f"r{rnd}-") for j in range(i, i + 100)])
    q.roll()
    full = q.table()
    from appliance.log.cleaner.offset_map import OffsetMap
    rounds = 0
    while True:
        segs, c = q.plan()
        if c.first_dirty >= c.first_uncleanable:
            break
        from appliance.log.cleaner.clean import Cleaner
        m = OffsetMap(1 << 20)
        m.max_entries = 500
        st = Cleaner(q.d, q.s, m).clean(segs, c, hw=q.hw, producers={}, swap=lambda gs, cp: bool(
            q.log.replace_segments([(g.base, [(x.base, x.ino, x.size) for x in g.old]) for g in gs],
                                   cp, 60)), now_ms=q.now)
        rounds += 1
        assert st.end_offset > c.first_dirty
    assert rounds >= 4 and q.table() == full
    q.close()
    p.close()


def test_group_segments_by_size_and_offset_span():
    from appliance.log.cleaner.plan import SegmentFile

    def seg(base, size):
        return SegmentFile(base, size, 1, 0, 8, 12, 0, 0)
    segs = [seg(0, 400), seg(10, 400), seg(20, 400), seg(30, 0), seg(40, 900)]
    assert [[s.base for s in g] for g in group_segments(segs, 1000, 4096, 50)] == \
        [[0, 10], [20, 30], [40]]
    big = [seg(0, 1), seg(2**31 - 5, 1), seg(2**31 + 10, 1)]
    assert [[s.base for s in g] for g in group_segments(big, 1000, 4096, 2**31 + 11)] == \
        [[0], [2**31 - 5, 2**31 + 10]]
    assert [[s.base for s in g] for g in group_segments(big, 1000, 4096, 2**32)] == \
        [[0], [2**31 - 5], [2**31 + 10]]


def test_compressed_batches_are_rebuilt_with_their_codec(part):
    from appliance.protocol.records import COMPRESSION_ZSTD
    p = part
    p.put([kv(1), kv(2), kv(3)], compression=COMPRESSION_ZSTD)
    p.put([kv(2, "w")])
    p.roll()
    p.clean()
    h = headers(p)[0]
    assert h.compression == COMPRESSION_ZSTD and h.records_count == 2
    assert p.table() == {b"k1": b"v1", b"k2": b"w2", b"k3": b"v3"}


def test_cleaned_log_survives_reopen_clean_and_after_a_crash(part):
    p = part
    for rnd in range(4):
        p.put([kv(i, f"r{rnd}-") for i in range(4)])
        p.put([kv(9, "x")], pid=3, txn=True)
        p.end(3, commit=rnd % 2 == 0)
    p.roll()
    p.clean()
    want, want_committed = p.read(committed=False), p.read()
    p.reopen(clean=True)
    assert p.read(committed=False) == want
    p.reopen(clean=False)
    os.unlink(os.path.join(p.d, "recovery-point"))     # every segment scanned and re-indexed
    p.reopen(clean=False)
    assert p.read(committed=False) == want and p.read() == want_committed


def test_writer_refuses_a_copy_of_segments_that_changed(part):
    from appliance.log.cleaner.clean import Cleaner
    from appliance.log.cleaner.offset_map import OffsetMap
    from appliance.log.swap import SwapRefused
    p = part
    for rnd in range(3):
        p.put([kv(i, f"r{rnd}") for i in range(4)])
    p.roll()
    segs, c = p.plan()
    refused = []

    def swap(groups, checkpoint):
        # The segments changed under the cleaner (as if retention replaced them).
        try:
            p.log.replace_segments([(g.base, [(x.base, x.ino + 1, x.size) for x in g.old])
                                    for g in groups], checkpoint, 60)
        except SwapRefused as e:
            refused.append(str(e))
            return False
        return True
    from appliance.log.cleaner.clean import CleaningAborted
    with pytest.raises(CleaningAborted):
        Cleaner(p.d, p.s, OffsetMap(1 << 20)).clean(segs, c, hw=p.hw, producers={}, swap=swap,
                                                   now_ms=p.now)
    assert refused and not [n for n in os.listdir(p.d) if n.endswith(CLEANED_SUFFIX)]
    assert len(p.read()) == 12


# -- a property: what read_committed makes of the log is what it made before cleaning ------------

from hypothesis import HealthCheck, event, given, settings as hsettings, strategies as st  # noqa: E402

_put = st.tuples(st.just("put"), st.lists(st.tuples(st.integers(0, 4), st.integers(0, 5).map(
    lambda x: x == 0)), min_size=1, max_size=4))
_op = st.one_of(
    _put, _put, _put,
    st.tuples(st.just("txn"), st.integers(1, 3), st.lists(st.integers(0, 4), min_size=1, max_size=3)),
    st.tuples(st.just("end"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("roll")),
    st.tuples(st.just("clean"), st.integers(0, 3000)),
    st.tuples(st.just("expire")),
)


@hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=5, max_size=60))
def test_cleaning_never_changes_what_read_committed_makes_of_the_log(tmp_path_factory, ops):
    p = Part(str(tmp_path_factory.mktemp("prop")), settings(segment_bytes=700))
    try:
        open_txn: dict[int, bool] = {}
        n = 0
        for op in ops:
            if op[0] == "put":
                n += 1
                p.put([(b"k%d" % k, None if dead else b"v%d" % n) for k, dead in op[1]])
            elif op[0] == "txn":
                n += 1
                p.put([(b"k%d" % k, b"t%d" % n) for k in op[2]], pid=op[1], txn=True)
                open_txn[op[1]] = True
            elif op[0] == "end" and open_txn:
                pid = sorted(open_txn)[op[1] % len(open_txn)]
                del open_txn[pid]
                p.end(pid, commit=op[2])
            elif op[0] == "roll" and p.log.active_end_position:
                p.roll()
            elif op[0] == "expire":
                for pid in [x for x in p.psm.entries if x not in open_txn]:
                    del p.psm.entries[pid]
            elif op[0] == "clean":
                if p.log.active_end_position:
                    p.roll()
                before, table = p.read(), p.table()
                raw = {r.offset: r for r in p.read(committed=False)}
                _, c = p.plan()
                p.now += op[1]
                if c.first_dirty < c.first_uncleanable:
                    p.clean()
                after = p.read()
                event("cleaning removed records" if len(after) < len(before) else "nothing removed")
                # The same table, from records that are the originals at their offsets.
                assert p.table() == table
                assert [r.offset for r in after] == sorted({r.offset for r in after})
                assert all(raw[r.offset] == r for r in p.read(committed=False))
                # Nothing at or past the first uncleanable offset went.
                assert [r for r in before if r.offset >= c.first_uncleanable] == \
                    [r for r in after if r.offset >= c.first_uncleanable]
        assert not [n for n in os.listdir(p.d) if n.endswith(CLEANED_SUFFIX)]
    finally:
        p.close()


# -- the swap, crashed at every step ----------------------------------------------------------------

class Crash(Exception):
    pass


def _scenario(d: str, segment_bytes: int = 100_000) -> Part:
    p = Part(d, settings(segment_bytes=segment_bytes))
    for rnd in range(3):
        p.put([kv(i, f"r{rnd}-") for i in range(6)])
        p.put([kv(9, "txn")], pid=4, txn=True)
        p.end(4, commit=rnd != 1)
        p.roll()
    return p


@pytest.mark.parametrize("segment_bytes", [100_000, 300], ids=["one group", "groups"])
@pytest.mark.parametrize("step", ["checked", "committed", "renamed", "retired", "done"])
def test_a_crash_at_any_step_of_a_swap_leaves_the_old_or_the_new_segments(tmp_path, step,
                                                                          segment_bytes):
    ref = _scenario(str(tmp_path / "ref"), segment_bytes)
    old = (ref.read(committed=False), ref.read())
    ref.clean()
    new = (ref.read(committed=False), ref.read())
    ref.close()
    assert old != new
    p = _scenario(str(tmp_path / "crash"), segment_bytes)
    if segment_bytes == 300:
        from appliance.log.cleaner.plan import group_segments
        segs, c = p.plan()
        assert len(group_segments(segs, 300, 4096, c.first_uncleanable)) > 1
    files_before = sorted(os.listdir(p.d))

    def hook(name):
        if name == step:
            raise Crash(name)
    p.log.crash_hook = hook
    with pytest.raises(Crash):
        p.clean()
    p.reopen(clean=False)                       # as after a kill -9: recovery at open
    got = (p.read(committed=False), p.read())
    assert got == (old if step == "checked" else new), step
    names = os.listdir(p.d)
    assert not [n for n in names if n.endswith((".cleaned", ".deleted")) or n == "cleaner-swap"]
    if step == "checked":
        assert sorted(n for n in names if not n.endswith(".snapshot")) == \
            sorted(n for n in files_before if not n.endswith(".snapshot"))
        assert p.checkpoint() is None
    else:
        assert p.checkpoint() == p.log.active_segment_base
    # The log is sound: cleaning again works and changes nothing a consumer sees.
    p.put([kv(0, "later")])
    p.roll()
    p.clean()
    assert p.table() == {**{r.key: r.value for r in new[1]}, b"k0": b"later0"}
    p.close()


def test_readers_holding_the_old_files_keep_reading_across_a_swap(tmp_path):
    from appliance.log.reader import LogReader, SegmentViews
    p = _scenario(str(tmp_path))
    r = LogReader(p.d)
    views = SegmentViews()
    hw = p.hw
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    old_bytes = b"".join(bytes(views.view(p.d, s.segment_base, s.position, s.length, s.inode))
                         for s in res.slices)
    p.clean()
    # A fetch answered before the swap is still copied from the file it was read from (its
    # retired name), although another file is under the segment's name now.
    again = b"".join(bytes(SegmentViews().view(p.d, s.segment_base, s.position, s.length, s.inode))
                     for s in res.slices)
    assert again == old_bytes
    # The reader notices the swap at its next refresh and reads the new files.
    r.refresh()
    res2 = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    new_bytes = b"".join(bytes(views.view(p.d, s.segment_base, s.position, s.length, s.inode))
                         for s in res2.slices)
    assert new_bytes == b"".join(p.batches()) and len(new_bytes) < len(old_bytes)
    # Retired files go after their delay.
    retired = [n for n in os.listdir(p.d) if n.endswith(".deleted")]
    assert retired and p.log.delete_retired(now=10**12) == len(retired)
    with pytest.raises(Exception):
        SegmentViews().view(p.d, res.slices[0].segment_base, res.slices[0].position,
                            res.slices[0].length, res.slices[0].inode)
    r.close()
    p.close()


def test_a_reader_that_missed_the_refresh_sees_the_old_or_the_new_data_never_a_mix(tmp_path):
    from appliance.log.reader import LogReader
    p = Part(str(tmp_path), settings(segment_bytes=400))
    for rnd in range(4):
        p.put([kv(i, f"r{rnd}-") for i in range(3)])
    p.roll()
    hw = p.hw
    old = [r.offset for r in p.read(committed=False)]
    r = LogReader(p.d)                         # lists the old segments, maps none yet
    p.clean()
    new = [r_.offset for r_ in p.read(committed=False)]
    res = r.read(0, 1 << 30, high_watermark=hw, log_start_offset=0, min_one_batch=True)
    from appliance.log.reader import SegmentViews
    v = SegmentViews()
    data = b"".join(bytes(v.view(p.d, s.segment_base, s.position, s.length, s.inode))
                    for s in res.slices)
    from appliance.protocol.records import decode_records, iter_batch_headers
    offs = [rec.offset for pos, h in iter_batch_headers(data) for rec in decode_records(data[pos:pos + h.size])]
    assert offs == sorted(set(offs)) and set(new) <= set(offs) <= set(old)
    r.close()
    p.close()


def test_reads_and_timestamp_lookups_across_empty_and_gapped_segments(tmp_path):
    from appliance.log.reader import LogReader
    p = Part(str(tmp_path), settings(segment_bytes=400))    # one segment a group

    def big(i, v):
        return b"k%d" % i, v.encode() * 100
    p.put([big(1, "a"), big(2, "a")], ts=T0)
    p.roll()
    p.put([big(3, "b"), big(4, "b")], ts=T0 + 10)           # all superseded below
    p.roll()
    p.put([big(1, "c")], ts=T0 + 20)
    p.roll()
    p.put([big(3, "d"), big(4, "d")], ts=T0 + 30)
    p.roll()
    p.put([big(5, "e")], ts=T0 + 40)
    bases = list_segment_bases(p.d)
    p.clean()
    sizes = {s.base: s.size for s in sealed_segments(p.d, p.log.active_segment_base)}
    assert list_segment_bases(p.d) == bases and sizes[bases[1]] == 0     # emptied, kept
    assert [(r.offset, r.key) for r in p.read(committed=False)] == \
        [(1, b"k2"), (4, b"k1"), (5, b"k3"), (6, b"k4"), (7, b"k5")]
    r = LogReader(p.d)
    for fetch, first in ((0, 0), (1, 0), (2, 4), (3, 4), (4, 4), (7, 7)):
        res = r.read(fetch, 1, high_watermark=p.hw, log_start_offset=0, min_one_batch=True)
        assert res.first_batch_offset == first, fetch
    assert r.offset_for_timestamp(T0 + 5, p.hw) == (4, T0 + 20)       # 2 and 3 are gone
    assert r.offset_for_timestamp(T0 + 30, p.hw) == (5, T0 + 30)
    assert r.max_timestamp(p.hw) == (7, T0 + 40)
    r.close()
    p.reopen(clean=False)
    assert [r_.offset for r_ in p.read(committed=False)] == [1, 4, 5, 6, 7]
    p.close()


def test_nothing_is_dirty_once_cleaned_up_to_the_active_segment(part):
    # Regression: the last sealed segment was taken as unbounded, so a cleaned log looked dirty
    # and was cleaned again and again.
    p = part
    for rnd in range(3):
        p.put([kv(i, f"r{rnd}-") for i in range(5)])
    p.roll()
    p.put([kv(1, "active")])
    _, c = p.plan()
    assert c.cleanable_bytes > 0 and c.due(0.0)
    p.clean()
    _, c = p.plan()
    assert (c.first_dirty, c.cleanable_bytes, c.due(0.0)) == (p.log.active_segment_base, 0, False)
