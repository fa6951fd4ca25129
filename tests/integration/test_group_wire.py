"""Transactional offsets and group fencing at the wire, against the real appliance: KIP-98's
offsets committed in a transaction (invisible until the COMMIT marker, never after an abort,
pending across a coordinator restart, stale producer epochs fenced) and KIP-447's group checks of
TxnOffsetCommit.

Everything is driven by hand with ``RawClient`` (helpers in ``group_wire.py``, ``txn_wire.py`` and ``raw_wire.py``): InitProducerId,
AddOffsetsToTxn, TxnOffsetCommit at each version, EndTxn, OffsetCommit, OffsetFetch with and
without RequireStable, JoinGroup/SyncGroup on separate connections to make generations. Error
codes are the broker's own, checked against what Kafka answers (KafkaApis, the group
coordinator's OffsetMetadataManager / ClassicGroup.validateOffsetCommit, and the transaction
verification of ReplicaManager / AddPartitionsToTxnManager):

- a stale producer epoch: the verification gets PRODUCER_FENCED from the transaction coordinator
  and AddPartitionsToTxnManager turns it into INVALID_PRODUCER_EPOCH (47) for every version;
- the group's offsets partition not in the transaction (no AddOffsetsToTxn): the coordinator
  says TRANSACTION_ABORTABLE, passed on to v4 (``genericError``) and turned into
  INVALID_TXN_STATE (48) for v0-3;
- group checks (v3+ with group metadata): UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID first
  (validateMember), then ILLEGAL_GENERATION; none with generation -1 and no member; the group
  state does not matter for transactional commits.

Restarts: the coordinator worker killed -9 (the supervisor restarts it), and the whole appliance
killed -9 and started again on the same data dir.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from group_wire import (committed, describe_group, fetch_offsets, join, new_member_id,
                        offset_commit, recv_join, send_join, sync, txn_offset_commit,
                        wait_committed)
from raw_wire import (COORDINATOR_NOT_AVAILABLE, FENCED_INSTANCE_ID, ILLEGAL_GENERATION,
                      INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, NONE, REBALANCE_IN_PROGRESS,
                      RETRIABLE, TRANSACTION_ABORTABLE, UNKNOWN_MEMBER_ID, UNSTABLE_OFFSET_COMMIT,
                      RawClient, create_topic, retry)
from txn_wire import add_offsets, end_txn, init_producer

# Fresh groups form at once (no initial rebalance delay).
GROUPS = {"initial_rebalance_delay_ms": 0}
TOPIC = "gw-in"
TP0, TP1, TP2 = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)


def start(appliance_factory, **kw):
    a = appliance_factory(groups=GROUPS, **kw)
    with RawClient(a.bootstrap) as raw:
        create_topic(raw, TOPIC, 3)
    return a


def end_version(v: int) -> int:
    """The EndTxn version that goes with TxnOffsetCommit ``v``: a v5 client speaks transaction
    version 2 (KIP-890 part 2), EndTxn v5."""
    return 5 if v >= 5 else 3


def begin_offsets(raw, tid, pid, epoch, group, v):
    """What a client does before TxnOffsetCommit ``v``: AddOffsetsToTxn, except for v5, which
    adds the group's offsets partition itself."""
    if v < 5:
        assert add_offsets(raw, tid, pid, epoch, group) == NONE


def must_end(raw, tid, pid, epoch, commit, v=3):
    r = end_txn(raw, tid, pid, epoch, commit, version=end_version(v))
    assert r.error_code == NONE, r


# -- 47, 48 ---------------------------------------------------------------------------------------

def test_txn_offsets_hidden_until_commit_marker_never_after_abort_unstable_meanwhile(appliance_factory):
    a = start(appliance_factory)
    group, tid = "g47", "g47-txn"
    with RawClient(a.bootstrap) as raw:
        assert offset_commit(raw, group, {TP0: 5, TP2: 7}) == {TP0: NONE, TP2: NONE}
        pid, epoch = init_producer(raw, tid)
        assert add_offsets(raw, tid, pid, epoch, group) == NONE
        assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 10, TP1: 20}) == {TP0: NONE, TP1: NONE}

        # 47: pending offsets are not returned, by any OffsetFetch version; 48: without
        # RequireStable (or before v7, which cannot ask) the last committed offset.
        for v in range(1, 10):
            assert fetch_offsets(raw, group, [TP0, TP1, TP2], version=v) == \
                (NONE, {TP0: (NONE, 5), TP1: (NONE, -1), TP2: (NONE, 7)}), v
        # 48: with RequireStable, UNSTABLE_OFFSET_COMMIT for exactly the partitions with pending
        # offsets (TP2 has none: its committed offset).
        for v in (7, 8, 9):
            err, got = fetch_offsets(raw, group, [TP0, TP1, TP2], require_stable=True, version=v)
            assert err == NONE, (v, err)
            assert {tp: e for tp, (e, _) in got.items()} == \
                {TP0: UNSTABLE_OFFSET_COMMIT, TP1: UNSTABLE_OFFSET_COMMIT, TP2: NONE}, (v, got)
            assert got[TP2] == (NONE, 7), (v, got)
        # another group is not affected by this group's pending offsets
        assert committed(raw, "g47-other", [TP0], require_stable=True) == {TP0: -1}

        # The COMMIT marker makes them visible (it lands after EndTxn is answered: poll).
        must_end(raw, tid, pid, epoch, True)
        wait_committed(raw, group, {TP0: 10, TP1: 20, TP2: 7})
        assert committed(raw, group, [TP0, TP1, TP2]) == {TP0: 10, TP1: 20, TP2: 7}

        # The next transaction of the same producer aborts: its offsets are never returned.
        assert add_offsets(raw, tid, pid, epoch, group) == NONE
        assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 99, TP1: 98}) == {TP0: NONE, TP1: NONE}
        assert committed(raw, group, [TP0, TP1]) == {TP0: 10, TP1: 20}
        assert committed(raw, group, [TP0, TP1], require_stable=True) == {TP0: "unstable", TP1: "unstable"}
        must_end(raw, tid, pid, epoch, False)
        wait_committed(raw, group, {TP0: 10, TP1: 20})
        for v in range(1, 10):
            assert fetch_offsets(raw, group, [TP0, TP1], version=v) == (NONE, {TP0: (NONE, 10), TP1: (NONE, 20)}), v


# -- 49 -------------------------------------------------------------------------------------------

def _coordinator_pid(a) -> int:
    (pid,) = [w["pid"] for w in a.workers("coordinator")]
    return pid


def _kill(a, how: str) -> None:
    if how == "coordinator":
        old = _coordinator_pid(a)
        os.kill(old, signal.SIGKILL)
        a.wait_for(lambda: _coordinator_pid(a) != old, 30, "coordinator restart")
    else:
        a.kill9_all()
        a.start()


def _offsets_after_restart(raw, group, tps, require_stable):
    """OffsetFetch retried while the restarted coordinator loads."""
    def op():
        err, got = fetch_offsets(raw, group, tps, require_stable=require_stable)
        if err != NONE:
            return err
        if any(e in RETRIABLE for e, _ in got.values()):
            return COORDINATOR_NOT_AVAILABLE
        return got
    got = retry(op)
    assert isinstance(got, dict), got
    return got


@pytest.mark.parametrize("kill", ["coordinator", "everything"])
def test_pending_txn_offsets_survive_coordinator_restart_until_the_marker(appliance_factory, kill):
    """Three transactions hold pending offsets (three groups) when the coordinator dies: after
    the restart one commits, one aborts, one stays open; after a second restart the first two
    outcomes are still there (their markers are in the log) and the third is still pending
    until its own commit."""
    a = start(appliance_factory)
    txns = {}                       # outcome -> (group, transactional id, pid, epoch)
    with RawClient(a.bootstrap) as raw:
        for outcome in ("commit", "abort", "later"):
            group, tid = f"g49-{outcome}", f"g49-txn-{outcome}"
            assert offset_commit(raw, group, {TP0: 5}) == {TP0: NONE}
            pid, epoch = init_producer(raw, tid)
            assert add_offsets(raw, tid, pid, epoch, group) == NONE
            assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 50, TP1: 60}) == {TP0: NONE, TP1: NONE}
            txns[outcome] = (group, tid, pid, epoch)
        for group, *_ in txns.values():
            assert committed(raw, group, [TP0, TP1], require_stable=True) == {TP0: "unstable", TP1: "unstable"}

    pending = {TP0: (UNSTABLE_OFFSET_COMMIT, -1), TP1: (UNSTABLE_OFFSET_COMMIT, -1)}
    before = {TP0: (NONE, 5), TP1: (NONE, -1)}
    done = {TP0: (NONE, 50), TP1: (NONE, 60)}
    _kill(a, kill)
    with RawClient(a.bootstrap) as raw:
        # Replayed from the group log: still pending, neither dropped nor materialized.
        for group, *_ in txns.values():
            assert _offsets_after_restart(raw, group, [TP0, TP1], True) == pending, group
            assert _offsets_after_restart(raw, group, [TP0, TP1], False) == before, group
        # The producers end their transactions (retrying while the coordinator loads).
        for outcome in ("commit", "abort"):
            _, tid, pid, epoch = txns[outcome]
            r = retry(lambda: end_txn(raw, tid, pid, epoch, outcome == "commit"))
            assert r.error_code == NONE, (outcome, r)
        wait_committed(raw, "g49-commit", {TP0: 50, TP1: 60})
        wait_committed(raw, "g49-abort", {TP0: 5, TP1: -1})
        assert committed(raw, "g49-later", [TP0, TP1], require_stable=True) == {TP0: "unstable", TP1: "unstable"}

    _kill(a, kill)
    with RawClient(a.bootstrap) as raw:
        assert _offsets_after_restart(raw, "g49-commit", [TP0, TP1], True) == done
        assert _offsets_after_restart(raw, "g49-abort", [TP0, TP1], True) == before
        assert _offsets_after_restart(raw, "g49-later", [TP0, TP1], True) == pending
        assert _offsets_after_restart(raw, "g49-later", [TP0, TP1], False) == before
        _, tid, pid, epoch = txns["later"]
        r = retry(lambda: end_txn(raw, tid, pid, epoch, True))
        assert r.error_code == NONE, r
        wait_committed(raw, "g49-later", {TP0: 50, TP1: 60})


# -- 50 -------------------------------------------------------------------------------------------

def test_stale_producer_epoch_is_fenced_and_writes_nothing(appliance_factory):
    a = start(appliance_factory)
    with RawClient(a.bootstrap) as raw:
        for v in range(6):
            _stale_epoch(raw, v)


def _stale_epoch(raw, v):
    group, tid = f"g50-{v}", f"g50-txn-{v}"
    pid, zombie_epoch = init_producer(raw, tid)
    begin_offsets(raw, tid, pid, zombie_epoch, group, v)
    assert txn_offset_commit(raw, tid, group, pid, zombie_epoch, {TP0: 10}, version=v) == {TP0: NONE}
    assert committed(raw, group, [TP0], require_stable=True) == {TP0: "unstable"}

    # A new instance of the producer: InitProducerId bumps the epoch and aborts the open
    # transaction; its pending offset is dropped.
    pid2, epoch = init_producer(raw, tid)
    assert pid2 == pid and epoch > zombie_epoch
    wait_committed(raw, group, {TP0: -1})

    # The zombie commits again with its old epoch: fenced (Kafka: INVALID_PRODUCER_EPOCH for
    # every version), nothing written, nothing pending.
    assert txn_offset_commit(raw, tid, group, pid, zombie_epoch, {TP0: 11, TP1: 11}, version=v) == \
        {TP0: INVALID_PRODUCER_EPOCH, TP1: INVALID_PRODUCER_EPOCH}, v
    assert committed(raw, group, [TP0, TP1], require_stable=True) == {TP0: -1, TP1: -1}

    # The new instance commits normally, and only its offset appears.
    begin_offsets(raw, tid, pid, epoch, group, v)
    assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 12}, version=v) == {TP0: NONE}
    must_end(raw, tid, pid, epoch, True, v)
    wait_committed(raw, group, {TP0: 12, TP1: -1})


# -- 51 -------------------------------------------------------------------------------------------

def _two_member_group(ra, rb, group):
    """A joins (generation 1) and syncs; B joins, which rebalances the group: both rejoin into
    generation 2 and sync. Returns (a_id, b_id)."""
    ja = join(ra, group)
    a_id = ja.member_id
    assert ja.generation_id == 1 and ja.leader == a_id, ja
    assert sync(ra, group, 1, a_id, {a_id: b"a-1"}).error_code == NONE
    b_id = new_member_id(rb, group)
    pending_b = send_join(rb, group, b_id)             # parked until A rejoins
    deadline = time.monotonic() + 10
    while describe_group(ra, group).group_state != "PreparingRebalance":
        assert time.monotonic() < deadline, describe_group(ra, group)
        time.sleep(0.02)
    ja2 = recv_join(ra, send_join(ra, group, a_id))
    jb = recv_join(rb, pending_b)
    assert ja2.error_code == jb.error_code == NONE, (ja2, jb)
    assert ja2.generation_id == jb.generation_id == 2, (ja2, jb)
    leader, follower = (ra, rb) if ja2.leader == a_id else (rb, ra)
    lid, fid = (a_id, b_id) if ja2.leader == a_id else (b_id, a_id)
    pending_f = sync(follower, group, 2, fid, wait=False)
    assert sync(leader, group, 2, lid, {a_id: b"a-2", b_id: b"b-2"}).error_code == NONE
    assert follower.read_response(14, 3, pending_f).error_code == NONE
    assert describe_group(ra, group).group_state == "Stable"
    return a_id, b_id


def test_old_generation_and_unknown_member_are_refused_and_write_nothing(appliance_factory):
    a = start(appliance_factory)
    group = "g51"
    with RawClient(a.bootstrap) as ra, RawClient(a.bootstrap) as rb:
        a_id, b_id = _two_member_group(ra, rb, group)
        last = {TP0: -1, TP1: -1}
        for v in (3, 4, 5):
            tid = f"g51-txn-{v}"
            pid, epoch = init_producer(ra, tid)
            begin_offsets(ra, tid, pid, epoch, group, v)
            offsets = {TP0: 100 + v, TP1: 200 + v}
            # A zombie of generation 1 (A is still a member, of generation 2).
            assert txn_offset_commit(ra, tid, group, pid, epoch, offsets, version=v, generation=1,
                                     member=a_id) == {TP0: ILLEGAL_GENERATION, TP1: ILLEGAL_GENERATION}, v
            assert committed(ra, group, [TP0, TP1], require_stable=True) == last, v
            # A member the group does not know (e.g. removed by a rebalance).
            assert txn_offset_commit(ra, tid, group, pid, epoch, offsets, version=v, generation=2,
                                     member="no-such-member") == {TP0: UNKNOWN_MEMBER_ID, TP1: UNKNOWN_MEMBER_ID}, v
            assert committed(ra, group, [TP0, TP1], require_stable=True) == last, v
            # The current generation and member: accepted, pending, then committed.
            assert txn_offset_commit(ra, tid, group, pid, epoch, offsets, version=v, generation=2,
                                     member=b_id) == {TP0: NONE, TP1: NONE}, v
            assert committed(ra, group, [TP0, TP1], require_stable=True) == {TP0: "unstable", TP1: "unstable"}
            must_end(ra, tid, pid, epoch, True, v)
            wait_committed(ra, group, offsets)
            last = offsets


def test_replaced_static_member_is_fenced(appliance_factory):
    a = start(appliance_factory)
    group = "g51-static"
    with RawClient(a.bootstrap) as r1, RawClient(a.bootstrap) as r2:
        first = join(r1, group, instance="inst-1")
        old_id = first.member_id
        assert sync(r1, group, first.generation_id, old_id, {old_id: b"x"}, instance="inst-1").error_code == NONE
        # A new incarnation of the same group.instance.id takes over with a new member id.
        second = join(r2, group, instance="inst-1")
        new_id, gen = second.member_id, second.generation_id
        assert new_id != old_id
        last = {TP0: -1}
        for v in (3, 4, 5):
            tid = f"g51s-txn-{v}"
            pid, epoch = init_producer(r1, tid)
            begin_offsets(r1, tid, pid, epoch, group, v)
            assert txn_offset_commit(r1, tid, group, pid, epoch, {TP0: 10 + v}, version=v, generation=gen,
                                     member=old_id, instance="inst-1") == {TP0: FENCED_INSTANCE_ID}, v
            assert committed(r1, group, [TP0], require_stable=True) == last, v
            # An instance id the group does not know.
            assert txn_offset_commit(r1, tid, group, pid, epoch, {TP0: 10 + v}, version=v, generation=gen,
                                     member=new_id, instance="inst-2") == {TP0: UNKNOWN_MEMBER_ID}, v
            assert committed(r1, group, [TP0], require_stable=True) == last, v
            # The current incarnation commits.
            assert txn_offset_commit(r2, tid, group, pid, epoch, {TP0: 10 + v}, version=v, generation=gen,
                                     member=new_id, instance="inst-1") == {TP0: NONE}, v
            must_end(r2, tid, pid, epoch, True, v)
            last = {TP0: 10 + v}
            wait_committed(r1, group, last)


# -- 52 -------------------------------------------------------------------------------------------

def test_default_group_metadata_skips_group_checks(appliance_factory):
    a = start(appliance_factory)
    group = "g52"
    with RawClient(a.bootstrap) as raw:
        j = join(raw, group)
        member = j.member_id
        assert sync(raw, group, j.generation_id, member, {member: b"m"}).error_code == NONE
        # A plain OffsetCommit without member / generation to a non-empty group is refused
        # (Kafka: only members commit there)...
        assert offset_commit(raw, group, {TP0: 1}) == {TP0: UNKNOWN_MEMBER_ID}
        # ...but a transactional one with the defaults (v0-2 have no such fields) is accepted.
        for v in range(6):
            tid = f"g52-txn-{v}"
            pid, epoch = init_producer(raw, tid)
            begin_offsets(raw, tid, pid, epoch, group, v)
            assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 100 + v, TP1: 200 + v},
                                     version=v) == {TP0: NONE, TP1: NONE}, v
            must_end(raw, tid, pid, epoch, True, v)
            wait_committed(raw, group, {TP0: 100 + v, TP1: 200 + v})
        # The group itself is untouched: same member, same generation, still Stable.
        d = describe_group(raw, group)
        assert d.group_state == "Stable" and [m.member_id for m in d.members] == [member], d
        # and a member in a group that is rebalancing (CompletingRebalance: joined, not synced)
        # may commit transactionally with its generation; plain commits wait for the sync.
        j2 = join(raw, group, member)
        assert j2.generation_id == j.generation_id + 1
        assert describe_group(raw, group).group_state == "CompletingRebalance"
        assert offset_commit(raw, group, {TP0: 1}, generation=j2.generation_id, member=member) == \
            {TP0: REBALANCE_IN_PROGRESS}
        tid = "g52-txn-rebalancing"
        pid, epoch = init_producer(raw, tid)
        assert add_offsets(raw, tid, pid, epoch, group) == NONE
        assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 300}, version=3,
                                 generation=j2.generation_id, member=member) == {TP0: NONE}
        must_end(raw, tid, pid, epoch, True)
        wait_committed(raw, group, {TP0: 300})


# -- TxnOffsetCommit without AddOffsetsToTxn ------------------------------------------------------

def test_txn_offset_commit_v4_without_add_offsets_gets_transaction_abortable(appliance_factory):
    """Kafka verifies that the transaction holds the group's offsets partition (KIP-890 part 1):
    its coordinator answers TRANSACTION_ABORTABLE, which v4 clients get as is and v0-3 clients
    as INVALID_TXN_STATE (AddPartitionsToTxnManager). The appliance answered INVALID_TXN_STATE
    to v4 too. Nothing is written. Both with no transaction at all and with an ongoing one that
    holds a data partition but not the offsets partition."""
    a = start(appliance_factory)
    with RawClient(a.bootstrap) as raw:
        for ongoing in (False, True):
            for v in range(5):
                group, tid = f"noadd-{ongoing}-{v}", f"noadd-txn-{ongoing}-{v}"
                pid, epoch = init_producer(raw, tid)
                if ongoing:
                    r = raw.request(24, 3, {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                                            "v3_and_below_producer_epoch": epoch,
                                            "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]})
                    assert [p.partition_error_code for t in r.results_by_topic_v3_and_below
                            for p in t.results_by_partition] == [NONE], r
                want = TRANSACTION_ABORTABLE if v >= 4 else INVALID_TXN_STATE
                assert txn_offset_commit(raw, tid, group, pid, epoch, {TP0: 7}, version=v) == {TP0: want}, (ongoing, v)
                assert committed(raw, group, [TP0], require_stable=True) == {TP0: -1}, (ongoing, v)
                if ongoing:
                    must_end(raw, tid, pid, epoch, False)
