"""Partition (appliance/log/partition.py): the requests a writer answers from its log and producer
state alone - DeleteRecords' outcomes, the cleaner's begin and swap, DescribeProducers - and the
retention tick, settings and close, on real logs in a tmp dir. No fork."""

from __future__ import annotations

import errno
import logging
import os

import pytest

import appliance.log.partition_log as plog
from appliance import ipc
from appliance.errors import ErrorCode as E
from appliance.log import swap
from appliance.log.cleaner import messages as cm
from appliance.log.cleaner.clean import Cleaner, CleaningAborted
from appliance.log.cleaner.offset_map import OffsetMap
from appliance.log.files import CLEANED_SUFFIX
from appliance.log.partition import Partition, load_producer_state
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.txn_index import AbortedTxn
from appliance.protocol.records import Record, build_batch, read_header
from cleanerkit import Part

T0 = 1_700_000_000_000


def settings(**kw) -> LogSettings:
    base = dict(segment_bytes=600, index_interval_bytes=100, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)
    base.update(kw)
    return LogSettings(**base)


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Env:
    def __init__(self, d: str, **kw) -> None:
        self.d = d
        self.log = PartitionLog.open(d, settings(**kw), T0)
        self.psm = ProducerStateManager(d, 60_000)
        load_producer_state(self.log, self.psm, T0)
        self.part = Partition("t", 3, self.log, self.psm)

    def put(self, n: int = 1, pid: int = -1, seq: int = 0, txn: bool = False, ts: int = T0) -> None:
        for i in range(n):
            b = bytearray(build_batch([Record(b"k", b"v" * 40, (), ts)], producer_id=pid,
                                      producer_epoch=0 if pid >= 0 else -1,
                                      base_sequence=seq + i if pid >= 0 else -1,
                                      transactional=txn))
            info = self.log.append(b, T0)
            if pid >= 0:
                self.psm.update(read_header(b, 0), info.base_offset, T0)


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path))
    yield e
    e.log.close(clean=False)


# -- DeleteRecords ----------------------------------------------------------------------------

def test_delete_records_moves_the_log_start_and_deletes_whole_segments_below_it(env):
    env.put(16)
    bases = env.log.segment_bases()
    assert len(bases) > 3
    result, moved = env.part.delete_records(bases[2] + 1)
    assert (result.error, result.low_watermark, moved) == (E.none, bases[2] + 1, True)
    assert env.log.segment_bases()[0] == bases[2]
    # At or below the log start: nothing changes, the answer is the low watermark.
    result, moved = env.part.delete_records(1)
    assert (result.error, result.low_watermark, moved) == (E.none, bases[2] + 1, False)
    # -1 is the high watermark.
    result, moved = env.part.delete_records(-1)
    assert (result.error, result.low_watermark, moved) == (E.none, 16, True)


def test_delete_records_refuses_offsets_outside_the_log(env):
    env.put(2)
    result, moved = env.part.delete_records(3)
    assert (result.error, result.low_watermark, moved) == (E.offset_out_of_range, -1, False)
    assert result.message == ("Cannot increment the log start offset to 3 of partition t-3 since "
                              "it is larger than the high watermark 2")
    result, _ = env.part.delete_records(-2)
    assert result.error == E.offset_out_of_range and result.message == "The offset -2 is not valid"
    assert env.log.log_start_offset == 0


def test_delete_records_of_a_compacted_topic_is_a_policy_violation(tmp_path):
    env = Env(str(tmp_path), cleanup_policy="compact")
    env.put(2)
    result, moved = env.part.delete_records(1)
    assert (result.error, moved) == (E.policy_violation, False)
    assert "can not be deleted due to the configured policy" in result.message
    env.log.close()


def test_delete_records_on_a_full_disk_changes_nothing(env, monkeypatch):
    env.put(4)
    monkeypatch.setattr(plog, "write_checkpoint", no_space)
    result, moved = env.part.delete_records(2)
    assert (result.error, moved) == (E.kafka_storage_error, False)
    assert result.message.startswith("cannot persist the log start offset")
    assert env.log.log_start_offset == 0


def test_the_published_lso_never_falls_below_the_log_start(env):
    env.put(1)
    env.put(1, pid=7, txn=True)                   # open at offset 1
    env.put(3)
    assert env.part.last_stable_offset() == 1
    env.part.delete_records(3)
    assert env.part.last_stable_offset() == 3


# -- the cleaner's begin and swap, DescribeProducers --------------------------------------------

def test_cleaner_begin_pages_through_the_producers_and_drops_stale_copies(env, monkeypatch):
    env.put(1, pid=5)
    env.put(2, pid=9)
    stale = os.path.join(env.d, f"{0:020d}.log{CLEANED_SUFFIX}")
    open(stale, "wb").close()
    monkeypatch.setattr(cm, "PRODUCERS_PER_ANSWER", 1)
    first = env.part.cleaner_begin(cm.CleanerBeginRequest())
    assert not os.path.exists(stale)
    assert (first.error, cm.unpack_producers(first.producers), first.next_cursor) == \
        (E.none, [(5, 0, 0)], 5)
    more = env.part.cleaner_begin(cm.CleanerBeginRequest(cursor=5))
    assert (cm.unpack_producers(more.producers), more.next_cursor) == ([(9, 2, 0)], -1)


def test_describe_producers_answers_every_active_producer(env):
    env.put(2, pid=5, txn=True)
    got = env.part.describe_producers(ipc.DescribeProducersRequest())
    assert got == ipc.DescribeProducersResult(E.none, [ipc.ProducerInfo(5, 0, 1, T0, -1, 0)])


@pytest.fixture
def cleanable(tmp_path):
    p = Part(str(tmp_path))
    for rnd in range(6):
        p.put([(b"k%d" % i, b"r%d-%d" % (rnd, i)) for i in range(4)])
    p.roll()
    yield p
    p.close()


def _swap_through(p: Part, delay_s: float = 60.0):
    """A cleaning round whose swap is the writer's: Partition.cleaner_swap's answers."""
    part = Partition("t", 0, p.log, p.psm)
    answers = []

    def swapped(groups, checkpoint):
        req = cm.CleanerSwapRequest([(g.base, [(x.base, x.ino, x.size) for x in g.old])
                                     for g in groups], checkpoint)
        answers.append(part.cleaner_swap(req, delay_s))
        return answers[-1][0].error == E.none
    return answers, swapped


def test_cleaner_swap_swaps_the_copies_in_and_says_the_segments_changed(cleanable):
    p = cleanable
    answers, swapped = _swap_through(p)
    version = p.log.segments_version
    segs, c = p.plan()
    Cleaner(p.d, p.s, OffsetMap(1 << 20)).clean(segs, c, hw=p.hw, producers=p.producers(),
                                                 swap=swapped, now_ms=p.now)
    assert [(r.error, changed) for r, changed in answers] == [(E.none, True)]
    assert p.log.segments_version > version and p.log.has_retired
    assert [r.value for r in p.read()] == [b"r5-%d" % i for i in range(4)]


def test_cleaner_swap_refused_or_out_of_space_changes_nothing(cleanable, monkeypatch, caplog):
    p = cleanable
    part = Partition("t", 0, p.log, p.psm)
    before = p.read()
    bases = p.log.segment_bases()
    # Segments that are not consecutive sealed ones: INVALID_REQUEST.
    with caplog.at_level(logging.INFO, logger="appliance.writer"):
        result, changed = part.cleaner_swap(cm.CleanerSwapRequest([(bases[1], [(bases[0], 1, 1)])]),
                                            60.0)
    assert (result.error, changed) == (E.invalid_request, False) and result.message
    # A full disk at the commit: KAFKA_STORAGE_ERROR, the cleaner tries again later.
    monkeypatch.setattr(swap, "atomic_write", no_space)
    answers, swapped = _swap_through(p)
    segs, c = p.plan()
    with pytest.raises(CleaningAborted):
        Cleaner(p.d, p.s, OffsetMap(1 << 20)).clean(segs, c, hw=p.hw, producers=p.producers(),
                                                     swap=swapped, now_ms=p.now)
    assert [(r.error, changed) for r, changed in answers] == [(E.kafka_storage_error, False)]
    assert p.read() == before and p.log.segment_bases() == bases


# -- retention, settings, close, recovery -----------------------------------------------------------

def test_a_failing_retention_tick_is_logged_once_and_once_when_it_works_again(env, monkeypatch,
                                                                                 caplog):
    env.put(6, ts=T0 - 10_000)
    env.log.update_settings(settings(retention_ms=1000))
    with caplog.at_level(logging.INFO, logger="appliance.writer"):
        monkeypatch.setattr(env.log, "enforce_retention", no_space)
        assert env.part.tick(T0) is False
        assert env.part.tick(T0) is False
        monkeypatch.undo()
        assert env.part.tick(T0) is True                   # segments past retention went
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert env.log.log_start_offset > 0


def test_changed_settings_say_whether_retention_is_enforced_now(env):
    assert env.part.update_settings(settings()) is False               # nothing changed
    assert env.part.update_settings(settings(index_interval_bytes=200)) is False
    assert env.log.settings.index_interval_bytes == 200
    assert env.part.update_settings(settings(index_interval_bytes=200, retention_ms=5)) is True


def test_close_on_a_full_disk_gives_up_the_snapshot_not_the_stop(tmp_path, monkeypatch):
    env = Env(str(tmp_path))
    env.put(2, pid=5)
    monkeypatch.setattr(env.psm, "take_snapshot", lambda offset, **kw: no_space())
    env.part.close()                                      # no exception
    env.log.close(clean=False)
    env = Env(str(tmp_path))                              # recovers the tail: both batches
    assert env.log.log_end_offset == 2 and env.psm.entries[5].last_seq == 1
    env.log.close()


def test_recovery_rebuilds_the_aborted_index_of_the_segments_it_scanned(tmp_path):
    env = Env(str(tmp_path))
    env.put(1, pid=7, txn=True)
    info = env.log.append_control(7, 0, False, 0, T0)
    first, lso = env.psm.preview_completion(7, info.base_offset, env.log.log_end_offset)
    env.log.append_aborted(AbortedTxn(7, first, info.last_offset, lso))
    env.psm.complete_txn(7, 0, 0, info.base_offset, True, T0)
    env.log.close(clean=False)                            # a crash: the tail is scanned again
    env = Env(str(tmp_path))
    assert env.log.aborted_entries() == [AbortedTxn(7, 0, 1, 2)]
    assert not env.psm.has_open_txn(7)
    env.log.close()
