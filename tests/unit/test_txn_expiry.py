"""The transaction coordinator's timers (appliance.txn.expiry, through the
TransactionCoordinator's tick): transaction timeouts, transactional-id expiration; one test per
behaviour, named after it (the coordinator of ``txnkit``: a fake clock, restarts on the same
directory)."""

import pytest

from appliance.errors import ErrorCode as E
from appliance.txn.metadata import TransactionState as S

from txnkit import INTERVAL, T0, TIMEOUT, Env, env  # noqa: F401 (env is a fixture)


def test_restart_while_ongoing_keeps_partitions_epoch_start_and_timeout(env):
    pid, ep = env.begin()
    env.clock += 30_000
    tc = env.crash_restart()
    md = tc.get("t")
    assert (md.state, md.producer_epoch, md.partitions, md.txn_start_ms) == \
        (S.Ongoing, ep, {("a", 0), ("b", 1)}, T0)
    assert tc.markers.take_marker_jobs() == []
    env.advance(INTERVAL)                       # T0 + 40 s: not yet timed out
    assert tc.get("t").state == S.Ongoing
    env.advance(INTERVAL * 3)                   # T0 + 70 s > start + 60 s
    assert tc.get("t").state == S.PrepareAbort


def test_timed_out_transaction_is_fenced_and_aborted(env):
    pid, ep = env.begin()
    env.advance(TIMEOUT)                        # start + timeout is not yet < now
    assert env.state() == S.Ongoing
    env.clock += 1
    env.tc.tick(env.clock)                      # the scan interval has not passed since the last scan
    env.advance(INTERVAL)
    md = env.tc.get("t")
    assert (md.state, md.producer_epoch) == (S.PrepareAbort, ep + 1)
    [job] = env.tc.markers.take_marker_jobs()
    assert (job.commit, job.producer_id, job.producer_epoch) == (False, pid, ep + 1)
    env.ack_all([job])
    assert env.state() == S.CompleteAbort
    assert env.clock - T0 <= TIMEOUT + 2 * INTERVAL


def test_timeout_runs_from_the_start_not_the_last_update(env):
    pid, ep = env.begin(parts=[("a", 0)])
    for i in range(1, 8):                       # keep adding partitions every 10 s
        env.clock += INTERVAL
        env.tc.add_partitions("t", pid, ep, [("a", i)])
        env.tc.tick(env.clock)
    assert env.state() == S.PrepareAbort        # Kafka times out from the start


@pytest.mark.parametrize("tv2", [False, True])
def test_timed_out_producer_is_fenced(env, tv2):
    pid, ep = env.begin()
    env.advance(TIMEOUT + INTERVAL)
    env.ack_all()
    version = 5 if tv2 else 3
    assert env.tc.end_txn("t", pid, ep, False, api_version=version).error == E.producer_fenced
    assert env.tc.end_txn("t", pid, ep, True, api_version=1).error == E.invalid_producer_epoch
    assert env.tc.add_partitions("t", pid, ep, [("a", 0)], api_version=3) == {("a", 0): E.producer_fenced}
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=False) == E.invalid_producer_epoch
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=True) == E.invalid_producer_epoch
    assert env.state() == S.CompleteAbort


def test_idle_transactional_id_expires_with_a_tombstone(tmp_path):
    env = Env(tmp_path, id_expiration_ms=3_600_000)
    pid, ep = env.init()
    other, _ = env.init("busy")
    env.clock += 3_000_000
    env.tc.add_partitions("busy", other, 0, [("a", 0)])
    env.tc.end_txn("busy", other, 0, True)
    env.ack_all()                               # "busy" was updated recently
    env.advance(600_001)                        # first expiration scan: T0 + 1 h + 1 ms
    assert env.tc.get("t") is None and env.tc.get("busy") is not None
    assert env.tc.add_partitions("t", pid, ep, [("a", 0)]) == {("a", 0): E.invalid_producer_id_mapping}
    assert env.tc.describe_transactions(["t"])[0].error == E.transactional_id_not_found
    tc = env.crash_restart()                    # the tombstone is in the log
    assert tc.get("t") is None and tc.get("busy") is not None
    r = tc.init_producer_id("t", TIMEOUT)
    assert r.error == E.none and r.producer_id != pid and r.producer_epoch == 0
    env.sm.close()


def test_transactions_in_progress_never_expire(tmp_path):
    env = Env(tmp_path, id_expiration_ms=1000, max_timeout_ms=10**9)
    env.begin("ongoing", parts=[("a", 0)])
    env.tc.init_producer_id("ongoing", 10**9)   # fence: Ongoing -> PrepareAbort, markers pending
    pid, ep = env.init("ongoing2", timeout=10**9)
    env.tc.add_partitions("ongoing2", pid, ep, [("a", 0)])
    env.clock += 10 * 3_600_000
    for _ in range(3):
        env.advance(3_600_000)
    assert env.tc.get("ongoing").state == S.PrepareAbort
    assert env.tc.get("ongoing2").state == S.Ongoing
    env.sm.close()


def test_2pc_transaction_is_never_timed_out_and_its_timeout_is_minus_one(tmp_path):
    e = Env(tmp_path, two_phase_commit_enable=True)
    r = e.tc.init_producer_id("t", 10, enable_2pc=True, api_version=6)
    assert r.error == E.none
    assert e.tc.add_partitions("t", r.producer_id, r.producer_epoch, [("a", 0)])[("a", 0)] == E.none
    assert e.tc.get("t").txn_timeout_ms == -1
    e.advance(e.cfg.max_timeout_ms * 3)
    assert e.state() == S.Ongoing
    assert e.tc.active_transaction_open_time_max_ms() == e.cfg.max_timeout_ms * 3
    e.sm.close()
