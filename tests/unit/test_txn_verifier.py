"""TransactionVerifier (appliance/log/verification.py): KIP-890 park / ask / verified / expire of
one partition, as actions, on a real ProducerStateManager; the appends the writer would carry out
are played through the producer state (check, update) as the writer's shell does. No fork."""

from __future__ import annotations

import pytest

from appliance.config import Config, ServerConfig, TransactionsConfig
from appliance.errors import ErrorCode as E
from appliance.log.producer_state import ProducerStateManager
from appliance.log.verification import (AppendParked, AskCoordinator, FailParked, Parked,
                                        TransactionVerifier)
from appliance.protocol.records import Record, build_batch, read_header

PID = 7
T = 1000.0          # monotonic seconds of the tests' clock
TIMEOUT_S = 30.0    # server.internal_request_timeout_ms by default


def batch(epoch=0, seq=0, pid=PID, transactional=True) -> bytearray:
    return bytearray(build_batch([Record(None, b"x")], producer_id=pid, producer_epoch=epoch,
                                 base_sequence=seq, transactional=transactional))


class Env:
    def __init__(self, tmp_path, **txn) -> None:
        self.psm = ProducerStateManager(str(tmp_path), expiration_ms=60_000)
        cfg = Config(transactions=TransactionsConfig(**txn))
        self.v = TransactionVerifier(self.psm, cfg, generation=3)
        self.next_offset = 0
        self.req = 0
        self.appended: list[int] = []           # request ids, in append order

    def parked(self, version=11, txn_id="t", **kw) -> tuple[Parked, object]:
        self.req += 1
        b = batch(**kw)
        return Parked("fe0", self.req, -1, version, txn_id, b), read_header(b, 0)

    def produce(self, now=T, version=11, txn_id="t", **kw) -> list:
        """A produce request reaching the writer: parked as its fast path would park it."""
        p, h = self.parked(version, txn_id, **kw)
        assert h.producer_id in self.v.parked or self.v.must_verify(h, version)
        return self.v.park(p, h, now)

    def append(self, a: AppendParked, fail: bool = False) -> None:
        """What the writer's shell does with AppendParked (the sequence checks and the producer
        state; ``fail``: the log refused it, e.g. a full disk)."""
        if fail:
            return
        h = a.header
        assert self.psm.check(h) is None
        self.psm.update(h, self.next_offset, 1)
        self.appended.append(a.parked.req_id)
        self.next_offset += h.last_offset_delta + 1

    def carry_out(self, actions, fail_first: bool = False) -> list:
        """Carry out each action before the next is taken (the generator's contract)."""
        out = []
        for a in actions:
            out.append(a)
            if isinstance(a, AppendParked):
                self.append(a, fail=fail_first)
                fail_first = False
        return out


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def test_a_transactional_batch_without_an_open_transaction_is_parked_and_asked(env):
    (ask,) = env.produce(version=11)
    assert ask == AskCoordinator(ask.req_id, "t", PID, 0, add=False)
    assert ask.req_id >> 40 == 3                 # ids of this generation
    assert env.v.next_deadline() == T + TIMEOUT_S
    # A later batch of the producer waits behind it, with no second question.
    assert env.produce(seq=1) == []
    assert [p.req_id for p in env.v.parked[PID]] == [1, 2]
    # Produce v12 asks for the implicit add (KIP-890 part 2).
    (ask12,) = env.produce(version=12, pid=8)
    assert ask12.add is True and ask12.producer_id == 8


def test_no_verification_for_a_plain_batch_an_open_transaction_or_when_disabled(tmp_path):
    env = Env(tmp_path)
    h = read_header(batch(transactional=False), 0)
    assert not env.v.must_verify(h, 12)
    env.psm.update(read_header(batch(), 0), 0, 1)            # the transaction is open here
    assert not env.v.must_verify(read_header(batch(seq=1), 0), 11)
    # A batch of the next epoch overtaking the previous transaction's marker is verified.
    assert env.v.must_verify(read_header(batch(epoch=1), 0), 11)
    off = Env(tmp_path, partition_verification_enable=False)
    h = read_header(batch(), 0)
    assert not off.v.must_verify(h, 11) and off.v.must_verify(h, 12)


def test_verified_appends_every_parked_batch_in_order(env):
    (ask,) = env.produce()
    env.produce(seq=1)
    env.produce(seq=2)
    done = env.carry_out(env.v.verified(ask.req_id, E.none, T + 0.01))
    assert [type(a) for a in done] == [AppendParked] * 3
    assert env.appended == [1, 2, 3]
    assert env.v.parked == {} and env.v.verifying == {} and env.v.next_deadline() is None
    assert env.psm.has_open_txn(PID)


def test_a_marker_between_the_question_and_the_answer_voids_it(env):
    """KIP-890's race guard: the marker of the previous transaction lands after the check."""
    (ask,) = env.produce(version=10)
    env.produce(version=11, seq=1)
    env.psm.complete_txn(PID, 0, 0, 5, True, 1)              # a marker for the producer
    done = list(env.v.verified(ask.req_id, E.none, T + 0.01))
    # Produce v11+ gets the abortable error (KafkaApis: genericError), older INVALID_TXN_STATE.
    assert [(a.parked.req_id, a.code) for a in done] == [(1, E.invalid_txn_state),
                                                         (2, E.transaction_abortable)]
    assert all(isinstance(a, FailParked) for a in done)
    assert done[0].message == "transaction verification failed: invalid_txn_state"
    assert env.appended == [] and env.v.parked == {}


def test_an_implicit_add_meeting_concurrent_transactions_is_asked_again_then_appended(env):
    (ask,) = env.produce(version=12)
    assert list(env.v.verified(ask.req_id, E.concurrent_transactions, T + 0.005)) == []
    # Waiting to ask again: the backoff (20 ms) from the answer.
    assert env.v.verifying[PID].req_id is None
    assert env.v.next_deadline() == pytest.approx(T + 0.025)
    assert env.v.expire(T + 0.02) == []
    (again,) = env.v.expire(T + 0.025)
    assert again == AskCoordinator(again.req_id, "t", PID, 0, add=True)
    assert again.req_id != ask.req_id
    # The late answer to the first question is nobody's any more.
    assert list(env.v.verified(ask.req_id, E.none, T + 0.03)) == []
    done = env.carry_out(env.v.verified(again.req_id, E.none, T + 0.03))
    assert [type(a) for a in done] == [AppendParked] and env.appended == [1]


def test_the_retry_window_over_v12_gets_concurrent_transactions_older_not_enough_replicas(env):
    (ask,) = env.produce(version=12)
    # The window (100 ms) counts from the first question, across the retries.
    assert list(env.v.verified(ask.req_id, E.concurrent_transactions, T + 0.06)) == []
    (again,) = env.v.expire(T + 0.08)
    (fail,) = env.v.verified(again.req_id, E.concurrent_transactions, T + 0.1)
    assert (fail.parked.req_id, fail.code) == (1, E.concurrent_transactions)
    assert env.v.parked == {} and env.v.verifying == {}
    # A verify-only question (Produce v11) is not retried: NOT_ENOUGH_REPLICAS at once.
    (ask,) = env.produce(version=11, pid=8)
    (fail,) = env.v.verified(ask.req_id, E.concurrent_transactions, T + 0.001)
    assert fail.code == E.not_enough_replicas


@pytest.mark.parametrize("answer,version,code", [
    (E.producer_fenced, 11, E.invalid_producer_epoch),
    (E.coordinator_not_available, 12, E.not_enough_replicas),
    (E.not_coordinator, 11, E.not_enough_replicas),
    (E.invalid_producer_id_mapping, 11, E.invalid_producer_id_mapping),
    (E.invalid_txn_state, 12, E.transaction_abortable),
    (E.transaction_abortable, 10, E.invalid_txn_state),
])
def test_coordinator_errors_as_the_producer_sees_them(env, answer, version, code):
    (ask,) = env.produce(version=version)
    (fail,) = env.v.verified(ask.req_id, answer, T + 0.001)
    assert fail.code == code


def test_an_unanswered_question_expires_with_not_enough_replicas(env):
    (ask,) = env.produce()
    env.produce(seq=1)
    assert env.v.expire(T + TIMEOUT_S - 0.001) == []
    done = env.v.expire(T + TIMEOUT_S)
    assert [(a.parked.req_id, a.code) for a in done] == [(1, E.not_enough_replicas),
                                                         (2, E.not_enough_replicas)]
    assert list(env.v.verified(ask.req_id, E.none, T + TIMEOUT_S + 1)) == []   # answered already
    assert env.v.verifying == {} and env.v.verify_reqs == {} and env.appended == []


def test_a_transactional_batch_without_a_transactional_id_is_refused(env):
    (fail,) = env.produce(txn_id="")
    assert isinstance(fail, FailParked)
    assert fail.code == E.transactional_id_authorization_failed and env.v.parked == {}


def test_a_released_batch_of_the_next_transaction_is_verified_again_in_order(env):
    """TV2: the producer's next transaction (epoch + 1) follows in the same parked queue, and
    waits for the previous one's marker (CONCURRENT_TRANSACTIONS, asked again) before it joins."""
    (ask,) = env.produce(version=12)
    env.produce(version=12, epoch=1, seq=0)
    env.produce(version=12, epoch=1, seq=1)
    done = env.carry_out(env.v.verified(ask.req_id, E.none, T + 0.01))
    assert [type(a) for a in done] == [AppendParked, AskCoordinator]
    assert done[1].producer_epoch == 1 and env.appended == [1]
    assert [p.req_id for p in env.v.parked[PID]] == [2, 3]
    assert list(env.v.verified(done[1].req_id, E.concurrent_transactions, T + 0.02)) == []
    env.psm.complete_txn(PID, 0, 0, env.next_offset, False, 1)   # the first one's marker
    env.next_offset += 1
    (again,) = env.v.expire(T + 0.04)
    done = env.carry_out(env.v.verified(again.req_id, E.none, T + 0.05))
    assert [type(a) for a in done] == [AppendParked, AppendParked] and env.appended == [1, 2, 3]


def test_a_released_batch_whose_append_failed_leaves_the_next_to_verify_again(env):
    """Whether a later batch needs a question of its own depends on the appends before it: the
    actions are taken one at a time."""
    (ask,) = env.produce()
    env.produce(seq=1)
    done = env.carry_out(env.v.verified(ask.req_id, E.none, T + 0.01), fail_first=True)
    assert [type(a) for a in done] == [AppendParked, AskCoordinator]
    assert env.appended == [] and [p.req_id for p in env.v.parked[PID]] == [2]


def test_a_reload_changes_the_settings(env):
    env.v.configure(Config(transactions=TransactionsConfig(partition_verification_enable=False,
                                                           add_partitions_retry_backoff_ms=5),
                           server=ServerConfig(internal_request_timeout_ms=1000)))
    assert (env.v.enabled, env.v.add_retry_s, env.v.timeout_s) == (False, 0.005, 1.0)
