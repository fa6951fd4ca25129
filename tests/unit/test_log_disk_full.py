"""A full disk in the log layer: files get their blocks before they are written or mapped, and a
write the disk cannot take changes nothing (issue 17, point 1).

The disk is made full by replacing the allocation calls with ones that fail with ENOSPC, or
pwrite/write with short writes; the integration tests fill real file systems.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import appliance.durable as durable
import appliance.log.partition_log as plog
import appliance.log.segment as segment
from appliance.errors import ErrorCode, KafkaError
from appliance.log.files import LOG_START_OFFSET_FILE, log_path
from appliance.durable import atomic_write, grow_file, read_checkpoint
from appliance.log.index import INDEX_GROW_BYTES, OffsetIndex, TimeIndex
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.txn_index import AbortedTxn, TransactionIndex
from appliance.protocol.records import Record, build_batch, read_header, scan_valid
from shm.region import Region

T0 = 1_700_000_000_000


def settings(**kw) -> LogSettings:
    base = dict(segment_bytes=8192, index_interval_bytes=200, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)
    base.update(kw)
    return LogSettings(**base)


def batch(n: int = 2, size: int = 50, ts: int = T0) -> bytearray:
    return bytearray(build_batch([Record(b"k", b"v" * size, [], ts + i) for i in range(n)],
                                 base_timestamp=ts))


def enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def full_disk(monkeypatch):
    """Call it to make every allocation of the log layer fail with ENOSPC; undo() to end it."""
    def fill() -> None:
        monkeypatch.setattr(durable, "allocate", enospc)
    return fill


def _blocks(path: str) -> int:
    return os.stat(path).st_blocks * 512


# -- allocation -----------------------------------------------------------------------------------

def test_active_segment_and_indexes_have_their_blocks(tmp_path):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(segment_bytes=1 << 20, segment_index_bytes=1 << 20), T0)
    lg.append(batch(), T0)
    # No sparse file: the file is as long as the blocks it has (1 MiB .log step, 64 KiB index step).
    for path in (log_path(d, 0), os.path.join(d, "00000000000000000000.index"),
                 os.path.join(d, "00000000000000000000.timeindex")):
        assert _blocks(path) >= os.path.getsize(path) - 4096, path
    assert os.path.getsize(log_path(d, 0)) == 1 << 20
    assert os.path.getsize(os.path.join(d, "00000000000000000000.index")) == INDEX_GROW_BYTES
    lg.close()


def test_grow_file_falls_back_to_what_is_needed(tmp_path, monkeypatch):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        real = durable.allocate

        def small_disk(fd, size, offset=0):
            if offset + size > 10_000:
                raise OSError(errno.ENOSPC, "full")
            real(fd, size, offset)
        monkeypatch.setattr(durable, "allocate", small_disk)
        assert grow_file(fd, 0, 1 << 20, 4000) == 4000
        assert os.fstat(fd).st_size == 4000
        with pytest.raises(OSError) as e:
            grow_file(fd, 4000, 1 << 20, 20_000)
        assert e.value.errno == errno.ENOSPC and os.fstat(fd).st_size == 4000
    finally:
        os.close(fd)


def test_region_gets_its_blocks_and_a_full_tmpfs_is_enospc(tmp_path, monkeypatch):
    r = Region.create(str(tmp_path / "ring"), 1 << 20)
    assert _blocks(str(tmp_path / "ring")) >= 1 << 20
    r.close()
    monkeypatch.setattr(os, "posix_fallocate", enospc)
    with pytest.raises(OSError) as e:
        Region.create(str(tmp_path / "other"), 1 << 20)
    assert e.value.errno == errno.ENOSPC
    assert sorted(os.listdir(tmp_path)) == ["ring"]          # no temporary file left


# -- indexes --------------------------------------------------------------------------------------

def test_index_grows_in_steps_and_a_reader_follows(tmp_path):
    path = str(tmp_path / "00000000000000000000.index")
    w = OffsetIndex(path, 0, writable=True, max_bytes=8 * 100_000)
    step = INDEX_GROW_BYTES // 8
    r = OffsetIndex(path, 0)
    assert os.path.getsize(path) == INDEX_GROW_BYTES and r.entries == 0
    for i in range(1, step + 10):
        w.append(i, i * 10)
    # The writer grew the file before its last slot; the reader's map (one step) is all written
    # entries, so it looks at the file once and remaps.
    assert os.path.getsize(path) == 2 * INDEX_GROW_BYTES
    assert r.entries == step + 9 and r.lookup(step + 5) == (step + 5, (step + 5) * 10)
    w.write_trimmed()
    w.close()
    sealed = OffsetIndex(path, 0)
    assert sealed.entries == step + 9 and sealed.entries == step + 9   # final: no more looking
    for ix in (r, sealed):
        ix.close()


def test_index_on_a_full_disk_refuses_the_entry_it_has_no_block_for(tmp_path, full_disk):
    path = str(tmp_path / "00000000000000000000.timeindex")
    w = TimeIndex(path, 0, writable=True, max_bytes=12 * 100_000)
    step = INDEX_GROW_BYTES // 12
    for i in range(1, step):
        w.maybe_append(T0 + i, i)
    full_disk()
    with pytest.raises(OSError) as e:      # the last slot of the step: it needs one more after it
        w.maybe_append(T0 + step, step)
    assert e.value.errno == errno.ENOSPC
    assert w.entries == step - 1 and w.last_entry == (T0 + step - 1, step - 1)
    w.close()


# -- appends --------------------------------------------------------------------------------------

def test_append_on_a_full_disk_writes_nothing_and_resumes(tmp_path, full_disk, monkeypatch):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(segment_bytes=4 << 20), T0)
    for _ in range(3):
        lg.append(batch(), T0)
    size, end = lg.active_end_position, lg.log_end_offset
    full_disk()
    big = batch(n=1, size=1_500_000)                   # beyond the 1 MiB the segment has
    with pytest.raises(KafkaError) as e:
        lg.append(big, T0)
    assert e.value.code == ErrorCode.kafka_storage_error
    assert (lg.active_end_position, lg.log_end_offset) == (size, end)
    assert Path(log_path(d, 0)).read_bytes()[size:].count(0) == os.path.getsize(log_path(d, 0)) - size
    lg.append(batch(), T0)                              # a small one fits the blocks it has
    monkeypatch.undo()
    lg.append(big, T0)                                  # room again: the file grows
    assert lg.log_end_offset == end + 3
    lg.close(clean=False)
    again = PartitionLog.open(d, settings(segment_bytes=4 << 20), T0)
    assert again.log_end_offset == end + 3
    again.close()


def test_short_pwrite_is_zeroed_and_not_counted(tmp_path, monkeypatch):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(), T0)
    lg.append(batch(), T0)
    size, end = lg.active_end_position, lg.log_end_offset
    real = os.pwrite

    def short(fd, data, pos):
        monkeypatch.setattr(os, "pwrite", real)
        return real(fd, bytes(data)[:len(data) // 2], pos)
    monkeypatch.setattr(os, "pwrite", short)
    with pytest.raises(KafkaError) as e:
        lg.append(batch(), T0)
    assert e.value.code == ErrorCode.kafka_storage_error
    assert (lg.active_end_position, lg.log_end_offset) == (size, end)
    raw = Path(log_path(d, 0)).read_bytes()
    assert raw[size:].count(0) == len(raw) - size            # the half batch is gone
    lg.append(batch(), T0)
    lg.close(clean=False)
    again = PartitionLog.open(d, settings(), T0)
    assert again.log_end_offset == end + 2
    again.close()


def test_roll_without_room_keeps_the_old_segment_active(tmp_path, monkeypatch):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(segment_bytes=4096), T0)
    while lg.active_end_position < 3000:
        lg.append(batch(n=2, size=100), T0)
    end = lg.log_end_offset
    # The trimmed index copies are the first thing a roll writes: no room for them.
    monkeypatch.setattr(segment, "write_tmp_copies", enospc)
    with pytest.raises(KafkaError) as e:
        lg.append(batch(n=4, size=300), T0)
    assert e.value.code == ErrorCode.kafka_storage_error
    assert lg.segment_bases() == [0] and lg.log_end_offset == end
    lg.append(batch(n=1, size=10), T0)                 # what still fits goes on
    monkeypatch.undo()
    # The new segment cannot be made: the sealed one is reopened as the active segment.
    monkeypatch.setattr(segment.LogSegment, "create", classmethod(enospc))
    with pytest.raises(KafkaError):
        lg.append(batch(n=4, size=300), T0)
    assert lg.segment_bases() == [0]
    lg.append(batch(n=1, size=10), T0)
    monkeypatch.undo()
    lg.append(batch(n=4, size=300), T0)
    assert lg.segment_bases() == [0, end + 2] and lg.log_end_offset == end + 6
    lg.close()
    again = PartitionLog.open(d, settings(segment_bytes=4096), T0)
    assert again.log_end_offset == end + 6
    again.close()


def test_retention_deletes_on_a_full_disk(tmp_path, monkeypatch):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(segment_bytes=1024), T0)
    for _ in range(20):
        lg.append(batch(n=2, size=100), T0)
    assert len(lg.segment_bases()) > 3
    real = plog.write_checkpoint
    monkeypatch.setattr(plog, "write_checkpoint", enospc)
    lg.settings = settings(segment_bytes=1024, retention_bytes=1000)
    assert lg.enforce_retention(T0)
    bases = lg.segment_bases()
    assert lg.log_start_offset == bases[0] > 0
    assert [b for b in (int(n[:20]) for n in os.listdir(d) if n.endswith(".log"))
            if b < bases[0]] == []
    monkeypatch.setattr(plog, "write_checkpoint", real)
    lg.close(clean=False)
    # The stale log-start checkpoint errs on the safe side: open takes the first segment's base.
    assert read_checkpoint(os.path.join(d, LOG_START_OFFSET_FILE)) < bases[0]
    again = PartitionLog.open(d, settings(segment_bytes=1024), T0)
    assert again.log_start_offset == bases[0]
    again.close()


# -- markers --------------------------------------------------------------------------------------

def test_undo_control_takes_the_marker_back_for_good(tmp_path):
    d = str(tmp_path)
    lg = PartitionLog.open(d, settings(), T0)
    lg.append(batch(), T0)
    size, end = lg.active_end_position, lg.log_end_offset
    info = lg.append_control(7, 0, False, 1, T0)
    assert lg.log_end_offset == end + 1
    lg.undo_control(info)
    assert (lg.active_end_position, lg.log_end_offset) == (size, end)
    raw = Path(log_path(d, 0)).read_bytes()
    assert raw[size:].count(0) == len(raw) - size
    lg.close(clean=False)
    # A crash now: recovery does not find the marker.
    assert scan_valid(Path(log_path(d, 0)).read_bytes())[1] == size
    again = PartitionLog.open(d, settings(), T0)
    assert again.log_end_offset == end
    again.close()


def test_preview_completion_says_what_complete_txn_will(tmp_path):
    psm = ProducerStateManager(str(tmp_path), 60_000)
    for pid, first in ((1, 10), (2, 20)):
        psm.update(read_header(build_batch([Record(b"k", b"v", [], T0)], base_timestamp=T0,
                                           producer_id=pid, producer_epoch=0, base_sequence=0,
                                           transactional=True), 0), first, T0)
    first, lso = psm.preview_completion(1, 30, 31)
    done = psm.complete_txn(1, 0, 1, 30, True, T0)
    assert (first, lso) == (done.first_offset, psm.last_stable_offset(31)) == (10, 20)


def test_txn_index_append_that_fails_leaves_no_torn_entry(tmp_path, monkeypatch):
    path = str(tmp_path / "00000000000000000000.txnindex")
    ix = TransactionIndex(path, 0, writable=True)
    ix.append(AbortedTxn(1, 0, 5, 0))
    real = os.write

    def short(fd, data):
        monkeypatch.setattr(os, "write", real)
        return real(fd, bytes(data)[:10])
    monkeypatch.setattr(os, "write", short)
    with pytest.raises(OSError):
        ix.append(AbortedTxn(2, 6, 9, 6))
    assert os.path.getsize(path) == 34 and ix.last_offset == 5
    ix.append(AbortedTxn(2, 6, 9, 6))
    assert [t.producer_id for t in ix.entries()] == [1, 2]
    ix.close()


def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_no_copy(tmp_path, monkeypatch):
    path = str(tmp_path / "checkpoint")
    atomic_write(path, b"old")
    monkeypatch.setattr(os, "write", enospc)
    with pytest.raises(OSError):
        atomic_write(path, b"new")
    monkeypatch.undo()
    assert Path(path).read_bytes() == b"old" and os.listdir(tmp_path) == ["checkpoint"]
