"""InitProducerId (appliance.txn.init_producer_id, through the TransactionCoordinator), one test
per behaviour of KIP-98, KIP-360, KIP-890 and KIP-939 that it alone decides, named after it (the
coordinator of ``txnkit``: a fake clock, restarts on the same directory)."""

from appliance.errors import ErrorCode as E
from appliance.txn.metadata import MAX_EPOCH, TransactionState as S

from txnkit import INTERVAL, TIMEOUT, Env, at_epoch, snapshot, env  # noqa: F401 (env is a fixture)


def test_null_transactional_id_gives_fresh_pid_epoch_0_without_log(env):
    size = env.sm.size_in_bytes()
    seen = set()
    for _ in range(3):
        r = env.tc.init_producer_id(None, TIMEOUT, api_version=4)
        assert (r.error, r.producer_epoch) == (E.none, 0)
        assert r.producer_id not in seen
        seen.add(r.producer_id)
    # KIP-360 form with the current id: still a fresh id (Kafka ignores it without txn id)
    r = env.tc.init_producer_id(None, TIMEOUT, max(seen), 0, api_version=4)
    assert r.producer_id not in seen and r.producer_epoch == 0
    assert env.sm.size_in_bytes() == size
    tc = env.crash_restart()
    assert tc.init_producer_id(None, TIMEOUT).producer_id not in seen | {r.producer_id}


def test_second_init_bumps_epoch_and_is_logged_before_reply(env):
    pid, ep = env.init()
    assert ep == 0
    tc = env.crash_restart()                      # the mapping was in the log before the reply
    assert snapshot(tc.get("t"))[:3] == (pid, 0, S.Empty)
    pid2, ep2 = env.init()
    assert (pid2, ep2) == (pid, 1)
    assert env.crash_restart().get("t").producer_epoch == 1


def test_second_instance_fences_the_first(env):
    pid, old = env.begin()
    # the second instance: its InitProducerId aborts the first's transaction, then succeeds
    assert env.tc.init_producer_id("t", TIMEOUT, api_version=4).error == E.concurrent_transactions
    env.ack_all()
    pid2, new = env.init()
    assert pid2 == pid and new > old
    # the first instance, every coordinator request, new and old request versions
    assert env.tc.add_partitions("t", pid, old, [("c", 0)], api_version=3) == {("c", 0): E.producer_fenced}
    assert env.tc.add_partitions("t", pid, old, [("c", 0)], api_version=1) == {("c", 0): E.invalid_producer_epoch}
    assert env.tc.add_offsets("t", pid, old, "g", api_version=2) == E.producer_fenced
    assert env.tc.add_offsets("t", pid, old, "g", api_version=0) == E.invalid_producer_epoch
    assert env.tc.end_txn("t", pid, old, True, api_version=3).error == E.producer_fenced
    assert env.tc.end_txn("t", pid, old, True, api_version=1).error == E.invalid_producer_epoch
    assert env.tc.verify_partition("t", pid, old, ("a", 0), add=False) == E.invalid_producer_epoch
    assert env.tc.verify_partition("t", pid, old, ("a", 0), add=True) == E.invalid_producer_epoch


def test_init_while_ongoing_aborts_with_bumped_epoch_first(env):
    pid, ep = env.begin()
    r = env.tc.init_producer_id("t", TIMEOUT, api_version=4)
    assert r.error == E.concurrent_transactions
    md = env.tc.get("t")
    assert (md.state, md.producer_epoch) == (S.PrepareAbort, ep + 1)
    [job] = env.tc.markers.take_marker_jobs()
    assert (job.commit, job.producer_id, job.producer_epoch) == (False, pid, ep + 1)
    assert job.partitions == [("a", 0), ("b", 1)]
    assert env.tc.init_producer_id("t", TIMEOUT).error == E.concurrent_transactions   # still aborting
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.none)
    assert env.tc.init_producer_id("t", TIMEOUT).error == E.concurrent_transactions
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.state() == S.CompleteAbort
    r = env.tc.init_producer_id("t", TIMEOUT)
    assert (r.error, r.producer_id, r.producer_epoch) == (E.none, pid, ep + 2)


def test_init_while_prepare_commit_never_aborts(env):
    pid, ep = env.begin()
    assert env.tc.end_txn("t", pid, ep, True).error == E.none
    jobs = env.tc.markers.take_marker_jobs()
    for _ in range(3):
        assert env.tc.init_producer_id("t", TIMEOUT).error == E.concurrent_transactions
        env.advance(INTERVAL)
    jobs += env.tc.markers.take_marker_jobs()
    assert all(j.commit for j in jobs)
    env.ack_all(jobs)
    assert env.state() == S.CompleteCommit
    assert env.init() == (pid, ep + 1)


def test_timeout_out_of_range_changes_nothing(env):
    pid, ep = env.init(timeout=1000)
    size = env.sm.size_in_bytes()
    for bad in (env.cfg.max_timeout_ms + 1, 0, -1):
        assert env.tc.init_producer_id("t", bad).error == E.invalid_transaction_timeout
        assert env.tc.init_producer_id("new", bad).error == E.invalid_transaction_timeout
    assert env.tc.get("new") is None
    assert snapshot(env.tc.get("t"))[:2] == (pid, ep) and env.tc.get("t").txn_timeout_ms == 1000
    assert env.sm.size_in_bytes() == size
    assert env.tc.init_producer_id("t", env.cfg.max_timeout_ms).error == E.none


# -- KIP-890 and KIP-360 ---------------------------------------------------------------------------

def test_c1_init_producer_id_epoch_overflow_rotates_producer_id(env):
    x = at_epoch(env, MAX_EPOCH - 2)
    assert env.init() == (x, MAX_EPOCH - 1)              # the last epoch a client may use
    z, ep = env.init()
    assert z != x and ep == 0
    assert env.tc.get("t").prev_producer_id == x
    assert env.crash_restart().get("t").producer_id == z


def test_c1_kip360_rotation_retry_returns_the_new_pair(env):
    x = at_epoch(env, MAX_EPOCH - 1)
    r = env.tc.init_producer_id("t", TIMEOUT, x, MAX_EPOCH - 1, api_version=4)
    assert r.error == E.none and r.producer_id != x and r.producer_epoch == 0
    assert env.tc.init_producer_id("t", TIMEOUT, x, MAX_EPOCH - 1, api_version=4) == r   # lost answer


def test_kip360_init_with_expected_epoch(env):
    pid, ep = env.init()
    r = env.tc.init_producer_id("t", TIMEOUT, pid, ep, api_version=4)
    assert (r.error, r.producer_id, r.producer_epoch) == (E.none, pid, ep + 1)
    assert env.tc.init_producer_id("t", TIMEOUT, pid, ep, api_version=4) == r     # retry: same
    assert env.tc.init_producer_id("t", TIMEOUT, pid, ep + 5, api_version=4).error == E.producer_fenced
    assert env.tc.init_producer_id("t", TIMEOUT, pid + 9, 0, api_version=4).error == E.producer_fenced
    assert env.tc.init_producer_id("t", TIMEOUT, pid + 9, 0, api_version=3).error == E.invalid_producer_epoch
    # an unknown transactional id accepts any expected pair and starts fresh
    assert env.tc.init_producer_id("fresh", TIMEOUT, 123, 4, api_version=4).producer_epoch == 0


def test_init_invalid_requests(env):
    assert env.tc.init_producer_id("", TIMEOUT).error == E.invalid_request
    assert env.tc.init_producer_id("t", TIMEOUT, 5, -1).error == E.invalid_request
    assert env.tc.init_producer_id("t", TIMEOUT, -1, 5).error == E.invalid_request
    assert env.tc.get("t") is None


# -- KIP-939 (two-phase commit) --------------------------------------------------------------------

def test_enable_2pc_refused_by_the_switch(tmp_path):
    # The TwoPhaseCommit permission is checked by the frontend (tests/integration/test_acls.py).
    e = Env(tmp_path)
    assert e.tc.init_producer_id("t", 1000, enable_2pc=True).error == E.transactional_id_authorization_failed
    e.sm.close()
    e2 = Env(tmp_path / "2", two_phase_commit_enable=True)
    assert e2.tc.init_producer_id("allowed", 1000, enable_2pc=True).error == E.none
    e2.sm.close()
