"""The background scrub's walk (appliance.log.scrub): every batch's CRC checked, damage reported
with file and position once, the budget kept, the active segment never read."""

from __future__ import annotations

import os
import struct

from appliance.log.files import log_path
from appliance.log.scrub import Scrubber, ScrubTarget, scan_segment
from appliance.protocol.records import Record, build_batch, set_base_offset


def write_segment(directory: str, base: int, n: int, per: int = 5, size: int = 100) -> list[int]:
    """``n`` batches of ``per`` records from offset ``base``; returns their positions."""
    os.makedirs(directory, exist_ok=True)
    out, positions, off = bytearray(), [], base
    for _ in range(n):
        b = bytearray(build_batch([Record(b"k", b"v" * size) for _ in range(per)]))
        set_base_offset(b, off)
        positions.append(len(out))
        out += b
        off += per
    with open(log_path(directory, base), "wb") as f:
        f.write(out)
    return positions


def flip(path: str, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        c = f.read(1)
        f.seek(pos)
        f.write(bytes([c[0] ^ 1]))


def test_scan_finds_a_flipped_value_byte_and_goes_on_past_it(tmp_path):
    d = str(tmp_path)
    pos = write_segment(d, 0, 10)
    path = log_path(d, 0)
    flip(path, pos[3] + 80)
    end, read, damage, done = scan_segment(path, 0, 1 << 30)
    assert done and end == read == os.path.getsize(path)
    assert [(x.position, x.offset) for x in damage] == [(pos[3], 15)]
    assert "CRC" in damage[0].reason


def test_scan_stops_at_a_header_it_cannot_walk(tmp_path):
    d = str(tmp_path)
    pos = write_segment(d, 0, 6)
    path = log_path(d, 0)
    with open(path, "r+b") as f:
        f.seek(pos[2] + 8)
        f.write(struct.pack(">i", 1 << 30))        # a length past the end: outside the CRC
    end, _, damage, done = scan_segment(path, 0, 1 << 30)
    assert done and end == pos[2]
    assert [x.position for x in damage] == [pos[2]]


def test_scan_keeps_its_budget_in_whole_batches(tmp_path):
    d = str(tmp_path)
    pos = write_segment(d, 0, 10)
    step = pos[1]
    end, read, damage, done = scan_segment(log_path(d, 0), 0, step * 3)
    assert (end, read, damage, done) == (pos[3], step * 3, [], False)
    end, read, _, done = scan_segment(log_path(d, 0), end, 1)        # at least one batch
    assert (end, read, done) == (pos[4], step, False)


def test_scrubber_walks_sealed_segments_only_reports_once_and_counts_passes(tmp_path):
    d = str(tmp_path / "t-0")
    write_segment(d, 0, 4)
    p10 = write_segment(d, 20, 4)
    active = write_segment(d, 40, 4)
    flip(log_path(d, 20), p10[1] + 70)
    flip(log_path(d, 40), active[0] + 70)                # active: never read by the scrub
    t = ScrubTarget("w.0", "t", 0, d)
    sc = Scrubber(pass_interval_s=60.0)
    sc.set_targets([t])
    seg_bytes = os.path.getsize(log_path(d, 0))
    found = []
    steps = 0
    while sc.passes == 0:
        assert sc.due(0.0)
        read, damage = sc.step(0.0, seg_bytes // 2, lambda _: 40)
        assert read <= seg_bytes // 2
        found += damage
        steps += 1
        assert steps < 20
    assert [(x.path, x.position, x.offset) for _, x in found] == [(log_path(d, 20), p10[1], 25)]
    assert sc.bytes_read == 2 * seg_bytes
    assert not sc.due(1.0) and sc.due(60.0)
    again = []
    while sc.passes == 1:
        again += sc.step(60.0, 1 << 20, lambda _: 40)[1]
    assert again == []                                   # reported once


def test_scrubber_skips_a_partition_whose_writer_is_not_ready(tmp_path):
    d = str(tmp_path / "t-0")
    pos = write_segment(d, 0, 4)
    write_segment(d, 20, 1)
    flip(log_path(d, 0), pos[0] + 70)
    sc = Scrubber(pass_interval_s=0.0)
    sc.set_targets([ScrubTarget("w.0", "t", 0, d)])
    assert sc.step(0.0, 1 << 20, lambda _: None) == (0, [])
    assert sc.passes == 1
    read, damage = sc.step(0.0, 1 << 20, lambda _: 20)
    assert read == os.path.getsize(log_path(d, 0)) and len(damage) == 1


def test_a_step_looks_at_a_bounded_number_of_partitions(tmp_path):
    from appliance.log.scrub import MAX_TARGETS_A_STEP
    targets = [ScrubTarget(f"w.{i}", "t", i, str(tmp_path / f"t-{i}")) for i in range(MAX_TARGETS_A_STEP + 10)]
    sc = Scrubber(pass_interval_s=0.0)
    sc.set_targets(targets)
    seen = []
    sc.step(0.0, 1 << 20, lambda t: seen.append(t) or None)
    assert len(seen) == MAX_TARGETS_A_STEP and sc.passes == 0
    sc.step(0.0, 1 << 20, lambda t: seen.append(t) or None)
    assert sc.passes == 1 and seen[MAX_TARGETS_A_STEP:] == targets[MAX_TARGETS_A_STEP:]
