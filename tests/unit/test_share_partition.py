"""The share partition state machine (appliance.group.share_partition), the share-state log
(appliance.group.share_store) and the share coordinator's sessions and membership
(appliance.group.share_group), sans-IO: KIP-932's acquisition, acknowledgement, delivery limit,
lock expiry, start offset, session epochs, and the state a reopened log gives back."""

from __future__ import annotations

from appliance.errors import ErrorCode as E
from appliance.group.messages import (ShareAckBatch, ShareFetchPart, ShareFetchRequest,
                                      ShareGroupHeartbeatRequest)
from appliance.group.share_group import ShareConfig, ShareService
from appliance.group.share_partition import (ACCEPT, ACKNOWLEDGED, ARCHIVED, AVAILABLE, REJECT,
                                             RELEASE, SharePartition)
from appliance.group.share_store import ShareStateStore

LOCK, LIMIT = 1000, 3


def test_acquire_locks_records_for_one_member_up_to_max_records() -> None:
    sp = SharePartition(0)
    assert sp.acquire("a", 4, 10, 0, 0, LOCK, LIMIT) == [(0, 3, 1)]
    assert sp.acquire("b", 100, 10, 0, 0, LOCK, LIMIT) == [(4, 9, 1)]
    assert sp.acquire("c", 100, 10, 0, 0, LOCK, LIMIT) == []


def test_accept_moves_the_start_offset_and_only_the_holder_may_acknowledge() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 5, 5, 0, 0, LOCK, LIMIT)
    assert sp.acknowledge("b", [(0, 0, [ACCEPT])], LIMIT) == E.invalid_record_state
    assert sp.acknowledge("a", [(0, 1, [ACCEPT])], LIMIT) == E.none
    assert sp.start_offset == 2
    assert sp.acknowledge("a", [(0, 0, [ACCEPT])], LIMIT) == E.invalid_record_state
    # per-offset types: 2 rejected, 3 accepted, 4 released
    assert sp.acknowledge("a", [(2, 4, [REJECT, ACCEPT, RELEASE])], LIMIT) == E.none
    assert sp.start_offset == 4
    assert sp.acquire("b", 10, 5, 0, 0, LOCK, LIMIT) == [(4, 4, 2)]


def test_a_bad_batch_applies_nothing() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 3, 3, 0, 0, LOCK, LIMIT)
    assert sp.acknowledge("a", [(0, 0, [ACCEPT]), (5, 5, [ACCEPT])], LIMIT) == E.invalid_record_state
    assert sp.start_offset == 0
    assert sp.acknowledge("a", [(0, 1, [ACCEPT, ACCEPT, ACCEPT])], LIMIT) == E.invalid_request
    assert sp.acknowledge("a", [(0, 0, [4])], LIMIT) == E.invalid_request     # RENEW


def test_expired_locks_redeliver_until_the_delivery_limit_then_archive() -> None:
    sp = SharePartition(0)
    for n in range(1, LIMIT + 1):
        assert sp.acquire("a", 1, 1, 0, n * LOCK * 2, LOCK, LIMIT) == [(0, 0, n)]
    assert sp.expire(100 * LOCK, LIMIT)
    assert sp.start_offset == 1 and not sp.runs


def test_release_of_a_member_and_log_start_moves() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 5, 5, 0, 0, LOCK, LIMIT)
    assert sp.release_member("a", LIMIT)
    assert sp.counts() == {AVAILABLE: 5}
    assert sp.acquire("b", 10, 8, 3, 0, LOCK, LIMIT) == [(3, 4, 2), (5, 7, 1)]


def test_snapshot_writes_acquired_as_available_and_restores() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 6, 6, 0, 0, LOCK, LIMIT)
    sp.acknowledge("a", [(0, 0, [ACCEPT]), (2, 2, [ACCEPT]), (3, 3, [REJECT])], LIMIT)
    back = SharePartition.restore(sp.start_offset, 1, sp.snapshot())
    assert back.start_offset == 1 and back.end_offset == 6
    assert back.offsets() == {
        1: (AVAILABLE, 1), 2: (ACKNOWLEDGED, 1), 3: (ARCHIVED, 1), 4: (AVAILABLE, 1),
        5: (AVAILABLE, 1)}
    assert back.acquire("b", 10, 6, 0, 0, LOCK, LIMIT) == [(1, 1, 2), (4, 5, 2)]


def test_share_state_log_reopens_to_the_last_snapshot(tmp_path) -> None:
    sp = SharePartition(0)
    sp.acquire("a", 4, 4, 0, 0, LOCK, LIMIT)
    sp.acknowledge("a", [(0, 1, [ACCEPT])], LIMIT)
    store = ShareStateStore(str(tmp_path), "os", 0)
    store.load()
    from appliance.group.share_store import ShareSnapshot
    key = ("g", b"\x01" * 16, 0)
    store.write([(key, ShareSnapshot(0, 1, 0, 0, 0, []))], 1)
    store.write([(key, ShareSnapshot(1, 1, sp.start_offset, 0, 2, sp.snapshot()))], 2)
    store.close(clean=False)
    again = ShareStateStore(str(tmp_path), "os", 3)
    snaps = again.load()
    assert list(snaps) == [key]
    assert (snaps[key].snapshot_epoch, snaps[key].start_offset) == (1, 2)
    assert snaps[key].batches == sp.snapshot()
    again.close()


class Env:
    def __init__(self, tmp_path, sessions=None) -> None:
        self.now = 0
        self.hw = {(b"\x01" * 16, 0): 10}
        self.store = ShareStateStore(str(tmp_path), "os", 0)
        self.svc = ShareService(self.store, ShareConfig(record_lock_duration_ms=LOCK,
                                                        auto_offset_reset="earliest",
                                                        max_share_sessions=2 if sessions is None else sessions),
                                lambda: self.now, lambda: {"t": (b"\x01" * 16, 1)},
                                lambda t, p: (self.hw[(t, p)], 0) if (t, p) in self.hw else None)
        self.svc.load()

    def fetch(self, member, epoch, acks=(), parts=True, acquire=True, renew=False, conn=""):
        part = ShareFetchPart(b"\x01" * 16, 0, [ShareAckBatch(f, l, [t]) for f, l, t in acks])
        return self.svc.fetch(ShareFetchRequest("g", member, epoch, [part] if parts else [], [],
                                                acquire, 5, renew=renew, connection=conn))


def test_heartbeat_assigns_every_partition_to_every_member(tmp_path) -> None:
    env = Env(tmp_path)
    r1 = env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m1", 0, None, ["t"]))
    r2 = env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m2", 0, None, ["t"]))
    assert r1.error == r2.error == E.none
    assert [tuple(a.partitions) for a in r1.assignment] == [(0,)] == [
        tuple(a.partitions) for a in r2.assignment]
    again = env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m1", r1.member_epoch))
    assert again.error == E.none and again.assignment is None
    assert env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m1", 99)).error == E.fenced_member_epoch
    assert env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "mx", 3)).error == E.unknown_member_id


def test_share_session_epochs_and_acknowledgement_in_fetch(tmp_path) -> None:
    env = Env(tmp_path)
    assert env.fetch("m", 1).error == E.share_session_not_found
    r = env.fetch("m", 0)
    assert r.error == E.none and r.parts[0].acquired == [(0, 4, 1)]
    assert env.fetch("m", 5).error == E.invalid_share_session_epoch
    r = env.fetch("m", 1, acks=[(0, 4, ACCEPT)], parts=True)
    assert r.parts[0].ack_error == E.none and r.parts[0].acquired == [(5, 9, 1)]
    # ShareAcknowledge may not open a session; -1 closes it and releases the rest
    assert env.fetch("n", 0, acquire=False).error == E.invalid_share_session_epoch
    r = env.fetch("m", -1, acks=[(5, 6, ACCEPT)], acquire=False)
    assert r.parts[0].ack_error == E.none
    r = env.fetch("o", 0)
    assert r.parts[0].acquired == [(7, 9, 2)]
    assert env.fetch("p", 0).error == E.none
    assert env.fetch("q", 0).error == E.share_session_limit_reached
    env.svc.close()
    # reopened: what was accepted stays done, what was acquired is available again
    env2 = Env(tmp_path)
    r = env2.fetch("z", 0)
    assert r.parts[0].acquired == [(7, 9, 2)]
    env2.svc.close()


def test_regression_a_huge_max_records_is_held_to_the_record_lock_limit() -> None:
    from appliance.group.share_partition import MAX_RECORD_LOCKS
    sp = SharePartition(0)
    assert sp.acquire("a", 2**31 - 1, 10**9, 0, 0, LOCK, LIMIT) == [(0, MAX_RECORD_LOCKS - 1, 1)]
    assert sp.acquire("b", 10, 10**9, 0, 0, LOCK, LIMIT) == []
    sp.acknowledge("a", [(0, 9, [ACCEPT])], LIMIT)
    assert sp.acquire("b", 100, 10**9, 0, 0, LOCK, LIMIT) == [
        (MAX_RECORD_LOCKS, MAX_RECORD_LOCKS + 9, 1)]


def test_acquire_through_takes_the_rest_of_a_batch_that_is_available() -> None:
    # Kafka's batch_optimized acquisition: the rest of the log batch the acquisition ended in
    sp = SharePartition(0)
    assert sp.acquire("a", 3, 20, 0, 0, LOCK, LIMIT) == [(0, 2, 1)]
    assert sp.acquire("b", 2, 20, 0, 0, LOCK, LIMIT) == [(3, 4, 1)]
    # a's batch is 0-9: 3-4 are b's, the rest is a's; nothing at or past the high watermark
    assert sp.acquire_through("a", 3, 9, 8, 0, LOCK) == [(5, 7, 1)]
    assert sp.end_offset == 8
    assert sp.acquire_through("b", 20, 30, 40, 0, LOCK) == []        # past the window's end
    assert sp.acknowledge("a", [(0, 2, [ACCEPT]), (5, 7, [ACCEPT])], LIMIT) == E.none
    assert sp.acknowledge("b", [(3, 4, [ACCEPT])], LIMIT) == E.none
    assert sp.start_offset == 8 and not sp.runs


def test_regression_acknowledgements_sent_beside_the_leave_were_lost(tmp_path) -> None:
    # librdkafka closes by sending the leave heartbeat and the final ShareAcknowledge at once;
    # the leave used to drop the share session, so the final acknowledgements met
    # SHARE_SESSION_NOT_FOUND and their records were released and delivered again.
    env = Env(tmp_path)
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m", 0, None, ["t"]))
    assert env.fetch("m", 0).parts[0].acquired == [(0, 4, 1)]
    assert env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m", -1)).error == E.none
    r = env.fetch("m", -1, acks=[(0, 4, ACCEPT)], acquire=False)
    assert r.error == E.none and r.parts[0].ack_error == E.none
    assert env.fetch("n", 0).parts[0].acquired == [(5, 9, 1)]      # 0-4 never come back
    # a member that left and never sends its final request: released after the grace
    from appliance.group.share_group import LEFT_SESSION_GRACE_MS, TICK_MS
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "n", 0, None, ["t"]))
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "n", -1))
    env.now += LEFT_SESSION_GRACE_MS + TICK_MS
    env.svc.tick(env.now)
    assert ("g", "n") not in env.svc.sessions
    assert env.fetch("o", 0).parts[0].acquired == [(5, 9, 2)]
    env.svc.close()


def test_share_partition_max_record_locks_holds_the_window() -> None:
    # [groups] share_partition_max_record_locks (Kafka's group.share.partition.max.record.locks)
    import msgspec
    import pytest
    from appliance.config import GroupsConfig
    from appliance.group.share_group import share_config
    cfg = share_config(msgspec.convert({"share_partition_max_record_locks": 100}, GroupsConfig))
    assert cfg.max_record_locks == 100
    assert share_config(GroupsConfig()).max_record_locks == 2000
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"share_partition_max_record_locks": 50}, GroupsConfig)
    sp = SharePartition(0)
    assert sp.acquire("a", 500, 10**6, 0, 0, LOCK, LIMIT, cfg.max_record_locks) == [(0, 99, 1)]
    assert sp.acquire("b", 500, 10**6, 0, 0, LOCK, LIMIT, cfg.max_record_locks) == []


def test_regression_records_acquired_past_the_fetch_max_bytes_were_never_delivered(tmp_path) -> None:
    # librdkafka 0171 fetch_max_bytes_small: a ShareFetch acquired up to max_records, but its
    # max_bytes carried one batch; the rest went out acquired without records (the client takes
    # such offsets for gaps, or they stayed locked). Now the frontend gives them back: AVAILABLE,
    # their delivery count as before, acquired again by the next fetch.
    env = Env(tmp_path)
    tid = b"\x01" * 16
    assert env.fetch("m", 0).parts[0].acquired == [(0, 4, 1)]
    r = env.svc.fetch(ShareFetchRequest("g", "m", 1, [], [], True, 0, again=True,
                                        unacquire=[(tid, 0, 1, 4)]))
    assert r.error == E.none
    sp = env.svc.partitions[("g", tid, 0)]
    offs = sp.offsets()
    assert [(o, *offs[o]) for o in range(1, 5)] == [(o, AVAILABLE, 0) for o in range(1, 5)]
    assert env.fetch("n", 0).parts[0].acquired == [(1, 5, 1)]      # never counted as delivered
    # only the holder's ACQUIRED offsets are given back
    sp.unacquire("m", 1, 5)
    offs = sp.offsets()
    assert all(offs[o][0] == 1 for o in range(1, 6))
    env.svc.close()


# -- parked ShareFetches (Kafka's DelayedShareFetch) ---------------------------------------------

def _serve(env, member, epoch, acks=(), again=False, wait_ms=0, max_records=5):
    """ShareService.serve_fetch as the coordinator's registry calls it: the answers it gives (now
    or later) land in the returned list."""
    out: list = []
    part = ShareFetchPart(b"\x01" * 16, 0, [ShareAckBatch(f, l, [t]) for f, l, t in acks])
    env.svc.serve_fetch(ShareFetchRequest("g", member, epoch, [] if again else [part], [], True,
                                          max_records, again=again, wait_ms=wait_ms), out.append)
    return out


def test_a_member_that_finds_the_window_full_waits_for_the_holders_acknowledgement(tmp_path) -> None:
    env = Env(tmp_path)
    env.svc.cfg = ShareConfig(record_lock_duration_ms=LOCK, auto_offset_reset="earliest",
                              max_share_sessions=4, max_record_locks=100)
    env.hw[(b"\x01" * 16, 0)] = 1000
    assert _serve(env, "a", 0, max_records=100)[0].parts[0].acquired == [(0, 99, 1)]
    first = _serve(env, "b", 0)[0]          # the window is full of a's records
    assert first.park and not first.parts[0].acquired
    parked = _serve(env, "b", 1, again=True, wait_ms=500)
    assert parked == [] and len(env.svc._parked) == 1
    # a's acknowledgement frees locks: b's parked fetch acquires and is answered
    r = _serve(env, "a", 1, acks=[(0, 9, ACCEPT)], max_records=1)[0]
    assert r.parts[0].ack_error == E.none and r.parts[0].acquired == [(100, 100, 1)]
    assert parked and parked[0].parts[0].acquired == [(101, 105, 1)]
    assert env.svc._parked == []
    env.svc.close()


def test_regression_the_holder_of_the_window_was_parked_with_its_acknowledgements(tmp_path) -> None:
    # librdkafka fetches ahead: the member whose records fill the window asks for more before it
    # acknowledges them, and its acknowledgements ride on its next ShareFetch. Parked, that fetch
    # held the window's release behind it (the trial that made 8 members slower).
    env = Env(tmp_path)
    env.svc.cfg = ShareConfig(record_lock_duration_ms=LOCK, auto_offset_reset="earliest",
                              max_share_sessions=4, max_record_locks=100)
    env.hw[(b"\x01" * 16, 0)] = 1000
    assert _serve(env, "a", 0, max_records=100)[0].parts[0].acquired == [(0, 99, 1)]
    again = _serve(env, "a", 1)[0]
    assert not again.park and not again.parts[0].acquired
    answered = _serve(env, "a", 2, again=True, wait_ms=500)                 # at once
    assert len(answered) == 1 and not answered[0].parts[0].acquired
    assert env.svc._parked == []
    env.svc.close()


def test_a_parked_fetch_is_answered_at_its_wait_by_new_records_or_by_the_members_next_fetch(tmp_path) -> None:
    env = Env(tmp_path, sessions=4)
    assert _serve(env, "a", 0, max_records=10)[0].parts[0].acquired == [(0, 9, 1)]
    assert _serve(env, "b", 0)[0].park                      # a holds every record there is
    parked = _serve(env, "b", 1, again=True, wait_ms=300)
    env.now += 299
    env.svc.tick(env.now)
    assert parked == []
    env.now += 1
    env.svc.tick(env.now)                                   # the wait ran out: nothing
    assert len(parked) == 1 and parked[0].parts == [] and env.svc._parked == []
    # new records: found at the next tick
    parked = _serve(env, "b", 1, again=True, wait_ms=10_000)
    env.hw[(b"\x01" * 16, 0)] = 12
    env.now += 200
    env.svc.tick(env.now)
    assert parked[0].parts[0].acquired == [(10, 11, 1)]
    # a member's next ShareFetch ends the one it had parked (its client gave up on it)
    assert _serve(env, "c", 0)[0].park
    parked = _serve(env, "c", 1, again=True, wait_ms=10_000)
    assert _serve(env, "c", 1)[0].park and parked[0].parts == [] and env.svc._parked == []
    # the holder's lock expiry frees the records: the parked one gets them
    parked = _serve(env, "c", 2, again=True, wait_ms=10_000)
    env.now += LOCK
    env.svc.tick(env.now)
    assert parked[0].parts[0].acquired == [(0, 4, 2)]
    env.svc.close()


def test_an_incremental_first_try_without_acknowledgements_parks_at_once(tmp_path) -> None:
    # Kafka's DelayedShareFetch: a ShareFetch that finds the window full waits in the first call
    # (one hop instead of two), as the again-try it stands for: its session epoch moves once.
    env = Env(tmp_path)
    env.svc.cfg = ShareConfig(record_lock_duration_ms=LOCK, auto_offset_reset="earliest",
                              max_share_sessions=4, max_record_locks=100)
    env.hw[(b"\x01" * 16, 0)] = 1000
    assert _serve(env, "a", 0, max_records=100)[0].parts[0].acquired == [(0, 99, 1)]
    assert _serve(env, "b", 0)[0].park           # an opening fetch answers its partitions
    parked = _serve(env, "b", 1, wait_ms=500)
    assert parked == [] and len(env.svc._parked) == 1 and env.svc._parked[0].req.again
    assert env.svc.sessions[("g", "b")].epoch == 2
    r = _serve(env, "a", 1, acks=[(0, 9, ACCEPT)], max_records=1)[0]
    assert r.parts[0].acquired == [(100, 100, 1)]
    assert parked[0].parts[0].acquired == [(101, 105, 1)]
    # with acknowledgements it answers at once (they are answered before any wait), even
    # with nothing to acquire: c fills what b's acknowledgement freed, b acknowledges again
    assert _serve(env, "b", 2, acks=[(101, 105, ACCEPT)], max_records=1)[0].parts[0].acquired \
        == [(106, 106, 1)]
    assert _serve(env, "c", 0)[0].parts[0].acquired == [(107, 109, 1)]
    answered = _serve(env, "b", 3, acks=[(106, 106, ACCEPT)], wait_ms=500)
    assert len(answered) == 1 and answered[0].park and env.svc._parked == []
    env.svc.close()


def test_batch_ends_sent_alone_teach_the_share_partition_and_acquire_nothing(tmp_path) -> None:
    # A read that looked ahead and needed no extension tells the coordinator the batch ends it
    # saw (ShareFetchRequest.bounds alone); the next acquisition ends at one of them.
    env = Env(tmp_path)
    tid = b"\x01" * 16
    r = env.fetch("m", 0)
    assert r.parts[0].acquired == [(0, 4, 1)] and r.parts[0].bounds_left == 0
    told = env.svc.fetch(ShareFetchRequest("g", "m", 1, [], [], True, 0, again=True,
                                           bounds=[(tid, 0, [6, 8, 9])]))
    assert told.error == E.none and told.parts == []
    sp = env.svc.partitions[("g", tid, 0)]
    assert sp.bounds == [6, 8, 9] and sp.bounds_past(4) == 3 and sp.bounds_past(8) == 1
    r = env.fetch("n", 0)                  # 5-9 acquirable, max 5: ends at 9 anyway
    assert r.parts[0].acquired == [(5, 9, 1)] and r.parts[0].bounds_left == 0
    env.svc.close()


def test_renew_restarts_the_lock_of_held_records_only_when_the_request_renews() -> None:
    """KIP-1222: RENEW keeps the record ACQUIRED by its member with a new lock deadline and the
    same delivery count; it is INVALID_REQUEST without the request's is_renew_ack, and a
    record the member does not hold (its lock lapsed) is INVALID_RECORD_STATE."""
    from appliance.group.share_partition import ACQUIRED, RENEW
    sp = SharePartition(0)
    assert sp.acquire("a", 5, 5, 0, 0, LOCK, LIMIT) == [(0, 4, 1)]
    assert sp.acknowledge("a", [(0, 4, [RENEW])], LIMIT) == E.invalid_request
    # at 900 ms: offsets 0-2 renewed until 1900, 3 accepted in the same batch, 4 left as it was
    assert sp.acknowledge("a", [(0, 3, [RENEW, RENEW, RENEW, ACCEPT])], LIMIT, 900 + LOCK) == E.none
    assert sp.counts() == {ACQUIRED: 4, ACKNOWLEDGED: 1}
    assert sp.expire(LOCK, LIMIT)                     # 4's lock lapses at 1000, the others' not
    assert sp.counts() == {ACQUIRED: 3, ACKNOWLEDGED: 1, AVAILABLE: 1}
    assert sp.acknowledge("a", [(4, 4, [RENEW])], LIMIT, 1000 + LOCK) == E.invalid_record_state
    assert sp.acknowledge("b", [(0, 0, [RENEW])], LIMIT, 1000 + LOCK) == E.invalid_record_state
    assert not sp.expire(1899, LIMIT)
    assert sp.acknowledge("a", [(0, 2, [ACCEPT])], LIMIT) == E.none
    assert sp.start_offset == 4
    assert sp.acquire("b", 10, 5, 0, 2000, LOCK, LIMIT) == [(4, 4, 2)]   # count kept by RENEW


def test_share_acknowledge_renews_through_the_service_only_with_is_renew_ack(tmp_path) -> None:
    env = Env(tmp_path)
    r = env.fetch("m", 0)
    assert r.parts[0].acquired == [(0, 4, 1)]
    r = env.fetch("m", 1, acks=[(0, 4, 4)], acquire=False)
    assert r.parts[0].ack_error == E.invalid_request
    r = env.fetch("m", 2, acks=[(0, 4, 4)], acquire=False, renew=True)
    assert r.parts[0].ack_error == E.none and r.lock_ms > 0
    env.svc.close()


def test_a_renew_only_acknowledgement_writes_no_share_state(tmp_path) -> None:
    """RENEW (KIP-1222) moves only a lock's deadline, which the snapshot does not carry: no
    write for it (there was one per renew); an ACCEPT beside it is written."""
    env = Env(tmp_path)
    assert env.fetch("m", 0).parts[0].acquired == [(0, 4, 1)]
    writes = []
    real = env.store.write
    env.store.write = lambda *a, **k: (writes.append(a), real(*a, **k))[1]
    r = env.fetch("m", 1, acks=[(0, 4, 4)], acquire=False, renew=True)
    assert r.parts[0].ack_error == E.none and writes == []
    r = env.fetch("m", 2, acks=[(0, 1, 4), (2, 4, 1)], acquire=False, renew=True)
    assert r.parts[0].ack_error == E.none and len(writes) == 1
    env.svc.close()


def test_regression_acknowledgements_whose_write_failed_stayed_done(tmp_path) -> None:
    """An ACCEPT whose share-state write failed (a full disk) was answered
    COORDINATOR_NOT_AVAILABLE but stayed applied in memory: the records were never delivered
    again, though the member was told its acknowledgement failed. Now they are rolled back (as
    Kafka's SharePartition on a failed persister write): still ACQUIRED by the member, and
    delivered again once the lock expires."""
    from appliance.group.share_partition import ACQUIRED
    from appliance.group.share_store import ShareLogWriteError
    env = Env(tmp_path)
    assert env.fetch("m", 0).parts[0].acquired == [(0, 4, 1)]
    real = env.store.write

    def full(*a, **k):
        raise ShareLogWriteError(E.kafka_storage_error, "No space left on device", maybe_written=False)
    env.store.write = full
    r = env.fetch("m", 1, acks=[(0, 4, ACCEPT)], acquire=False)
    assert r.parts[0].ack_error == E.coordinator_not_available
    sp = env.svc.partitions[("g", b"\x01" * 16, 0)]
    assert sp.start_offset == 0 and sp.counts().get(ACQUIRED) == 5
    env.store.write = real
    env.now = LOCK + 1
    assert sp.expire(env.now, 5)
    assert env.fetch("n", 0).parts[0].acquired == [(0, 4, 2)]
    env.svc.close()


def test_a_closed_connection_closes_its_share_sessions_and_releases_their_records(tmp_path) -> None:
    # Kafka's ShareSessionCache disconnect listener: a consumer killed -9 loses its records to
    # the others when its socket closes, not at the end of their locks.
    from appliance.group.messages import ShareConnectionClosed
    env = Env(tmp_path)
    assert env.fetch("m", 0, conn="fe-1").parts[0].acquired == [(0, 4, 1)]
    assert env.fetch("n", 0, conn="fe-2").parts[0].acquired == [(5, 9, 1)]
    # another connection's close, or a session the connection did not open: nothing
    assert env.svc.connection_closed(ShareConnectionClosed("fe-3", [("g", "m")])).closed == 0
    assert env.svc.connection_closed(ShareConnectionClosed("fe-1", [("g", "x")])).closed == 0
    assert ("g", "m") in env.svc.sessions
    assert env.svc.connection_closed(ShareConnectionClosed("fe-1", [("g", "m")])).closed == 1
    assert ("g", "m") not in env.svc.sessions
    assert env.fetch("m", 1).error == E.share_session_not_found
    # the released records go to the next member at once, delivered a second time
    assert env.fetch("o", 0, conn="fe-4").parts[0].acquired == [(0, 4, 2)]
    # a session opened again on a new connection is not the old connection's any more
    assert env.fetch("n", 0, conn="fe-5").error == E.none
    assert env.svc.connection_closed(ShareConnectionClosed("fe-2", [("g", "n")])).closed == 0
    assert ("g", "n") in env.svc.sessions
    env.svc.close()


def test_a_restarted_frontend_closes_the_share_sessions_of_its_killed_predecessor(tmp_path) -> None:
    # A frontend killed -9 tells nobody that its connections closed: the next process of that
    # name does, closing every session opened on a connection of an earlier process.
    from appliance.group.messages import ShareFrontendStarted
    env = Env(tmp_path, sessions=4)
    assert env.fetch("m", 0, conn="frontend-0/100/1").parts[0].acquired == [(0, 4, 1)]
    assert env.fetch("n", 0, conn="frontend-1/200/1").parts[0].acquired == [(5, 9, 1)]
    assert env.svc.frontend_started(ShareFrontendStarted("frontend-0", 100)).closed == 0
    r = env.svc.frontend_started(ShareFrontendStarted("frontend-0", 300))
    assert r.error == E.none and r.closed == 1
    assert ("g", "m") not in env.svc.sessions and ("g", "n") in env.svc.sessions
    assert env.fetch("o", 0, conn="frontend-0/300/1").parts[0].acquired == [(0, 4, 2)]
    # the new process's own sessions stay when it is said again
    assert env.svc.frontend_started(ShareFrontendStarted("frontend-0", 300)).closed == 0
    env.svc.close()
