"""The compacted-log engine (appliance.log.compacted_log) on its own, under a minimal key-value
store: append and reopen, the flush policy's syncs, write errors, the compaction trigger, the
rewrite's batches and renumbering, and the swap's crash safety at every step."""

import os

import pytest

from appliance.config import FlushPolicy
from appliance.errors import ErrorCode
from appliance.log.compacted_log import (COMPLETE_MARKER, CompactedLog, CompactedLogCorrupt,
                                         CompactedLogDamaged,
                                         CompactedLogWriteError, LiveRecord)
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.protocol.records import Record, build_batch

STEPS = ["begin", "copying", "written", "marked", "closed", "old-moved", "new-moved", "cleaned"]


class SimulatedCrash(BaseException):
    """Raised by the crash hook; a BaseException so no handler on the way swallows it."""


class KVCorrupt(CompactedLogCorrupt):
    pass


class KVWriteError(CompactedLogWriteError):
    pass


class Entry:
    def __init__(self, value: bytes, producer_id: int, record_offset: int) -> None:
        self.value, self.producer_id, self.record_offset = value, producer_id, record_offset


class KV(CompactedLog):
    """The last value per key; a null value deletes. Keys starting with b"!" make the replay
    refuse the record (a stand-in for an undecodable value)."""

    WHAT = "kv log"
    DIRS = ("kv", "kv.compacting", "kv.old")
    Corrupt = KVCorrupt
    WriteError = KVWriteError

    def __init__(self, directory, policy="os", **kw):
        self.data: dict[bytes, Entry] = {}
        kw.setdefault("segment_bytes", 1 << 20)
        kw.setdefault("compact_bytes", 1 << 30)
        super().__init__(str(directory), policy, 1000, clock=lambda: 1000, **kw)

    def load(self) -> dict[bytes, bytes]:
        self.data.clear()

        def apply(h, batch):
            for rec in self._decode(h, batch):
                if rec.key.startswith(b"!"):
                    raise self.Corrupt(f"bad record at {rec.offset}")
                self._apply(rec.key, rec.value, h.producer_id, rec.offset)
        self._replay(apply)
        return self.view()

    def _apply(self, key, value, producer_id, offset):
        old = self.data.pop(key, None)
        if old is not None:
            self._live_bytes -= len(key) + len(old.value)
        if value is not None:
            self.data[key] = Entry(bytes(value), producer_id, offset)
            self._live_bytes += len(key) + len(value)

    def put(self, key: bytes, value: bytes | None, producer_id: int = -1, *, sync=True) -> None:
        appended = self._append([(key, value)], 1000, producer_id, 0 if producer_id >= 0 else -1,
                                sync=sync)
        self._apply(key, value, producer_id, appended.base_offset)
        self._maybe_compact()

    def live_records(self):
        for key, e in sorted(self.data.items(), key=lambda kv: kv[1].record_offset):
            yield LiveRecord(key, e.value, e.producer_id, 0 if e.producer_id >= 0 else -1, e)

    def view(self) -> dict[bytes, bytes]:
        return {k: e.value for k, e in self.data.items()}


def loaded(path, **kw) -> KV:
    kv = KV(path, **kw)
    kv.load()
    return kv


def reopened(path, **kw) -> dict[bytes, bytes]:
    kv = KV(path, **kw)
    try:
        return kv.load()
    finally:
        kv.close()


def churn(kv: KV, rounds: int, keys: int = 4) -> dict[bytes, bytes]:
    for r in range(rounds):
        for k in range(keys):
            kv.put(b"k%d" % k, b"v%d-" % r + b"x" * 40)
        kv.put(b"gone%d" % r, b"y")
        kv.put(b"gone%d" % r, None)
    return kv.view()


def batches(kv: KV) -> list:
    """(producer id, transactional, records) of every batch in the live log."""
    return [(h.producer_id, h.is_transactional, h.records_count) for h, _ in kv._batches()]


# -- open, append, reopen -------------------------------------------------------------------------

def test_appends_survive_clean_and_unclean_close(tmp_path):
    kv = loaded(tmp_path)
    kv.put(b"a", b"1")
    kv.put(b"b", b"2")
    kv.put(b"a", b"3")
    kv.put(b"b", None)
    kv.close()
    assert reopened(tmp_path) == {b"a": b"3"}
    kv = loaded(tmp_path)
    kv.put(b"c", b"4")
    kv.close(clean=False)                       # as kill -9 leaves it
    assert reopened(tmp_path) == {b"a": b"3", b"c": b"4"}
    assert sorted(os.listdir(tmp_path)) == ["kv"]


def test_undecodable_record_raises_the_stores_corrupt(tmp_path):
    kv = loaded(tmp_path)
    kv.put(b"!bad", b"x")
    kv.close()
    kv = KV(tmp_path)
    with pytest.raises(KVCorrupt):
        kv.load()
    kv.close()


def _flip(path: str, needle: bytes) -> None:
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(needle)
        f.seek(at)
        f.write(bytes([data[at] ^ 0x20]))


def test_regression_a_flipped_byte_in_the_tail_truncates_the_log_there(tmp_path):
    """Bit rot (issue 34) in the active segment of a cleanly closed log: its replay checks every
    batch's CRC; a bad one is the log's tail, truncated as Kafka's recovery truncates any log's
    tail (it used to be Corrupt, which crash-looped the coordinator). What precedes it loads,
    the log takes appends at the cut, and the anomaly names the file and the offset."""
    import glob
    kv = loaded(tmp_path)
    kv.put(b"a", b"value-one")
    kv.put(b"b", b"value-two")
    kv.put(b"c", b"value-three")
    kv.close()
    (path,) = glob.glob(os.path.join(str(tmp_path), "kv", "*.log"))
    _flip(path, b"value-two")
    kv = KV(tmp_path)
    assert kv.load() == {b"a": b"value-one"}
    assert any(path in a and "offset 1 " in a and "fails its CRC" in a for a in kv.anomalies), \
        kv.anomalies
    kv.put(b"d", b"value-four")
    assert kv.data[b"d"].record_offset == 1
    kv.close()
    assert reopened(tmp_path) == {b"a": b"value-one", b"d": b"value-four"}


def test_regression_a_flipped_byte_in_a_sealed_segment_is_damaged_naming_file_and_offset(tmp_path):
    """Bit rot in a sealed segment is not a tail: truncating there would drop every later
    segment. The load refuses (``Damaged``, a ``Corrupt``) naming the file and the offset; the
    coordinator turns it into exit 3."""
    kv = loaded(tmp_path, segment_bytes=200)
    for i in range(6):
        kv.put(b"k%d" % i, b"value-%d-" % i + b"x" * 60)
    kv.close()
    segs = sorted(glob_logs(tmp_path))
    assert len(segs) >= 3
    _flip(segs[0], b"value-0-")
    before = {p: read(p) for p in segs}
    kv = KV(tmp_path, segment_bytes=200)
    with pytest.raises(CompactedLogDamaged, match="fails its CRC") as e:
        kv.load()
    assert e.value.path == segs[0] and e.value.offset == 0
    assert segs[0] in str(e.value) and "offset 0 " in str(e.value)
    kv.close(clean=False)
    assert {p: read(p) for p in segs} == before                 # nothing truncated


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def glob_logs(tmp_path) -> list[str]:
    import glob
    return glob.glob(os.path.join(str(tmp_path), "kv", "*.log"))


def test_anomaly_is_logged_and_kept(tmp_path, caplog):
    kv = KV(tmp_path)
    kv._anomaly("odd record skipped")
    assert kv.anomalies == ["odd record skipped"]
    assert "kv log: odd record skipped" in caplog.text
    kv.close()


# -- flush policy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("policy,syncs", [("os", 0), ("batch", 3), ("interval", 3),
                                          (FlushPolicy.BATCH, 3)])
def test_each_write_syncs_when_acks_wait_for_a_sync(tmp_path, monkeypatch, policy, syncs):
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    kv = loaded(tmp_path, policy=policy)
    assert isinstance(kv.flush_policy, FlushPolicy)
    kv.put(b"a", b"1")
    kv.put(b"b", b"2", producer_id=7)
    kv._append_control(7, 0, True, 1, 1000)
    assert len(calls) == syncs
    kv.put(b"c", b"3", sync=False)
    kv.put(b"d", b"4", sync=False)
    kv._sync()                                  # one sync for several appends
    assert len(calls) == syncs + (syncs > 0)
    kv.close()


def test_unknown_flush_policy_is_refused(tmp_path):
    with pytest.raises(ValueError):
        KV(tmp_path, policy="sometimes")


def test_failed_sync_may_have_written_a_refused_append_did_not(tmp_path, monkeypatch):
    kv = loaded(tmp_path, policy="batch", segment_bytes=4096)
    with pytest.raises(KVWriteError) as ei:
        kv.put(b"big", b"x" * 5000)
    assert not ei.value.maybe_written and ei.value.code == ErrorCode.record_list_too_large
    assert kv.view() == {}

    def boom(fd):
        raise OSError(5, "EIO")
    monkeypatch.setattr(os, "fdatasync", boom)
    with pytest.raises(KVWriteError) as ei:
        kv.put(b"a", b"1")
    assert ei.value.maybe_written and ei.value.code == ErrorCode.kafka_storage_error
    monkeypatch.undo()            # the disk works again for the close
    kv.close()


# -- compaction -----------------------------------------------------------------------------------

def test_compaction_runs_when_the_log_outgrows_the_limit_and_twice_the_live_bytes(tmp_path):
    kv = loaded(tmp_path, compact_bytes=4000)
    expected = churn(kv, 100)
    assert kv.compactions >= 1
    assert kv.size_in_bytes() <= max(4000, 2 * kv.live_bytes) + 200
    kv.close()
    assert reopened(tmp_path) == expected
    assert sorted(os.listdir(tmp_path)) == ["kv"]


def test_no_compaction_while_live_records_fill_half_the_log(tmp_path):
    kv = loaded(tmp_path, compact_bytes=10000)
    for i in range(100):
        kv.put(b"k%d" % i, b"v" * 1000)           # every record live
    assert kv.compactions == 0 and kv.size_in_bytes() > 10000
    kv.close()


def test_no_compaction_before_load(tmp_path):
    kv = KV(tmp_path, compact_bytes=1000)
    for i in range(100):
        kv.put(b"a", b"%d" % i)
    assert kv.compactions == 0
    with pytest.raises(RuntimeError):
        kv.compact()
    kv.close()
    assert reopened(tmp_path) == {b"a": b"99"}


def test_rewrite_batches_by_producer_in_log_order_and_renumbers(tmp_path):
    kv = loaded(tmp_path)
    kv.put(b"a", b"1")
    kv.put(b"p", b"2", producer_id=5)
    kv.put(b"q", b"3", producer_id=5)
    kv.put(b"b", b"4")
    kv.put(b"c", b"5")
    kv.put(b"a", None)
    kv.compact()
    assert batches(kv) == [(5, True, 2), (-1, False, 2)]
    assert {k: e.record_offset for k, e in kv.data.items()} == {b"p": 0, b"q": 1, b"b": 2, b"c": 3}
    kv.close()
    assert reopened(tmp_path) == {b"p": b"2", b"q": b"3", b"b": b"4", b"c": b"5"}


def test_rewrite_batch_size_follows_the_store(tmp_path, monkeypatch):
    kv = loaded(tmp_path)
    for i in range(5):
        kv.put(b"k%d" % i, b"v")
    monkeypatch.setattr(KV, "REWRITE_BATCH_RECORDS", 2)
    kv.compact()
    assert [n for _, _, n in batches(kv)] == [2, 2, 1]
    kv.close()


def test_failed_compaction_is_repaired_and_retried(tmp_path, monkeypatch):
    kv = loaded(tmp_path, compact_bytes=2000)
    fails = {"n": 1}

    def hook(name):
        if name == "old-moved" and fails["n"]:
            fails["n"] -= 1
            raise OSError(28, "ENOSPC")            # an ordinary failure, the process lives on
    kv._crash_hook = hook
    expected = churn(kv, 60)
    assert fails["n"] == 0 and kv.compactions >= 1
    kv.close()
    assert reopened(tmp_path) == expected
    assert sorted(os.listdir(tmp_path)) == ["kv"]


def _log_bytes(path) -> bytes:
    """Every batch of the log at ``path``, as bytes (repairing it first, as opening does)."""
    kv = KV(path)
    try:
        return b"".join(bytes(b) for _, b in kv._batches())
    finally:
        kv.close()


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_every_swap_step_leaves_the_old_or_the_new_log(tmp_path, step):
    # the same history twice: one compacts to the end (the new log), one crashes at `step`
    done, crashed = tmp_path / "done", tmp_path / "crashed"
    for d in (done, crashed):
        kv = loaded(d)
        expected = churn(kv, 20)
        kv.close()
    old = _log_bytes(crashed)
    kv = loaded(done)
    kv.compact()
    kv.close()
    new = _log_bytes(done)
    assert new != old

    def hook(name):
        if name == step:
            raise SimulatedCrash(name)
    kv = loaded(crashed, crash_hook=hook)
    with pytest.raises(SimulatedCrash):
        kv.compact()
    if kv._log is not None:
        kv._log.close(clean=False)                # the process dies: nothing is cleaned up
    assert reopened(crashed) == expected          # opening repairs
    assert sorted(os.listdir(crashed)) == ["kv"]
    assert not os.path.exists(crashed / "kv" / COMPLETE_MARKER)
    now = _log_bytes(crashed)
    # the swap is decided by the first rename: before it the live log is the old one; after it,
    # the marked new log is finished into place
    assert now == (new if STEPS.index(step) >= STEPS.index("old-moved") else old)
    kv = loaded(crashed)                          # and it goes on working
    kv.put(b"later", b"z")
    kv.compact()
    kv.close()
    assert reopened(crashed) == {**expected, b"later": b"z"}


def test_repair_puts_back_an_old_log_left_alone(tmp_path):
    kv = loaded(tmp_path)
    kv.put(b"a", b"1")
    kv.close()
    os.rename(tmp_path / "kv", tmp_path / "kv.old")
    assert reopened(tmp_path) == {b"a": b"1"}
    assert sorted(os.listdir(tmp_path)) == ["kv"]


def test_repair_finishes_a_swap_between_the_renames_and_drops_an_unmarked_one(tmp_path):
    kv = loaded(tmp_path)
    kv.put(b"a", b"old")
    kv.close()
    os.rename(tmp_path / "kv", tmp_path / "kv.old")
    new = PartitionLog.open(str(tmp_path / "kv.compacting"), LogSettings(), 0)
    new.append(bytearray(build_batch([Record(b"a", b"new")])), 0)
    new.close()
    (tmp_path / "kv.compacting" / COMPLETE_MARKER).write_bytes(b"")
    assert reopened(tmp_path) == {b"a": b"new"}
    junk = PartitionLog.open(str(tmp_path / "kv.compacting"), LogSettings(), 0)
    junk.append(bytearray(build_batch([Record(b"a", b"junk")])), 0)
    junk.close()                                  # no completion marker: discarded
    assert reopened(tmp_path) == {b"a": b"new"}
    assert sorted(os.listdir(tmp_path)) == ["kv"]


@pytest.mark.parametrize("step", ["marked", "closed", "old-moved", "new-moved", "cleaned"])
def test_swap_failing_in_a_live_process_leaves_memory_numbered_as_the_log(tmp_path, step):
    # An ordinary error (disk full, EIO) during the swap: the process goes on, opening repairs
    # towards the old or the new log, and the record offsets in memory must be that log's.
    kv = loaded(tmp_path, compact_bytes=1 << 30)
    churn(kv, 10)

    def hook(name):
        if name == step:
            raise OSError(5, "EIO")
    kv._crash_hook = hook
    kv.compact_bytes = 0                          # the next write triggers a compaction
    kv.put(b"k0", b"last")
    assert kv.compactions == 0
    kv._crash_hook, kv.compact_bytes = None, 1 << 30
    kv.put(b"k1", b"after")                       # appended to whichever log is live now
    memory = {k: e.record_offset for k, e in kv.data.items()}
    kv.close()
    replayed = loaded(tmp_path)
    assert {k: e.record_offset for k, e in replayed.data.items()} == memory
    replayed.close()
