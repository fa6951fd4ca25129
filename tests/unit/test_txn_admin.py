"""The transaction coordinator's admin queries (appliance.txn.admin, through the
TransactionCoordinator): ListTransactions, DescribeTransactions and KIP-939's
ActiveTransactionOpenTimeMaxMs (the coordinator of ``txnkit``: a fake clock)."""

from appliance.errors import ErrorCode as E

from txnkit import T0, TIMEOUT, env  # noqa: F401 (env is a fixture)


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
