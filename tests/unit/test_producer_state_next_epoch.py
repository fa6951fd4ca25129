"""ProducerStateManager.needs_verification with a transaction-version-2 producer whose next
transaction (epoch + 1, after EndTxn) reaches the partition before the previous transaction's
marker: the batch must be verified with the coordinator, not joined to the open transaction."""

from __future__ import annotations

import pytest

from appliance.log.producer_state import ProducerStateManager
from appliance.protocol.records import Record, build_batch, read_header


def thdr(pid=7, epoch=0, seq=0):
    return read_header(build_batch([Record(key=None, value=b"x")], producer_id=pid,
                                   producer_epoch=epoch, base_sequence=seq, transactional=True))


@pytest.fixture
def psm(tmp_path):
    return ProducerStateManager(str(tmp_path), expiration_ms=60_000)


def test_batch_of_a_newer_epoch_than_the_open_transaction_needs_verification(psm):
    psm.update(thdr(pid=1, epoch=4, seq=0), 10, 1)          # transaction of epoch 4 open here
    assert not psm.needs_verification(thdr(pid=1, epoch=4, seq=1))   # same transaction
    assert psm.needs_verification(thdr(pid=1, epoch=5, seq=0))       # the next one: verify
    # An older epoch is not verified here: the sequence check fences it (INVALID_PRODUCER_EPOCH).
    assert not psm.needs_verification(thdr(pid=1, epoch=3, seq=0))
    psm.complete_txn(1, 5, 0, 11, False, 1)                   # the COMMIT marker (TV2: epoch + 1)
    assert psm.needs_verification(thdr(pid=1, epoch=5, seq=0))       # no transaction open
