"""ProducerStateManager: the sequence rules table, wrap-around, epoch bumps, snapshots, replay."""

import os

import pytest

from appliance.errors import ErrorCode, KafkaError
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import (NUM_BATCHES_TO_RETAIN, SEQ_MOD, ProducerStateManager,
                                          last_sequence, list_snapshots, snapshot_path)
from appliance.protocol.records import Record, build_batch, read_header

MAX = SEQ_MOD - 1


def hdr(pid=7, epoch=0, seq=0, n=1):
    return read_header(build_batch([Record(key=None, value=b"x")] * n, producer_id=pid,
                                   producer_epoch=epoch, base_sequence=seq))


def code(psm, h):
    try:
        dup = psm.check(h)
    except KafkaError as e:
        return e.code
    return "dup" if dup is not None else "append"


class Log:
    """Feeds batches through check/update like the writer does, assigning offsets."""

    def __init__(self, psm):
        self.psm, self.next = psm, 0

    def append(self, h):
        dup = self.psm.check(h)
        if dup is not None:
            return dup.first_offset
        base = self.next
        self.psm.update(h, base, 1000)
        self.next += h.last_offset_delta + 1
        return base


@pytest.fixture
def psm(tmp_path):
    return ProducerStateManager(str(tmp_path), expiration_ms=60_000)


def test_new_producer_must_start_at_zero(psm):
    assert code(psm, hdr(seq=0)) == "append"
    assert code(psm, hdr(seq=5)) == ErrorCode.unknown_producer_id


def test_in_sequence_appends_and_gap_is_out_of_order(psm):
    log = Log(psm)
    log.append(hdr(seq=0, n=3))                    # seqs 0..2
    assert code(psm, hdr(seq=3)) == "append"
    assert code(psm, hdr(seq=4)) == ErrorCode.out_of_order_sequence_number
    assert code(psm, hdr(seq=2, n=2)) == ErrorCode.out_of_order_sequence_number   # overlaps


def test_duplicate_of_any_of_the_last_five_returns_original_offsets(psm):
    log = Log(psm)
    offsets = [log.append(hdr(seq=i * 2, n=2)) for i in range(NUM_BATCHES_TO_RETAIN)]
    for i, off in enumerate(offsets):
        assert log.append(hdr(seq=i * 2, n=2)) == off          # nothing appended
    assert log.next == 2 * NUM_BATCHES_TO_RETAIN


def test_retry_older_than_the_window_is_duplicate_sequence(psm):
    log = Log(psm)
    for i in range(NUM_BATCHES_TO_RETAIN + 2):
        log.append(hdr(seq=i))
    assert code(psm, hdr(seq=0)) == ErrorCode.duplicate_sequence_number


def test_old_epoch_is_fenced_and_new_epoch_restarts_at_zero(psm):
    log = Log(psm)
    log.append(hdr(epoch=3, seq=0))
    assert code(psm, hdr(epoch=2, seq=1)) == ErrorCode.invalid_producer_epoch
    assert code(psm, hdr(epoch=4, seq=1)) == ErrorCode.out_of_order_sequence_number
    assert code(psm, hdr(epoch=4, seq=0)) == "append"
    log.append(hdr(epoch=4, seq=0))
    assert code(psm, hdr(epoch=3, seq=1)) == ErrorCode.invalid_producer_epoch
    # a duplicate must match the epoch too
    assert code(psm, hdr(epoch=4, seq=0)) == "dup"


def test_sequence_wraps_at_int32_max(psm):
    assert last_sequence(MAX - 1, 3) == 1
    log = Log(psm)
    log.append(hdr(seq=0))
    psm.entries[7].batches.clear()
    psm.update(hdr(seq=MAX - 2, n=3), 10, 1)       # seqs MAX-2 .. MAX
    assert code(psm, hdr(seq=0, n=2)) == "append"  # next after MAX is 0
    psm.update(hdr(seq=0, n=2), 13, 1)
    assert code(psm, hdr(seq=2)) == "append"
    assert code(psm, hdr(seq=MAX - 2, n=3)) == "dup"
    # a batch spanning the wrap
    psm.entries[7].batches.clear()
    psm.update(hdr(seq=MAX - 5, n=1), 20, 1)
    assert code(psm, hdr(seq=MAX - 4, n=10)) == "append"


def test_producers_are_independent(psm):
    log = Log(psm)
    log.append(hdr(pid=1, seq=0))
    log.append(hdr(pid=2, seq=0))
    assert code(psm, hdr(pid=1, seq=1)) == "append"
    assert code(psm, hdr(pid=2, seq=2)) == ErrorCode.out_of_order_sequence_number


def test_expiration_keeps_open_transactions(psm):
    psm.update(hdr(pid=1), 0, 0)
    psm.update(hdr(pid=2), 1, 0)
    psm.entries[2].txn_first_offset = 1
    assert psm.expire(59_999) == 0
    assert psm.expire(60_000) == 1
    assert set(psm.entries) == {2}


def test_snapshot_round_trip_and_keep_two(psm, tmp_path):
    log = Log(psm)
    for i in range(7):
        log.append(hdr(pid=1, seq=i))
    log.append(hdr(pid=2, epoch=5, seq=0, n=4))
    for off in (3, 8, 11):
        psm.take_snapshot(off)
    assert list_snapshots(str(tmp_path)) == [8, 11]
    with open(snapshot_path(str(tmp_path), 11), "rb") as f:
        off, entries = ProducerStateManager.decode(f.read())
    assert off == 11
    assert {p: (e.epoch, list(e.batches)) for p, e in entries.items()} == \
           {p: (e.epoch, list(e.batches)) for p, e in psm.entries.items()}


def test_corrupt_snapshot_falls_back_to_the_older_one(psm, tmp_path):
    psm.update(hdr(pid=1), 0, 0)
    psm.take_snapshot(1)
    psm.update(hdr(pid=1, seq=1), 1, 0)
    psm.take_snapshot(2)
    with open(snapshot_path(str(tmp_path), 2), "r+b") as f:
        f.seek(30)
        f.write(b"\xff\xff")
    fresh = ProducerStateManager(str(tmp_path), 60_000)
    start = fresh.load(5, lambda off: iter(()), 0)
    assert start == 1 and fresh.entries[1].last_seq == 0
    assert list_snapshots(str(tmp_path)) == [1]


def test_snapshot_beyond_log_end_is_dropped(psm, tmp_path):
    psm.update(hdr(pid=1), 0, 0)
    psm.take_snapshot(50)
    fresh = ProducerStateManager(str(tmp_path), 60_000)
    assert fresh.load(10, lambda off: iter(()), 0) == 0
    assert fresh.entries == {} and list_snapshots(str(tmp_path)) == []


def test_load_replays_the_log_after_the_snapshot(tmp_path):
    d = str(tmp_path / "p")
    settings = LogSettings(segment_bytes=4096)
    lg = PartitionLog.open(d, settings, 0)
    psm = ProducerStateManager(d, 60_000)
    lg.roll_listener = psm.take_snapshot
    for i in range(60):      # several rolls, so several snapshots were taken
        b = bytearray(build_batch([Record(key=None, value=b"v" * 200)], producer_id=9,
                                  producer_epoch=0, base_sequence=i))
        h = read_header(b)
        assert psm.check(h) is None
        info = lg.append(b, 0)
        psm.update(h, info.base_offset, 0)
    assert list_snapshots(d), "rolls must have written snapshots"
    lg.close(clean=False)            # as after kill -9: no shutdown snapshot
    lg2 = PartitionLog.open(d, settings, 0)
    fresh = ProducerStateManager(d, 60_000)
    start = fresh.load(lg2.log_end_offset, lg2.headers_from, 0)
    assert 0 < start < 60
    assert [b.first_seq for b in fresh.entries[9].batches] == list(range(55, 60))
    assert [b.first_offset for b in fresh.entries[9].batches] == list(range(55, 60))
    # a retry of the last pre-crash batch is recognised; the next sequence is accepted
    retry = read_header(build_batch([Record(key=None, value=b"v" * 200)], producer_id=9,
                                    producer_epoch=0, base_sequence=59))
    assert fresh.check(retry).first_offset == 59
    lg2.close()
