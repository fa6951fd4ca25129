"""FailedProduceRequestsPerSec / FailedFetchRequestsPerSec as Kafka's ReplicaManager counts them:
unexpected failures only (``appliance.api.produce.failed_produce``,
``appliance.api.fetch.EXPECTED_FETCH_ERRORS``)."""

import pytest

from appliance.api.fetch import EXPECTED_FETCH_ERRORS
from appliance.api.produce import failed_produce
from appliance.errors import ErrorCode as E
from appliance.ipc import ProduceResult
from appliance.log.verification import FailParked

EXPECTED_PRODUCE = (E.unknown_topic_or_partition, E.not_leader_or_follower, E.message_too_large,
                    E.record_list_too_large, E.corrupt_message, E.kafka_storage_error,
                    E.unknown_topic_id, E.topic_authorization_failed,
                    E.transactional_id_authorization_failed, E.invalid_topic_exception,
                    E.invalid_required_acks, E.request_timed_out)
COUNTED_PRODUCE = (E.invalid_record, E.invalid_timestamp, E.out_of_order_sequence_number,
                   E.invalid_producer_epoch, E.invalid_txn_state, E.not_enough_replicas,
                   E.unknown_server_error, E.invalid_request)


@pytest.mark.parametrize("code", EXPECTED_PRODUCE)
def test_expected_produce_errors_are_not_failures(code):
    assert not failed_produce(ProduceResult(int(code)))


@pytest.mark.parametrize("code", COUNTED_PRODUCE)
def test_unexpected_produce_errors_are_failures(code):
    assert failed_produce(ProduceResult(int(code), error_message="whatever the log said"))


@pytest.mark.parametrize("code", (E.invalid_txn_state, E.transaction_abortable, E.not_enough_replicas,
                                  E.invalid_producer_epoch, E.concurrent_transactions))
def test_a_verifications_refusal_is_not_a_failure(code):
    """Kafka's postVerificationCallback answers these without marking the meter; the same codes
    from the log (an epoch or transaction-state check, min.insync.replicas) are counted."""
    message = FailParked(None, code).message
    assert not failed_produce(ProduceResult(int(code), error_message=message))
    assert failed_produce(ProduceResult(int(code)))


def test_success_is_not_a_failure():
    assert not failed_produce(ProduceResult(0, base_offset=5))


def test_expected_fetch_errors():
    assert EXPECTED_FETCH_ERRORS == {int(c) for c in (
        E.unknown_topic_or_partition, E.not_leader_or_follower, E.unknown_leader_epoch,
        E.fenced_leader_epoch, E.replica_not_available, E.kafka_storage_error,
        E.inconsistent_topic_id, E.offset_out_of_range, E.topic_authorization_failed,
        E.unknown_topic_id)}
    for counted in (E.corrupt_message, E.unknown_server_error):
        assert int(counted) not in EXPECTED_FETCH_ERRORS
