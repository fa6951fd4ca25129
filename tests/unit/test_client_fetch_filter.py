"""appliance.client: the read_committed filter on synthetic Fetch answers (batches, markers and the
AbortedTransactions list as a broker returns them)."""

from __future__ import annotations

import pytest

from appliance.client.consumer import filter_fetched
from appliance.errors import CorruptRecord
from appliance.protocol.records import (Record, build_batch, build_control_batch,
                                        set_base_offset)


class Log:
    """Builds a partition's bytes batch by batch, assigning offsets like a broker."""

    def __init__(self, start: int = 0) -> None:
        self.parts: list[bytes] = []
        self.next = start

    def data(self, pid: int, values: list[str], *, txn: bool = True, codec: int = 0) -> int:
        b = bytearray(build_batch([Record(None, v.encode()) for v in values], producer_id=pid,
                                  producer_epoch=0, base_sequence=0, transactional=txn,
                                  compression=codec))
        return self._add(b, len(values))

    def marker(self, pid: int, commit: bool) -> int:
        b = bytearray(build_control_batch(commit=commit, producer_id=pid, producer_epoch=0,
                                          coordinator_epoch=0, timestamp_ms=1))
        return self._add(b, 1)

    def _add(self, b: bytearray, count: int) -> int:
        first = self.next
        set_base_offset(b, first)
        self.parts.append(bytes(b))
        self.next += count
        return first

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def values(fetched) -> list[str]:
    return [r.value.decode() for r in fetched.records]


def test_committed_and_aborted_transactions_interleaved():
    log = Log()
    a1 = log.data(1, ["a1", "a2"])          # producer 1: aborted
    log.data(2, ["c1"])                     # producer 2: committed
    log.data(1, ["a3"])
    log.data(2, ["c2", "c3"])
    log.marker(1, commit=False)
    log.marker(2, commit=True)
    log.data(-1, ["plain"], txn=False)      # not transactional: always visible
    aborted = [(1, a1)]
    got = filter_fetched(log.bytes(), 0, aborted, read_committed=True)
    assert values(got) == ["c1", "c2", "c3", "plain"]
    assert got.next_position == log.next
    assert got.aborted_batches == 2 and got.control_batches == 2
    # read_uncommitted sees every data record (never the markers).
    got = filter_fetched(log.bytes(), 0, aborted, read_committed=False)
    assert values(got) == ["a1", "a2", "c1", "a3", "c2", "c3", "plain"]
    assert got.next_position == log.next


def test_same_producer_aborted_then_committed():
    # The abort marker ends the producer's aborted range: its next transaction is visible.
    log = Log(start=10)
    first = log.data(7, ["x1", "x2"])
    log.marker(7, commit=False)
    log.data(7, ["y1"], codec=4)
    log.marker(7, commit=True)
    got = filter_fetched(log.bytes(), 10, [(7, first)], read_committed=True)
    assert values(got) == ["y1"]
    assert got.next_position == log.next


def test_aborted_transaction_starting_later_than_the_batch_does_not_hide_it():
    log = Log()
    log.data(3, ["early"])
    log.marker(3, commit=True)
    later = log.data(3, ["late"])
    log.marker(3, commit=False)
    got = filter_fetched(log.bytes(), 0, [(3, later)], read_committed=True)
    assert values(got) == ["early"]


def test_position_moves_past_control_only_answers():
    log = Log(start=41)
    log.marker(5, commit=True)
    log.marker(6, commit=False)
    got = filter_fetched(log.bytes(), 41, [], read_committed=True)
    assert got.records == [] and got.next_position == 43


def test_fetch_from_inside_a_batch_skips_earlier_records_and_batches():
    log = Log()
    log.data(-1, ["r0", "r1"], txn=False)
    log.data(-1, ["r2", "r3", "r4"], txn=False, codec=4)
    got = filter_fetched(log.bytes(), 3, None, read_committed=True)
    assert values(got) == ["r3", "r4"]
    assert [r.offset for r in got.records] == [3, 4]
    assert got.next_position == 5


def test_torn_last_batch_is_left_for_the_next_fetch():
    log = Log()
    log.data(-1, ["whole"], txn=False)
    log.data(-1, ["torn" * 10], txn=False)
    data = log.bytes()
    got = filter_fetched(data[:-7], 0, [], read_committed=True)
    assert values(got) == ["whole"] and got.next_position == 1


def test_corrupt_batch_is_refused():
    log = Log()
    log.data(-1, ["fine"], txn=False)
    data = bytearray(log.bytes())
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecord):
        filter_fetched(bytes(data), 0, [], read_committed=False)


def test_records_of_log_append_time_batches_are_reported_as_such():
    """Spark's timestampType column (1 = LogAppendTime) comes from the batch attribute."""
    log = Log()
    log.data(-1, ["create-a", "create-b"], txn=False)
    b = bytearray(build_batch([Record(None, b"append-a"), Record(None, b"append-b")],
                              timestamp_type=1))
    log._add(b, 2)
    got = filter_fetched(log.bytes(), 1, None, False)
    assert [r.offset for r in got.records] == [1, 2, 3]
    assert got.log_append_time == {2, 3}
