"""Offsets of consumer groups (appliance.group.offsets): OffsetCommit / OffsetFetch, transactional
offsets and their markers (KIP-98, KIP-447), deletion, group metadata,
expiration (KIP-211), restarts."""

import os

from appliance.errors import ErrorCode as E
from appliance.group.messages import OffsetPartition
from appliance.group.offsets import OffsetManager
from appliance.group.records import GroupMemberRecord, GroupRecord
from appliance.group.store import GroupStateStore

DAY = 24 * 3600 * 1000


def member(mid="m1"):
    return GroupMemberRecord(member_id=mid, client_id="c", client_host="/h", rebalance_timeout=1000,
                             session_timeout=1000, subscription=b"s", assignment=b"a")


def group(members=(), ts=1000, protocol_type="consumer", gen=1):
    return GroupRecord(protocol_type=protocol_type, generation=gen,
                       protocol="range" if members else None, leader=members[0].member_id if members else None,
                       current_state_timestamp=ts, members=list(members))


def manager(path, **kw) -> OffsetManager:
    flush = kw.pop("flush", "os")
    store_kw = {k: kw.pop(k) for k in ("compact_bytes", "segment_bytes") if k in kw}
    om = OffsetManager(GroupStateStore(str(path), flush, 0, **store_kw), **kw)
    om.load()
    return om


def restart(om: OffsetManager, path, clean=False, **kw) -> OffsetManager:
    om.close(clean=clean)
    return manager(path, **kw)


def fetch1(om, g, t, p, stable=False) -> OffsetPartition:
    (r,) = om.fetch_offsets(g, [(t, p)], stable)
    return r


def off(t, p, o, epoch=-1, md=""):
    return (t, p, o, epoch, md)


# -- OffsetCommit / OffsetFetch -------------------------------------------------------------------

def test_commit_fetch_round_trip(tmp_path):
    om = manager(tmp_path)
    res = om.commit_offsets("g", [off("t", 0, 10, 3, "meta"), off("t", 1, 20, -1, None)], 1000)
    assert res == {("t", 0): E.none, ("t", 1): E.none}
    assert om.fetch_offsets("g", [("t", 0), ("t", 1), ("t", 2)], False) == [
        OffsetPartition("t", 0, 10, 3, "meta", E.none),
        OffsetPartition("t", 1, 20, -1, "", E.none),            # null metadata stored as ""
        OffsetPartition("t", 2, -1, -1, "", E.none),            # unknown partition
    ]
    assert fetch1(om, "nobody", "t", 0) == OffsetPartition("t", 0, -1, -1, "", E.none)
    om.commit_offsets("g", [off("a", 5, 1)], 1001)
    assert [(r.topic, r.partition, r.offset) for r in om.fetch_offsets("g", None)] == [
        ("a", 5, 1), ("t", 0, 10), ("t", 1, 20)]
    assert om.fetch_offsets("nobody", None) == []
    om = restart(om, tmp_path)
    assert fetch1(om, "g", "t", 0) == OffsetPartition("t", 0, 10, 3, "meta", E.none)
    assert om.groups_with_offsets() == {"g"}
    om.close()


def test_metadata_too_large(tmp_path):
    om = manager(tmp_path, offset_metadata_max_bytes=10)
    res = om.commit_offsets("g", [off("t", 0, 1, md="x" * 11), off("t", 1, 2, md="x" * 10)], 1)
    assert res == {("t", 0): E.offset_metadata_too_large, ("t", 1): E.none}
    assert fetch1(om, "g", "t", 0).offset == -1 and fetch1(om, "g", "t", 1).offset == 2
    # Kafka compares String.length(): UTF-16 code units, not bytes
    assert om.commit_offsets("g", [off("t", 2, 3, md="é" * 10)], 2) == {("t", 2): E.none}
    assert om.commit_offsets("g", [off("t", 3, 3, md="😀" * 6)], 2) == {("t", 3): E.offset_metadata_too_large}
    size = om.store.size_in_bytes()
    assert om.commit_offsets("g", [off("t", 4, 1, md="y" * 50)], 3) == {("t", 4): E.offset_metadata_too_large}
    assert om.store.size_in_bytes() == size             # nothing written at all
    om.close()


def test_default_metadata_limit_is_4096(tmp_path):
    om = manager(tmp_path)
    assert om.commit_offsets("g", [off("t", 0, 1, md="x" * 4096), off("t", 1, 1, md="x" * 4097)], 1) == {
        ("t", 0): E.none, ("t", 1): E.offset_metadata_too_large}
    om.close()


def test_commit_is_persisted_before_returning(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 7)], 1)
    om2 = manager(tmp_path)                      # a second reader of the same files, no close
    assert fetch1(om2, "g", "t", 0).offset == 7
    om2.close(clean=False)
    om.close(clean=False)


# -- transactional offsets ------------------------------------------------------------------------

def test_txn_offsets_invisible_until_commit_marker(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 5)], 1)
    assert om.txn_commit_offsets("g", 100, 0, [off("t", 0, 50, 2, "x"), off("t", 1, 60)], 2) == {
        ("t", 0): E.none, ("t", 1): E.none}
    assert fetch1(om, "g", "t", 0).offset == 5
    assert fetch1(om, "g", "t", 1).offset == -1
    assert [r.partition for r in om.fetch_offsets("g", None)] == [0]
    assert om.has_pending("g") and om.pending_producers("g") == {100}
    assert om.complete_txn(100, 0, True, 3) == E.none
    assert fetch1(om, "g", "t", 0) == OffsetPartition("t", 0, 50, 2, "x", E.none)
    assert fetch1(om, "g", "t", 1).offset == 60
    assert not om.has_pending("g") and om.pending_producers("g") == set()
    om.close()


def test_aborted_txn_offsets_never_visible(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 5)], 1)
    om.txn_commit_offsets("g", 100, 0, [off("t", 0, 50), off("t", 1, 60)], 2)
    assert om.complete_txn(100, 0, False, 3) == E.none
    assert fetch1(om, "g", "t", 0).offset == 5 and fetch1(om, "g", "t", 1).offset == -1
    assert not om.has_pending("g")
    om = restart(om, tmp_path)
    assert fetch1(om, "g", "t", 0).offset == 5 and fetch1(om, "g", "t", 1).offset == -1
    om.close()


def test_require_stable_unstable_during_txn_committed_after(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 5), off("t", 1, 6)], 1)
    om.txn_commit_offsets("g", 100, 0, [off("t", 0, 50)], 2)
    assert fetch1(om, "g", "t", 0, stable=True) == OffsetPartition("t", 0, -1, -1, "", E.unstable_offset_commit)
    assert fetch1(om, "g", "t", 1, stable=True).offset == 6        # other partitions answer
    assert fetch1(om, "g", "t", 0, stable=False).offset == 5       # without the flag: last committed
    everything = om.fetch_offsets("g", None, True)
    assert [(r.partition, r.error) for r in everything] == [(0, E.unstable_offset_commit), (1, E.none)]
    om.complete_txn(100, 0, True, 3)
    assert fetch1(om, "g", "t", 0, stable=True) == OffsetPartition("t", 0, 50, -1, "", E.none)
    om.close()


def test_pending_partition_without_committed_offset_is_unstable(tmp_path):
    om = manager(tmp_path)
    om.txn_commit_offsets("g", 100, 0, [off("t", 3, 1)], 1)
    assert fetch1(om, "g", "t", 3, stable=True).error == E.unstable_offset_commit
    assert fetch1(om, "g", "t", 3).offset == -1
    assert fetch1(om, "other", "t", 3, stable=True).error == E.none   # other groups unaffected
    om.complete_txn(100, 0, False, 2)
    assert fetch1(om, "g", "t", 3, stable=True) == OffsetPartition("t", 3, -1, -1, "", E.none)
    om.close()


def test_restart_keeps_pending_until_a_later_commit_marker(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 5)], 1)
    om.txn_commit_offsets("g", 100, 1, [off("t", 0, 50)], 2)
    om.txn_commit_offsets("h", 100, 1, [off("u", 0, 7)], 2)
    om = restart(om, tmp_path)                               # kill -9 with the txn open
    assert fetch1(om, "g", "t", 0).offset == 5
    assert fetch1(om, "g", "t", 0, stable=True).error == E.unstable_offset_commit
    assert om.pending_producers("g") == {100} and om.pending_producer_ids() == {100}
    assert om.complete_txn(100, 1, True, 3) == E.none         # the marker comes after the restart
    assert fetch1(om, "g", "t", 0).offset == 50 and fetch1(om, "h", "u", 0).offset == 7
    om = restart(om, tmp_path)
    assert fetch1(om, "g", "t", 0, stable=True).offset == 50
    assert fetch1(om, "h", "u", 0, stable=True).offset == 7
    assert om.pending_producer_ids() == set()
    om.close()


def test_restart_after_abort_marker(tmp_path):
    om = manager(tmp_path)
    om.txn_commit_offsets("g", 100, 1, [off("t", 0, 50)], 2)
    om = restart(om, tmp_path)
    assert om.complete_txn(100, 2, False, 3) == E.none          # timeout abort: bumped epoch
    om = restart(om, tmp_path)
    assert fetch1(om, "g", "t", 0, stable=True) == OffsetPartition("t", 0, -1, -1, "", E.none)
    om.close()


def test_marker_completes_every_group_of_the_producer_only(tmp_path):
    om = manager(tmp_path)
    om.txn_commit_offsets("a", 1, 0, [off("t", 0, 10)], 1)
    om.txn_commit_offsets("b", 1, 0, [off("t", 0, 20)], 1)
    om.txn_commit_offsets("a", 2, 0, [off("t", 1, 30)], 1)
    om.complete_txn(1, 0, True, 2)
    assert fetch1(om, "a", "t", 0).offset == 10 and fetch1(om, "b", "t", 0).offset == 20
    assert fetch1(om, "a", "t", 1).offset == -1 and om.pending_producers("a") == {2}
    # a second marker of the same transaction (another offsets partition) changes nothing
    size = om.store.size_in_bytes()
    assert om.complete_txn(1, 0, True, 3) == E.none
    assert om.store.size_in_bytes() == size
    om.close()


def test_stale_epochs_are_refused(tmp_path):
    om = manager(tmp_path)
    om.txn_commit_offsets("g", 7, 5, [off("t", 0, 1)], 1)
    assert om.txn_commit_offsets("g", 7, 4, [off("t", 1, 2)], 2) == {("t", 1): E.invalid_producer_epoch}
    assert om.complete_txn(7, 4, True, 3) == E.invalid_producer_epoch
    assert om.pending_producers("g") == {7} and fetch1(om, "g", "t", 0).offset == -1
    assert om.complete_txn(7, 5, True, 4) == E.none
    assert fetch1(om, "g", "t", 0).offset == 1
    om.close()


def test_later_txn_commit_of_the_same_partition_replaces_the_pending_one(tmp_path):
    om = manager(tmp_path)
    om.txn_commit_offsets("g", 7, 0, [off("t", 0, 1)], 1)
    om.txn_commit_offsets("g", 7, 0, [off("t", 0, 2)], 2)
    om.complete_txn(7, 0, True, 3)
    assert fetch1(om, "g", "t", 0).offset == 2
    om.close()


def test_txn_metadata_too_large(tmp_path):
    om = manager(tmp_path, offset_metadata_max_bytes=3)
    assert om.txn_commit_offsets("g", 7, 0, [off("t", 0, 1, md="abcd"), off("t", 1, 1, md="abc")], 1) == {
        ("t", 0): E.offset_metadata_too_large, ("t", 1): E.none}
    om.complete_txn(7, 0, True, 2)
    assert fetch1(om, "g", "t", 0).offset == -1 and fetch1(om, "g", "t", 1).offset == 1
    om.close()


# -- deletion -------------------------------------------------------------------------------------

def test_delete_group(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group(), 1)
    om.commit_offsets("g", [off("t", 0, 1), off("t", 1, 2)], 1)
    om.txn_commit_offsets("g", 9, 0, [off("t", 2, 3)], 2)
    om.commit_offsets("other", [off("t", 0, 4)], 2)
    assert om.delete_group("g", 3) == E.none
    assert om.fetch_offsets("g", None) == [] and not om.has_offsets("g") and not om.has_pending("g")
    assert om.stored_group("g") is None
    om.complete_txn(9, 0, True, 4)              # the cancelled pending offset does not come back
    assert fetch1(om, "g", "t", 2).offset == -1
    om = restart(om, tmp_path)
    assert om.fetch_offsets("g", None) == [] and om.stored_group("g") is None
    assert fetch1(om, "other", "t", 0).offset == 4
    assert om.delete_group("nothing", 5) == E.none
    om.close()


def test_delete_offsets(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 1), off("t", 1, 2), off("u", 0, 3)], 1)
    om.txn_commit_offsets("g", 9, 0, [off("v", 0, 4)], 1)
    res = om.delete_offsets("g", [("t", 0), ("v", 0), ("x", 9)], 2)
    assert res == {("t", 0): E.none, ("v", 0): E.none, ("x", 9): E.none}
    assert [(r.topic, r.partition) for r in om.fetch_offsets("g", None)] == [("t", 1), ("u", 0)]
    assert not om.has_pending("g")
    om = restart(om, tmp_path)
    assert [(r.topic, r.partition) for r in om.fetch_offsets("g", None)] == [("t", 1), ("u", 0)]
    om.close()


# -- group metadata -------------------------------------------------------------------------------

def test_store_group_and_load(tmp_path):
    om = manager(tmp_path)
    rec = group([member("m1"), member("m2")])
    assert om.store_group("g", rec, 1) == E.none
    assert om.store_group("h", group(), 1) == E.none
    assert om.store_group("h", None, 2) == E.none
    size = om.store.size_in_bytes()
    assert om.store_group("never", None, 3) == E.none       # no tombstone for nothing
    assert om.store.size_in_bytes() == size
    om.close(clean=False)
    om = OffsetManager(GroupStateStore(str(tmp_path), "os", 0))
    assert om.load() == {"g": rec}
    om.close()


# -- expiration (KIP-211) -------------------------------------------------------------------------

def test_standalone_offsets_expire_from_commit_time(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("simple", [off("t", 0, 1)], 0)
    om.commit_offsets("simple", [off("t", 1, 1)], 5 * DAY)
    res = om.expire_offsets(7 * DAY - 1, 7 * DAY, lambda g: True)
    assert res.expired == {} and res.deleted_groups == []
    res = om.expire_offsets(7 * DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"simple": [("t", 0)]} and res.deleted_groups == []
    res = om.expire_offsets(12 * DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"simple": [("t", 1)]} and res.deleted_groups == ["simple"]
    assert om.groups_with_offsets() == set()
    om = restart(om, tmp_path)
    assert om.fetch_offsets("simple", None) == []
    om.close()


def test_offsets_of_a_live_group_never_expire(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group([member()], ts=0), 0)
    om.commit_offsets("g", [off("t", 0, 1)], 0)
    res = om.expire_offsets(100 * DAY, 7 * DAY, lambda g: False)
    assert res == ({}, [])
    assert fetch1(om, "g", "t", 0).offset == 1
    om.close()


def test_empty_group_expires_from_when_it_became_empty(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 1)], 0)                 # committed long before
    om.store_group("g", group(ts=10 * DAY), 10 * DAY)            # became Empty at day 10
    assert om.expire_offsets(16 * DAY, 7 * DAY, lambda g: True) == ({}, [])
    res = om.expire_offsets(17 * DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"g": [("t", 0)]} and res.deleted_groups == ["g"]
    assert om.stored_group("g") is None                          # the group record is tombstoned
    om = restart(om, tmp_path)
    assert om.stored_group("g") is None and om.fetch_offsets("g", None) == []
    om.close()


def test_empty_since_callback_overrides_the_stored_timestamp(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group(ts=0), 0)
    om.commit_offsets("g", [off("t", 0, 1)], 0)
    since = {"g": 20 * DAY}
    assert om.expire_offsets(26 * DAY, 7 * DAY, lambda g: True, empty_since=since.get) == ({}, [])
    res = om.expire_offsets(27 * DAY, 7 * DAY, lambda g: True, empty_since=since.get)
    assert res.expired == {"g": [("t", 0)]}
    om.close()


def test_explicit_expire_timestamp(tmp_path):
    om = manager(tmp_path)
    om.commit_offsets("g", [off("t", 0, 1)], 0, expire_timestamp=DAY)   # OffsetCommit v2-v4 retention
    om.commit_offsets("g", [off("t", 1, 1)], 0)
    om = restart(om, tmp_path)                                          # kept in the v1 value
    res = om.expire_offsets(DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"g": [("t", 0)]} and res.deleted_groups == []
    om.close()


def test_pending_txn_offsets_block_expiry_and_group_deletion(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group(ts=0), 0)
    om.commit_offsets("g", [off("t", 0, 1), off("t", 1, 1)], 0)
    om.txn_commit_offsets("g", 3, 0, [off("t", 0, 2)], 0)
    res = om.expire_offsets(30 * DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"g": [("t", 1)]} and res.deleted_groups == []
    assert om.stored_group("g") is not None and fetch1(om, "g", "t", 0).offset == 1
    om.complete_txn(3, 0, False, 30 * DAY)
    res = om.expire_offsets(30 * DAY, 7 * DAY, lambda g: True)
    assert res.expired == {"g": [("t", 0)]} and res.deleted_groups == ["g"]
    om.close()


def test_empty_group_without_offsets_is_deleted(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group(ts=0), 0)
    om.store_group("live", group([member()], ts=0), 0)
    res = om.expire_offsets(1, 7 * DAY, lambda g: g != "live")
    assert res == ({}, ["g"])
    assert om.stored_group("g") is None and om.stored_group("live") is not None
    om.close()


def test_unsubscribed_topics_of_a_stable_group_expire_kip496(tmp_path):
    om = manager(tmp_path)
    om.store_group("g", group([member()], ts=0), 0)
    om.commit_offsets("g", [off("old", 0, 1), off("cur", 0, 1)], 0)
    res = om.expire_offsets(8 * DAY, 7 * DAY, lambda g: False, subscribed_topics=lambda g: {"cur"})
    assert res.expired == {"g": [("old", 0)]} and res.deleted_groups == []
    assert [r.topic for r in om.fetch_offsets("g", None)] == ["cur"]
    om.close()


# -- gates and failures ---------------------------------------------------------------------------

def test_before_load_everything_is_load_in_progress(tmp_path):
    om = OffsetManager(GroupStateStore(str(tmp_path), "os", 0))
    assert om.commit_offsets("g", [off("t", 0, 1)], 1) == {("t", 0): E.coordinator_load_in_progress}
    assert fetch1(om, "g", "t", 0).error == E.coordinator_load_in_progress
    assert om.complete_txn(1, 0, True, 1) == E.coordinator_load_in_progress
    assert om.store_group("g", None, 1) == E.coordinator_load_in_progress
    om.close()


def test_a_write_that_may_have_landed_breaks_the_manager(tmp_path, monkeypatch):
    om = manager(tmp_path, flush="batch")
    om.commit_offsets("g", [off("t", 0, 1)], 1)

    def boom(fd):
        raise OSError(5, "EIO")
    monkeypatch.setattr(os, "fdatasync", boom)
    assert om.commit_offsets("g", [off("t", 0, 2)], 2) == {("t", 0): E.not_coordinator}
    assert om.broken
    assert fetch1(om, "g", "t", 0).error == E.not_coordinator
    assert om.txn_commit_offsets("g", 1, 0, [off("t", 0, 3)], 3) == {("t", 0): E.not_coordinator}
    monkeypatch.undo()
    om = restart(om, tmp_path)                  # a restart reloads what the log holds
    assert not om.broken and fetch1(om, "g", "t", 0).offset == 2
    om.close()


def test_regression_a_full_disk_logged_every_failed_commit(tmp_path, monkeypatch, caplog):
    """On a full disk every consumer's every commit failed with its own ERROR line (a dozen a
    second in the chaos suite): one report per interval, with the count of the others."""
    import errno
    import appliance.group.offsets as offsets_mod
    om = manager(tmp_path, flush="batch")
    om.commit_offsets("g", [off("t", 0, 1)], 1)
    now = [1000.0]
    om._clock = lambda: now[0]

    def full(fd, *a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(os, "pwrite", full)
    with caplog.at_level("ERROR", logger="appliance.group.offsets"):
        for i in range(5):
            assert om.commit_offsets("g", [off("t", 0, 2 + i)], 2 + i) == {("t", 0): E.not_coordinator}
        assert len(caplog.records) == 1
        now[0] += offsets_mod.FAILURE_LOG_INTERVAL_S
        om.commit_offsets("g", [off("t", 0, 9)], 9)
        assert len(caplog.records) == 2 and "4 more failed writes" in caplog.records[1].getMessage()
    monkeypatch.undo()
    assert not om.broken and fetch1(om, "g", "t", 0).offset == 1
    om.close()


def test_a_commit_too_large_for_the_log(tmp_path):
    om = manager(tmp_path, segment_bytes=4096)
    res = om.commit_offsets("g", [off("t", i, i, md="m" * 100) for i in range(100)], 1)
    assert set(res.values()) == {E.invalid_commit_offset_size}
    assert not om.broken and om.fetch_offsets("g", None) == []
    assert om.commit_offsets("g", [off("t", 0, 1)], 2) == {("t", 0): E.none}
    om.close()


def test_many_commits_with_compaction_and_restart(tmp_path):
    om = manager(tmp_path, compact_bytes=16384)
    for i in range(500):
        om.commit_offsets(f"g{i % 5}", [off("t", i % 7, i, md="x" * 20)], i)
        if i == 250:
            om.txn_commit_offsets("g0", 42, 1, [off("t", 99, 1234)], i)
    assert om.store.compactions >= 1
    expect = {g: om.fetch_offsets(g, None) for g in ("g0", "g1", "g2", "g3", "g4")}
    om = restart(om, tmp_path, compact_bytes=16384)
    assert {g: om.fetch_offsets(g, None) for g in expect} == expect
    assert fetch1(om, "g0", "t", 99, stable=True).error == E.unstable_offset_commit
    om.complete_txn(42, 1, True, 1000)
    assert fetch1(om, "g0", "t", 99).offset == 1234
    om.close()
    assert not os.path.exists(os.path.join(str(tmp_path), "log.compacting"))
