"""The transaction coordinator's request logic (appliance.txn.coordinator), one test per
behaviour of KIP-98, KIP-890 and KIP-939 that it alone decides, named after it. A fake clock;
restarts build a new coordinator on the same directory with the next coordinator epoch, as the
worker does."""

import pytest

from appliance.config import TransactionsConfig
from appliance.errors import ErrorCode as E
from appliance.txn import state_manager as smod
from appliance.catalog import OFFSETS_TOPIC
from appliance.txn.coordinator import TransactionCoordinator, java_string_hash, partition_for
from appliance.txn.metadata import MAX_EPOCH, TransactionMetadata, TransactionState as S
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import (TransactionStateManager, TxnLogWriteError,
                                         bump_coordinator_epoch)

T0 = 1_700_000_000_000
TIMEOUT = 60_000
INTERVAL = 10_000


class Env:
    def __init__(self, path, flush="os", **cfg):
        self.dir = str(path)
        self.clock = T0
        self.flush = flush
        self.cfg = TransactionsConfig(**{"abort_timed_out_interval_ms": INTERVAL, **cfg})
        self.start()

    def now(self) -> int:
        return self.clock

    def start(self) -> None:
        self.sm = TransactionStateManager(self.dir, self.flush, self.now)
        self.tc = TransactionCoordinator(self.sm, ProducerIdManager(self.dir), self.cfg,
                                         bump_coordinator_epoch(self.dir), self.now)
        self.tc.load()

    def crash_restart(self) -> TransactionCoordinator:
        """kill -9 and start again: the log is not closed cleanly."""
        self.sm.close(clean=False)
        self.start()
        return self.tc

    def advance(self, ms: int) -> None:
        self.clock += ms
        self.tc.tick(self.clock)

    def init(self, tid="t", timeout=TIMEOUT, **kw):
        r = self.tc.init_producer_id(tid, timeout, api_version=kw.pop("api_version", 4), **kw)
        assert r.error == E.none, r
        return r.producer_id, r.producer_epoch

    def begin(self, tid="t", parts=(("a", 0), ("b", 1))):
        pid, ep = self.init(tid)
        assert set(self.tc.add_partitions(tid, pid, ep, list(parts), api_version=3).values()) == {E.none}
        return pid, ep

    def ack_all(self, jobs=None) -> list:
        jobs = self.tc.markers.take_marker_jobs() if jobs is None else jobs
        for job in jobs:
            for p in job.partitions:
                self.tc.markers.on_marker_result(job.job_id, p, E.none)
        return jobs

    def state(self, tid="t") -> S:
        return self.tc.get(tid).state


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.sm.close()


def snapshot(md: TransactionMetadata):
    return (md.producer_id, md.producer_epoch, md.state, frozenset(md.partitions), md.txn_start_ms,
            md.pending_state, md.txn_timeout_ms)


# -- coordinator basics ---------------------------------------------------------------------------

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


def test_unknown_id_or_other_pid_is_invalid_mapping(env):
    pid, ep = env.init()
    assert env.tc.add_partitions("nope", pid, ep, [("a", 0)]) == {("a", 0): E.invalid_producer_id_mapping}
    assert env.tc.add_partitions("t", pid + 1, ep, [("a", 0)]) == {("a", 0): E.invalid_producer_id_mapping}
    assert env.tc.add_offsets("t", pid + 1, ep, "g") == E.invalid_producer_id_mapping
    assert env.tc.end_txn("t", pid + 1, ep, True).error == E.invalid_producer_id_mapping
    assert env.tc.verify_partition("nope", pid, ep, ("a", 0), add=True) == E.invalid_producer_id_mapping
    assert env.state() == S.Empty


def test_requests_during_prepare_are_refused_and_change_nothing(env):
    pid, ep = env.begin()
    env.tc.end_txn("t", pid, ep, True)
    before = snapshot(env.tc.get("t"))
    size = env.sm.size_in_bytes()
    assert env.tc.add_partitions("t", pid, ep, [("c", 0)]) == {("c", 0): E.concurrent_transactions}
    assert env.tc.add_offsets("t", pid, ep, "g") == E.concurrent_transactions
    assert env.tc.end_txn("t", pid, ep, True).error == E.concurrent_transactions
    # Kafka: the pending Complete* transition answers CONCURRENT_TRANSACTIONS to any command
    assert env.tc.end_txn("t", pid, ep, False).error == E.concurrent_transactions
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=False) == E.concurrent_transactions
    assert snapshot(env.tc.get("t")) == before and env.sm.size_in_bytes() == size


def test_first_partition_starts_ongoing_persisted_with_timer(env):
    pid, ep = env.init()
    env.clock += 5000
    assert env.tc.add_partitions("t", pid, ep, [("a", 0)]) == {("a", 0): E.none}
    tc = env.crash_restart()
    md = tc.get("t")
    assert (md.state, md.partitions, md.txn_start_ms) == (S.Ongoing, {("a", 0)}, T0 + 5000)
    env.clock += 1000
    env.tc.add_partitions("t", pid, ep, [("a", 1)])
    assert env.tc.get("t").txn_start_ms == T0 + 5000          # the timer does not restart
    size = env.sm.size_in_bytes()
    assert env.tc.add_partitions("t", pid, ep, [("a", 1)]) == {("a", 1): E.none}
    assert env.sm.size_in_bytes() == size                      # nothing new: nothing logged


def test_partition_for_is_kafkas():
    # Java: "hello".hashCode() == 99162322, "Hello World".hashCode() == -862545276,
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE (Utils.abs maps it to 0)
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Hello World") == -862545276
    assert java_string_hash("polygenelubricants") == -2**31
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00     # UTF-16 surrogate pair
    assert partition_for("hello") == 99162322 % 50
    assert partition_for("Hello World") == 862545276 % 50
    assert partition_for("polygenelubricants") == 0
    assert partition_for("my-group", 8) == abs(java_string_hash("my-group")) % 8


def test_add_offsets_adds_the_groups_offsets_partition_and_gets_the_marker(env):
    pid, ep = env.init()
    assert env.tc.add_offsets("t", pid, ep, "Hello World", api_version=2) == E.none   # starts it, as in Kafka
    part = (OFFSETS_TOPIC, 862545276 % 50)
    assert env.tc.get("t").partitions == {part} and env.state() == S.Ongoing
    env.tc.end_txn("t", pid, ep, True)
    [job] = env.tc.markers.take_marker_jobs()
    assert job.partitions == [part] and job.commit


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


# -- timeouts and expiration --------------------------------------------------------------------------

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


# -- KIP-890 ------------------------------------------------------------------------------------------

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


def test_late_batch_of_finished_transaction_cannot_join_the_next(env):
    pid, ep = env.begin(parts=[("a", 0)])
    env.tc.end_txn("t", pid, ep, True, api_version=5)
    env.ack_all()
    assert env.tc.verify_partition("t", pid, ep + 1, ("b", 0), add=True) == E.none   # next txn
    before = snapshot(env.tc.get("t"))
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=True) == E.invalid_producer_epoch
    assert snapshot(env.tc.get("t")) == before


def _at_epoch(env, epoch: int, tid="t"):
    """An Empty transactional id whose epoch is ``epoch`` (written through the log and
    reloaded, as if 32k InitProducerIds had happened)."""
    pid, _ = env.init(tid)
    m = env.tc.get(tid).copy()
    m.producer_epoch = epoch
    env.sm.append(m)
    env.crash_restart()
    return pid


def test_tv2_epoch_overflow_rotates_producer_id(env):
    x = _at_epoch(env, MAX_EPOCH - 1)
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
    x = _at_epoch(env, MAX_EPOCH - 1)
    env.tc.add_partitions("t", x, MAX_EPOCH - 1, [("a", 0)])
    r = env.tc.end_txn("t", x, MAX_EPOCH - 1, False, api_version=5)
    tc = env.crash_restart()
    [job] = tc.markers.take_marker_jobs()
    assert (job.producer_id, job.producer_epoch, job.commit) == (x, MAX_EPOCH, False)
    env.ack_all([job])
    assert (tc.get("t").producer_id, tc.get("t").producer_epoch) == (r.producer_id, 0)


def test_c1_init_producer_id_epoch_overflow_rotates_producer_id(env):
    x = _at_epoch(env, MAX_EPOCH - 2)
    assert env.init() == (x, MAX_EPOCH - 1)              # the last epoch a client may use
    z, ep = env.init()
    assert z != x and ep == 0
    assert env.tc.get("t").prev_producer_id == x
    assert env.crash_restart().get("t").producer_id == z


def test_c1_kip360_rotation_retry_returns_the_new_pair(env):
    x = _at_epoch(env, MAX_EPOCH - 1)
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


def test_implicit_add_adds_or_changes_nothing(env):
    pid, ep = env.init()
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=True) == E.none
    md = env.tc.get("t")
    assert (md.state, md.partitions, md.txn_start_ms) == (S.Ongoing, {("a", 0)}, T0)
    before = snapshot(md)
    assert env.tc.verify_partition("t", pid, ep + 1, ("b", 0), add=True) == E.invalid_producer_epoch
    assert env.tc.verify_partition("t", pid + 1, ep, ("b", 0), add=True) == E.invalid_producer_id_mapping
    assert snapshot(env.tc.get("t")) == before
    assert env.crash_restart().get("t").partitions == {("a", 0)}


def test_verify_only_partition_not_in_transaction_is_invalid_state(env):
    pid, ep = env.begin(parts=[("a", 0)])
    assert env.tc.verify_partition("t", pid, ep, ("a", 1), add=False) == E.invalid_txn_state
    assert env.tc.get("t").partitions == {("a", 0)}


def test_verify_only_never_changes_state(env):
    pid, ep = env.init()
    size = env.sm.size_in_bytes()
    cases = []
    cases.append(env.tc.verify_partition("t", pid, ep, ("a", 0), add=False))        # Empty
    env.tc.add_partitions("t", pid, ep, [("a", 0)])
    size = env.sm.size_in_bytes()
    before = snapshot(env.tc.get("t"))
    cases.append(env.tc.verify_partition("t", pid, ep, ("a", 0), add=False))        # in Ongoing
    cases.append(env.tc.verify_partition("t", pid, ep, ("b", 0), add=False))        # not in it
    cases.append(env.tc.verify_partition("t", pid, ep + 1, ("a", 0), add=False))    # wrong epoch
    cases.append(env.tc.verify_partition("t", pid + 1, ep, ("a", 0), add=False))    # wrong pid
    assert cases == [E.invalid_txn_state, E.none, E.invalid_txn_state, E.invalid_producer_epoch,
                     E.invalid_producer_id_mapping]
    assert snapshot(env.tc.get("t")) == before and env.sm.size_in_bytes() == size
    env.tc.end_txn("t", pid, ep, True)
    env.ack_all()
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=False) == E.invalid_txn_state   # Complete


# -- EndTxn details --------------------------------------------------------------------------------------

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


# -- marker results -------------------------------------------------------------------------------------

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


# -- log failures -----------------------------------------------------------------------------------------

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


# -- admin ---------------------------------------------------------------------------------------------

def test_list_transactions_filters(env):
    env.begin("ongoing")
    env.clock += 5000
    p2, _ = env.init("empty")
    p3, e3 = env.begin("done")
    env.tc.end_txn("done", p3, e3, True)
    env.ack_all()
    env.clock += 1000

    def ids(**kw):
        r = env.tc.list_transactions(**kw)
        assert r.error == E.none
        return sorted((t.transactional_id, t.state) for t in r.transactions), r.unknown_state_filters

    assert ids() == ([("done", "CompleteCommit"), ("empty", "Empty"), ("ongoing", "Ongoing")], [])
    assert ids(state_filters=["Ongoing", "Bogus"]) == ([("ongoing", "Ongoing")], ["Bogus"])
    assert ids(producer_id_filters=[p2]) == ([("empty", "Empty")], [])
    # running longer than 5.5 s: "ongoing" started 6 s ago, "done" 1 s ago; Kafka counts
    # Empty (start -1) as running forever
    assert ids(duration_filter_ms=5500)[0] == [("empty", "Empty"), ("ongoing", "Ongoing")]
    assert ids(transactional_id_pattern="on.*")[0] == [("ongoing", "Ongoing")]
    assert ids(transactional_id_pattern="on")[0] == []                  # whole-id match
    assert env.tc.list_transactions(transactional_id_pattern="(").error == E.invalid_regular_expression


def test_describe_transactions(env):
    pid, ep = env.begin(parts=[("b", 1), ("a", 0), ("a", 2)])
    [d, missing, bad] = env.tc.describe_transactions(["t", "nope", ""])
    assert d.error == E.none and d.state == "Ongoing"
    assert (d.timeout_ms, d.start_time_ms, d.producer_id, d.producer_epoch) == (TIMEOUT, T0, pid, ep)
    assert d.partitions == [("a", 0), ("a", 2), ("b", 1)]
    assert missing.error == E.transactional_id_not_found
    assert bad.error == E.invalid_request


# -- KIP-939 (two-phase commit) ---------------------------------------------------------------------

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


def test_enable_2pc_refused_by_the_switch(tmp_path):
    # The TwoPhaseCommit permission is checked by the frontend (tests/integration/test_acls.py).
    e = Env(tmp_path)
    assert e.tc.init_producer_id("t", 1000, enable_2pc=True).error == E.transactional_id_authorization_failed
    e.sm.close()
    e2 = Env(tmp_path / "2", two_phase_commit_enable=True)
    assert e2.tc.init_producer_id("allowed", 1000, enable_2pc=True).error == E.none
    e2.sm.close()


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


def test_metric_counts_open_transactions_only(env):
    assert env.tc.active_transaction_open_time_max_ms() == 0
    env.begin("t1")
    env.clock += 500
    env.begin("t2")
    env.clock += 100
    assert env.tc.active_transaction_open_time_max_ms() == 600
    pid, ep = env.tc.get("t1").producer_id, env.tc.get("t1").producer_epoch
    assert env.tc.end_txn("t1", pid, ep, True, api_version=3).error == E.none
    env.ack_all()
    assert env.tc.active_transaction_open_time_max_ms() == 100


# -- the service: adds wait for the markers of the previous transaction ---------------------------

class _Answers:
    """A Responder per request; what was answered, in order."""

    def __init__(self):
        self.got = []

    def responder(self, req_id):
        from appliance.service import Responder
        return Responder(lambda src, rid, result: self.got.append((rid, result)), "fe0", req_id)


def _service(env, wait_ms=100):
    from appliance.txn.service import TransactionService
    return TransactionService(env.tc, env.now, wait_ms)


def _committing(env):
    """A transaction of ("a", 0) and ("b", 1) whose EndTxn(commit) was answered: PrepareCommit,
    its markers not yet written."""
    pid, ep = env.begin()
    assert env.tc.end_txn("t", pid, ep, True, api_version=3).error == E.none
    assert env.state() == S.PrepareCommit
    return pid, ep


def test_add_partitions_during_the_last_commits_markers_is_answered_when_they_are_written(env):
    from appliance.txn.messages import AddOffsetsToTxnRequest, AddPartitionsToTxnRequest
    pid, ep = _committing(env)
    svc, answers = _service(env), _Answers()
    svc.add_partitions(AddPartitionsToTxnRequest("t", pid, ep, [("c", 0)], 3), answers.responder(1))
    svc.add_offsets(AddOffsetsToTxnRequest("t", pid, ep, "g", 3), answers.responder(2))
    svc.retry_waiting()
    assert answers.got == [] and svc.next_deadline_ms() == T0 + 100 and svc.wait_s() == 0.1
    env.clock += 5
    env.ack_all()                                # the markers are written: CompleteCommit
    assert env.state() == S.CompleteCommit
    svc.retry_waiting()
    assert [rid for rid, _ in answers.got] == [1, 2]
    assert [e.error for e in answers.got[0][1].results] == [E.none]
    assert answers.got[1][1].error == E.none
    assert env.state() == S.Ongoing
    assert env.tc.get("t").partitions == {("c", 0), (OFFSETS_TOPIC, partition_for("g"))}
    assert svc.waiting == [] and svc.next_deadline_ms() is None and svc.wait_s() is None


def test_add_partitions_whose_markers_stay_unwritten_is_answered_concurrent_transactions(env):
    from appliance.txn.messages import AddPartitionsToTxnRequest
    pid, ep = _committing(env)
    svc, answers = _service(env), _Answers()
    svc.add_partitions(AddPartitionsToTxnRequest("t", pid, ep, [("c", 0)], 3), answers.responder(1))
    env.clock += 99
    svc.retry_waiting()
    assert answers.got == []
    env.clock += 1                               # the 100 ms wait is over
    svc.retry_waiting()
    assert [e.error for e in answers.got[0][1].results] == [E.concurrent_transactions]
    assert env.state() == S.PrepareCommit and svc.waiting == []


def test_add_partitions_with_no_wait_configured_is_answered_concurrent_transactions_at_once(env):
    from appliance.txn.messages import AddPartitionsToTxnRequest
    pid, ep = _committing(env)
    svc, answers = _service(env, wait_ms=0), _Answers()
    svc.add_partitions(AddPartitionsToTxnRequest("t", pid, ep, [("c", 0)], 3), answers.responder(1))
    assert [e.error for e in answers.got[0][1].results] == [E.concurrent_transactions]
    assert svc.waiting == []


def test_add_partitions_refused_for_another_reason_is_answered_at_once(env):
    from appliance.txn.messages import AddPartitionsToTxnRequest
    pid, ep = _committing(env)
    svc, answers = _service(env), _Answers()
    svc.add_partitions(AddPartitionsToTxnRequest("t", pid, ep + 1, [("c", 0)], 3),
                       answers.responder(1))             # a stale producer's epoch
    svc.add_partitions(AddPartitionsToTxnRequest("u", pid, ep, [("c", 0)], 3),
                       answers.responder(2))             # an unknown transactional id
    assert [[e.error for e in r.results] for _, r in answers.got] == [
        [E.producer_fenced], [E.invalid_producer_id_mapping]]
    assert svc.waiting == []


def test_a_stopping_coordinator_answers_the_adds_that_wait(env):
    from appliance.txn.messages import AddPartitionsToTxnRequest
    pid, ep = _committing(env)
    svc, answers = _service(env), _Answers()
    svc.add_partitions(AddPartitionsToTxnRequest("t", pid, ep, [("c", 0)], 3), answers.responder(1))
    svc.answer_waiting()
    assert [e.error for e in answers.got[0][1].results] == [E.concurrent_transactions]
