"""KIP-890 / KIP-1050 TRANSACTION_ABORTABLE by API and version (``appliance.txn.messages.abortable_for``)
and the coordinator's own verification codes (``TransactionCoordinator.verify_partition(raw=True)``,
Kafka's handleVerifyPartitionsInTransaction), against the codes a partition writer gets.

Kafka 4.3's transaction coordinator writes TRANSACTION_ABORTABLE in one place only: a KIP-890
verification that finds the partition outside the transaction. KafkaApis passes it through to
AddPartitionsToTxn v4-5 (VerifyOnly, the broker form); AddPartitionsToTxnManager turns it into
INVALID_TXN_STATE for Produce < v11 and TxnOffsetCommit < v4; nothing maps it for EndTxn,
AddOffsetsToTxn or InitProducerId, whose coordinator paths never produce it.
"""

import pytest

from appliance.errors import ErrorCode as E
from appliance.txn.messages import ABORTABLE_SINCE, abortable_for

from txnkit import INTERVAL, TIMEOUT, env  # noqa: F401 (env is a fixture)

# api key -> (name, highest version served), the versions every case below walks through
APIS = {0: ("Produce", 13), 22: ("InitProducerId", 6), 24: ("AddPartitionsToTxn", 5),
        25: ("AddOffsetsToTxn", 4), 26: ("EndTxn", 5), 28: ("TxnOffsetCommit", 5)}


@pytest.mark.parametrize("key,version", [(k, v) for k, (_, top) in APIS.items() for v in range(top + 1)])
def test_transaction_abortable_only_for_versions_that_carry_it(key, version):
    first = {0: 11, 22: 5, 24: 4, 25: 4, 26: 4, 28: 4}[key]
    want = E.transaction_abortable if version >= first else E.invalid_txn_state
    assert abortable_for(key, version, E.transaction_abortable) == want, (APIS[key][0], version)
    # every other code passes at every version
    for code in (E.none, E.invalid_txn_state, E.producer_fenced, E.concurrent_transactions):
        assert abortable_for(key, version, code) == code


def test_the_table_names_kafkas_first_versions():
    # "Version N adds support for new error code TRANSACTION_ABORTABLE (KIP-890)" in Kafka's
    # message definitions; AddPartitionsToTxn's v5, yet Kafka answers the broker form's v4 alike.
    assert ABORTABLE_SINCE == {0: 11, 22: 5, 24: 4, 25: 4, 26: 4, 28: 4}
    assert abortable_for(1, 17, E.transaction_abortable) == E.invalid_txn_state   # an API without it


def test_verify_only_answers_the_coordinators_codes_raw_and_the_writers_mapped(env):
    pid, ep = env.begin(parts=[("a", 0)])
    cases = {  # (partition, epoch): (raw, as a writer gets it)
        (("a", 0), ep): (E.none, E.none),
        (("a", 1), ep): (E.transaction_abortable, E.invalid_txn_state),      # not in the txn
        (("a", 0), ep + 1): (E.producer_fenced, E.invalid_producer_epoch),   # wrong epoch
    }
    for (part, epoch), (raw, writer) in cases.items():
        assert env.tc.verify_partition("t", pid, epoch, part, add=False, raw=True) == raw, part
        assert env.tc.verify_partition("t", pid, epoch, part, add=False) == writer, part
    assert env.tc.verify_partition("t", pid + 1, ep, ("a", 0), add=False, raw=True) == \
        E.invalid_producer_id_mapping
    # Completed: the partitions are gone, so each one is outside the transaction (Kafka checks
    # the partition set, not the state).
    env.tc.end_txn("t", pid, ep, True)
    env.ack_all()
    assert env.tc.verify_partition("t", pid, ep, ("a", 0), add=False, raw=True) == E.transaction_abortable


def test_end_txn_and_add_offsets_never_answer_transaction_abortable(env):
    """Kafka 4.3: a transaction aborted by its timeout fences the producer (PRODUCER_FENCED from
    EndTxn v4+ and AddOffsetsToTxn v4+, INVALID_PRODUCER_EPOCH below v2): not abortable."""
    pid, ep = env.begin(parts=[("a", 0)])
    env.advance(TIMEOUT + INTERVAL)
    env.ack_all()
    for version in range(6):
        err = env.tc.end_txn("t", pid, ep, False, api_version=version).error
        assert err == (E.producer_fenced if version >= 2 else E.invalid_producer_epoch), version
    for version in range(5):
        err = env.tc.add_offsets("t", pid, ep, "g", api_version=version)
        assert err == (E.producer_fenced if version >= 2 else E.invalid_producer_epoch), version
