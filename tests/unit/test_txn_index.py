"""Aborted-transaction index (.txnindex): Kafka's byte layout, collect semantics, torn tails,
truncation, and its life with the segment (roll fsync, retention delete, recovery rebuild)."""

from __future__ import annotations

import os
import struct

import pytest

from appliance.log.files import list_segment_bases, txnindex_path
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.reader import LogReader
from appliance.log.txn_index import (ENTRY_SIZE, AbortedTxn, TransactionIndex, collect_entries,
                                     decode_entries, encode_entry, read_entries, sane)
from appliance.protocol.records import Record, build_batch

# Kafka's TransactionIndexTest fixture.
KAFKA_TXNS = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13),
              AbortedTxn(2, 18, 35, 25), AbortedTxn(3, 32, 50, 40)]


@pytest.fixture
def index(tmp_path):
    ix = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"), 0, writable=True)
    yield ix
    ix.close()


def test_entry_layout_matches_kafka_aborted_txn():
    # AbortedTxn: VERSION_OFFSET 0 (2), PRODUCER_ID_OFFSET 2 (8), FIRST_OFFSET_OFFSET 10 (8),
    # LAST_OFFSET_OFFSET 18 (8), LAST_STABLE_OFFSET_OFFSET 26 (8), TOTAL_SIZE 34, big endian.
    assert ENTRY_SIZE == 34
    raw = encode_entry(AbortedTxn(983493, 137, 299, 200))
    assert raw == (b"\x00\x00" + (983493).to_bytes(8, "big") + (137).to_bytes(8, "big")
                   + (299).to_bytes(8, "big") + (200).to_bytes(8, "big"))
    assert struct.unpack_from(">h", raw, 0)[0] == 0
    assert struct.unpack_from(">q", raw, 2)[0] == 983493
    assert struct.unpack_from(">q", raw, 10)[0] == 137
    assert struct.unpack_from(">q", raw, 18)[0] == 299
    assert struct.unpack_from(">q", raw, 26)[0] == 200
    assert decode_entries(raw) == [AbortedTxn(983493, 137, 299, 200)]


def test_file_is_created_on_first_append_and_holds_only_entries(index):
    assert not os.path.exists(index.path)
    index.fsync()                           # nothing to sync yet: no file, no error
    for t in KAFKA_TXNS:
        index.append(t)
    with open(index.path, "rb") as f:
        assert f.read() == b"".join(encode_entry(t) for t in KAFKA_TXNS)
    assert index.entries() == KAFKA_TXNS


def test_reopen_appends_after_existing_entries(index, tmp_path):
    for t in KAFKA_TXNS:
        index.append(t)
    index.close()
    again = TransactionIndex(index.path, 0, writable=True)
    assert again.last_offset == 50
    again.append(AbortedTxn(3, 50, 60, 55))
    assert again.entries() == KAFKA_TXNS + [AbortedTxn(3, 50, 60, 55)]
    again.close()


def test_last_offset_must_increase(index):
    index.append(AbortedTxn(1, 5, 15, 13))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(0, 0, 15, 11))
    with pytest.raises(ValueError):
        index.append(AbortedTxn(0, 0, 10, 11))
    assert index.entries() == [AbortedTxn(1, 5, 15, 13)]


def test_read_only_index_refuses_appends(tmp_path):
    ix = TransactionIndex(str(tmp_path / "x.txnindex"), 0)
    with pytest.raises(ValueError):
        ix.append(AbortedTxn(1, 1, 2, 3))
    assert ix.entries() == [] and ix.collect(0, 100) == ([], False)


def test_collect_aborted_transactions_kafka_cases(index):
    for t in KAFKA_TXNS:
        index.append(t)
    assert index.collect(0, 100) == (KAFKA_TXNS, False)
    assert index.collect(0, 32) == (KAFKA_TXNS[:3], True)       # entry 2's LSO 25 < 32, entry
    assert index.collect(0, 35) == (KAFKA_TXNS, True)           # 3 starts at 32 < 35: included
    assert index.collect(10, 35) == (KAFKA_TXNS, True)
    assert index.collect(11, 35) == (KAFKA_TXNS[1:], True)
    assert index.collect(20, 41) == (KAFKA_TXNS[2:], False)


def test_collect_stops_early_at_an_entry_whose_lso_reaches_the_upper_bound():
    entries = [AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10), AbortedTxn(3, 20, 30, 31)]
    # entry 1's LSO 6 >= 6: the search ends there; entry 2 (first 3 < 6) is not even looked at
    assert collect_entries(entries, 0, 6) == ([AbortedTxn(1, 0, 5, 6)], True)
    assert collect_entries(entries, 0, 7) == (entries[:2], True)


def test_collect_ignores_entries_at_or_past_the_high_watermark():
    entries = [AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10)]
    assert collect_entries(entries, 0, 100, high_watermark=9) == ([entries[0]], True)
    assert collect_entries(entries, 0, 100, high_watermark=10) == (entries, False)


def test_torn_tail_is_ignored_by_readers_and_cut_by_the_writer(index):
    for t in KAFKA_TXNS[:2]:
        index.append(t)
    index.close()
    with open(index.path, "ab") as f:
        f.write(encode_entry(KAFKA_TXNS[2])[:20])          # a crash mid-write
    assert read_entries(index.path) == KAFKA_TXNS[:2]
    assert TransactionIndex(index.path, 0).collect(0, 100) == (KAFKA_TXNS[:2], False)
    assert not sane(index.path, 0, 100)
    w = TransactionIndex(index.path, 0, writable=True)    # reopening for append cuts the tail
    assert os.path.getsize(index.path) == 2 * ENTRY_SIZE and w.last_offset == 15
    w.append(KAFKA_TXNS[2])
    assert w.entries() == KAFKA_TXNS[:3]
    w.close()


def test_unknown_version_is_refused(index):
    index.append(KAFKA_TXNS[0])
    index.close()
    with open(index.path, "r+b") as f:
        f.write(b"\x00\x01")
    with pytest.raises(ValueError):
        read_entries(index.path)
    assert not sane(index.path, 0, 100)


def test_sanity_check(index):
    for t in KAFKA_TXNS:
        index.append(t)
    assert sane(index.path, 0, 51)
    assert not sane(index.path, 100, 200)       # Kafka's case: last offset below the start
    assert not sane(index.path, 0, 50)          # a marker past the segment's end
    assert sane(str(index.path) + ".missing", 0, 1)


def test_truncate_to(index):
    txns = [AbortedTxn(0, 0, 10, 2), AbortedTxn(1, 5, 15, 16), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    for t in txns:
        index.append(t)
    index.truncate_to(51)
    assert index.entries() == txns
    index.truncate_to(50)
    assert index.entries() == txns[:3] and index.last_offset == 35
    index.append(AbortedTxn(3, 40, 45, 41))                   # appends continue after the cut
    assert index.entries() == txns[:3] + [AbortedTxn(3, 40, 45, 41)]
    index.truncate_to(0)
    assert index.entries() == [] and index.last_offset == -1


def test_delete(index):
    index.append(KAFKA_TXNS[0])
    index.delete()
    assert not os.path.exists(index.path)
    index.delete()                                            # twice is fine


# -- with the segment ---------------------------------------------------------------------------

def settings(**kw) -> LogSettings:
    base = dict(segment_bytes=2048, index_interval_bytes=200, segment_index_bytes=4096,
                retention_ms=-1, retention_bytes=-1)
    base.update(kw)
    return LogSettings(**base)


def txn_batch(pid: int, seq: int, size: int = 300) -> bytearray:
    return bytearray(build_batch([Record(b"k", b"v" * size)], producer_id=pid, producer_epoch=0,
                                 base_sequence=seq, transactional=True, base_timestamp=1000))


def test_file_name_sits_next_to_the_segment(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(), 0)
    log.append(txn_batch(1, 0), 0)
    m = log.append_control(1, 0, False, 0, 0)
    log.append_aborted(AbortedTxn(1, 0, m.base_offset, m.base_offset + 1))
    assert os.path.exists(os.path.join(d, "00000000000000000000.txnindex"))
    assert txnindex_path(d, 0) == os.path.join(d, "00000000000000000000.txnindex")
    log.close()


def test_roll_fsyncs_the_old_index_and_the_new_segment_starts_without_one(tmp_path, monkeypatch):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(), 0)
    log.append(txn_batch(1, 0), 0)
    m = log.append_control(1, 0, False, 0, 0)
    log.append_aborted(AbortedTxn(1, 0, m.base_offset, m.base_offset + 1))
    synced = []
    real = TransactionIndex.fsync

    def spy(self):
        synced.append((self.base_offset, self._fd >= 0))
        real(self)
    monkeypatch.setattr(TransactionIndex, "fsync", spy)
    while len(log.segment_bases()) == 1:
        log.append(bytearray(build_batch([Record(b"k", b"v" * 300)], base_timestamp=1000)), 0)
    assert (0, True) in synced
    new = log.active_segment_base
    assert not os.path.exists(txnindex_path(d, new))
    log.close()


def test_retention_deletes_the_index_with_its_segment(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(retention_bytes=0), 0)
    log.append(txn_batch(1, 0), 0)
    m = log.append_control(1, 0, False, 0, 0)
    log.append_aborted(AbortedTxn(1, 0, m.base_offset, m.base_offset + 1))
    while len(log.segment_bases()) == 1:
        log.append(bytearray(build_batch([Record(b"k", b"v" * 300)], base_timestamp=1000)), 0)
    assert os.path.exists(txnindex_path(d, 0))
    assert log.enforce_retention(10**13)
    assert 0 not in list_segment_bases(d)
    assert not os.path.exists(txnindex_path(d, 0))
    log.close()


def test_orphan_txnindex_is_removed_at_open(tmp_path):
    d = str(tmp_path)
    PartitionLog.open(d, settings(), 0).close()
    orphan = txnindex_path(d, 12345)
    with open(orphan, "wb") as f:
        f.write(encode_entry(AbortedTxn(1, 12345, 12346, 12347)))
    PartitionLog.open(d, settings(), 0).close()
    assert not os.path.exists(orphan)


def test_reader_collects_across_segments(tmp_path):
    d = str(tmp_path)
    log = PartitionLog.open(d, settings(), 0)
    # producer 1's transaction spans a roll; its marker (and entry) land in the later segment
    log.append(txn_batch(1, 0), 0)
    while len(log.segment_bases()) == 1:
        log.append(bytearray(build_batch([Record(b"k", b"v" * 300)], base_timestamp=1000)), 0)
    m = log.append_control(1, 0, False, 0, 0)
    log.append_aborted(AbortedTxn(1, 0, m.base_offset, m.base_offset + 1))
    hw = log.log_end_offset
    r = LogReader(d)
    assert read_entries(txnindex_path(d, 0)) == []
    assert r.collect_aborted(0, 1, hw) == [(1, 0)]            # from segment 0 on
    assert r.collect_aborted(m.base_offset, hw, hw) == [(1, 0)]   # only the marker in range
    assert r.collect_aborted(0, 1, m.base_offset) == []      # marker not below the HW yet
    r.close()
    log.close()
