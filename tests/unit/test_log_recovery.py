"""Recovery after a crash at any instant: torn appends, garbage, corruption, interrupted rolls and
retention deletes, clean-shutdown marker, damaged indexes."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from appliance.log import log_loader as LL
from appliance.log.files import (CLEAN_SHUTDOWN_FILE, LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE,
                                 index_path, log_path, timeindex_path)
from appliance.durable import write_checkpoint
from appliance.log.index import OffsetIndex, TimeIndex
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.reader import LogReader
from appliance.log.segment import build_index_entries
from crc32c import crc32c

from appliance.protocol.records import (ATTRIBUTES_OFFSET, COMPRESSION_ZSTD, CRC_OFFSET, HEADER_SIZE,
                                        Record, build_batch, iter_batch_headers, read_header,
                                        scan_valid)

T0 = 1_700_000_000_000
SEG = 2048
S = LogSettings(segment_bytes=SEG, index_interval_bytes=100, segment_index_bytes=1200,
                retention_ms=-1, retention_bytes=-1)


def batch(i: int) -> bytearray:
    return bytearray(build_batch([Record(b"k%d" % i, b"v" * (20 + i % 17), [("h", b"%d" % i)], T0 + i)
                                  for _ in range(1 + i % 3)], base_timestamp=T0 + i))


def make_log(d: str, n: int) -> list[bytes]:
    log = PartitionLog.open(d, S, T0)
    out = []
    for i in range(n):
        b = batch(i)
        log.append(b, T0)
        out.append(bytes(b))
    log.close(clean=False)           # as a kill -9 would leave it
    return out


def read_all(d: str, hw: int, lso: int = 0) -> bytes:
    r = LogReader(d)
    out = bytearray()
    off = lso
    while off < hw:
        res = r.read(off, 1 << 30, high_watermark=hw, log_start_offset=lso, min_one_batch=True)
        for s in res.slices:
            with open(log_path(d, s.segment_base), "rb") as f:
                f.seek(s.position)
                out += f.read(s.length)
        off = list(iter_batch_headers(out))[-1][1].last_offset + 1
    r.close()
    return bytes(out)


def check_indexes_consistent(d: str, base: int) -> None:
    """The index files describe exactly what Kafka's rule gives for the surviving batches."""
    data = Path(log_path(d, base)).read_bytes()
    valid, end = scan_valid(data)
    want = build_index_entries(valid, S.index_interval_bytes)
    with OffsetIndex(index_path(d, base), base) as ox, TimeIndex(timeindex_path(d, base), base) as tx:
        got = [ox.entry(i) for i in range(ox.entries)]
        assert got == want.offsets
        assert all(p < end for _, p in got)
        times = [tx.entry(i) for i in range(tx.entries)]
        assert times[:len(want.times)] == want.times
        assert all(o < (valid[-1][1].last_offset + 1 if valid else base) for _, o in times)


def leo_of(batches: list[bytes]) -> int:
    return list(iter_batch_headers(b"".join(batches)))[-1][1].last_offset + 1 if batches else 0


def test_torn_last_batch_at_every_byte(tmp_path):
    pristine = str(tmp_path / "pristine")
    sent = make_log(pristine, 12)
    bases = sorted(int(n[:20]) for n in os.listdir(pristine) if n.endswith(".log"))
    active = bases[-1]
    data = Path(log_path(pristine, active)).read_bytes()
    valid, end = scan_valid(data)
    last_pos = valid[-1][0]
    assert len(valid) >= 2
    expect = b"".join(sent)
    expect_prefix = expect[:len(expect) - (end - last_pos)]
    want_leo = valid[-1][1].base_offset
    for cut in range(last_pos, end):
        for mode in ("zeros", "short"):
            d = str(tmp_path / f"c{cut}{mode}")
            shutil.copytree(pristine, d)
            with open(log_path(d, active), "r+b") as f:
                if mode == "zeros":          # torn memcpy into the preallocated file
                    f.seek(cut)
                    f.write(bytes(end - cut))
                else:                        # file cut short
                    f.truncate(cut)
            log = PartitionLog.open(d, S, T0)
            assert log.log_end_offset == want_leo, (cut, mode)
            assert log.active_end_position == last_pos
            assert log.segment_bases() == bases
            log.append(batch(99), T0)        # appends continue right after the intact prefix
            leo = log.log_end_offset
            log.close()
            got = read_all(d, leo)
            assert got[:len(expect_prefix)] == expect_prefix
            check_indexes_consistent(d, active)
            shutil.rmtree(d)


@pytest.mark.parametrize("tail", [b"\xff" * 300, bytes(range(256)), b"\x00\x00\x00\x00\x00\x00\x00\x07" + b"\x00\x00\x00\x40" + b"\x01" * 70])
def test_garbage_after_last_batch_is_cut(tmp_path, tail):
    d = str(tmp_path)
    sent = make_log(d, 5)
    data = Path(log_path(d, 0)).read_bytes()
    end = scan_valid(data)[1]
    with open(log_path(d, 0), "r+b") as f:
        f.seek(end)
        f.write(tail)
    log = PartitionLog.open(d, S, T0)
    assert log.log_end_offset == leo_of(sent) and log.active_end_position == end
    log.close()
    assert read_all(d, leo_of(sent)) == b"".join(sent)
    check_indexes_consistent(d, 0)


def test_corrupt_crc_in_the_middle_of_active_segment_keeps_prefix(tmp_path):
    d = str(tmp_path)
    sent = make_log(d, 6)
    data = Path(log_path(d, 0)).read_bytes()
    valid, _ = scan_valid(data)
    pos3 = valid[3][0]
    with open(log_path(d, 0), "r+b") as f:
        f.seek(pos3 + 70)
        f.write(b"\xEE")
    log = PartitionLog.open(d, S, T0)
    assert log.log_end_offset == valid[3][1].base_offset
    log.close()
    assert read_all(d, valid[3][1].base_offset) == b"".join(sent[:3])
    check_indexes_consistent(d, 0)


def _poison(data: bytearray, pos: int, how: str) -> None:
    """Make the batch at ``pos`` unreadable by a consumer while its CRC still holds."""
    h = read_header(data, pos)
    end = pos + h.size
    if how == "record length":                 # the first record's length varint
        data[pos + HEADER_SIZE] = 0x7E
    elif how == "garbage claimed as zstd":
        data[pos + 22] |= COMPRESSION_ZSTD
    struct.pack_into(">I", data, pos + CRC_OFFSET, crc32c(bytes(data[pos + ATTRIBUTES_OFFSET:end])))


@pytest.mark.parametrize("how", ["record length", "garbage claimed as zstd"])
def test_recovery_truncates_at_a_crc_valid_batch_whose_records_are_unreadable(tmp_path, how):
    d = str(tmp_path)
    sent = make_log(d, 6)
    data = bytearray(Path(log_path(d, 0)).read_bytes())
    valid, _ = scan_valid(data)
    pos3 = valid[3][0]
    _poison(data, pos3, how)
    with open(log_path(d, 0), "r+b") as f:
        f.write(data)
    assert len(scan_valid(data)[0]) == len(valid)      # the CRC alone does not see it
    log = PartitionLog.open(d, S, T0)
    assert log.log_end_offset == valid[3][1].base_offset
    log.append(batch(99), T0)
    leo = log.log_end_offset
    log.close()
    assert read_all(d, leo)[:sum(map(len, sent[:3]))] == b"".join(sent[:3])
    check_indexes_consistent(d, 0)


def test_corrupt_earlier_unflushed_segment_drops_later_segments(tmp_path):
    d = str(tmp_path)
    sent = make_log(d, 60)
    bases = sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log"))
    assert len(bases) >= 4
    victim = bases[1]
    data = Path(log_path(d, victim)).read_bytes()
    valid, _ = scan_valid(data)
    with open(log_path(d, victim), "r+b") as f:   # flip a byte inside its 2nd batch
        f.seek(valid[1][0] + 65)
        f.write(bytes([data[valid[1][0] + 65] ^ 1]))
    os.unlink(os.path.join(d, RECOVERY_POINT_FILE))   # nothing known durable: scan everything
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == bases[:2]
    assert log.log_end_offset == valid[1][1].base_offset
    for b in bases[2:]:
        assert not os.path.exists(log_path(d, b))
    leo = log.log_end_offset
    log.close()
    got = read_all(d, leo)
    assert got == b"".join(sent)[:len(got)] and 0 < len(got) < len(b"".join(sent))


def test_recovery_point_limits_the_scan(tmp_path, monkeypatch):
    d = str(tmp_path)
    make_log(d, 40)
    bases = sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log"))
    scanned = []
    real = LL.recover_segment

    def spy(directory, base, **kw):
        scanned.append(base)
        return real(directory, base, **kw)

    monkeypatch.setattr(LL, "recover_segment", spy)
    PartitionLog.open(d, S, T0).close(clean=False)
    assert scanned == [bases[-1]]                     # only the active segment is scanned


def test_clean_shutdown_skips_the_scan(tmp_path, monkeypatch):
    d = str(tmp_path)
    log = PartitionLog.open(d, S, T0)
    for i in range(30):
        log.append(batch(i), T0)
    leo, bases = log.log_end_offset, log.segment_bases()
    log.close()
    assert os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE))
    monkeypatch.setattr(LL, "recover_segment", lambda *a, **k: pytest.fail("scanned"))
    log = PartitionLog.open(d, S, T0)
    assert (log.log_end_offset, log.segment_bases()) == (leo, bases)
    log.close()


def test_a_deferred_clean_close_leaves_markers_only_after_every_fsync(tmp_path, monkeypatch):
    """A writer host's stop (DeferredSync): the partitions seal without syncing, the markers
    appear only in ``run``, after every file the seals changed was fsynced (issue 32: nine
    fsyncs a partition, one after the other, overran the shutdown timeout at 10,000
    partitions); the next open is clean (no scan) with every batch."""
    from appliance import durable
    dirs = [str(tmp_path / f"p{i}") for i in range(3)]
    logs = [PartitionLog.open(d, S, T0) for d in dirs]
    for log in logs:
        for i in range(30):
            log.append(batch(i), T0)
    ends = [(log.log_end_offset, log.segment_bases()) for log in logs]
    synced = []
    real = durable._fsync_path
    monkeypatch.setattr(durable, "_fsync_path", lambda p: (synced.append(p), real(p)))
    deferred = durable.DeferredSync(CLEAN_SHUTDOWN_FILE)
    for log in logs:
        log.close(deferred=deferred)
    assert not any(os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE)) for d in dirs)
    deferred.run()
    assert all(os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE)) for d in dirs)
    for d, (leo, bases) in zip(dirs, ends):
        active = bases[-1]
        assert {log_path(d, active), index_path(d, active), timeindex_path(d, active)} <= set(synced)
    monkeypatch.setattr(LL, "recover_segment", lambda *a, **k: pytest.fail("scanned"))
    for d, end in zip(dirs, ends):
        log = PartitionLog.open(d, S, T0)
        assert (log.log_end_offset, log.segment_bases()) == end
        log.close()


def test_a_failed_deferred_fsync_leaves_no_marker(tmp_path, monkeypatch):
    """An fsync that fails in ``run`` (EIO) leaves no partition marked clean: each next open
    recovers its active segment, as after a crash."""
    import errno
    from appliance import durable
    dirs = [str(tmp_path / f"p{i}") for i in range(2)]
    logs = [PartitionLog.open(d, S, T0) for d in dirs]
    for log in logs:
        log.append(batch(0), T0)
    deferred = durable.DeferredSync(CLEAN_SHUTDOWN_FILE)
    for log in logs:
        log.close(deferred=deferred)

    def eio(path):
        raise OSError(errno.EIO, "I/O error", path)
    monkeypatch.setattr(durable, "_fsync_path", eio)
    with pytest.raises(OSError):
        deferred.run()
    assert not any(os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE)) for d in dirs)


def test_clean_marker_with_damaged_index_still_recovers(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, S, T0)
    for i in range(30):
        log.append(batch(i), T0)
    leo, bases = log.log_end_offset, log.segment_bases()
    log.close()
    with open(index_path(d, bases[1]), "r+b") as f:      # last entry points past the log
        f.seek(-8, os.SEEK_END)
        f.write(struct.pack(">II", 20, 10**6))
    os.unlink(timeindex_path(d, bases[2]))                # and a lost time index
    log = PartitionLog.open(d, S, T0)
    assert (log.log_end_offset, log.segment_bases()) == (leo, bases)
    log.close()
    for b in bases:
        check_indexes_consistent(d, b)


def test_marker_but_sealed_log_cut_short_is_recovered(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, S, T0)
    for i in range(30):
        log.append(batch(i), T0)
    leo = log.log_end_offset
    bases = log.segment_bases()
    log.close()
    size = os.path.getsize(log_path(d, bases[-1]))
    with open(log_path(d, bases[-1]), "r+b") as f:
        f.truncate(size - 5)
    log = PartitionLog.open(d, S, T0)
    assert log.log_end_offset < leo and log.segment_bases() == bases
    log.close()


def test_crash_during_roll_orphan_indexes_without_log(tmp_path):
    d = str(tmp_path)
    sent = make_log(d, 5)
    leo = leo_of(sent)
    for p in (index_path(d, leo), timeindex_path(d, leo)):
        open(p, "wb").close()
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == [0] and log.log_end_offset == leo
    assert not os.path.exists(index_path(d, leo))
    log.close()


def test_crash_during_roll_new_empty_segment_after_unsealed_one(tmp_path):
    d = str(tmp_path)
    sent = make_log(d, 5)                # segment 0 still preallocated, indexes untrimmed
    leo = leo_of(sent)
    with open(log_path(d, leo), "wb") as f:
        f.truncate(SEG)                  # the new, still empty, preallocated segment
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == [0, leo] and log.log_end_offset == leo
    assert os.path.getsize(log_path(d, 0)) == scan_valid(Path(log_path(d, 0)).read_bytes())[1]
    log.append(batch(7), T0)
    log.close()
    assert read_all(d, leo + 2)[:len(b"".join(sent))] == b"".join(sent)
    check_indexes_consistent(d, 0)


def test_crash_during_retention_delete(tmp_path):
    d = str(tmp_path)
    make_log(d, 40)
    bases = sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log"))
    # the new log start was persisted; segment 0 fully gone, segment 1 half deleted
    write_checkpoint(os.path.join(d, LOG_START_OFFSET_FILE), bases[2])
    for p in (index_path(d, bases[0]), timeindex_path(d, bases[0]), log_path(d, bases[0]),
              index_path(d, bases[1])):
        os.unlink(p)
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == bases[2:] and log.log_start_offset == bases[2]
    assert not os.path.exists(log_path(d, bases[1])) and not os.path.exists(timeindex_path(d, bases[1]))
    log.close()


def test_log_end_below_log_start_starts_over(tmp_path):
    d = str(tmp_path)
    sent = make_log(d, 5)
    write_checkpoint(os.path.join(d, LOG_START_OFFSET_FILE), 1000)
    log = PartitionLog.open(d, S, T0)
    assert (log.log_start_offset, log.log_end_offset, log.segment_bases()) == (1000, 1000, [1000])
    assert log.append(batch(1), T0).base_offset == 1000
    log.close()
    assert sent


def test_empty_directory_and_zero_filled_active_segment(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, S, T0)
    log.close(clean=False)
    log = PartitionLog.open(d, S, T0)
    assert (log.log_end_offset, log.segment_bases()) == (0, [0])
    log.close(clean=False)
    with open(log_path(d, 0), "r+b") as f:
        f.write(bytes(200))
    log = PartitionLog.open(d, S, T0)
    assert log.log_end_offset == 0
    log.close()


def test_torn_index_entries_are_rebuilt(tmp_path):
    d = str(tmp_path)
    make_log(d, 12)
    # garbage in the preallocated part of the active segment's offset index
    with open(index_path(d, 0), "r+b") as f:
        f.seek(8 * 3)
        f.write(struct.pack(">II", 500, 999999) * 4)
    log = PartitionLog.open(d, S, T0)
    leo = log.log_end_offset
    log.close()
    check_indexes_consistent(d, 0)
    assert read_all(d, leo)


def test_repeated_crashes_with_appends_in_between(tmp_path):
    d = str(tmp_path)
    sent = []
    for round_ in range(6):
        log = PartitionLog.open(d, S, T0)
        assert log.log_end_offset == (leo_of(sent) if sent else 0)
        for i in range(7):
            b = batch(round_ * 7 + i)
            log.append(b, T0)
            sent.append(bytes(b))
        log.close(clean=round_ % 2 == 0)
    assert read_all(d, leo_of(sent)) == b"".join(sent)


# -- aborted-transaction index --------------------------------------------------------------------

from appliance.log.files import txnindex_path  # noqa: E402
from appliance.durable import read_checkpoint  # noqa: E402
from appliance.log.txn_index import AbortedTxn, encode_entry, read_entries   # noqa: E402


def abort_in_each_segment(d: str, segments: int) -> tuple[PartitionLog, list[AbortedTxn]]:
    """A log of ``segments`` segments, each holding one aborted transaction (data + marker)."""
    log = PartitionLog.open(d, S, T0)
    entries = []
    for pid in range(1, segments + 1):
        b = bytearray(build_batch([Record(b"k", b"v" * 50)], producer_id=pid, producer_epoch=0,
                                  base_sequence=0, transactional=True, base_timestamp=T0))
        first = log.append(b, T0).base_offset
        m = log.append_control(pid, 0, False, 0, T0)
        e = AbortedTxn(pid, first, m.base_offset, m.base_offset + 1)
        log.append_aborted(e)
        entries.append(e)
        i = 0
        while pid < segments and len(log.segment_bases()) == pid:
            log.append(batch(i), T0)
            i += 1
    assert len(log.segment_bases()) == segments
    return log, entries


def test_clean_reopen_keeps_every_txnindex(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 3)
    log.close()
    log = PartitionLog.open(d, S, T0)
    assert log.txn_index_rebuild_from == log.log_end_offset
    assert log.aborted_entries() == entries
    log.close()


def test_unclean_reopen_rebuilds_the_scanned_segments_only(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 3)
    active = log.active_segment_base
    log.close(clean=False)
    log = PartitionLog.open(d, S, T0)
    assert log.txn_index_rebuild_from == active
    assert not os.path.exists(txnindex_path(d, active))
    kept = [e for e in entries if e.last_offset < active]
    assert kept and log.aborted_entries() == kept
    log.close(clean=False)


def test_damaged_txnindex_of_a_sealed_segment_sends_it_to_recovery(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 4)
    bases = log.segment_bases()
    log.close()
    with open(txnindex_path(d, bases[1]), "ab") as f:
        f.write(b"\x00\x00\x01")                        # a torn entry
    log = PartitionLog.open(d, S, T0)
    # that segment and every later one lost their files; earlier ones kept theirs
    assert log.txn_index_rebuild_from == bases[1]
    assert log.aborted_entries() == [e for e in entries if e.last_offset < bases[1]]
    # the recovery point stays at the rebuilt segment until the rebuild is durable
    assert read_checkpoint(os.path.join(d, RECOVERY_POINT_FILE)) == bases[1]
    for e in entries:
        if e.last_offset >= bases[1]:
            log.append_aborted(e)
    with pytest.raises(ValueError):
        log.append_aborted(entries[0])                  # below the rebuild point: refused
    log.finish_txn_index_rebuild()
    assert read_checkpoint(os.path.join(d, RECOVERY_POINT_FILE)) == log.active_segment_base
    assert log.aborted_entries() == entries
    assert [read_entries(txnindex_path(d, b)) for b in bases] == [[e] for e in entries]
    log.close()


def test_txnindex_entry_outside_its_segment_is_insane(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 2)
    bases = log.segment_bases()
    log.close()
    with open(txnindex_path(d, bases[0]), "ab") as f:
        f.write(encode_entry(AbortedTxn(9, bases[1], bases[1] + 5, bases[1] + 6)))
    log = PartitionLog.open(d, S, T0)
    assert log.txn_index_rebuild_from == bases[0]
    assert log.aborted_entries() == []
    log.close()


def test_lost_recovery_point_rebuilds_everything(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 3)
    log.close(clean=False)
    os.unlink(os.path.join(d, RECOVERY_POINT_FILE))
    log = PartitionLog.open(d, S, T0)
    assert log.txn_index_rebuild_from == log.segment_bases()[0]
    assert log.aborted_entries() == []
    log.close(clean=False)


def test_rebuilt_sealed_index_is_fsynced_by_a_clean_close(tmp_path):
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 3)
    log.close(clean=False)
    os.unlink(os.path.join(d, RECOVERY_POINT_FILE))
    log = PartitionLog.open(d, S, T0)
    for e in entries:
        log.append_aborted(e)
    log.close()                                  # no explicit finish: the close does it
    log = PartitionLog.open(d, S, T0)
    assert log.aborted_entries() == entries and log.txn_index_rebuild_from == log.log_end_offset
    log.close()


# -- what an open makes durable (issue 32: ten thousand partitions' creation and restart) -----------

def _count_fsyncs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counting(fd):
        calls.append(fd)
        real(fd)
    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_a_new_partitions_first_open_fsyncs_nothing(tmp_path, monkeypatch):
    """A new partition's first open wrote five fsyncs (two checkpoints, the directory twice),
    most of the time of a CreateTopics of ten thousand partitions: what it writes, lost in a
    crash, the next open writes again the same (a missing checkpoint reads as 0)."""
    d = str(tmp_path / "p")
    os.makedirs(d)
    calls = _count_fsyncs(monkeypatch)
    log = PartitionLog.open(d, S, T0)
    assert calls == []
    log.close(clean=False)
    for name in (LOG_START_OFFSET_FILE, RECOVERY_POINT_FILE):
        os.unlink(os.path.join(d, name))          # as a crash might leave them: lost
    log = PartitionLog.open(d, S, T0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    log.close(clean=True)


def test_recovering_only_the_active_segment_fsyncs_nothing_a_sealed_one_everything(tmp_path, monkeypatch):
    """The active segment lies above the recovery point: recovered again after any unclean stop,
    so its truncation and rebuilt indexes need no fsync (what the flush policy promised is on
    disk); a sealed segment recovered moves the recovery point past it, so its files and the
    directory are fsynced."""
    d = str(tmp_path / "p")
    os.makedirs(d)
    log = PartitionLog.open(d, S, T0)
    for i in range(3):
        log.append(batch(i), T0)
    log.close(clean=False)
    calls = _count_fsyncs(monkeypatch)
    log = PartitionLog.open(d, S, T0)
    assert calls == [] and log.log_end_offset > 0
    log.close(clean=False)
    monkeypatch.undo()
    log = PartitionLog.open(d, S, T0)
    while len(log.segment_bases()) < 3:
        log.append(batch(7), T0)
    log.close(clean=False)
    write_checkpoint(os.path.join(d, RECOVERY_POINT_FILE), 0)     # everything to recover again
    calls = _count_fsyncs(monkeypatch)
    log = PartitionLog.open(d, S, T0)
    assert len(calls) >= 2 * (len(log.segment_bases()) - 1)       # the sealed ones' log, indexes
    log.close(clean=True)


def test_regression_a_torn_length_in_a_sealed_segment_keeps_the_later_segments(tmp_path):
    """Bit rot in a batch's length field of a sealed segment (issue 34) fails the segment's
    load; its recovery used to delete every later segment as if it were an unflushed tail (all
    acknowledged, intact). Only the damaged segment is cut now; the others serve as before."""
    d = str(tmp_path)
    log = PartitionLog.open(d, S, T0)
    for i in range(60):
        log.append(batch(i), T0)
    leo, bases = log.log_end_offset, log.segment_bases()
    log.close()
    assert len(bases) >= 4
    victim = bases[1]
    data = Path(log_path(d, victim)).read_bytes()
    valid, _ = scan_valid(data)
    with open(log_path(d, victim), "r+b") as f:       # the last batch's length (the load's
        f.seek(valid[-1][0] + 8)                        # header walk reads it): frames nothing
        f.write(struct.pack(">i", 1 << 24))
    later = {b: Path(log_path(d, b)).read_bytes() for b in bases[2:]}
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == bases and log.log_end_offset == leo
    log.close()
    assert {b: Path(log_path(d, b)).read_bytes() for b in bases[2:]} == later
    assert os.path.getsize(log_path(d, victim)) == valid[-1][0]    # only the damage cut


def test_regression_a_flipped_abort_marker_in_a_sealed_segment_keeps_the_segment_and_its_abort(tmp_path):
    """Found by the chaos suite's bit flip (issue 34): a bit of a sealed segment's ABORT marker
    changed while the appliance was down failed the open's check of the .txnindex against its
    markers, which sent the segment to recovery: cut after the batch before the marker, every
    later acknowledged batch of the segment went, and the aborted transaction's records, whose
    marker and index entry were gone, were served to read_committed consumers as committed (G1a).
    A marker that fails its CRC says nothing about the index: the entry is kept, the segment
    loads, and the fetch path refuses the damaged batch."""
    d = str(tmp_path)
    log, entries = abort_in_each_segment(d, 3)
    leo, bases = log.log_end_offset, log.segment_bases()
    log.close(clean=False)                              # a kill -9
    path = log_path(d, bases[0])
    data = Path(path).read_bytes()
    pos = next(p for p, h in iter_batch_headers(data) if h.base_offset == entries[0].last_offset)
    assert pos + 200 < len(data)                        # later batches in the segment
    with open(path, "r+b") as f:                        # the control record's type: ABORT -> COMMIT
        f.seek(pos + HEADER_SIZE + 4)
        f.write(bytes([data[pos + HEADER_SIZE + 4] ^ 0x01]))
    log = PartitionLog.open(d, S, T0)
    assert log.segment_bases() == bases and log.log_end_offset == leo
    assert os.path.getsize(path) == len(data)
    # (the active segment's entry comes back from the producer-state replay, as after any kill)
    assert log.aborted_entries() == [e for e in entries if e.last_offset < bases[-1]]
    assert log.aborted_entries()[0] == entries[0]
    log.close()
