"""AddPartitionsToTxn, AddOffsetsToTxn and KIP-890 verification (appliance.txn.coordinator),
one test per behaviour of KIP-98 and KIP-890 that the coordinator alone decides, named after it
(the coordinator of ``txnkit``: a fake clock, restarts on the same directory)."""

from appliance.catalog.model import OFFSETS_TOPIC
from appliance.errors import ErrorCode as E
from appliance.txn.coordinator import java_string_hash, partition_for
from appliance.txn.metadata import TransactionState as S

from txnkit import T0, snapshot, env  # noqa: F401 (env is a fixture)


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


# -- KIP-890 ---------------------------------------------------------------------------------------

def test_late_batch_of_finished_transaction_cannot_join_the_next(env):
    pid, ep = env.begin(parts=[("a", 0)])
    env.tc.end_txn("t", pid, ep, True, api_version=5)
    env.ack_all()
    assert env.tc.verify_partition("t", pid, ep + 1, ("b", 0), add=True) == E.none   # next txn
    before = snapshot(env.tc.get("t"))
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=True) == E.invalid_producer_epoch
    assert snapshot(env.tc.get("t")) == before


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
