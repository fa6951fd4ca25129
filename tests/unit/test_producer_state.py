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


def test_unknown_plain_producer_may_start_at_any_sequence_as_in_kafka(psm):
    # current Kafka accepts it (since KIP-360) (a producer whose state expired)
    assert code(psm, hdr(seq=0)) == "append"
    assert code(psm, hdr(pid=99, seq=5)) == "append"


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


def test_regression_a_clean_stop_rewrote_the_snapshot_of_an_idle_partition(psm, tmp_path):
    """A clean close snapshots with ``unless_present``: a partition with nothing appended since
    its last snapshot keeps that file (Kafka's takeSnapshot skips an offset it has); its two
    fsyncs per partition were a third of a 10,000-partition stop, which overran the shutdown
    timeout and was killed. A new offset is written as before."""
    psm.update(hdr(pid=1), 0, 0)
    psm.take_snapshot(1)
    path = snapshot_path(str(tmp_path), 1)
    before = os.stat(path).st_ino
    psm.take_snapshot(1, sync_dir=False, unless_present=True)
    assert os.stat(path).st_ino == before
    psm.update(hdr(pid=1, seq=1), 1, 0)
    psm.take_snapshot(2, sync_dir=False, unless_present=True)
    assert list_snapshots(str(tmp_path)) == [1, 2]
    fresh = ProducerStateManager(str(tmp_path), 60_000)
    assert fresh.load(2, lambda off: iter(()), 0) == 2 and fresh.entries[1].last_seq == 1


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


# -- transactions ----------------------------------------------------------------------------------

from appliance.log.producer_state import CompletedTxn                      # noqa: E402
from appliance.log.txn_index import AbortedTxn                            # noqa: E402
from appliance.protocol.records import CONTROL_ABORT, CONTROL_COMMIT      # noqa: E402


def thdr(pid=7, epoch=0, seq=0, n=1):
    return read_header(build_batch([Record(key=None, value=b"x")] * n, producer_id=pid,
                                   producer_epoch=epoch, base_sequence=seq, transactional=True))


def test_unknown_transactional_producer_with_nonzero_sequence_is_out_of_order(psm):
    # KIP-890: retriable OUT_OF_ORDER, not UNKNOWN_PRODUCER_ID
    assert code(psm, thdr(seq=3)) == ErrorCode.out_of_order_sequence_number
    assert code(psm, hdr(seq=3)) == "append"
    assert code(psm, thdr(seq=0)) == "append"


def test_transactional_batch_opens_a_transaction_at_its_base_offset(psm):
    assert psm.needs_verification(thdr(pid=1))
    assert not psm.needs_verification(hdr(pid=1))
    psm.update(thdr(pid=1, seq=0, n=3), 10, 1)
    assert psm.entries[1].txn_first_offset == 10
    assert not psm.needs_verification(thdr(pid=1, seq=3))
    psm.update(thdr(pid=1, seq=3), 13, 1)                 # a later batch keeps the first offset
    assert psm.entries[1].txn_first_offset == 10
    assert psm.first_unstable_offset() == 10
    assert psm.last_stable_offset(14) == 10
    assert psm.open_transactions() == {1: 10}


def test_plain_batch_inside_an_open_transaction_is_invalid_txn_state(psm):
    psm.update(thdr(pid=1, seq=0), 0, 1)
    assert code(psm, hdr(pid=1, seq=1)) == ErrorCode.invalid_txn_state
    assert code(psm, thdr(pid=1, seq=1)) == "append"


def test_lso_is_the_smallest_open_first_offset_and_hw_when_none(psm):
    assert psm.first_unstable_offset() == -1 and psm.last_stable_offset(5) == 5
    psm.update(hdr(pid=9, seq=0), 0, 1)                   # plain data never holds the LSO
    assert psm.last_stable_offset(1) == 1
    psm.update(thdr(pid=1), 1, 1)
    psm.update(thdr(pid=2), 2, 1)
    psm.update(thdr(pid=3), 3, 1)
    assert psm.last_stable_offset(4) == 1
    # P2 commits first: P1 still holds the LSO (KIP-98: offset order is kept)
    done = psm.complete_txn(2, 0, 0, 4, False, 1)
    assert done == CompletedTxn(2, 2, 4, False)
    assert psm.last_stable_offset(5) == 1
    psm.complete_txn(1, 0, 0, 5, True, 1)
    assert psm.last_stable_offset(6) == 3
    psm.complete_txn(3, 0, 0, 6, False, 1)
    assert psm.first_unstable_offset() == -1 and psm.last_stable_offset(7) == 7
    # Kafka's maybeIncrementFirstUnstableOffset: never below the log start offset
    psm.update(thdr(pid=4), 7, 1)
    assert psm.last_stable_offset(20, log_start_offset=12) == 12


def test_marker_without_open_transaction_reports_the_marker_as_first_offset(psm):
    assert psm.complete_txn(5, 2, 3, 40, True, 1) == CompletedTxn(5, 40, 40, True)
    e = psm.entries[5]
    assert (e.epoch, e.coordinator_epoch, e.txn_first_offset) == (2, 3, -1)


def test_heap_stays_bounded_under_a_long_open_transaction(psm):
    psm.update(thdr(pid=1), 0, 1)
    off = 1
    for i in range(2000):
        psm.update(thdr(pid=100 + i % 7, seq=0, epoch=i), off, 1)
        psm.complete_txn(100 + i % 7, i, 0, off + 1, bool(i % 2), 1)
        off += 2
    assert psm.first_unstable_offset() == 0
    assert len(psm._heap) <= 2 * len(psm._open) + 65


def test_marker_epoch_fencing(psm):
    # Kafka's appendEndTxnMarker: a marker whose epoch is below the producer's is refused
    psm.update(thdr(pid=1, epoch=5), 0, 1)
    with pytest.raises(KafkaError) as e:
        psm.check_marker(1, 4, 0)
    assert e.value.code == ErrorCode.invalid_producer_epoch
    psm.check_marker(1, 5, 0)
    psm.check_marker(1, 6, 0)                              # a bumped epoch is fine (TV2)


def test_marker_coordinator_epoch_fencing(psm):
    # Kafka's appendEndTxnMarker: a marker from an older coordinator is refused
    psm.update(thdr(pid=1), 0, 1)
    psm.complete_txn(1, 0, 7, 1, False, 1)
    with pytest.raises(KafkaError) as e:
        psm.check_marker(1, 0, 6)
    assert e.value.code == ErrorCode.transaction_coordinator_fenced
    psm.check_marker(1, 0, 7)
    psm.check_marker(1, 0, 8)
    # epoch is checked first (Kafka's appendEndTxnMarker order)
    with pytest.raises(KafkaError) as e:
        psm.check_marker(1, -1, 6)
    assert e.value.code == ErrorCode.invalid_producer_epoch


def test_marker_for_unknown_producer_passes_and_creates_the_entry(psm):
    psm.check_marker(42, 3, 1)
    done = psm.complete_txn(42, 3, 1, 9, True, 1)
    assert done.first_offset == done.last_offset == 9
    with pytest.raises(KafkaError):
        psm.check_marker(42, 3, 0)


def test_marker_with_bumped_epoch_resets_the_sequence_window(psm):
    # KIP-890 part 2: the marker carries epoch + 1; the next transaction starts at sequence 0
    log = Log(psm)
    log.append(thdr(pid=1, epoch=0, seq=0, n=3))
    psm.complete_txn(1, 1, 0, 3, False, 1)
    e = psm.entries[1]
    assert e.epoch == 1 and not e.batches
    assert code(psm, thdr(pid=1, epoch=0, seq=3)) == ErrorCode.invalid_producer_epoch
    assert code(psm, thdr(pid=1, epoch=1, seq=3)) == ErrorCode.out_of_order_sequence_number
    assert code(psm, thdr(pid=1, epoch=1, seq=0)) == "append"


def test_verification_token_race_guard(psm):
    # KIP-890 race guard: a marker between verification and append invalidates the verification
    t = psm.start_verification(1, 0)
    assert psm.verification_valid(1, t)
    psm.complete_txn(1, 0, 0, 5, True, 1)
    assert not psm.verification_valid(1, t)
    # a newer verification replaces an older one
    t1 = psm.start_verification(1, 0)
    t2 = psm.start_verification(1, 0)
    assert not psm.verification_valid(1, t1) and psm.verification_valid(1, t2)
    assert not psm.verification_valid(2, t2)
    # the append that opens the transaction consumes it
    psm.update(thdr(pid=1, seq=0), 6, 1)
    assert not psm.verification_valid(1, t2)


def test_verification_tokens_expire(psm):
    t = psm.start_verification(1, 0, now_ms=1000)
    psm.expire(1000 + 59_999)
    assert psm.verification_valid(1, t)
    psm.expire(1000 + 60_000)
    assert not psm.verification_valid(1, t)


def test_expiration_never_drops_a_producer_with_an_open_transaction(psm):
    psm.update(thdr(pid=1), 0, 0)
    psm.update(hdr(pid=2), 1, 0)
    assert psm.expire(10**9) == 1 and set(psm.entries) == {1}
    psm.complete_txn(1, 0, 0, 2, False, 10**9)
    assert psm.expire(10**9 + 60_000) == 1 and not psm.entries


def test_snapshot_keeps_open_transactions_and_coordinator_epochs(psm, tmp_path):
    psm.update(thdr(pid=1), 0, 1)
    psm.complete_txn(2, 0, 4, 1, False, 1)
    psm.take_snapshot(2)
    fresh = ProducerStateManager(str(tmp_path), 60_000)
    assert fresh.load(2, lambda off: iter(()), 1) == 2
    assert fresh.open_transactions() == {1: 0} and fresh.last_stable_offset(2) == 0
    assert fresh.entries[2].coordinator_epoch == 4


def _tlog(d):
    return PartitionLog.open(d, LogSettings(segment_bytes=1 << 20), 0)


def _txn(lg, psm, pid, seq, transactional=True):
    b = bytearray(build_batch([Record(key=None, value=b"v")], producer_id=pid, producer_epoch=0,
                              base_sequence=seq, transactional=transactional))
    h = read_header(b)
    assert psm.check(h) is None
    info = lg.append(b, 0)
    psm.update(h, info.base_offset, 0)
    return info.base_offset


def _marker(lg, psm, pid, commit, coord=0):
    psm.check_marker(pid, 0, coord)
    info = lg.append_control(pid, 0, commit, coord, 0)
    done = psm.complete_txn(pid, 0, coord, info.base_offset, not commit, 0)
    if done.aborted:
        lg.append_aborted(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                     psm.last_stable_offset(lg.log_end_offset)))
    return done


def test_snapshot_then_replay_restores_open_and_ended_transactions(tmp_path):
    d = str(tmp_path / "p")
    lg = _tlog(d)
    psm = ProducerStateManager(d, 60_000)
    a0 = _txn(lg, psm, 1, 0)          # P1 open at snapshot time, committed after it
    b0 = _txn(lg, psm, 2, 0)          # P2 open at snapshot time, aborted after it
    _txn(lg, psm, 3, 0)               # P3 open at snapshot time, still open at the crash
    psm.take_snapshot(lg.log_end_offset)
    _txn(lg, psm, 1, 1)
    _marker(lg, psm, 1, True)
    _txn(lg, psm, 2, 1)
    d2 = _marker(lg, psm, 2, False)
    c4 = _txn(lg, psm, 4, 0)          # P4 opens after the snapshot
    _txn(lg, psm, 9, 0, transactional=False)
    before = ({p: (e.epoch, e.coordinator_epoch, e.txn_first_offset, list(e.batches))
               for p, e in psm.entries.items()}, psm.last_stable_offset(lg.log_end_offset))
    assert before[1] == 2 and psm.open_transactions() == {3: 2, 4: c4}
    lg.close(clean=False)

    lg2 = _tlog(d)
    fresh = ProducerStateManager(d, 60_000)
    seen = []
    start = fresh.load(lg2.log_end_offset, lg2.headers_from, 0,
                       on_completed=lambda done, lso: seen.append((done, lso)))
    assert start == 3
    after = ({p: (e.epoch, e.coordinator_epoch, e.txn_first_offset, list(e.batches))
              for p, e in fresh.entries.items()}, fresh.last_stable_offset(lg2.log_end_offset))
    assert after == before
    assert [s[0] for s in seen] == [CompletedTxn(1, a0, 4, False), CompletedTxn(2, b0, d2.last_offset, True)]
    # the LSO reported with each marker is the one just after it (P3 still open: 2)
    assert [s[1] for s in seen] == [b0, 2]
    lg2.close()


def test_load_never_starts_after_max_start_offset(tmp_path):
    d = str(tmp_path / "p")
    lg = _tlog(d)
    psm = ProducerStateManager(d, 60_000)
    _txn(lg, psm, 1, 0)
    _marker(lg, psm, 1, False)
    psm.take_snapshot(lg.log_end_offset)                  # past the marker
    lg.close(clean=False)
    lg2 = _tlog(d)
    fresh = ProducerStateManager(d, 60_000)
    seen = []
    assert fresh.load(lg2.log_end_offset, lg2.headers_from, 0,
                      on_completed=lambda done, lso: seen.append(done), max_start_offset=0) == 0
    assert seen == [CompletedTxn(1, 0, 1, True)]
    assert list_snapshots(d) == [2]                       # kept, only not used
    lg2.close()


def test_headers_from_reports_control_type_and_coordinator_epoch(tmp_path):
    d = str(tmp_path / "p")
    lg = _tlog(d)
    lg.append(bytearray(build_batch([Record(key=None, value=b"v")])), 0)
    lg.append_control(5, 2, True, 11, 0)
    lg.append_control(6, 3, False, 12, 0)
    got = [(base, h.is_control, ctrl) for base, h, ctrl in lg.headers_from(0)]
    assert got == [(0, False, None), (1, True, (CONTROL_COMMIT, 11)), (2, True, (CONTROL_ABORT, 12))]
    lg.close()
