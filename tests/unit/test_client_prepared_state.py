"""appliance.client: PreparedTxnState (KIP-939) - its string form round-trips and is checked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.client import PreparedTxnState

pids = st.integers(min_value=0, max_value=2**63 - 1)
epochs = st.integers(min_value=0, max_value=2**15 - 1)


@given(pids, epochs)
def test_string_form_round_trips(pid, epoch):
    s = PreparedTxnState(pid, epoch)
    text = str(s)
    assert text == f"{pid}:{epoch}"
    assert PreparedTxnState(text) == s
    assert PreparedTxnState.from_string(text) == s
    assert hash(PreparedTxnState(text)) == hash(s)
    assert s.has_transaction


def test_empty_state_is_no_transaction():
    for empty in (PreparedTxnState(), PreparedTxnState(""), PreparedTxnState.from_string(None),
                  PreparedTxnState(-1, -1)):
        assert not empty.has_transaction
        assert str(empty) == ""
        assert empty == PreparedTxnState()
        assert (empty.producer_id, empty.epoch) == (-1, -1)


def test_states_differ_by_producer_id_or_epoch():
    assert PreparedTxnState(7, 3) != PreparedTxnState(7, 4)
    assert PreparedTxnState(7, 3) != PreparedTxnState(8, 3)
    assert PreparedTxnState(7, 3) != PreparedTxnState()
    assert PreparedTxnState(" 7:3 ") == PreparedTxnState(7, 3)


@pytest.mark.parametrize("bad", ["7", "7:", ":3", "a:b", "7:3:1", "-2:3", "7:-1", "7:40000", "7;3"])
def test_malformed_strings_are_refused(bad):
    with pytest.raises(ValueError):
        PreparedTxnState(bad)


def test_half_set_pairs_are_refused():
    with pytest.raises(ValueError):
        PreparedTxnState(5, -1)
    with pytest.raises(ValueError):
        PreparedTxnState(-1, 5)
    with pytest.raises(TypeError):
        PreparedTxnState("5:1", 2)


def test_state_is_immutable():
    s = PreparedTxnState(1, 2)
    with pytest.raises(AttributeError):
        s.epoch = 3
