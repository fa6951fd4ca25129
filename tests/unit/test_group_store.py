"""The group log (appliance.group.store): record layouts, replay of committed and transactional
offsets and group metadata, torn tails, compaction and its crash safety."""

import os
import struct

import pytest

from appliance.group import store as smod
from appliance.group.consumer_records import ConsumerKey
from appliance.group.records import GroupMemberRecord, GroupRecord
from appliance.group.store import (COMPACTING_DIR, COMPLETE_MARKER, LOG_DIR, OLD_DIR, GroupKey,
                                   GroupLogCorrupt, GroupLogWriteError, GroupStateStore,
                                   OffsetEntry, OffsetKey, RecordDecodeError, UnknownKeyVersion,
                                   decode_group_value, decode_key, decode_offset_value,
                                   encode_group_key, encode_group_value, encode_offset_key,
                                   encode_offset_value)
from appliance.log.files import list_segment_bases, log_path
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.protocol.records import Record, build_batch


class SimulatedCrash(BaseException):
    """Raised by the crash hook; a BaseException so no handler on the way swallows it."""


def member(mid="m1", instance=None, sub=b"sub", asg=b"asg"):
    return GroupMemberRecord(member_id=mid, group_instance_id=instance, client_id="cid",
                             client_host="/127.0.0.1", rebalance_timeout=300000,
                             session_timeout=45000, subscription=sub, assignment=asg)


def group(gen=1, members=None, ts=1000, protocol_type="consumer"):
    return GroupRecord(protocol_type=protocol_type, generation=gen, protocol="range",
                       leader="m1" if members else None, current_state_timestamp=ts,
                       members=list(members or []))


def entry(offset, epoch=-1, md="", ts=100, expire=-1):
    return OffsetEntry(offset, epoch, md, ts, expire)


def open_store(path, **kw) -> GroupStateStore:
    return GroupStateStore(str(path), kw.pop("flush", "os"), 1000, **kw)


def loaded(path, **kw) -> GroupStateStore:
    st = open_store(path, **kw)
    st.load()
    return st


def committed(st, g):
    return {tp: (e.offset, e.leader_epoch, e.metadata) for tp, e in st.offsets.get(g, {}).items()}


def pending(st, pid, g):
    return {tp: e.offset for tp, e in st.pending.get(pid, {}).get(g, {}).items()}


def snapshot(st):
    """Everything replay rebuilds, in comparable form."""
    return ({g: committed(st, g) for g in st.offsets},
            {pid: {g: {tp: (e.offset, e.producer_epoch) for tp, e in by_tp.items()}
                   for g, by_tp in by_g.items()} for pid, by_g in st.pending.items()},
            {g: e.record for g, e in st.groups.items()},
            {g: set(p) for g, p in st.open_producers.items()})


def reopened(path, **kw):
    st = loaded(path, **kw)
    try:
        return snapshot(st)
    finally:
        st.close()


# -- layouts ------------------------------------------------------------------------------------

def test_key_layouts_are_kafkas():
    assert encode_offset_key("g", "t", 3) == b"\x00\x01" b"\x00\x01g" b"\x00\x01t" b"\x00\x00\x00\x03"
    assert encode_group_key("grp") == b"\x00\x02" b"\x00\x03grp"
    assert decode_key(encode_offset_key("g", "tp", 7)) == OffsetKey("g", "tp", 7)
    assert decode_key(b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x01") == OffsetKey("g", "t", 1)   # v0
    assert decode_key(encode_group_key("grp")) == GroupKey("grp")
    # KIP-848's consumer group records (key versions 3-8) are known; 15 is not
    assert decode_key(b"\x00\x03\x00\x01g") == ConsumerKey(3, "g", None)
    assert decode_key(b"\x00\x08\x00\x01g\x00\x02m1") == ConsumerKey(8, "g", "m1")
    with pytest.raises(UnknownKeyVersion):
        decode_key(b"\x00\x0f\x00\x01g")
    with pytest.raises(RecordDecodeError):
        decode_key(b"\x00\x01\x00\x05g")


def test_offset_value_layouts():
    v3 = encode_offset_value(42, 5, "md", 1234)
    assert v3 == struct.pack(">hqih", 3, 42, 5, 2) + b"md" + struct.pack(">q", 1234)
    e = decode_offset_value(v3)
    assert (e.offset, e.leader_epoch, e.metadata, e.commit_timestamp, e.expire_timestamp) == (42, 5, "md", 1234, -1)
    v1 = encode_offset_value(42, 5, "", 1234, 9999)
    assert v1 == struct.pack(">hqhqq", 1, 42, 0, 1234, 9999)
    e = decode_offset_value(v1)
    assert (e.offset, e.leader_epoch, e.expire_timestamp) == (42, -1, 9999)
    e = decode_offset_value(struct.pack(">hqh", 0, 7, 1) + b"x" + struct.pack(">q", 5))
    assert (e.offset, e.metadata, e.commit_timestamp) == (7, "x", 5)
    e = decode_offset_value(struct.pack(">hqh", 2, 8, 0) + struct.pack(">q", 6))
    assert (e.offset, e.commit_timestamp) == (8, 6)
    # v4 (flexible), with an unknown tagged field
    v4 = struct.pack(">hqi", 4, 9, 3) + bytes([3]) + b"ab" + struct.pack(">q", 77) + bytes([1, 5, 2, 0, 0])
    e = decode_offset_value(v4)
    assert (e.offset, e.leader_epoch, e.metadata, e.commit_timestamp) == (9, 3, "ab", 77)
    with pytest.raises(RecordDecodeError):
        decode_offset_value(struct.pack(">hq", 5, 1))
    with pytest.raises(RecordDecodeError):
        decode_offset_value(v3[:-1])


def test_group_value_v4_round_trip_and_layout():
    rec = group(members=[member("m1", "inst-1"), member("m2", None, b"", b"\x00\x01")])
    raw = encode_group_value(rec)
    assert raw[:2] == b"\x00\x04"
    assert raw[2:11] == bytes([9]) + b"consumer"
    assert decode_group_value(raw) == rec
    empty = GroupRecord(protocol_type="", generation=0, protocol=None, leader=None,
                        current_state_timestamp=-1, members=[])
    assert decode_group_value(encode_group_value(empty)) == empty


def _old_group_value(version, members):
    def s(x):
        return struct.pack(">h", -1) if x is None else struct.pack(">h", len(x)) + x.encode()

    def b(x):
        return struct.pack(">i", len(x)) + x
    out = struct.pack(">h", version) + s("consumer") + struct.pack(">i", 3) + s("range") + s("m1")
    if version >= 2:
        out += struct.pack(">q", 555)
    out += struct.pack(">i", len(members))
    for mid, inst in members:
        out += s(mid)
        if version >= 3:
            out += s(inst)
        out += s("cid") + s("host")
        if version >= 1:
            out += struct.pack(">i", 60000)
        out += struct.pack(">i", 10000) + b(b"S") + b(b"A")
    return out


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_group_value_old_versions_decode(version):
    rec = decode_group_value(_old_group_value(version, [("m1", "i1")]))
    assert (rec.protocol_type, rec.generation, rec.protocol, rec.leader) == ("consumer", 3, "range", "m1")
    assert rec.current_state_timestamp == (555 if version >= 2 else -1)
    m = rec.members[0]
    assert (m.member_id, m.client_id, m.client_host, m.session_timeout) == ("m1", "cid", "host", 10000)
    assert m.group_instance_id == ("i1" if version >= 3 else None)
    assert m.rebalance_timeout == (60000 if version >= 1 else 10000)   # v0: = session timeout
    assert (bytes(m.subscription), bytes(m.assignment)) == (b"S", b"A")


# -- replay -------------------------------------------------------------------------------------

def test_committed_offsets_and_groups_survive_reopen(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(10, 2, "a"), ("t", 1): entry(20)}, 100)
    st.commit_offsets("g", {("t", 0): entry(11, 3, "b")}, 101)
    st.commit_offsets("h", {("u", 5): entry(1)}, 102)
    st.store_group("g", group(members=[member()]), 103)
    st.store_group("gone", group(), 104)
    st.store_group("gone", None, 105)
    before = snapshot(st)
    st.close()
    after = reopened(tmp_path)
    assert after == before
    assert after[0] == {"g": {("t", 0): (11, 3, "b"), ("t", 1): (20, -1, "")}, "h": {("u", 5): (1, -1, "")}}
    assert set(after[2]) == {"g"}


def test_crash_without_close_loses_nothing_written(tmp_path):
    st = loaded(tmp_path)
    for i in range(30):
        st.commit_offsets("g", {("t", i % 4): entry(i)}, 100 + i)
    before = snapshot(st)
    st.close(clean=False)
    assert reopened(tmp_path) == before


def test_pending_offsets_replayed_pending_and_completed_by_later_marker(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(5)}, 100)
    st.commit_offsets("g", {("t", 0): entry(50), ("t", 1): entry(60)}, 101, producer_id=7, producer_epoch=2)
    st.commit_offsets("h", {("t", 0): entry(70)}, 101, producer_id=7, producer_epoch=2)
    st.commit_offsets("g", {("t", 2): entry(80)}, 102, producer_id=8, producer_epoch=0)
    st.close(clean=False)
    st = loaded(tmp_path)                       # restart with both transactions open
    assert committed(st, "g") == {("t", 0): (5, -1, "")}
    assert pending(st, 7, "g") == {("t", 0): 50, ("t", 1): 60}
    assert pending(st, 7, "h") == {("t", 0): 70}
    assert st.open_producers == {"g": {7, 8}, "h": {7}}
    assert st.end_transaction(7, 2, True, 200) in (["g", "h"], ["h", "g"])
    assert st.end_transaction(8, 0, False, 201) == ["g"]
    st.close()
    st = loaded(tmp_path)                       # markers replayed from the log
    assert committed(st, "g") == {("t", 0): (50, -1, ""), ("t", 1): (60, -1, "")}
    assert committed(st, "h") == {("t", 0): (70, -1, "")}
    assert st.pending == {} and st.open_producers == {}
    st.close()


def test_most_recent_of_plain_and_transactional_commit_wins(tmp_path):
    st = loaded(tmp_path)
    # pending first, plain commit later, then COMMIT: the plain one is more recent and stays
    st.commit_offsets("g", {("t", 0): entry(100)}, 1, producer_id=1, producer_epoch=0)
    st.commit_offsets("g", {("t", 0): entry(200)}, 2)
    # plain first, pending later, then COMMIT: the transactional one wins
    st.commit_offsets("g", {("t", 1): entry(300)}, 3)
    st.commit_offsets("g", {("t", 1): entry(400)}, 4, producer_id=1, producer_epoch=0)
    st.end_transaction(1, 0, True, 5)
    expect = {("t", 0): (200, -1, ""), ("t", 1): (400, -1, "")}
    assert committed(st, "g") == expect
    st.close()
    st = loaded(tmp_path)
    assert committed(st, "g") == expect
    st.close()


def test_abort_drops_pending_offsets(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    st.commit_offsets("g", {("t", 0): entry(2)}, 2, producer_id=3, producer_epoch=1)
    st.end_transaction(3, 1, False, 3)
    assert committed(st, "g") == {("t", 0): (1, -1, "")} and st.pending == {}
    st.close()
    assert reopened(tmp_path)[0] == {"g": {("t", 0): (1, -1, "")}}


def test_tombstone_removes_committed_and_pending_of_the_key(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1), ("t", 1): entry(2)}, 1)
    st.commit_offsets("g", {("t", 0): entry(5), ("t", 2): entry(6)}, 2, producer_id=4, producer_epoch=0)
    st.delete({"g": ([("t", 0)], False)}, 3)
    assert committed(st, "g") == {("t", 1): (2, -1, "")}
    assert pending(st, 4, "g") == {("t", 2): 6}
    st.end_transaction(4, 0, True, 4)            # the cancelled pending offset does not come back
    assert committed(st, "g") == {("t", 1): (2, -1, ""), ("t", 2): (6, -1, "")}
    before = snapshot(st)
    st.close()
    assert reopened(tmp_path) == before


def test_group_tombstone_keeps_offsets(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    st.store_group("g", group(), 2)
    st.delete({"g": ([], True)}, 3)
    assert "g" not in st.groups and committed(st, "g") == {("t", 0): (1, -1, "")}
    st.close()
    snap = reopened(tmp_path)
    assert snap[2] == {} and snap[0] == {"g": {("t", 0): (1, -1, "")}}


def _raw_append(path, records, pid=-1, epoch=-1, txn=False):
    lg = PartitionLog.open(os.path.join(str(path), LOG_DIR), LogSettings(), 1000)
    lg.append(bytearray(build_batch([Record(k, v, (), 5) for k, v in records], producer_id=pid,
                                    producer_epoch=epoch, transactional=txn,
                                    base_sequence=0 if txn else -1, base_timestamp=5)), 5)
    lg.close()


def test_unknown_key_version_skipped_undecodable_value_refused(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    st.close()
    _raw_append(tmp_path, [(b"\x00\x0f\x00\x01x", b"whatever"), (None, b"x")])
    st = loaded(tmp_path)
    assert committed(st, "g") == {("t", 0): (1, -1, "")}
    assert len(st.anomalies) == 2
    st.close()
    _raw_append(tmp_path, [(encode_offset_key("g", "t", 0), b"\x00\x03\x00")])
    st = open_store(tmp_path)
    with pytest.raises(GroupLogCorrupt):
        st.load()
    st.close()


def test_transactional_tombstone_removes_only_that_producers_pending(tmp_path):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    st.commit_offsets("g", {("t", 0): entry(2)}, 2, producer_id=1, producer_epoch=0)
    st.commit_offsets("g", {("t", 0): entry(3)}, 2, producer_id=2, producer_epoch=0)
    st.close()
    _raw_append(tmp_path, [(encode_offset_key("g", "t", 0), None)], pid=1, epoch=0, txn=True)
    st = loaded(tmp_path)
    assert committed(st, "g") == {("t", 0): (1, -1, "")}
    assert st.pending == {2: {"g": {("t", 0): st.pending[2]["g"][("t", 0)]}}}
    assert st.open_producers == {"g": {2}}
    st.close()


# -- torn tail ----------------------------------------------------------------------------------

def _segment_files(path):
    d = os.path.join(str(path), LOG_DIR)
    return [log_path(d, b) for b in list_segment_bases(d)]


@pytest.mark.parametrize("how", ["truncate", "zeros"])
@pytest.mark.parametrize("keep", [1, 30, -2])
def test_torn_tail_after_crash_keeps_acknowledged_records(tmp_path, how, keep):
    st = loaded(tmp_path)
    st.commit_offsets("g", {("t", 0): entry(1), ("t", 1): entry(2)}, 1)
    st.commit_offsets("g", {("t", 2): entry(3)}, 2, producer_id=9, producer_epoch=0)
    st.store_group("g", group(members=[member()]), 3)
    before = snapshot(st)
    end = st._log.active_end_position
    st.commit_offsets("g", {("t", 0): entry(100), ("t", 5): entry(500)}, 4)   # torn below
    torn_end = st._log.active_end_position
    st.close(clean=False)
    seg = _segment_files(tmp_path)[-1]
    cut = end + keep if keep > 0 else torn_end + keep   # mid-record, or just short of the end
    if how == "truncate":
        os.truncate(seg, cut)
    else:
        with open(seg, "r+b") as f:
            f.seek(cut)
            f.write(b"\x00" * (torn_end - cut))
    st = loaded(tmp_path)
    assert snapshot(st) == before
    st.commit_offsets("g", {("t", 9): entry(9)}, 5)       # appends go on after the cut
    after = snapshot(st)
    st.close(clean=False)
    assert reopened(tmp_path) == after


# -- durability and errors ----------------------------------------------------------------------

def test_batch_flush_policy_fdatasyncs(tmp_path, monkeypatch):
    calls = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (calls.append(fd), real(fd)))
    st = loaded(tmp_path, flush="batch")
    st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    st.store_group("g", group(), 2)
    st.commit_offsets("g", {("t", 0): entry(2)}, 3, producer_id=1, producer_epoch=0)
    st.end_transaction(1, 0, True, 4)
    st.delete({"g": ([("t", 0)], True), "h": ([("t", 1)], False)}, 5)
    assert len(calls) == 5                   # one per write, one for the whole deletion
    st.close()


def test_failed_sync_reports_maybe_written_and_leaves_memory(tmp_path, monkeypatch):
    st = loaded(tmp_path, flush="batch")

    def boom(fd):
        raise OSError(5, "EIO")
    monkeypatch.setattr(os, "fdatasync", boom)
    with pytest.raises(GroupLogWriteError) as ei:
        st.commit_offsets("g", {("t", 0): entry(1)}, 1)
    assert ei.value.maybe_written and st.offsets == {}
    monkeypatch.undo()            # the disk works again for the close
    st.close()


def test_batch_larger_than_a_segment_is_refused(tmp_path):
    st = loaded(tmp_path, segment_bytes=4096)
    with pytest.raises(GroupLogWriteError) as ei:
        st.commit_offsets("g", {("t", i): entry(i, md="x" * 100) for i in range(100)}, 1)
    assert not ei.value.maybe_written and st.offsets == {}
    st.commit_offsets("g", {("t", 0): entry(1)}, 2)
    st.close()


# -- compaction ---------------------------------------------------------------------------------

def _churn(st, n, now=1000):
    for i in range(n):
        st.commit_offsets("g", {("t", i % 3): entry(i, md="m" * 50)}, now + i)


def test_compaction_keeps_latest_groups_and_open_transactions(tmp_path):
    st = loaded(tmp_path, compact_bytes=8192)
    st.store_group("g", group(members=[member()]), 1)
    st.store_group("old", group(), 1)
    st.store_group("old", None, 1)
    # an open transaction whose offset is older in the log than a later plain commit
    st.commit_offsets("g", {("t", 0): entry(-5)}, 2, producer_id=5, producer_epoch=3)
    st.commit_offsets("g", {("t", 7): entry(70)}, 2, producer_id=6, producer_epoch=0)
    _churn(st, 300)
    assert st.compactions >= 1
    assert st.size_in_bytes() < 8192 * 2
    before = snapshot(st)
    assert before[1] == {5: {"g": {("t", 0): (-5, 3)}}, 6: {"g": {("t", 7): (70, 0)}}}
    st.close()
    assert reopened(tmp_path, compact_bytes=8192) == before
    st = loaded(tmp_path, compact_bytes=8192)
    st.end_transaction(5, 3, True, 5000)     # older than the plain commit of t-0: not materialized
    st.end_transaction(6, 0, True, 5001)
    expect = {("t", 0): (297, -1, "m" * 50), ("t", 1): (298, -1, "m" * 50),
              ("t", 2): (299, -1, "m" * 50), ("t", 7): (70, -1, "")}
    assert committed(st, "g") == expect
    st.close()
    snap = reopened(tmp_path)
    assert snap[0] == {"g": expect} and snap[1] == {}


def test_compaction_renumbers_record_offsets_in_memory(tmp_path):
    st = loaded(tmp_path)
    _churn(st, 50)
    st.commit_offsets("g", {("t", 0): entry(1000)}, 2000, producer_id=1, producer_epoch=0)
    _churn(st, 50, 3000)
    st.compact(4000)
    # a new plain commit after the compaction is more recent than the pending one
    st.commit_offsets("g", {("t", 0): entry(2000)}, 4001)
    st.end_transaction(1, 0, True, 4002)
    assert committed(st, "g")[("t", 0)][0] == 2000
    st.close()
    assert reopened(tmp_path)[0]["g"][("t", 0)][0] == 2000


STEPS = ["begin", "copying", "written", "marked", "closed", "old-moved", "new-moved", "cleaned"]


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_compaction_step(tmp_path, step):
    def hook(name):
        if name == step:
            raise SimulatedCrash(name)
    st = loaded(tmp_path, crash_hook=hook)
    st.store_group("g", group(members=[member()]), 1)
    st.commit_offsets("g", {("t", 9): entry(11)}, 2, producer_id=2, producer_epoch=1)
    _churn(st, 60)
    before = snapshot(st)
    with pytest.raises(SimulatedCrash):
        st.compact(5000)
    if st._log is not None:
        st._log.close(clean=False)           # the process dies here
    d = str(tmp_path)
    after = reopened(tmp_path)
    assert after == before
    assert os.path.isdir(os.path.join(d, LOG_DIR))
    assert not os.path.exists(os.path.join(d, COMPACTING_DIR))
    assert not os.path.exists(os.path.join(d, OLD_DIR))
    assert not os.path.exists(os.path.join(d, LOG_DIR, COMPLETE_MARKER))
    # and the repaired log goes on working: the pending offset commits later
    st = loaded(tmp_path)
    st.end_transaction(2, 1, True, 6000)
    assert committed(st, "g")[("t", 9)] == (11, -1, "")
    st.close()
    assert reopened(tmp_path)[0]["g"][("t", 9)] == (11, -1, "")


def test_compaction_failure_is_retried_later_and_loses_nothing(tmp_path, monkeypatch):
    st = loaded(tmp_path, compact_bytes=4096)
    real = smod.GroupStateStore.compact
    fails = {"n": 1}

    def flaky(self, now_ms):
        if fails["n"]:
            fails["n"] -= 1
            raise OSError(28, "ENOSPC")
        return real(self, now_ms)
    monkeypatch.setattr(smod.GroupStateStore, "compact", flaky)
    _churn(st, 200)
    assert st.compactions >= 1 and fails["n"] == 0
    before = snapshot(st)
    st.close()
    assert reopened(tmp_path) == before


def test_compaction_failing_after_the_first_rename_renumbers_memory(tmp_path):
    # The swap fails (EIO) after log -> log.old: the store repairs towards the new log, so the
    # record offsets in memory must be the new log's, or a later marker compares a pending
    # offset with a plain commit by stale offsets.
    st = loaded(tmp_path)
    _churn(st, 60)
    st.commit_offsets("g", {("t", 0): entry(1)}, 1, producer_id=1, producer_epoch=0)

    def hook(name):
        if name == "new-moved":
            raise OSError(5, "EIO")
    st._crash_hook = hook
    st.compact_bytes = 0
    st.commit_offsets("g", {("t", 1): entry(7)}, 2)      # triggers the failing compaction
    assert st.compactions == 0
    st._crash_hook, st.compact_bytes = None, smod.DEFAULT_COMPACT_BYTES
    st.commit_offsets("g", {("t", 0): entry(2)}, 3)      # later than the pending offset
    st.end_transaction(1, 0, True, 4)
    assert committed(st, "g")[("t", 0)][0] == 2
    before = snapshot(st)
    st.close()
    assert reopened(tmp_path) == before


def test_live_bytes_tracked_incrementally_match_a_replay(tmp_path):
    st = loaded(tmp_path)
    st.store_group("g", group(members=[member()]), 1)
    st.commit_offsets("g", {("t", 0): entry(1), ("t", 1): entry(2)}, 1)
    st.commit_offsets("g", {("t", 0): entry(3)}, 2, producer_id=1, producer_epoch=0)
    st.commit_offsets("g", {("t", 1): entry(4)}, 2, producer_id=2, producer_epoch=0)
    st.commit_offsets("g", {("t", 0): entry(5)}, 3)
    st.end_transaction(1, 0, True, 4)
    st.delete({"g": ([("t", 1)], False)}, 5)
    st.store_group("h", group(), 6)
    st.store_group("g", group(gen=2), 7)
    live = st.live_bytes
    st.close()
    st = loaded(tmp_path)
    assert st.live_bytes == live > 0
    st.compact(10)
    assert st.live_bytes == live
    st.close()
