"""The gate every transaction request passes and the copy-on-write log append
(appliance.txn.metadata_cache, through the TransactionCoordinator): loading, a newer coordinator,
failed and uncertain appends, the flush policy; one test per behaviour, named after it (the
coordinator of ``txnkit``: a fake clock, restarts on the same directory)."""

from appliance.config import TransactionsConfig
from appliance.errors import ErrorCode as E
from appliance.txn import state_manager as smod
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.metadata import TransactionState as S
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, TxnLogWriteError

from txnkit import INTERVAL, T0, TIMEOUT, Env, snapshot, env  # noqa: F401 (env is a fixture)


def test_requests_before_load_answer_load_in_progress(tmp_path):
    sm = TransactionStateManager(str(tmp_path), "os", lambda: T0)
    tc = TransactionCoordinator(sm, ProducerIdManager(str(tmp_path)), TransactionsConfig(), 1, lambda: T0)
    assert tc.init_producer_id("t", TIMEOUT).error == E.coordinator_load_in_progress
    assert tc.end_txn("t", 0, 0, True).error == E.coordinator_load_in_progress
    assert tc.list_transactions().error == E.coordinator_load_in_progress
    assert tc.describe_transactions(["t"])[0].error == E.coordinator_load_in_progress
    assert tc.init_producer_id(None, TIMEOUT).error == E.none      # idempotent: any broker
    tc.load()
    assert tc.init_producer_id("t", TIMEOUT).error == E.none
    sm.close()


def test_coordinator_fenced_stops_everything(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    env.tc.markers.on_marker_result(job.job_id, ("a", 0), E.transaction_coordinator_fenced)
    assert env.tc.needs_restart
    env.tc.markers.on_marker_result(job.job_id, ("b", 1), E.none)
    assert env.state() == S.PrepareCommit
    assert env.tc.markers.take_marker_jobs() == []
    assert env.tc.init_producer_id("t", TIMEOUT).error == E.not_coordinator
    assert env.tc.end_txn("t", pid, ep, True).error == E.not_coordinator
    env.advance(10 * INTERVAL)
    assert env.tc.markers.take_marker_jobs() == []


# -- log failures ----------------------------------------------------------------------------------

def test_failed_append_answers_error_and_changes_nothing(env, monkeypatch):
    pid, ep = env.begin()
    before = snapshot(env.tc.get("t"))

    def fail(m):
        raise TxnLogWriteError(E.kafka_storage_error, "disk gone", maybe_written=False)
    monkeypatch.setattr(env.sm, "append", fail)
    assert env.tc.end_txn("t", pid, ep, True).error == E.not_coordinator
    assert env.tc.init_producer_id("t", TIMEOUT).error == E.not_coordinator
    assert env.tc.add_partitions("t", pid, ep, [("z", 0)]) == {("z", 0): E.not_coordinator}
    assert snapshot(env.tc.get("t")) == before and env.tc.markers.take_marker_jobs() == []
    assert not env.tc.needs_restart


def test_append_that_may_have_landed_asks_for_a_restart(env, monkeypatch):
    pid, ep = env.begin()

    def fail(m):
        raise TxnLogWriteError(E.kafka_storage_error, "fdatasync", maybe_written=True)
    monkeypatch.setattr(env.sm, "append", fail)
    assert env.tc.end_txn("t", pid, ep, True).error == E.not_coordinator
    assert env.tc.needs_restart
    assert env.tc.add_partitions("t", pid, ep, [("a", 0)]) == {("a", 0): E.not_coordinator}


def test_failed_complete_append_is_retried_by_tick(env, monkeypatch):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    real = env.sm.append

    def fail(m):
        raise TxnLogWriteError(E.kafka_storage_error, "x", maybe_written=False)
    monkeypatch.setattr(env.sm, "append", fail)
    env.ack_all()
    assert env.state() == S.PrepareCommit
    assert env.tc.init_producer_id("t", TIMEOUT).error == E.concurrent_transactions
    monkeypatch.setattr(env.sm, "append", real)
    env.tc.tick(env.clock)
    assert env.state() == S.CompleteCommit


def test_batch_policy_fdatasyncs_before_the_reply(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(smod.os, "fdatasync", lambda fd: calls.append(fd))
    env = Env(tmp_path, flush="batch")
    env.begin()
    n = len(calls)
    env.tc.end_txn("t", env.tc.get("t").producer_id, 0, True)
    assert len(calls) == n + 1
    env.sm.close()


def test_regression_a_full_disk_at_producer_id_allocation_logged_a_traceback_per_request(
        tmp_path, monkeypatch, caplog):
    """Chaos (disk-full on the loop device): each InitProducerId logged "producer id allocation
    failed" with an OSError traceback. Now: a retriable answer, one warning, no traceback, and
    ids again once there is room."""
    import errno
    import logging

    from appliance.txn import producer_ids

    sm = TransactionStateManager(str(tmp_path), "os", lambda: T0)
    tc = TransactionCoordinator(sm, ProducerIdManager(str(tmp_path)), TransactionsConfig(), 1, lambda: T0)
    tc.load()

    def full(path, data, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(producer_ids, "atomic_write", full)
    with caplog.at_level(logging.INFO, "appliance.txn.coordinator"):
        for _ in range(3):
            assert tc.init_producer_id(None, TIMEOUT).error == E.coordinator_not_available
    said = [r for r in caplog.records if "producer id allocation failed" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and said[0].exc_info is None
    monkeypatch.undo()
    r = tc.init_producer_id(None, TIMEOUT)
    assert r.error == E.none
    sm.close()
