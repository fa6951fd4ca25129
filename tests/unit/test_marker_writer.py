"""MarkerWriter (appliance/log/markers.py): COMMIT/ABORT markers on a real PartitionLog and
ProducerStateManager: the producer state's checks, an abort indexed before the producer state
takes it, the undo on a full disk (logged once), KIP-939 fences lifted. No fork."""

from __future__ import annotations

import errno
import logging

import pytest

from appliance import ipc
from appliance.errors import ErrorCode as E
from appliance.log.markers import MarkerWriter
from appliance.log.partition import Partition
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.txn_index import AbortedTxn
from appliance.protocol.records import Record, build_batch, read_header

T0 = 1_700_000_000_000


def settings() -> LogSettings:
    return LogSettings(segment_bytes=1 << 16, index_interval_bytes=4096,
                       segment_index_bytes=4096, retention_ms=-1, retention_bytes=-1)


class Env:
    def __init__(self, d: str) -> None:
        self.d = d
        self.log = PartitionLog.open(d, settings(), T0)
        self.psm = ProducerStateManager(d, 60_000)
        self.part = Partition("t", 0, self.log, self.psm)
        self.markers = MarkerWriter(self.part)
        self.seq: dict[int, int] = {}

    def txn(self, pid: int, epoch: int = 0, n: int = 2) -> int:
        """A transactional batch of ``pid``, appended as the writer appends it; its base."""
        seq = self.seq.get(pid, 0)
        self.seq[pid] = seq + n
        b = bytearray(build_batch([Record(None, b"v")] * n, producer_id=pid,
                                  producer_epoch=epoch, base_sequence=seq, transactional=True))
        h = read_header(b, 0)
        assert self.psm.check(h) is None
        info = self.log.append(b, T0)
        self.psm.update(h, info.base_offset, T0)
        return info.base_offset

    def marker(self, pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0):
        return self.markers.write(ipc.WriteMarkerRequest(pid, epoch, commit, coordinator_epoch), T0)

    def controls(self) -> list[tuple[int, tuple[int, int]]]:
        return [(base, ctrl) for base, h, ctrl in self.log.headers_from(0) if ctrl is not None]


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.log.close()


def test_a_commit_marker_ends_the_transaction_without_an_index_entry(env):
    env.txn(7)
    assert env.marker(7, commit=True) == (E.none, 3)
    assert env.controls() == [(2, (1, 0))]                 # COMMIT, coordinator epoch 0
    assert not env.psm.has_open_txn(7) and env.log.aborted_entries() == []
    assert env.part.last_stable_offset() == 3


def test_an_abort_marker_is_indexed_with_the_lso_it_leaves(env):
    env.txn(7)                                             # 0..1
    env.txn(8)                                             # 2..3, still open after 7's abort
    assert env.marker(7, commit=False) == (E.none, 5)
    assert env.log.aborted_entries() == [AbortedTxn(7, 0, 4, 2)]
    assert not env.psm.has_open_txn(7) and env.psm.has_open_txn(8)
    # A marker for a producer with no open transaction: first = last = the marker's offset.
    assert env.marker(9, commit=False) == (E.none, 6)
    assert env.log.aborted_entries()[-1] == AbortedTxn(9, 5, 5, 2)


def test_the_producer_states_checks_refuse_a_marker_and_append_nothing(env):
    env.txn(7, epoch=2)
    assert env.marker(7, commit=True, epoch=1) == (E.invalid_producer_epoch, 0)
    assert env.marker(7, commit=True, epoch=2, coordinator_epoch=4) == (E.none, 3)
    env.txn(7, epoch=2)
    assert env.marker(7, commit=False, epoch=2, coordinator_epoch=3) == \
        (E.transaction_coordinator_fenced, 0)
    assert env.log.log_end_offset == 5 and env.psm.has_open_txn(7)


def test_an_abort_whose_index_entry_finds_a_full_disk_is_taken_back(env, monkeypatch, caplog):
    """Regressions: the marker was left in the log without its entry; a full disk flooded the
    log with one warning per resent marker."""
    env.txn(7)
    real = env.log.append_aborted

    def full(txn):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(env.log, "append_aborted", full)
    with caplog.at_level(logging.INFO, logger="appliance.writer"):
        for _ in range(3):                                 # the coordinator sends it again
            assert env.marker(7, commit=False) == (E.kafka_storage_error, 0)
            assert env.log.log_end_offset == 2 and env.controls() == []
            assert env.psm.has_open_txn(7)                 # the producer state as it was
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        monkeypatch.setattr(env.log, "append_aborted", real)
        assert env.marker(7, commit=False) == (E.none, 3)
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert env.log.aborted_entries() == [AbortedTxn(7, 0, 2, 3)]
    assert env.controls() == [(2, (0, 0))] and not env.psm.has_open_txn(7)
    # A recovery after a crash finds the one marker, at its offset.
    env.log.close(clean=False)
    env.log = PartitionLog.open(env.d, settings(), T0)
    assert env.log.log_end_offset == 3 and env.controls() == [(2, (0, 0))]


def test_a_marker_lifts_a_kip939_fence_at_or_below_its_epoch(env):
    fence = env.part.fence
    fence(ipc.FenceProducerRequest(7, 3))
    fence(ipc.FenceProducerRequest(7, 2))                  # never lowered
    fence(ipc.FenceProducerRequest(8, 5))
    assert env.part.fenced == {7: 3, 8: 5}
    assert env.marker(8, commit=False, epoch=4)[0] == E.none   # below the fence: it stays
    assert env.marker(7, commit=False, epoch=3)[0] == E.none
    assert env.part.fenced == {8: 5}
