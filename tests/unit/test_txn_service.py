"""The transaction requests of the coordinator worker (appliance.txn.service): adds that find
the markers of the producer's previous transaction on their way wait for them (the coordinator of
``txnkit``: a fake clock)."""

from appliance.catalog.model import OFFSETS_TOPIC
from appliance.errors import ErrorCode as E
from appliance.txn.coordinator import partition_for
from appliance.txn.metadata import TransactionState as S

from txnkit import T0, env  # noqa: F401 (env is a fixture)


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
