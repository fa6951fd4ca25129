"""EndTxn and the end of every transaction (appliance.txn.end_txn, through the
TransactionCoordinator): Prepare* logged before the markers, Complete* once every partition
answered, what each marker answer does; one test per behaviour of KIP-98, KIP-890 and KIP-939,
named after it (the coordinator of ``txnkit``: a fake clock, restarts on the same directory)."""

import pytest

from appliance.catalog.model import OFFSETS_TOPIC
from appliance.errors import ErrorCode as E
from appliance.txn.metadata import MAX_EPOCH, TransactionState as S

from txnkit import INTERVAL, TIMEOUT, Env, at_epoch, env  # noqa: F401 (env is a fixture)


def test_commit_prepare_is_durable_before_markers_and_complete_after_all_acks(env):
    pid, ep = env.begin(parts=[("a", 0), ("b", 1), ("c", 2)])
    assert env.tc.end_txn("t", pid, ep, True).error == E.none
    [job] = env.tc.markers.take_marker_jobs()
    assert job.coordinator_epoch == env.tc.coordinator_epoch
    assert (job.producer_id, job.producer_epoch, job.commit) == (pid, ep, True)
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.state() == S.PrepareCommit
    tc = env.crash_restart()                 # a crash now: PrepareCommit is what the log says
    assert tc.get("t").state == S.PrepareCommit
    [job] = tc.markers.take_marker_jobs()
    env.ack_all([job])
    assert tc.get("t").state == S.CompleteCommit
    assert env.crash_restart().get("t").state == S.CompleteCommit


def test_prepare_is_in_log_before_end_txn_returns(env, monkeypatch):
    pid, ep = env.begin()
    seen = []
    real = env.sm.append
    monkeypatch.setattr(env.sm, "append", lambda m: (seen.append(m.state), real(m)))
    env.tc.end_txn("t", pid, ep, True)
    assert seen == [S.PrepareCommit] and env.tc.markers.take_marker_jobs()


def test_abort_sends_abort_markers_to_every_partition(env):
    parts = [("a", 0), ("a", 1), ("b", 0), (OFFSETS_TOPIC, 3)]
    pid, ep = env.begin(parts=parts)
    assert env.tc.end_txn("t", pid, ep, False).error == E.none
    [job] = env.tc.markers.take_marker_jobs()
    assert not job.commit and job.partitions == sorted(parts)
    env.ack_all([job])
    assert env.state() == S.CompleteAbort and env.tc.get("t").partitions == set()


@pytest.mark.parametrize("version", [3, 5])
@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_retry_after_completion(env, version, commit):
    pid, ep = env.begin()
    r = env.tc.end_txn("t", pid, ep, commit, api_version=version)
    env.ack_all()
    again = env.tc.end_txn("t", pid, ep, commit, api_version=version)      # the answer was lost
    assert again == r and again.error == E.none
    assert env.tc.end_txn("t", pid, ep, not commit, api_version=version).error == E.invalid_txn_state
    tc = env.crash_restart()                   # retry after a coordinator failover
    assert tc.end_txn("t", pid, ep, commit, api_version=version) == r


def test_end_txn_on_empty_is_invalid_state(env):
    pid, ep = env.init()
    for v in (0, 3, 5):
        assert env.tc.end_txn("t", pid, ep, True, api_version=v).error == E.invalid_txn_state
        assert env.tc.end_txn("t", pid, ep, False, api_version=v).error == E.invalid_txn_state
    assert env.state() == S.Empty


@pytest.mark.parametrize("commit", [True, False])
def test_restart_after_prepare_resends_markers_with_new_coordinator_epoch(env, commit):
    pid, ep = env.begin(parts=[("a", 0), ("b", 1)])
    env.tc.end_txn("t", pid, ep, commit)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    old_epoch = env.tc.coordinator_epoch
    tc = env.crash_restart()
    assert tc.coordinator_epoch == old_epoch + 1
    [job2] = tc.markers.take_marker_jobs()             # no client action needed
    assert (job2.commit, job2.producer_id, job2.producer_epoch) == (commit, pid, ep)
    assert job2.partitions == [("a", 0), ("b", 1)] and job2.coordinator_epoch == old_epoch + 1
    assert tc.init_producer_id("t", TIMEOUT).error == E.concurrent_transactions
    env.ack_all([job2])
    assert tc.get("t").state == (S.CompleteCommit if commit else S.CompleteAbort)


@pytest.mark.parametrize("version", [3, 5])
def test_empty_transaction_completes_without_markers(env, version):
    pid, ep = env.init()
    assert env.tc.add_partitions("t", pid, ep, []) == {}
    assert env.state() == S.Ongoing
    r = env.tc.end_txn("t", pid, ep, True, api_version=version)
    assert r.error == E.none
    assert env.tc.markers.take_marker_jobs() == []
    assert env.state() == S.CompleteCommit
    assert env.crash_restart().get("t").state == S.CompleteCommit


def test_prepare_other_command_without_pending_markers_is_invalid_state(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.invalid_producer_epoch)    # job abandoned
    assert env.tc.end_txn("t", pid, ep, False).error == E.invalid_txn_state
    assert env.tc.end_txn("t", pid, ep, True).error == E.concurrent_transactions


# -- KIP-890 ---------------------------------------------------------------------------------------

def test_tv2_end_txn_bumps_epoch_in_reply_and_markers(env):
    pid, ep = env.begin()
    r = env.tc.end_txn("t", pid, ep, True, api_version=5)
    assert (r.error, r.producer_id, r.producer_epoch) == (E.none, pid, ep + 1)
    [job] = env.tc.markers.take_marker_jobs()
    assert job.producer_epoch == ep + 1
    env.ack_all([job])
    md = env.tc.get("t")
    assert (md.producer_id, md.producer_epoch, md.client_txn_version) == (pid, ep + 1, 2)
    # the old epoch is fenced, the new one starts the next transaction
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=True) == E.invalid_producer_epoch
    assert env.tc.verify_partition("t", pid, ep + 1, ("a", 0), add=True) == E.none
    r2 = env.tc.end_txn("t", pid, ep + 1, False, api_version=5)
    assert r2.producer_epoch == ep + 2
    # a TV0 commit does not bump
    env.ack_all()
    env.tc.verify_partition("t", pid, ep + 2, ("a", 0), add=True)
    assert env.tc.end_txn("t", pid, ep + 2, True, api_version=4).producer_epoch == ep + 2


def test_tv2_retry_while_markers_pending_is_concurrent(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True, api_version=5)
    assert env.tc.end_txn("t", pid, ep, True, api_version=5).error == E.concurrent_transactions
    assert env.tc.end_txn("t", pid, ep + 1, True, api_version=5).error == E.producer_fenced


def test_tv2_epoch_overflow_rotates_producer_id(env):
    x = at_epoch(env, MAX_EPOCH - 1)
    assert env.tc.add_partitions("t", x, MAX_EPOCH - 1, [("a", 0)]) == {("a", 0): E.none}
    r = env.tc.end_txn("t", x, MAX_EPOCH - 1, True, api_version=5)
    z = r.producer_id
    assert r.error == E.none and z != x and r.producer_epoch == 0
    [job] = env.tc.markers.take_marker_jobs()
    assert (job.producer_id, job.producer_epoch) == (x, MAX_EPOCH)       # markers: (old id, MAX)
    md = env.tc.get("t")
    assert (md.producer_id, md.next_producer_id, md.state) == (x, z, S.PrepareCommit)
    # the client starts its next transaction early: wait, not a fatal mapping error (ours)
    assert env.tc.verify_partition("t", z, 0, ("a", 0), add=True) == E.concurrent_transactions
    assert env.tc.end_txn("t", x, MAX_EPOCH - 1, True, api_version=5).error == E.concurrent_transactions
    env.ack_all([job])
    md = env.tc.get("t")
    assert (md.producer_id, md.producer_epoch, md.prev_producer_id, md.next_producer_id) == (z, 0, x, -1)
    # a retried EndTxn with the old pair gets the same new pair, also after a restart
    assert env.tc.end_txn("t", x, MAX_EPOCH - 1, True, api_version=5) == r
    assert env.tc.end_txn("t", x, MAX_EPOCH - 1, False, api_version=5).error == E.invalid_txn_state
    tc = env.crash_restart()
    assert tc.end_txn("t", x, MAX_EPOCH - 1, True, api_version=5) == r
    # and the new pair works
    assert tc.verify_partition("t", z, 0, ("a", 0), add=True) == E.none
    assert tc.end_txn("t", z, 0, True, api_version=5).producer_epoch == 1


def test_overflow_survives_restart_between_prepare_and_complete(env):
    x = at_epoch(env, MAX_EPOCH - 1)
    env.tc.add_partitions("t", x, MAX_EPOCH - 1, [("a", 0)])
    r = env.tc.end_txn("t", x, MAX_EPOCH - 1, False, api_version=5)
    tc = env.crash_restart()
    [job] = tc.markers.take_marker_jobs()
    assert (job.producer_id, job.producer_epoch, job.commit) == (x, MAX_EPOCH, False)
    env.ack_all([job])
    assert (tc.get("t").producer_id, tc.get("t").producer_epoch) == (r.producer_id, 0)


# -- marker results --------------------------------------------------------------------------------

def test_retriable_marker_error_is_retried_after_backoff(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.not_leader_or_follower)
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.tc.markers.take_marker_jobs() == []
    assert env.tc.markers.next_retry_due_ms() == env.clock + env.tc.markers.retry_backoff_ms
    env.clock += env.tc.markers.retry_backoff_ms
    [again] = env.tc.markers.take_marker_jobs()
    assert again.job_id == job.job_id and again.partitions == [("a", 0)]
    assert env.tc.markers.take_marker_jobs() == []
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.request_timed_out)
    env.clock += env.tc.markers.retry_backoff_ms
    [again] = env.tc.markers.take_marker_jobs()
    assert env.state() == S.PrepareCommit
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    assert env.state() == S.CompleteCommit


def test_deleted_partition_is_dropped_from_the_job(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, False)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.unknown_topic_or_partition)
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.state() == S.CompleteAbort


def test_stale_and_duplicate_marker_results_are_ignored(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(999, ("a", 0), E.none)
    env.tc.markers.on_marker_result(job.job_id, ("zzz", 0), E.none)
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.not_leader_or_follower)    # late error
    assert env.state() == S.PrepareCommit and env.tc.markers.next_retry_due_ms() is None
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.state() == S.CompleteCommit
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)                       # job is gone


def test_invalid_producer_epoch_abandons_job_and_the_scan_redrives_it(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.invalid_producer_epoch)
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)                       # ignored: job gone
    assert env.state() == S.PrepareCommit
    assert env.tc.markers.take_marker_jobs() == []
    env.advance(INTERVAL)
    [job2] = env.tc.markers.take_marker_jobs()
    assert job2.job_id != job.job_id and job2.commit and job2.partitions == [("a", 0), ("b", 1)]
    env.ack_all([job2])
    assert env.state() == S.CompleteCommit


# -- KIP-939 (two-phase commit) --------------------------------------------------------------------

def test_kept_transaction_retry_of_end_txn_during_prepare_and_after_restart(tmp_path):
    e = Env(tmp_path, two_phase_commit_enable=True)
    pid, ep = e.begin()
    r = e.tc.init_producer_id("t", TIMEOUT, enable_2pc=True, keep_prepared_txn=True, api_version=6)
    assert (r.error, r.ongoing_producer_id, r.ongoing_producer_epoch) == (E.none, pid, ep)
    nxt = (r.producer_id, r.producer_epoch)
    assert e.tc.kept_fences() == [(pid, ep + 1, [("a", 0), ("b", 1)])]
    end = e.tc.end_txn("t", *nxt, True, api_version=5)
    assert end.error == E.none and (end.producer_id, end.producer_epoch) == (pid, ep + 2)
    assert e.tc.kept_fences() == []
    # markers carry the ongoing id with its epoch + 1
    (job,) = e.tc.markers.take_marker_jobs()
    assert (job.producer_id, job.producer_epoch, job.commit) == (pid, ep + 1, True)
    # a retry while the markers are out waits; the other command is refused
    assert e.tc.end_txn("t", *nxt, True, api_version=5).error == E.concurrent_transactions
    assert e.tc.end_txn("t", *nxt, False, api_version=5).error == E.invalid_txn_state
    # Prepare survives a crash and is driven to completion; then the retry gets the new pair
    tc = e.crash_restart()
    e.ack_all()
    assert e.state() == S.CompleteCommit
    again = tc.end_txn("t", *nxt, True, api_version=5)
    assert again.error == E.none and (again.producer_id, again.producer_epoch) == (pid, ep + 2)
    e.sm.close()
