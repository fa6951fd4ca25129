"""Bit rot in the indexes of sealed segments (issue 34): an offset or time index that is missing,
torn, or does not match its log is rebuilt from the log at open - the same bytes a seal wrote -
without touching the log (no CRC scan, no truncation, no later segment dropped)."""

from __future__ import annotations

import os
import struct

import pytest

from appliance.log.files import index_path, list_segment_bases, log_path, timeindex_path
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.reader import LogReader
from appliance.protocol.records import Record, build_batch

T0 = 1_700_000_000_000
S = LogSettings(segment_bytes=4096, index_interval_bytes=200, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)


def make(d: str, n: int = 120) -> int:
    lg = PartitionLog.open(d, S, T0)
    for i in range(n):
        lg.append(bytearray(build_batch([Record(b"k", b"v" * (30 + i % 13), [], T0 + i)],
                                        base_timestamp=T0 + i)), T0)
    end = lg.log_end_offset
    lg.close()                            # clean: sealed segments are loaded, not scanned
    return end


def snapshot_files(d: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith((".log", ".index", ".timeindex")):
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
    return out


def flip(path: str, pos: int, mask: int = 0x80) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        c = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([c ^ mask]))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


DAMAGE = {
    "offset entry position flipped": lambda p: flip(index_path(*p), 8 * 2 + 4),
    "offset entry offset flipped": lambda p: flip(index_path(*p), 8 * 1 + 1),
    "commit word zeroed in the middle": lambda p: (flip(index_path(*p), 8 * 1 + 4, 0),
                                                  _zero(index_path(*p), 8 * 1 + 4, 4)),
    "offset index torn mid-entry": lambda p: truncate(index_path(*p), 8 * 2 + 3),
    "offset index missing": lambda p: os.unlink(index_path(*p)),
    "time entry timestamp flipped": lambda p: flip(timeindex_path(*p), 12 * 1 + 6, 0x01),
    "last time entry timestamp flipped": lambda p: flip(
        timeindex_path(*p), os.path.getsize(timeindex_path(*p)) - 12 + 7, 0x01),
    "time index torn": lambda p: truncate(timeindex_path(*p), 12 * 1 + 5),
    "time index missing": lambda p: os.unlink(timeindex_path(*p)),
}


def _zero(path: str, pos: int, n: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(bytes(n))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_index_of_a_sealed_segment_is_rebuilt_from_the_log(tmp_path, case):
    d = str(tmp_path / "p")
    end = make(d)
    bases = list_segment_bases(d)
    assert len(bases) >= 3
    before = snapshot_files(d)
    DAMAGE[case]((d, bases[1]))
    assert snapshot_files(d) != before
    lg = PartitionLog.open(d, S, T0)
    try:
        assert lg.log_end_offset == end
        assert lg.segment_bases() == bases
    finally:
        lg.close()
    after = snapshot_files(d)
    for name, content in before.items():
        if name.endswith(".log"):
            assert after[name] == content, f"{name} changed"       # the log is not touched
        elif not name.startswith(f"{bases[-1]:020d}"):
            assert after[name] == content, f"{name} was not rebuilt as it was sealed"
    r = LogReader(d)
    try:
        off, n = 0, 0
        while off < end:
            rr = r.read(off, 1 << 20, high_watermark=end, log_start_offset=0, min_one_batch=True)
            off, n = rr.next_offset, n + 1
        assert off == end
        assert r.offset_for_timestamp(T0 + 50, end) == (50, T0 + 50)
    finally:
        r.close()


def test_an_index_that_matches_its_log_is_not_rewritten(tmp_path):
    d = str(tmp_path / "p")
    make(d)
    bases = list_segment_bases(d)
    inodes = {b: os.stat(index_path(d, b)).st_ino for b in bases[:-1]}
    PartitionLog.open(d, S, T0).close()
    assert {b: os.stat(index_path(d, b)).st_ino for b in bases[:-1]} == inodes


def test_check_all_finds_an_entry_out_of_order_that_the_sanity_check_passes(tmp_path):
    from appliance.log.index import CorruptIndex, OffsetIndex
    d = str(tmp_path / "p")
    make(d)
    b = list_segment_bases(d)[1]
    path = index_path(d, b)
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack(">I", 3000))           # first entry's position past the second's
    ix = OffsetIndex(path, b)
    try:
        ix.sanity_check(os.path.getsize(log_path(d, b)))      # Kafka's check looks at the end only
        with pytest.raises(CorruptIndex):
            ix.check_all(os.path.getsize(log_path(d, b)), 1 << 40)
    finally:
        ix.close()


def aborts(d: str, segments: int):
    """One aborted transaction (data + ABORT marker) in each of ``segments`` segments."""
    from appliance.log.txn_index import AbortedTxn
    lg = PartitionLog.open(d, S, T0)
    entries = []
    for pid in range(1, segments + 1):
        b = bytearray(build_batch([Record(b"k", b"v" * 50)], producer_id=pid, producer_epoch=0,
                                  base_sequence=0, transactional=True, base_timestamp=T0))
        first = lg.append(b, T0).base_offset
        m = lg.append_control(pid, 0, False, 0, T0)
        e = AbortedTxn(pid, first, m.base_offset, m.base_offset + 1)
        lg.append_aborted(e)
        entries.append(e)
        while pid < segments and len(lg.segment_bases()) == pid:
            lg.append(bytearray(build_batch([Record(b"k", b"x" * 300)], base_timestamp=T0)), T0)
    return lg, entries


@pytest.mark.parametrize("field,at", [("producer id", 2 + 7), ("first offset", 10 + 7),
                                      ("marker offset", 18 + 7), ("last stable offset", 26 + 6)])
def test_an_aborted_index_entry_that_names_no_abort_of_its_producer_is_rebuilt(tmp_path, field, at):
    """A flipped producer id passes the sanity check (order and range) but would hand a
    read_committed consumer the aborted records as committed."""
    from appliance.log.files import txnindex_path
    from appliance.log.txn_index import read_entries
    d = str(tmp_path / "p")
    lg, entries = aborts(d, 3)
    bases = lg.segment_bases()
    lg.close()
    path = txnindex_path(d, bases[1])
    flip(path, at, 0x01)
    damaged = read_entries(path)
    assert damaged != [entries[1]]
    lg = PartitionLog.open(d, S, T0)
    try:
        assert lg.txn_index_rebuild_from == bases[1]     # the caller replays from there
        assert all(e not in lg.aborted_entries() for e in damaged)
    finally:
        lg.close(clean=False)
