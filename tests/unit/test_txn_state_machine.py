"""The coordinator's transaction states and transition table (appliance.txn.metadata), and
that the coordinator turns an illegal transition into INVALID_TXN_STATE instead of raising."""

import itertools

import pytest

from appliance.config import TransactionsConfig
from appliance.errors import ErrorCode as E
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.metadata import (VALID_PREVIOUS_STATES, IllegalTransition, TransactionMetadata,
                                    TransactionState as S)
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager

# Kafka's TransactionState.scala, written out independently of the module under test:
# (name, id, valid previous states)
KAFKA = {
    "Empty": (0, {"Empty", "CompleteCommit", "CompleteAbort"}),
    "Ongoing": (1, {"Ongoing", "Empty", "CompleteCommit", "CompleteAbort"}),
    "PrepareCommit": (2, {"Ongoing"}),
    "PrepareAbort": (3, {"Ongoing", "PrepareEpochFence"}),
    "CompleteCommit": (4, {"PrepareCommit"}),
    "CompleteAbort": (5, {"PrepareAbort"}),
    "Dead": (6, {"Empty", "CompleteAbort", "CompleteCommit"}),
    "PrepareEpochFence": (7, {"Ongoing"}),
}


def test_state_ids_and_names_are_kafkas():
    assert {s.name: int(s) for s in S} == {name: v[0] for name, v in KAFKA.items()}
    for name in KAFKA:
        assert S.from_name(name).name == name
    assert S.from_name("ONGOING") is None


def test_table_is_kafkas():
    assert {t.name: {s.name for s in prev} for t, prev in VALID_PREVIOUS_STATES.items()} == \
        {name: v[1] for name, v in KAFKA.items()}


@pytest.mark.parametrize("current,target", list(itertools.product(list(S), list(S))),
                         ids=lambda s: s.name)
def test_every_transition(current, target):
    md = TransactionMetadata("t", 1, 0, 1000, current)
    if current.name in KAFKA[target.name][1]:
        md.transition(target)
        assert md.state == target
    else:
        with pytest.raises(IllegalTransition):
            md.transition(target)
        assert md.state == current            # unchanged


def test_expiration_allowed_only_when_no_transaction():
    assert {s.name for s in S if s.is_expiration_allowed} == {"Empty", "CompleteCommit", "CompleteAbort"}


@pytest.mark.parametrize("state", [S.Dead, S.PrepareEpochFence])
def test_never_logged_states_cannot_be_encoded(state):
    with pytest.raises(ValueError):
        TransactionMetadata("t", 1, 0, 1000, state).to_log_value()


def test_empty_with_partitions_cannot_be_encoded():
    md = TransactionMetadata("t", 1, 0, 1000, S.Empty, partitions={("a", 0)})
    with pytest.raises(ValueError):
        md.to_log_value()


def test_log_value_round_trip_keeps_every_logged_field():
    md = TransactionMetadata("t", 7, 3, 1000, S.PrepareCommit, prev_producer_id=7, next_producer_id=9,
                             next_producer_epoch=4, last_producer_epoch=2,
                             partitions={("b", 1), ("a", 0), ("a", 3)}, txn_start_ms=10,
                             txn_last_update_ms=20, client_txn_version=2)
    back = TransactionMetadata.from_log_value("t", md.to_log_value())
    md.last_producer_epoch = -1                # not in the record (as in Kafka)
    assert back == md


# -- the coordinator answers illegal transitions, never raises ------------------------------------

@pytest.fixture
def tc(tmp_path):
    clock = [1_000_000]
    sm = TransactionStateManager(str(tmp_path), "os", lambda: clock[0])
    c = TransactionCoordinator(sm, ProducerIdManager(str(tmp_path)), TransactionsConfig(), 1,
                               lambda: clock[0])
    c.load()
    yield c
    sm.close()


@pytest.mark.parametrize("bad", [S.Dead, S.PrepareEpochFence])
def test_impossible_cached_state_is_answered_invalid_txn_state(tc, bad):
    r = tc.init_producer_id("t", 60000)
    md = tc.get("t")
    md.state = bad                             # a state that is never cached (bug simulation)
    pid, epoch = r.producer_id, r.producer_epoch
    assert tc.add_partitions("t", pid, epoch, [("a", 0)], api_version=3) == {("a", 0): E.invalid_txn_state}
    assert tc.add_offsets("t", pid, epoch, "g", api_version=3) == E.invalid_txn_state
    assert tc.verify_partition("t", pid, epoch, ("a", 0), add=True) == E.invalid_txn_state
    assert tc.verify_partition("t", pid, epoch, ("a", 0), add=False) == E.invalid_txn_state
    assert tc.end_txn("t", pid, epoch, True, api_version=3).error == E.invalid_txn_state
    assert tc.end_txn("t", pid, epoch, False, api_version=5).error == E.invalid_txn_state
    assert tc.init_producer_id("t", 60000, api_version=4).error == E.invalid_txn_state
    assert tc.get("t").state == bad


def test_transition_rows_through_the_coordinator(tc):
    """Each legal row of the table is reached by a request; the illegal ones are refused."""
    r = tc.init_producer_id("t", 60000)                                  # (new) -> Empty
    pid, ep = r.producer_id, r.producer_epoch
    assert tc.get("t").state == S.Empty
    assert tc.end_txn("t", pid, ep, True).error == E.invalid_txn_state   # Empty -> Prepare*: no
    assert tc.init_producer_id("t", 60000).producer_epoch == ep + 1      # Empty -> Empty
    ep += 1
    assert tc.add_partitions("t", pid, ep, [("a", 0)]) == {("a", 0): E.none}   # Empty -> Ongoing
    assert tc.add_partitions("t", pid, ep, [("a", 1)]) == {("a", 1): E.none}   # Ongoing -> Ongoing
    assert tc.get("t").partitions == {("a", 0), ("a", 1)}
    assert tc.end_txn("t", pid, ep, True).error == E.none                # Ongoing -> PrepareCommit
    assert tc.get("t").state == S.PrepareCommit
    assert tc.add_partitions("t", pid, ep, [("a", 2)]) == {("a", 2): E.concurrent_transactions}
    [job] = tc.markers.take_marker_jobs()
    for p in job.partitions:
        tc.markers.on_marker_result(job.job_id, p, E.none)
    assert tc.get("t").state == S.CompleteCommit                         # PrepareCommit -> CompleteCommit
    assert tc.add_partitions("t", pid, ep, [("b", 0)]) == {("b", 0): E.none}   # CompleteCommit -> Ongoing
    assert tc.end_txn("t", pid, ep, False).error == E.none               # Ongoing -> PrepareAbort
    [job] = tc.markers.take_marker_jobs()
    tc.markers.on_marker_result(job.job_id, ("b", 0), E.none)
    assert tc.get("t").state == S.CompleteAbort                          # PrepareAbort -> CompleteAbort
    assert tc.init_producer_id("t", 60000).error == E.none               # CompleteAbort -> Empty
    assert tc.get("t").state == S.Empty
