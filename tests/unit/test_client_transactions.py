"""appliance.client: the transaction manager's decisions, against a scripted coordinator (no
sockets: responses are kio entities built by the codec, as a broker's would be decoded)."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest

from appliance.client import KafkaError, PreparedTxnState
from appliance.client.errors import FatalProducerError, IllegalStateError
from appliance.client.transactions import TransactionManager, TxnState
from appliance.protocol import messages
from scripted_connection import ScriptedConnection

INIT, ADD, END = 22, 24, 26
TV2_VERSIONS = {0: 12, 22: 6, 24: 5, 25: 4, 26: 5, 28: 5}
TV1_VERSIONS = {0: 11, 22: 6, 24: 3, 25: 4, 26: 4, 28: 4}


class ScriptedCoordinator(ScriptedConnection):
    """Answers each request with the next scripted value dict for its api key."""

    def __init__(self, versions: dict[int, int], tv: int) -> None:
        super().__init__(versions, tv)
        self.script: dict[int, deque[dict]] = defaultdict(deque)
        self.sent: list[tuple[int, int, dict]] = []

    def answer(self, api_key: int, **values) -> None:
        self.script[api_key].append(values)

    def request(self, api_key: int, body, *, version: int | None = None, expect_response: bool = True):
        v = self.versions[api_key] if version is None else version
        self.sent.append((api_key, v, dict(body)))
        values = self.script[api_key].popleft()
        return messages.build(messages.response_class(api_key, v), values)

    def requests(self, api_key: int) -> list[dict]:
        return [body for key, _, body in self.sent if key == api_key]


class FakeCluster:
    def __init__(self, conn: ScriptedCoordinator) -> None:
        self.conn = conn

    def coordinator(self, key, key_type, *, timeout_ms=None):
        return self.conn

    def any_connection(self):
        return self.conn

    def forget_coordinator(self, key, key_type) -> None:
        pass


def manager(tv: int = 2, *, two_pc: bool = True, versions=None, **kw) -> tuple[TransactionManager,
                                                                                  ScriptedCoordinator]:
    conn = ScriptedCoordinator(versions or (TV2_VERSIONS if tv == 2 else TV1_VERSIONS), tv)
    tm = TransactionManager(FakeCluster(conn), transactional_id="tid", enable_two_phase_commit=two_pc,
                            retry_backoff_ms=1, max_block_ms=5000, **kw)
    return tm, conn


def init_ok(conn, pid=10, epoch=3, ongoing=(-1, -1)) -> None:
    conn.answer(INIT, error_code=0, producer_id=pid, producer_epoch=epoch,
                ongoing_txn_producer_id=ongoing[0], ongoing_txn_producer_epoch=ongoing[1])


def test_keep_prepared_txn_with_an_open_transaction_enters_the_prepared_state():
    tm, conn = manager()
    init_ok(conn, pid=11, epoch=0, ongoing=(10, 7))
    tm.init_transactions(keep_prepared_txn=True)
    (req,) = conn.requests(INIT)
    assert req["enable2_pc"] is True and req["keep_prepared_txn"] is True
    assert tm.state == TxnState.PREPARED
    assert tm.prepared == PreparedTxnState(10, 7)
    assert (tm.producer_id, tm.epoch) == (11, 0)
    with pytest.raises(IllegalStateError):
        tm.require_transaction("send")
    with pytest.raises(IllegalStateError):
        tm.begin()
    # The matching state commits, with the pair InitProducerId handed out; EndTxn v5's answer is
    # the pair for the next transaction.
    conn.answer(END, error_code=0, producer_id=11, producer_epoch=1)
    assert tm.complete(PreparedTxnState("10:7")) is True
    (end,) = conn.requests(END)
    assert (end["producer_id"], end["producer_epoch"], end["committed"]) == (11, 0, True)
    assert tm.state == TxnState.READY and (tm.producer_id, tm.epoch) == (11, 1)


def test_a_mismatching_state_aborts_the_kept_transaction():
    tm, conn = manager()
    init_ok(conn, pid=11, epoch=0, ongoing=(10, 7))
    tm.init_transactions(keep_prepared_txn=True)
    conn.answer(END, error_code=0, producer_id=11, producer_epoch=1)
    assert tm.complete(PreparedTxnState(10, 6)) is False
    assert conn.requests(END)[0]["committed"] is False


def test_complete_is_a_no_op_when_no_transaction_is_open():
    tm, conn = manager()
    init_ok(conn)
    tm.init_transactions(keep_prepared_txn=True)
    assert tm.state == TxnState.READY
    assert tm.complete(PreparedTxnState(10, 3)) is None
    assert conn.requests(END) == []


def test_complete_aborts_an_open_unprepared_transaction():
    tm, conn = manager()
    init_ok(conn)
    tm.init_transactions()
    tm.begin()
    tm.add_partitions([("t", 0)])
    conn.answer(END, error_code=0, producer_id=10, producer_epoch=4)
    assert tm.complete(PreparedTxnState(10, 3)) is False
    assert conn.requests(END)[0]["committed"] is False


def test_prepare_returns_the_current_pair_and_locks_the_transaction():
    tm, conn = manager()
    init_ok(conn, pid=10, epoch=3)
    tm.init_transactions()
    tm.begin()
    tm.add_partitions([("t", 0), ("t", 1)])
    assert conn.requests(ADD) == []                    # TV2: Produce v12 adds partitions
    tm.sequences.allocate(("t", 0), 5)
    state = tm.prepare()
    assert state == PreparedTxnState(10, 3) and str(state) == "10:3"
    with pytest.raises(IllegalStateError):
        tm.prepare()
    conn.answer(END, error_code=0, producer_id=10, producer_epoch=4)
    tm.end(True)
    assert tm.epoch == 4 and tm.sequences.peek(("t", 0)) == 0   # new epoch: sequences from 0


def test_prepare_of_an_empty_transaction_identifies_nothing_and_sends_no_end_txn():
    tm, conn = manager()
    init_ok(conn)
    tm.init_transactions()
    tm.begin()
    assert tm.prepare() == PreparedTxnState()
    tm.end(True)
    assert conn.requests(END) == [] and tm.state == TxnState.READY


def test_prepare_needs_two_phase_commit():
    tm, conn = manager(two_pc=False)
    init_ok(conn)
    tm.init_transactions()
    tm.begin()
    with pytest.raises(KafkaError) as e:
        tm.prepare()
    assert e.value.code == 48                           # INVALID_TXN_STATE, as the KIP says
    assert tm.state == TxnState.IN_TRANSACTION


def test_two_phase_commit_needs_init_producer_id_v6():
    tm, conn = manager(versions={**TV2_VERSIONS, 22: 5})
    with pytest.raises(KafkaError) as e:
        tm.init_transactions()
    assert e.value.code == 35 and "v6" in str(e.value)
    assert conn.requests(INIT) == []


def test_two_phase_commit_needs_transaction_version_2():
    tm, conn = manager(tv=1)
    with pytest.raises(KafkaError) as e:
        tm.init_transactions()
    assert e.value.code == 35 and "transaction version 2" in str(e.value)


def test_authorization_failure_is_fatal():
    tm, conn = manager()
    conn.answer(INIT, error_code=53)
    with pytest.raises(FatalProducerError) as e:
        tm.init_transactions()
    assert e.value.code == 53
    assert tm.state == TxnState.FATAL_ERROR
    with pytest.raises(FatalProducerError):
        tm.begin()


def test_concurrent_transactions_is_retried():
    tm, conn = manager()
    conn.answer(INIT, error_code=51)
    conn.answer(INIT, error_code=14)
    init_ok(conn, pid=5, epoch=1)
    tm.init_transactions()
    assert len(conn.requests(INIT)) == 3 and (tm.producer_id, tm.epoch) == (5, 1)


def test_transaction_version_1_adds_partitions_explicitly_and_keeps_the_epoch():
    tm, conn = manager(tv=1, two_pc=False)
    init_ok(conn, pid=10, epoch=3)
    tm.init_transactions()
    assert tm.tv2 is False
    tm.begin()
    conn.answer(ADD, results_by_topic_v3_and_below=[
        {"name": "t", "results_by_partition": [{"partition_index": 0, "partition_error_code": 0},
                                               {"partition_index": 1, "partition_error_code": 0}]}])
    tm.add_partitions([("t", 0), ("t", 1)])
    tm.add_partitions([("t", 1)])                       # known already: no request
    (add,) = conn.requests(ADD)
    assert add["v3_and_below_topics"] == [{"name": "t", "partitions": [0, 1]}]
    assert add["v3_and_below_producer_id"] == 10
    tm.sequences.allocate(("t", 0), 4)
    conn.answer(END, error_code=0)
    tm.end(True)
    assert (conn.sent[-1][0], conn.sent[-1][1]) == (END, 4)
    assert (tm.producer_id, tm.epoch) == (10, 3) and tm.sequences.peek(("t", 0)) == 4


def test_fenced_end_txn_is_fatal():
    tm, conn = manager()
    init_ok(conn)
    tm.init_transactions()
    tm.begin()
    tm.add_partitions([("t", 0)])
    conn.answer(END, error_code=90)
    with pytest.raises(FatalProducerError) as e:
        tm.end(True)
    assert e.value.code == 90 and tm.state == TxnState.FATAL_ERROR
