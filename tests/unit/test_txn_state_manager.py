"""The transaction-state log (appliance.txn.state_manager): append, replay, tombstones,
durability, compaction and its crash safety, and the coordinator epoch file."""

import os
from pathlib import Path

import pytest

from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.protocol.records import Record, build_batch
from appliance.txn import state_manager as smod
from appliance.txn.metadata import TransactionMetadata, TransactionState as S
from appliance.txn.records import encode_key, encode_value
from appliance.txn.state_manager import (COMPACTING_DIR, COMPLETE_MARKER, LOG_DIR, OLD_DIR,
                                         TransactionLogCorrupt, TransactionStateManager,
                                         TxnLogWriteError, bump_coordinator_epoch,
                                         read_coordinator_epoch)


class SimulatedCrash(BaseException):
    """Raised by the crash hook; a BaseException so no handler on the way swallows it."""


def md(tid: str, pid: int = 1, epoch: int = 0, state: S = S.Empty, parts=(), start: int = -1,
       update: int = 100) -> TransactionMetadata:
    return TransactionMetadata(tid, pid, epoch, 60000, state, partitions=set(parts),
                               txn_start_ms=start, txn_last_update_ms=update)


def open_sm(path, **kw) -> TransactionStateManager:
    return TransactionStateManager(str(path), kw.pop("flush", "os"), lambda: 1000, **kw)


def reload(path, **kw) -> dict:
    sm = open_sm(path, **kw)
    try:
        return sm.load()
    finally:
        sm.close()


def test_last_record_per_id_wins_and_tombstones_delete(tmp_path):
    sm = open_sm(tmp_path)
    sm.load()
    sm.append(md("a", epoch=0))
    sm.append(md("b", pid=2))
    sm.append(md("a", epoch=1, state=S.Ongoing, parts=[("t", 0), ("t", 3)], start=50))
    sm.append(md("c", pid=3))
    sm.append_tombstone("c")
    sm.close()
    state = reload(tmp_path)
    assert set(state) == {"a", "b"}
    a = state["a"]
    assert (a.producer_epoch, a.state, a.partitions, a.txn_start_ms) == (1, S.Ongoing, {("t", 0), ("t", 3)}, 50)


def test_crash_without_close_loses_nothing_appended(tmp_path):
    sm = open_sm(tmp_path)
    sm.load()
    for i in range(50):
        sm.append(md(f"id{i}", pid=i))
    sm.close(clean=False)                      # as kill -9 would leave it
    assert set(reload(tmp_path)) == {f"id{i}" for i in range(50)}


@pytest.mark.parametrize("policy,syncs", [("os", 0), ("batch", 2), ("interval", 2)])
def test_append_fdatasyncs_unless_policy_os(tmp_path, monkeypatch, policy, syncs):
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(smod.os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    sm = open_sm(tmp_path, flush=policy)
    sm.load()
    sm.append(md("a"))
    sm.append_tombstone("a")
    assert len(calls) == syncs
    sm.close()


def test_failed_fdatasync_reports_maybe_written(tmp_path, monkeypatch):
    def boom(fd):
        raise OSError(5, "EIO")
    monkeypatch.setattr(smod.os, "fdatasync", boom)
    sm = open_sm(tmp_path, flush="batch")
    sm.load()
    with pytest.raises(TxnLogWriteError) as exc:
        sm.append(md("a"))
    assert exc.value.maybe_written
    monkeypatch.undo()            # the disk works again for the close
    sm.close()


def _raw_append(path, key: bytes, value: bytes | None) -> None:
    """Append a record with arbitrary bytes, as a corrupt or foreign log would hold it."""
    sm = open_sm(path)
    sm.load()
    sm._write(key, value)
    sm.close()


def test_epoch_regression_for_same_pid_is_logged_and_the_later_record_wins(tmp_path):
    # KIP-98 calls this a corrupt log; Kafka's loader does not check and keeps the last record.
    sm = open_sm(tmp_path)
    sm.load()
    sm.append(md("a", pid=5, epoch=7))
    sm.append(md("a", pid=5, epoch=3))
    sm.append(md("b", pid=6, epoch=9))
    sm.append(md("b", pid=8, epoch=0))          # new producer id after an overflow: legal
    sm.close()
    sm = open_sm(tmp_path)
    state = sm.load()
    assert state["a"].producer_epoch == 3
    assert state["b"].producer_id == 8
    assert len(sm.anomalies) == 1 and "epoch went down" in sm.anomalies[0]
    sm.close()


def test_unknown_key_version_is_skipped(tmp_path):
    _raw_append(tmp_path, b"\x00\x05\x00\x01x", encode_value(md("x").to_log_value()))
    sm = open_sm(tmp_path)
    sm.load()
    sm.append(md("a"))
    sm.close()
    sm = open_sm(tmp_path)
    assert set(sm.load()) == {"a"}
    assert any("unknown transaction log key version 5" in a for a in sm.anomalies)
    sm.close()


def test_undecodable_value_refuses_to_load(tmp_path):
    _raw_append(tmp_path, encode_key("a"), b"\x00\x09garbage")
    sm = open_sm(tmp_path)
    with pytest.raises(TransactionLogCorrupt):
        sm.load()
    sm.close()


# -- compaction ---------------------------------------------------------------------------------

def _churn(sm, ids: int, rounds: int) -> dict:
    """Many updates of a few ids plus some deleted ids; returns the expected live state."""
    expected = {}
    for r in range(rounds):
        for i in range(ids):
            m = md(f"id{i}", pid=i, epoch=r, update=r)
            sm.append(m)
            expected[m.transactional_id] = m
        sm.append(md(f"gone{r}", pid=1000 + r))
        sm.append_tombstone(f"gone{r}")
    return expected


def _same(state: dict, expected: dict) -> None:
    assert set(state) == set(expected)
    for tid, m in expected.items():
        got = state[tid]
        assert (got.producer_id, got.producer_epoch, got.state) == (m.producer_id, m.producer_epoch, m.state)


def test_compaction_rewrites_live_records_when_the_log_grows(tmp_path):
    sm = open_sm(tmp_path, compact_bytes=20000)
    sm.load()
    expected = _churn(sm, ids=5, rounds=200)
    assert sm.compactions >= 1
    assert sm.size_in_bytes() <= max(20000, 2 * sm.live_bytes) + 200
    sm.close()
    _same(reload(tmp_path), expected)
    assert sorted(os.listdir(tmp_path)) == [LOG_DIR]


def test_no_compaction_before_load(tmp_path):
    sm = open_sm(tmp_path, compact_bytes=1000)
    for i in range(100):
        sm.append(md("a", epoch=i))
    assert sm.compactions == 0                  # the live set is unknown before load()
    sm.close()
    assert reload(tmp_path)["a"].producer_epoch == 99


STEPS = ["begin", "copying", "written", "marked", "closed", "old-moved", "new-moved", "cleaned"]


@pytest.mark.parametrize("step", STEPS)
def test_compaction_crash_at_any_step_leaves_old_or_new_log(tmp_path, step):
    sm = open_sm(tmp_path)
    sm.load()
    expected = _churn(sm, ids=4, rounds=30)
    size_before = sm.size_in_bytes()

    def hook(name):
        if name == step:
            raise SimulatedCrash(name)
    sm._crash_hook = hook
    with pytest.raises(SimulatedCrash):
        sm.compact()
    if sm._log is not None:
        sm._log.close(clean=False)             # the process dies: nothing is cleaned up
    # the next coordinator start repairs and loads
    sm2 = open_sm(tmp_path)
    _same(sm2.load(), expected)
    assert sorted(os.listdir(tmp_path)) == [LOG_DIR]
    assert not os.path.exists(os.path.join(tmp_path, LOG_DIR, COMPLETE_MARKER))
    if STEPS.index(step) >= STEPS.index("new-moved"):
        assert sm2.size_in_bytes() < size_before          # the compacted log is in place
    elif STEPS.index(step) <= STEPS.index("closed"):
        assert sm2.size_in_bytes() == size_before         # the old log is still in place
    # and it keeps working: append, compact, reload
    sm2.append(md("later", pid=77))
    sm2.compact()
    sm2.close()
    expected["later"] = md("later", pid=77)
    _same(reload(tmp_path), expected)


def test_repair_finishes_swap_when_only_new_and_old_exist(tmp_path):
    """The instant between the two renames, built by hand."""
    sm = open_sm(tmp_path)
    sm.load()
    sm.append(md("a", epoch=1))
    sm.append(md("a", epoch=2))
    sm.close()
    os.rename(tmp_path / LOG_DIR, tmp_path / OLD_DIR)
    new = PartitionLog.open(str(tmp_path / COMPACTING_DIR), LogSettings(), 0)
    new.append(bytearray(build_batch([Record(encode_key("a"), encode_value(md("a", epoch=2).to_log_value()))])), 0)
    new.close()
    (tmp_path / COMPACTING_DIR / COMPLETE_MARKER).write_bytes(b"")
    state = reload(tmp_path)
    assert state["a"].producer_epoch == 2
    assert sorted(os.listdir(tmp_path)) == [LOG_DIR]


def test_incomplete_compaction_dir_is_discarded(tmp_path):
    sm = open_sm(tmp_path)
    sm.load()
    sm.append(md("a", epoch=4))
    sm.close()
    junk = PartitionLog.open(str(tmp_path / COMPACTING_DIR), LogSettings(), 0)
    junk.append(bytearray(build_batch([Record(encode_key("a"), encode_value(md("a", epoch=1).to_log_value()))])), 0)
    junk.close()                                         # no completion marker
    assert reload(tmp_path)["a"].producer_epoch == 4
    assert sorted(os.listdir(tmp_path)) == [LOG_DIR]


# -- coordinator epoch -------------------------------------------------------------------------------

def test_coordinator_epoch_increments_durably(tmp_path):
    d = str(tmp_path / "co")
    assert read_coordinator_epoch(d) == 0
    assert [bump_coordinator_epoch(d) for _ in range(3)] == [1, 2, 3]
    assert read_coordinator_epoch(d) == 3
    assert Path(os.path.join(d, "coordinator-epoch")).read_text() == "3\n"


def test_damaged_coordinator_epoch_file_is_refused(tmp_path):
    (tmp_path / "coordinator-epoch").write_text("x7\n")
    with pytest.raises(ValueError):
        bump_coordinator_epoch(str(tmp_path))


def test_a_long_coordinator_load_beats_its_heartbeat_as_it_replays(tmp_path):
    """The coordinator sets ``progress`` to its heartbeat beat before each log's load: a replay
    longer than the supervisor's heartbeat timeout would have every incarnation killed mid-load
    until the crash-loop rule stopped the appliance."""
    sm = open_sm(tmp_path)
    sm.load()
    for i in range(600):
        sm.append(md(f"id{i}", pid=i))       # one batch each
    sm.close(clean=False)
    sm = open_sm(tmp_path)
    beats = []
    sm.progress = lambda: beats.append(1)
    try:
        assert len(sm.load()) == 600
    finally:
        sm.close()
    assert len(beats) == 600 // sm.PROGRESS_BATCHES
