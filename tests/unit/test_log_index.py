"""Offset and time indexes: Kafka's formats and floor lookups, readers' entry-count detection."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from appliance.log.index import CorruptIndex, OffsetIndex, TimeIndex


@pytest.fixture
def paths(tmp_path):
    return str(tmp_path / "00000000000000000100.index"), str(tmp_path / "00000000000000000100.timeindex")


def test_offset_index_format_is_big_endian_relative_offset_then_position(paths):
    ix = OffsetIndex(paths[0], 100, writable=True, max_bytes=4096)
    ix.append(105, 4242)
    ix.close()
    raw = Path(paths[0]).read_bytes()
    assert len(raw) == 4096                                  # preallocated
    assert raw[:8] == struct.pack(">II", 5, 4242) and raw[8:] == bytes(4088)


def test_time_index_format_is_timestamp_then_relative_offset(paths):
    ix = TimeIndex(paths[1], 100, writable=True, max_bytes=4096)
    ix.maybe_append(1_700_000_000_000, 103)
    ix.close()
    raw = Path(paths[1]).read_bytes()
    assert len(raw) == 4092                                  # rounded down to 12-byte entries
    assert raw[:12] == struct.pack(">qI", 1_700_000_000_000, 3)


def test_offset_lookup_floor_semantics(paths):
    ix = OffsetIndex(paths[0], 100, writable=True, max_bytes=4096)
    assert ix.lookup(500) == (100, 0)                        # empty: (base, 0)
    for off, pos in [(104, 100), (110, 300), (120, 900)]:
        ix.append(off, pos)
    assert ix.lookup(99) == (100, 0)
    assert ix.lookup(103) == (100, 0)
    assert ix.lookup(104) == (104, 100)
    assert ix.lookup(109) == (104, 100)
    assert ix.lookup(110) == (110, 300)
    assert ix.lookup(10**12) == (120, 900)
    ix.close()


def test_offset_index_refuses_non_increasing_and_position_zero(paths):
    ix = OffsetIndex(paths[0], 100, writable=True, max_bytes=4096)
    ix.append(104, 100)
    with pytest.raises(ValueError):
        ix.append(104, 200)
    with pytest.raises(ValueError):
        ix.append(105, 0)
    with pytest.raises(ValueError):
        ix.append(100 + 2**31, 300)                          # relative offset overflow
    ix.close()


def test_offset_index_full(paths):
    ix = OffsetIndex(paths[0], 0, writable=True, max_bytes=24)
    for i in range(3):
        ix.append(i + 1, (i + 1) * 10)
    assert ix.is_full()
    with pytest.raises(ValueError):
        ix.append(10, 100)
    ix.close()


def test_time_lookup_floor_semantics_and_maybe_append(paths):
    ix = TimeIndex(paths[1], 100, writable=True, max_bytes=4096)
    assert ix.lookup(10**15) == (-1, 100)
    assert ix.maybe_append(1000, 101)
    assert not ix.maybe_append(1000, 105)                    # same timestamp: ignored
    assert ix.maybe_append(2000, 110)
    assert ix.maybe_append(3000, 120)
    with pytest.raises(ValueError):
        ix.maybe_append(2500, 125)                           # timestamps never go back
    assert ix.lookup(999) == (-1, 100)
    assert ix.lookup(1000) == (1000, 101)
    assert ix.lookup(2999) == (2000, 110)
    assert ix.lookup(5000) == (3000, 120)
    assert ix.last_entry == (3000, 120)
    ix.close()


def test_time_index_reserves_last_slot_for_roll(paths):
    ix = TimeIndex(paths[1], 0, writable=True, max_bytes=36)   # 3 slots
    ix.maybe_append(1, 1)
    ix.maybe_append(2, 2)
    assert ix.is_full()
    with pytest.raises(ValueError):
        ix.maybe_append(3, 3)
    assert ix.maybe_append(3, 3, skip_full_check=True)
    ix.close()


def test_truncate_to_removes_entries_at_or_after_offset(paths):
    ix = OffsetIndex(paths[0], 0, writable=True, max_bytes=4096)
    for off in (10, 20, 30, 40):
        ix.append(off, off * 10)
    ix.truncate_to(30)
    assert ix.entries == 2 and ix.lookup(1000) == (20, 200) and ix.last_offset == 20
    ix.truncate_to(25)
    assert ix.entries == 2
    ix.append(35, 350)
    assert ix.lookup(1000) == (35, 350)
    ix.truncate_to(0)
    assert ix.entries == 0
    ix.close()
    t = TimeIndex(paths[1], 0, writable=True, max_bytes=4096)
    for ts, off in ((5, 10), (6, 20), (7, 30)):
        t.maybe_append(ts, off)
    t.truncate_to(20)
    assert t.entries == 1 and t.last_entry == (5, 10)
    t.close()


def test_reader_sees_entries_appended_after_it_opened(paths):
    w = OffsetIndex(paths[0], 100, writable=True, max_bytes=4096)
    r = OffsetIndex(paths[0], 100)
    assert r.entries == 0 and r.lookup(200) == (100, 0)
    w.append(110, 500)
    assert r.entries == 1 and r.lookup(200) == (110, 500)
    for i in range(1, 300):
        w.append(110 + i, 500 + i)
    assert r.entries == 300 and r.lookup(250) == (250, 640)
    wt = TimeIndex(paths[1], 100, writable=True, max_bytes=4096)
    rt = TimeIndex(paths[1], 100)
    wt.maybe_append(50, 100)                                 # relative offset 0 in slot 0
    assert rt.entries == 1 and rt.lookup(60) == (50, 100)
    wt.maybe_append(70, 101)
    assert rt.entries == 2 and rt.last_entry == (70, 101)
    for x in (w, r, wt, rt):
        x.close()


def test_reader_count_detection_ignores_preallocated_zeros(paths):
    w = OffsetIndex(paths[0], 0, writable=True, max_bytes=8 * 1000)
    for i in range(1, 538):
        w.append(i, i * 3)
    w.close()
    r = OffsetIndex(paths[0], 0)
    assert r.max_entries == 1000 and r.entries == 537
    r.close()
    # Reopened writable without a count: detected the same way.
    w = OffsetIndex(paths[0], 0, writable=True, max_bytes=8 * 1000)
    assert w.entries == 537 and w.last_offset == 537
    w.close()


def test_time_index_first_entry_zero_timestamp_zero_offset_is_harmless(paths):
    w = TimeIndex(paths[1], 100, writable=True, max_bytes=120)
    w.maybe_append(0, 100)        # (0, rel 0): indistinguishable from an empty slot ...
    r = TimeIndex(paths[1], 100)
    # ... and either way the lookup starts at the segment's base offset
    assert r.lookup(0)[1] == 100 and r.lookup(10)[1] == 100
    w.maybe_append(5, 103)
    assert r.entries == 2 and r.lookup(7) == (5, 103)
    w.close()
    r.close()


def test_write_trimmed_replaces_file_and_old_reader_map_stays_valid(paths):
    w = OffsetIndex(paths[0], 0, writable=True, max_bytes=4096)
    for i in range(1, 6):
        w.append(i, i * 100)
    r = OffsetIndex(paths[0], 0)
    ino = os.stat(paths[0]).st_ino
    w.write_trimmed()
    w.close()
    assert os.path.getsize(paths[0]) == 40 and os.stat(paths[0]).st_ino != ino
    assert r.lookup(3) == (3, 300) and r.entries == 5    # the old file is still mapped
    r.close()
    again = OffsetIndex(paths[0], 0)
    assert again.entries == 5 and again.max_entries == 5
    again.close()


def test_sanity_check(paths):
    w = OffsetIndex(paths[0], 100, writable=True, max_bytes=4096)
    w.append(110, 500)
    w.sanity_check(log_size=1000)
    with pytest.raises(CorruptIndex):
        w.sanity_check(log_size=400)                    # points past the log end
    w.close()
    with open(paths[0], "wb") as f:
        f.write(struct.pack(">II", 5, 100) + b"\x01\x02\x03")   # not a multiple of 8
    with pytest.raises(CorruptIndex):
        OffsetIndex(paths[0], 100).sanity_check()
    with open(paths[1], "wb") as f:
        f.write(struct.pack(">qI", 50, 1) + struct.pack(">qI", 40, 2))
    with pytest.raises(CorruptIndex):
        TimeIndex(paths[1], 100).sanity_check()          # last timestamp below first


def test_missing_file_read_only_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        OffsetIndex(str(tmp_path / "nope.index"), 0)


def test_empty_file_read_only(tmp_path):
    p = str(tmp_path / "e.index")
    open(p, "wb").close()
    r = OffsetIndex(p, 7)
    assert r.entries == 0 and r.lookup(100) == (7, 0)
    t = TimeIndex(p, 7)
    assert t.lookup(5) == (-1, 7) and t.last_entry == (-1, 7)
