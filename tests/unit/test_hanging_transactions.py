"""appliance.log.hanging: a transaction found open at a partition's open and never touched again
is aborted by the writer after twice transactions.max_timeout_ms (issue 34: after a power cut
under flush policy os, a transaction whose coordinator record was lost pinned the partition's LSO
for the rest of the chaos run)."""

from __future__ import annotations

from appliance import ipc
from appliance.errors import ErrorCode
from appliance.log.hanging import HangingWatch
from appliance.log.markers import MarkerWriter
from appliance.log.partition import Partition
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.protocol.records import Record, build_batch, read_header


def _open(d):
    return PartitionLog.open(d, LogSettings(segment_bytes=1 << 20), 0), ProducerStateManager(d, 60_000)


def _send(lg, psm, pid, seq):
    b = bytearray(build_batch([Record(key=None, value=b"v")], producer_id=pid, producer_epoch=0,
                              base_sequence=seq, transactional=True))
    h = read_header(b)
    assert psm.check(h) is None
    info = lg.append(b, 0)
    psm.update(h, info.base_offset, 0)


def test_regression_a_transaction_no_coordinator_knows_pinned_the_lso_for_ever(tmp_path):
    d = str(tmp_path / "p")
    lg, psm = _open(d)
    _send(lg, psm, 7, 0)              # open at the open: its coordinator record lost with a cut
    _send(lg, psm, 8, 0)              # open too, but its producer goes on after the open
    assert psm.last_stable_offset(lg.log_end_offset) == 0
    watch = HangingWatch(psm, now=100.0, limit_s=60.0)
    assert watch.due(psm, 159.0) == []
    _send(lg, psm, 8, 1)              # live: written to again
    due = watch.due(psm, 161.0)
    assert [h.producer_id for h in due] == [7]
    assert watch.due(psm, 500.0) == []                 # named once; 8 is the coordinator's
    h = due[0]
    part = Partition("t", 0, lg, psm)
    code, _ = MarkerWriter(part).write(ipc.WriteMarkerRequest(
        h.producer_id, h.producer_epoch, False, h.coordinator_epoch, b"", 0), 0)
    assert code == ErrorCode.none
    assert 7 not in psm.open_transactions()
    assert psm.last_stable_offset(lg.log_end_offset) == 1     # only 8's transaction holds it now
    lg.close()


def test_a_transaction_that_ends_or_begins_after_the_open_is_never_named(tmp_path):
    d = str(tmp_path / "p")
    lg, psm = _open(d)
    _send(lg, psm, 7, 0)
    watch = HangingWatch(psm, now=0.0, limit_s=60.0)
    lg.append_control(7, 0, True, 0, 0)
    psm.complete_txn(7, 0, 0, lg.log_end_offset - 1, False, 0)
    _send(lg, psm, 7, 1)              # a new transaction of the same producer, after the open
    _send(lg, psm, 9, 0)              # and another producer's
    assert watch.due(psm, 1000.0) == []
    lg.close()


def test_no_watch_with_two_phase_commit(tmp_path):
    """KIP-939: a prepared transaction may wait for its external coordinator beyond any timeout."""
    d = str(tmp_path / "p")
    lg, psm = _open(d)
    _send(lg, psm, 7, 0)
    assert HangingWatch(psm, now=0.0, limit_s=60.0, enabled=False).due(psm, 1e9) == []
    lg.close()
