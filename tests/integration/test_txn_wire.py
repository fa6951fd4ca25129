"""Transactions at the wire level, against the real appliance: one test per behaviour KIP-98 and
KIP-890 ask of the broker (a test may cover several; its name says what it checks).

Transactions are driven by hand with ``RawClient``: InitProducerId with a transactional id,
AddPartitionsToTxn, Produce of transactional batches built with ``build_batch(transactional=True)``,
EndTxn; then the outcome is read back with raw Fetch (isolation level 0/1: AbortedTransactions,
LastStableOffset, HighWatermark, the control batches themselves), ListOffsets, DescribeTransactions,
DescribeProducers and the files in the data dir. No client library sits in between, so every error
code checked here is the broker's own.

Moments that real clients cannot reach on purpose are made with signals: a partition writer
stopped with SIGSTOP cannot acknowledge markers, so the transaction stays PrepareCommit; a stopped
coordinator cannot answer a KIP-890 verification or load its state. Every process stopped is
continued in a ``finally``.
"""

from __future__ import annotations

import glob
import os
import struct
import time

import pytest

from appliance.data_layout import partition_dir
from appliance.log.txn_index import read_entries
from appliance.protocol.records import (CONTROL_ABORT, CONTROL_COMMIT, Record, build_batch,
                                        build_control_batch, scan_valid)
from appliance.txn.state_manager import read_coordinator_epoch
from appliance_harness import coordinator_pid, eventually, stopped
from raw_wire import (CONCURRENT_TRANSACTIONS, COORDINATOR_NOT_AVAILABLE, EARLIEST,
                      INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, INVALID_RECORD,
                      INVALID_REQUEST, INVALID_TOPIC_EXCEPTION, INVALID_TXN_STATE, NONE,
                      NOT_ENOUGH_REPLICAS, OUT_OF_ORDER_SEQUENCE_NUMBER, PRODUCER_FENCED, READ_COMMITTED,
                      READ_UNCOMMITTED, TRANSACTION_ABORTABLE, TRANSACTION_COORDINATOR_FENCED,
                      RawClient, create_topic, end_offsets, fetch, list_offset, plain, produce,
                      records_of)
from java_programs import java4_program  # noqa: F401 (fixture)
from txn_wire import Txn, add_offsets, describe, end_txn, init_pid, producers, txn_partitions, write_markers


def test_first_transactional_batch_with_nonzero_sequence_is_out_of_order(appliance):
    """A transactional producer with no state on the partition whose first batch has
    sequence != 0 gets OUT_OF_ORDER_SEQUENCE_NUMBER and nothing is appended; sequence 0 then
    goes through (the partition really was in the transaction)."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g3")
        plain(raw, "g3", 0, [b"before"])
        t = Txn(raw, "g3-txn")
        t.must_add("g3", [0])
        for seq in (1, 5, 2**31 - 1):
            p = t.send("g3", 0, [b"x"], seq=seq)
            assert p.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER, (seq, p)
        assert end_offsets(raw, "g3") == (1, 1)
        assert t.describe().transaction_state == "Ongoing"
        assert t.pid not in producers(raw, "g3")
        assert t.must_send("g3", 0, [b"first"]) == 1          # sequence 0
        t.commit()
        got = fetch(raw, "g3", isolation=READ_COMMITTED)
        assert got.values() == [b"before", b"first"]


def test_control_batch_from_a_client_is_rejected(appliance):
    """A client's control batch (a forged COMMIT marker, transactional or not) is refused
    with INVALID_RECORD and nothing is appended; the open transaction it tries to end stays open."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g8")
        t = Txn(raw, "g8-txn")
        t.must_add("g8", [0])
        first = t.must_send("g8", 0, [b"open"])
        assert end_offsets(raw, "g8") == (1, first)
        forged = build_control_batch(commit=True, producer_id=t.pid, producer_epoch=t.epoch,
                                     coordinator_epoch=1000, timestamp_ms=int(time.time() * 1000))
        p = produce(raw, "g8", 0, forged, txn_id="g8-txn")
        assert p.error_code == INVALID_RECORD, p
        # the same without the transactional bit, from a plain producer
        plain_ctl = build_batch([Record(key=struct.pack(">hh", 0, CONTROL_COMMIT),
                                        value=struct.pack(">hi", 0, 0))], control=True)
        assert produce(raw, "g8", 0, plain_ctl).error_code == INVALID_RECORD
        assert end_offsets(raw, "g8") == (1, first)
        got = fetch(raw, "g8")
        assert [b.control for b in got.batches] == [False]
        assert producers(raw, "g8")[t.pid].current_txn_start_offset == first
        # the coordinator epoch of the forged marker was not stored either
        assert producers(raw, "g8")[t.pid].coordinator_epoch == -1


# -- coordinator basics -----------------------------------------------------------------------------

def test_find_coordinator_for_a_transactional_id_names_this_node(appliance_factory):
    """FindCoordinator key type 1 (transaction) names this broker at every version that
    has a key type (v1-6; v4+ batched). An empty transactional id is INVALID_REQUEST (Kafka).
    The location does not depend on the coordinator's state: while it cannot answer (stopped),
    FindCoordinator still names this node and the transaction APIs answer the retriable
    COORDINATOR_NOT_AVAILABLE, which sends clients back to FindCoordinator."""
    app = appliance_factory(server={"internal_request_timeout_ms": 1000})
    host, port = app.bootstrap.rsplit(":", 1)
    with RawClient(app.bootstrap) as raw:
        def find(v, key="g12-txn"):
            r = raw.request(10, v, {"key": key, "key_type": 1, "coordinator_keys": [key]})
            if v >= 4:
                (c,) = r.coordinators
                assert c.key == key
                return c.error_code, c.node_id, c.host, c.port
            return r.error_code, r.node_id, r.host, r.port

        for v in range(1, 7):
            assert find(v) == (NONE, 1, host, int(port)), v
            assert find(v, "")[0] == INVALID_REQUEST, v
        with stopped(coordinator_pid(app)):
            assert find(6) == (NONE, 1, host, int(port))
            t0 = time.monotonic()
            assert init_pid(raw, "g12-txn").error_code == COORDINATOR_NOT_AVAILABLE
            assert time.monotonic() - t0 < 5
        assert init_pid(raw, "g12-txn").error_code == NONE


def _txn_log_batches(app) -> int:
    n = 0
    for path in glob.glob(os.path.join(app.data_dir, "__coordinator", "txn-log", "*.log")):
        with open(path, "rb") as f:
            n += len(scan_valid(f.read())[0])
    return n


def test_init_producer_id_without_transactional_id(appliance):
    """InitProducerId with a null transactional id hands out a producer id never handed out
    before, with epoch 0, at every version, and writes nothing to the transaction log (a
    transactional InitProducerId does write there: the check can see a write)."""
    with RawClient(appliance.bootstrap) as raw:
        before = _txn_log_batches(appliance)
        seen = set()
        for v in range(0, 6):
            for _ in range(3):
                r = init_pid(raw, None, version=v)
                assert r.error_code == NONE and r.producer_epoch == 0 and r.producer_id >= 0, (v, r)
                assert r.producer_id not in seen
                seen.add(r.producer_id)
        assert _txn_log_batches(appliance) == before
        t = Txn(raw, "g13-txn")
        assert t.pid not in seen
        assert _txn_log_batches(appliance) == before + 1


def test_init_producer_id_again_keeps_the_id_and_bumps_the_epoch(appliance):
    """A second InitProducerId for the same transactional id returns the same producer id
    and a greater epoch; the mapping is in the transaction log before the reply, so it survives
    kill -9 of the whole appliance right after the reply (and a clean restart)."""
    with RawClient(appliance.bootstrap) as raw:
        first = init_pid(raw, "g14-txn")
        second = init_pid(raw, "g14-txn")
        assert first.error_code == second.error_code == NONE
        assert second.producer_id == first.producer_id
        assert second.producer_epoch == first.producer_epoch + 1
    appliance.kill9_all()
    appliance.start()
    with RawClient(appliance.bootstrap) as raw:
        d = describe(raw, "g14-txn")
        assert (d.producer_id, d.producer_epoch) == (first.producer_id, second.producer_epoch)
        third = init_pid(raw, "g14-txn")
        assert (third.producer_id, third.producer_epoch) == (first.producer_id, second.producer_epoch + 1)
    appliance.terminate()
    appliance.start()
    with RawClient(appliance.bootstrap) as raw:
        fourth = init_pid(raw, "g14-txn")
        assert (fourth.producer_id, fourth.producer_epoch) == (first.producer_id, third.producer_epoch + 1)


def test_unknown_transactional_id_or_other_producer_id_is_invalid_mapping(appliance):
    """AddPartitionsToTxn for a transactional id the coordinator does not know, or with a
    producer id other than the mapped one, fails with INVALID_PRODUCER_ID_MAPPING at every
    client version (v0-3), and nothing is added; so do AddOffsetsToTxn and EndTxn."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g19", 2)
        t = Txn(raw, "g19-txn")
        other = init_pid(raw, None).producer_id
        stranger = Txn(raw, "g19-unknown", pid=t.pid, epoch=0)        # an id nobody initialized
        for v in range(0, 4):
            assert set(t.add("g19", [0, 1], pid=other, version=v).values()) == {INVALID_PRODUCER_ID_MAPPING}, v
            assert set(stranger.add("g19", [0], version=v).values()) == {INVALID_PRODUCER_ID_MAPPING}, v
        assert stranger.add_offsets("g19-group") == INVALID_PRODUCER_ID_MAPPING
        assert stranger.end(True).error_code == INVALID_PRODUCER_ID_MAPPING
        assert t.end(False, pid=other).error_code == INVALID_PRODUCER_ID_MAPPING
        d = t.describe()
        assert d.transaction_state == "Empty" and txn_partitions(d) == []
        assert describe(raw, "g19-unknown").error_code == 105         # TRANSACTIONAL_ID_NOT_FOUND
        # and the right pair works
        t.must_add("g19", [0, 1])
        assert txn_partitions(t.describe()) == [("g19", 0), ("g19", 1)]


def test_requests_during_prepare_commit_are_refused_and_change_nothing(appliance):
    """While the transaction is PrepareCommit (its partition writer is stopped, so the
    COMMIT marker cannot be acknowledged), AddPartitionsToTxn, AddOffsetsToTxn and EndTxn are
    refused with CONCURRENT_TRANSACTIONS (or INVALID_TXN_STATE) and the transaction is unchanged;
    InitProducerId waits as well and never aborts the decided commit (KIP-98). Once the writer runs
    again the commit completes and read_committed sees the data."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g20", 2)
        t = Txn(raw, "g20-txn")
        t.must_add("g20", [0])
        t.must_send("g20", 0, [b"a", b"b"])
        writer = appliance.writer("g20", 0)["pid"]
        with stopped(writer):
            r = t.end(True)
            assert r.error_code == NONE, r
            before = t.describe()
            assert before.transaction_state == "PrepareCommit"
            assert txn_partitions(before) == [("g20", 0)]
            for v in range(0, 4):
                codes = t.add("g20", [1], version=v)
                assert set(codes.values()) <= {CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE}, (v, codes)
            assert t.add_offsets("g20-group") in (CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE)
            for v in range(0, 5):
                assert t.end(True, version=v).error_code in (CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE), v
                assert t.end(False, version=v).error_code in (CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE), v
            assert init_pid(raw, "g20-txn").error_code == CONCURRENT_TRANSACTIONS
            # a transactional batch for partition 1 (not in the transaction) is not appended
            # (the verification meets CONCURRENT_TRANSACTIONS: retriable NOT_ENOUGH_REPLICAS)
            p = t.send("g20", 1, [b"late"])
            assert p.error_code == NOT_ENOUGH_REPLICAS, p
            time.sleep(0.3)
            after = t.describe()
            assert (after.transaction_state, after.producer_id, after.producer_epoch, txn_partitions(after),
                    after.transaction_start_time) == \
                   (before.transaction_state, before.producer_id, before.producer_epoch,
                    txn_partitions(before), before.transaction_start_time)
            assert fetch(raw, "g20", 1).high_watermark == 0
        t.wait_state("CompleteCommit")
        got = fetch(raw, "g20", 0, isolation=READ_COMMITTED)
        assert got.values() == [b"a", b"b"] and got.aborted == []
        assert [m[2] for m in got.markers()] == [CONTROL_COMMIT]


# -- commit / abort -----------------------------------------------------------------------------------

def test_abort_writes_an_abort_marker_and_index_entry_on_every_partition(appliance):
    """EndTxn(ABORT) puts an ABORT marker (with the producer's epoch and the coordinator
    epoch) on every partition of the transaction, including one that got no data, and each
    partition gets an aborted-index entry (pid, first offset, marker offset) that read_committed
    fetches report."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g24a", 2)
        create_topic(raw, "g24b", 1)
        plain(raw, "g24a", 0, [b"p0"])
        t = Txn(raw, "g24-txn")
        t.must_add("g24a", [0, 1])
        t.must_add("g24b", [0])
        first_a0 = t.must_send("g24a", 0, [b"x1"])
        t.must_send("g24a", 0, [b"x2", b"x3"])
        first_b0 = t.must_send("g24b", 0, [b"y"])
        t.abort()
        expect = {("g24a", 0): (first_a0, 4), ("g24a", 1): (0, 0), ("g24b", 0): (first_b0, 1)}
        for (topic, p), (first, marker) in expect.items():
            got = fetch(raw, topic, p, isolation=READ_COMMITTED)
            assert got.error_code == NONE
            assert got.aborted == [(t.pid, first)], (topic, p, got)
            assert got.high_watermark == got.last_stable_offset == marker + 1
            ctl = [b for b in got.batches if b.control]
            assert len(ctl) == 1 and ctl[0].base_offset == marker
            assert (ctl[0].producer_id, ctl[0].producer_epoch) == (t.pid, t.epoch)
            (ctype, coord_epoch), = ctl[0].values
            assert ctype == CONTROL_ABORT
            assert coord_epoch == read_coordinator_epoch(os.path.join(appliance.data_dir, "__coordinator")) >= 1
            assert producers(raw, topic, p)[t.pid].coordinator_epoch == coord_epoch
            entries = read_entries(os.path.join(partition_dir(appliance.data_dir, topic, p),
                                                f"{0:020d}.txnindex"))
            assert [(e.producer_id, e.first_offset, e.last_offset) for e in entries] == \
                   [(t.pid, first, marker)], (topic, p, entries)


def test_end_txn_retries_and_end_txn_without_a_transaction(appliance):
    """EndTxn retried with the same command after the transaction completed succeeds;
    with the opposite command it is INVALID_TXN_STATE (and the outcome does not change).
    EndTxn with no transaction in progress (Empty) is INVALID_TXN_STATE."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g25")
        t = Txn(raw, "g25-txn")
        for v in range(0, 5):
            assert t.end(True, version=v).error_code == INVALID_TXN_STATE, v     # Empty
            assert t.end(False, version=v).error_code == INVALID_TXN_STATE, v
        assert t.describe().transaction_state == "Empty"
        t.must_add("g25", [0])
        t.must_send("g25", 0, [b"c"])
        t.commit()
        for v in range(0, 5):
            assert t.end(True, version=v).error_code == NONE, v                  # a retry
            assert t.end(False, version=v).error_code == INVALID_TXN_STATE, v
        t.must_add("g25", [0])
        t.must_send("g25", 0, [b"a"])
        t.abort()
        assert t.end(False).error_code == NONE
        assert t.end(True).error_code == INVALID_TXN_STATE
        assert t.describe().transaction_state == "CompleteAbort"
        got = fetch(raw, "g25", isolation=READ_COMMITTED)
        assert got.values() == [b"c", b"a"] and got.aborted == [(t.pid, 2)]
        assert [m[2] for m in got.markers()] == [CONTROL_COMMIT, CONTROL_ABORT]


def test_stale_marker_epochs_are_rejected(appliance):
    """WriteTxnMarkers (sent by a client) for a producer whose stored epoch is higher is
    rejected with INVALID_PRODUCER_EPOCH. One carrying a coordinator epoch below the one
    stored for the producer (by the coordinator's last marker) is rejected with
    TRANSACTION_COORDINATOR_FENCED. Neither writes anything: log end, LSO and the open
    transaction stay, and the real commit afterwards works. One carrying a coordinator epoch
    above the coordinator's current one is refused (INVALID_REQUEST, ours) so that it cannot
    fence the real coordinator."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g30")
        t = Txn(raw, "g30-txn")
        assert init_pid(raw, "g30-txn").producer_epoch == 1            # epoch 1 from now on
        t.epoch = 1
        t.must_add("g30", [0])
        t.must_send("g30", 0, [b"one"])
        t.commit()                                                      # the coordinator's marker
        coord_epoch = producers(raw, "g30")[t.pid].coordinator_epoch
        assert coord_epoch >= 1
        t.must_add("g30", [0])
        first = t.must_send("g30", 0, [b"two"])
        state = (end_offsets(raw, "g30"), fetch(raw, "g30").batches)
        assert state[0] == (first + 1, first)
        for version in (1, 2):
            for commit in (True, False):
                assert write_markers(raw, t.pid, 0, commit, coord_epoch, "g30", [0], version) == \
                    {("g30", 0): INVALID_PRODUCER_EPOCH}
                assert write_markers(raw, t.pid, t.epoch, commit, coord_epoch - 1, "g30", [0], version) == \
                    {("g30", 0): TRANSACTION_COORDINATOR_FENCED}
        assert (end_offsets(raw, "g30"), fetch(raw, "g30").batches) == state
        ap = producers(raw, "g30")[t.pid]
        assert (ap.producer_epoch, ap.coordinator_epoch, ap.current_txn_start_offset) == (1, coord_epoch, first)
        t.commit()
        got = fetch(raw, "g30", isolation=READ_COMMITTED)
        assert got.values() == [b"one", b"two"] and got.aborted == []
        # A coordinator epoch above the coordinator's own can only be forged: refused, nothing
        # written (stored, it would fence the real coordinator for this producer for good).
        t.must_add("g30", [0])
        t.must_send("g30", 0, [b"three"])
        hw = end_offsets(raw, "g30")[0]
        for version in (1, 2):
            assert write_markers(raw, t.pid, t.epoch, False, coord_epoch + 1, "g30", [0], version) == \
                {("g30", 0): INVALID_REQUEST}
        assert end_offsets(raw, "g30")[0] == hw
        assert producers(raw, "g30")[t.pid].coordinator_epoch == coord_epoch
        t.commit()
        assert fetch(raw, "g30", isolation=READ_COMMITTED).values() == [b"one", b"two", b"three"]
        # the control case: the same marker with current epochs is written
        assert write_markers(raw, t.pid, t.epoch, False, coord_epoch, "g30", [0]) == {("g30", 0): NONE}
        assert end_offsets(raw, "g30")[0] == hw + 2


# -- LSO and read_committed -----------------------------------------------------------------------------

def test_lso_tracks_the_first_open_transaction(appliance):
    """LSO = smallest first offset of the open transactions, the high watermark with none
    open, never decreasing (Fetch and ListOffsets agree). read_committed returns no batch at
    or beyond the LSO, including a fetch that starts between the LSO and the high watermark
    (empty, no error, as Kafka's read bounded by the LSO)."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g37")
        seen = []

        def check(hw, lso):
            got = fetch(raw, "g37")
            assert (got.high_watermark, got.last_stable_offset) == (hw, lso), got
            assert end_offsets(raw, "g37") == (hw, lso)
            rc = fetch(raw, "g37", isolation=READ_COMMITTED)
            assert (rc.high_watermark, rc.last_stable_offset) == (hw, lso)
            assert all(b.last_offset < lso for b in rc.batches), rc.batches          # below the LSO
            assert rc.batches == [b for b in got.batches if b.last_offset < lso]
            for off in range(lso, hw + 1):
                mid = fetch(raw, "g37", offset=off, isolation=READ_COMMITTED)
                assert mid.error_code == NONE and mid.batches == [], (off, mid)
            seen.append(lso)
            assert seen == sorted(seen), seen

        plain(raw, "g37", 0, [b"p0", b"p1", b"p2"])
        check(3, 3)
        t1, t2 = Txn(raw, "g37-1"), Txn(raw, "g37-2")
        t1.must_add("g37", [0])
        t2.must_add("g37", [0])
        assert t1.must_send("g37", 0, [b"t1a"]) == 3
        check(4, 3)
        plain(raw, "g37", 0, [b"p3"])
        assert t2.must_send("g37", 0, [b"t2a", b"t2b"]) == 5
        t1.must_send("g37", 0, [b"t1b"])
        check(8, 3)
        t1.commit()                     # marker at 8; t2 (first offset 5) still open
        check(9, 5)
        plain(raw, "g37", 0, [b"p4"])
        check(10, 5)
        t2.abort()                      # marker at 10; nothing open
        check(11, 11)
        t1.must_add("g37", [0])
        assert t1.must_send("g37", 0, [b"t1c"]) == 11
        check(12, 11)
        t1.commit()
        check(13, 13)
        rc = fetch(raw, "g37", isolation=READ_COMMITTED)
        assert rc.aborted == [(t2.pid, 5)]


def test_aborted_transactions_overlapping_the_fetched_range(appliance):
    """A read_committed fetch lists (pid, first offset) of every aborted transaction whose
    range overlaps the returned batches - also one whose only batch in range is its abort
    marker (fetch starting at the marker), and one that holds nothing but its marker on the
    partition (added, no data, aborted) - and never a committed one or one wholly before the
    fetch offset."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g39", 2)
        a, b, c = Txn(raw, "g39-a"), Txn(raw, "g39-b"), Txn(raw, "g39-c")
        for t in (a, b, c):
            t.must_add("g39", [0])
        assert a.must_send("g39", 0, [b"a1"]) == 0
        assert b.must_send("g39", 0, [b"b1"]) == 1
        assert c.must_send("g39", 0, [b"c1"]) == 2
        a.must_send("g39", 0, [b"a2"])             # 3
        a.abort()                                  # marker 4
        b.commit()                                 # marker 5
        c.abort()                                  # marker 6
        plain(raw, "g39", 0, [b"p"])               # 7
        d = Txn(raw, "g39-d")
        d.must_add("g39", [0])
        d.abort()                                  # marker 8, nothing else of d on the partition
        plain(raw, "g39", 0, [b"q"])               # 9
        full = fetch(raw, "g39", isolation=READ_COMMITTED)
        assert full.high_watermark == full.last_stable_offset == 10
        assert full.aborted == sorted([(a.pid, 0), (c.pid, 2), (d.pid, 8)])
        assert full.markers() == [(4, a.pid, CONTROL_ABORT), (5, b.pid, CONTROL_COMMIT),
                                  (6, c.pid, CONTROL_ABORT), (8, d.pid, CONTROL_ABORT)]

        def aborted_from(offset, max_bytes=1 << 20):
            got = fetch(raw, "g39", offset=offset, isolation=READ_COMMITTED, max_bytes=max_bytes)
            assert got.error_code == NONE and got.batches
            return got.aborted, got.batches[0].base_offset, got.batches[-1].last_offset

        # only the abort marker of a (offset 4) and everything after it is in range
        assert aborted_from(4) == (sorted([(a.pid, 0), (c.pid, 2), (d.pid, 8)]), 4, 9)
        # from c's marker: a is wholly before the fetch offset
        assert aborted_from(6) == (sorted([(c.pid, 2), (d.pid, 8)]), 6, 9)
        # from d's marker (its only batch anywhere)
        assert aborted_from(8) == ([(d.pid, 8)], 8, 9)
        assert aborted_from(9) == ([], 9, 9)
        # one batch only (the limit applies to whole batches, at least one): what it overlaps
        one = len(build_batch(records_of([b"a1"])))
        assert aborted_from(0, one) == ([(a.pid, 0)], 0, 0)
        assert aborted_from(1, one) == (sorted([(a.pid, 0)]), 1, 1)
        assert aborted_from(5, one) == (sorted([(c.pid, 2)]), 5, 5)
        # the other partition had no abort
        assert fetch(raw, "g39", 1, isolation=READ_COMMITTED).aborted == []


def test_read_uncommitted_returns_everything_up_to_the_high_watermark(appliance):
    """Read_uncommitted returns data up to the high watermark - open and aborted
    transactional batches and the markers too - with no aborted list, and still reports the
    LSO (pinned by the open transaction)."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g41")
        a, b = Txn(raw, "g41-a"), Txn(raw, "g41-b")
        a.must_add("g41", [0])
        b.must_add("g41", [0])
        a.must_send("g41", 0, [b"aborted"])
        a.abort()
        first_open = b.must_send("g41", 0, [b"open"])
        got = fetch(raw, "g41")
        assert got.error_code == NONE and got.aborted is None
        assert (got.high_watermark, got.last_stable_offset) == (3, first_open)
        assert got.values() == [b"aborted", b"open"]
        assert got.markers() == [(1, a.pid, CONTROL_ABORT)]
        assert all(x.transactional for x in got.batches)
        rc = fetch(raw, "g41", isolation=READ_COMMITTED)
        assert rc.values() == [b"aborted"] and rc.aborted == [(a.pid, 0)]   # the client filters it


def test_fetch_below_v4_is_not_served(appliance):
    """A Fetch older than v4 would have to behave as read_uncommitted. The appliance serves
    Fetch v4-17 only (as Kafka 4.0, which removed v0-3 with KIP-896): ApiVersions says so and a
    v3 request gets the connection closed, so no old-version fetch can leak or hide transactional
    data. The lowest version served, v4, carries the isolation level and honours both."""
    with RawClient(appliance.bootstrap) as raw:
        r = raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        (fetch_range,) = [(k.min_version, k.max_version) for k in r.api_keys if k.api_key == 1]
        assert fetch_range[0] == 4
        create_topic(raw, "g42")
        t = Txn(raw, "g42-txn")
        t.must_add("g42", [0])
        t.must_send("g42", 0, [b"open"])
        ru = fetch(raw, "g42", version=4)
        assert ru.values() == [b"open"] and ru.last_stable_offset == 0 and ru.aborted is None
        rc = fetch(raw, "g42", isolation=READ_COMMITTED, version=4)
        assert rc.batches == [] and rc.last_stable_offset == 0 and rc.aborted == []
    with RawClient(appliance.bootstrap) as raw:
        # Fetch v3: replica_id, max_wait, min_bytes, max_bytes, [topic, [partition, offset, max]]
        body = struct.pack(">iiii", -1, 0, 0, 1 << 20) + struct.pack(">ih", 1, 3) + b"g42" + \
            struct.pack(">iiqi", 1, 0, 0, 1 << 20)
        header = struct.pack(">hhih", 1, 3, 99, 4) + b"test"           # request header v1
        raw.send_frame(header + body)
        assert raw.closed_by_peer(5.0)


def test_list_offsets_latest_is_the_lso_for_read_committed(appliance):
    """ListOffsets LATEST with READ_COMMITTED answers the LSO, with READ_UNCOMMITTED the
    high watermark, at every version with an isolation level (v2+); v1 (none) answers the HW."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g43")
        plain(raw, "g43", 0, [b"a", b"b"])
        t = Txn(raw, "g43-txn")
        t.must_add("g43", [0])
        t.must_send("g43", 0, [b"t1", b"t2"])
        plain(raw, "g43", 0, [b"c"])
        for v in range(2, 12):
            assert list_offset(raw, "g43", isolation=READ_COMMITTED, version=v) == 2, v
            assert list_offset(raw, "g43", isolation=READ_UNCOMMITTED, version=v) == 5, v
            assert list_offset(raw, "g43", ts=EARLIEST, isolation=READ_COMMITTED, version=v) == 0, v
        assert list_offset(raw, "g43", version=1) == 5
        t.commit()
        for v in range(2, 12):
            assert list_offset(raw, "g43", isolation=READ_COMMITTED, version=v) == 6, v


def test_open_transaction_holds_back_a_later_committed_one(appliance):
    """P1's transaction is open when P2 commits a later one on the same partition:
    read_committed consumers see neither until P1 ends, then both, in offset order (commit),
    or only P2's (abort)."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g44", 2)
        for p, p1_commits in ((0, True), (1, False)):
            p1, p2 = Txn(raw, f"g44-p1-{p}"), Txn(raw, f"g44-p2-{p}")
            p1.must_add("g44", [p])
            first = p1.must_send("g44", p, [b"p1-a"])
            p2.must_add("g44", [p])
            p2.must_send("g44", p, [b"p2-a"])
            p1.must_send("g44", p, [b"p1-b"])
            p2.must_send("g44", p, [b"p2-b"])
            p2.commit()
            for _ in range(3):
                rc = fetch(raw, "g44", p, isolation=READ_COMMITTED)
                assert rc.batches == [] and rc.last_stable_offset == first, rc
                assert end_offsets(raw, "g44", p) == (5, first)
                time.sleep(0.05)
            if p1_commits:
                p1.commit()
                want = [b"p1-a", b"p2-a", b"p1-b", b"p2-b"]
            else:
                p1.abort()
                want = [b"p2-a", b"p2-b"]
            rc = fetch(raw, "g44", p, isolation=READ_COMMITTED)
            assert rc.last_stable_offset == rc.high_watermark == 6
            aborted = {pid for pid, _ in rc.aborted}
            # the consumer's filter (KIP-98, Kafka's fetcher): drop batches of aborted producers
            visible = [v for b in rc.batches if not b.control and b.producer_id not in aborted
                       for v in b.values]
            assert visible == want, (p, visible)


def _committed_view(raw, topic, partitions):
    out = {}
    for p in partitions:
        rc = fetch(raw, topic, p, isolation=READ_COMMITTED)
        assert rc.error_code == NONE, rc
        out[p] = (rc.high_watermark, rc.last_stable_offset, rc.aborted,
                  [(b.base_offset, b.control) for b in rc.batches],
                  end_offsets(raw, topic, p))
        for off in sorted({b.base_offset for b in rc.batches}):
            # the aborted list as a consumer resuming at each batch sees it
            out[(p, off)] = fetch(raw, topic, p, offset=off, isolation=READ_COMMITTED).aborted
    return out


@pytest.mark.parametrize("how", ["terminate", "kill9"])
def test_aborted_index_and_lso_survive_a_restart(appliance_factory, how):
    """After a clean restart and after kill -9 of the whole appliance, the aborted
    transactions reported for every fetch position, the LSO (pinned by a still-open transaction)
    and the high watermark are what they were; once the open transaction commits, every abort
    is reported, also the one written after it. Small segments put aborts into sealed segments
    and into the active one (which recovery rescans after kill -9, rebuilding its index from the
    log)."""
    app = appliance_factory()
    expected = {0: [], 1: []}          # partition -> [(pid, first offset)] of aborted transactions
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g45", 2, configs=[("segment.bytes", "900")])

        def txn(i, end):
            t = Txn(raw, f"g45-{i}")
            t.must_add("g45", [0, 1])
            for p in (0, 1):
                first = t.must_send("g45", p, [b"v%d-%d" % (i, p)])
                plain(raw, "g45", p, [b"plain-%d" % i])
                if end == "abort":
                    expected[p].append((t.pid, first))
            if end == "abort":
                t.abort()
            elif end == "commit":
                t.commit()
            return t

        d = partition_dir(app.data_dir, "g45", 0)

        def bases():
            return sorted(int(os.path.basename(f).split(".")[0]) for f in glob.glob(os.path.join(d, "*.log")))

        def last_abort_in_active_segment():
            aborts = [off for off, _, kind in fetch(raw, "g45", 0).markers() if kind == CONTROL_ABORT]
            b = bases()
            return len(b) >= 3 and b[-1] <= aborts[-1] < b[-1] + 3

        # Aborted and committed transactions until an abort marker has just begun a segment
        # (earlier aborts sit in sealed segments), then a transaction left open: the LSO stays
        # below that segment's abort, which kill -9 makes recovery rebuild.
        i = 0
        while True:
            abort = i % 2 == 0
            txn(i, "abort" if abort else "commit")
            i += 1
            if abort and last_abort_in_active_segment():
                break
            assert i < 40
        open_txn = txn(i, None)                             # stays open over the restart
        txn(i + 1, "abort")                                 # above the LSO
        aborts = [off for off, _, kind in fetch(raw, "g45", 0).markers() if kind == CONTROL_ABORT]
        assert bases()[-1] <= aborts[-2], (bases(), aborts)   # still the active segment
        n_below = len(expected[0]) - 1
        before = _committed_view(raw, "g45", [0, 1])
        for p in (0, 1):
            assert before[p][1] < before[p][0]                      # LSO pinned by the open txn
            assert before[p][2] == sorted(expected[p][:n_below])    # the aborts below it
    if how == "kill9":
        app.kill9_all()
    else:
        app.terminate()
    app.start()
    with RawClient(app.bootstrap) as raw:
        after = eventually(lambda: _try_view(raw), what="partitions served again")
        assert after == before
        open_txn.raw = raw
        open_txn.commit()
        for p in (0, 1):
            rc = fetch(raw, "g45", p, isolation=READ_COMMITTED)
            assert rc.last_stable_offset == rc.high_watermark
            assert rc.aborted == sorted(expected[p])


def _try_view(raw):
    try:
        return _committed_view(raw, "g45", [0, 1])
    except AssertionError:
        return None


def test_deleted_segment_takes_its_txnindex_with_it(appliance_factory):
    """Retention deletes a segment together with its aborted-transaction index file; the
    index files of the segments that stay are kept (no index without its segment), and
    read_committed still works from the new log start."""
    app = appliance_factory(log={"retention_check_interval_ms": 100})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g46", configs=[("segment.bytes", "400"), ("retention.bytes", "800")])
        d = partition_dir(app.data_dir, "g46", 0)

        def bases(ext):
            return {int(os.path.basename(f).split(".")[0]) for f in glob.glob(os.path.join(d, f"*.{ext}"))}

        indexed = set()
        for i in range(10):
            t = Txn(raw, f"g46-{i}")
            t.must_add("g46", [0])
            t.must_send("g46", 0, [b"x" * 100])
            t.abort()
            indexed |= bases("txnindex")
        assert len(indexed) >= 4, indexed
        start = eventually(lambda: list_offset(raw, "g46", ts=EARLIEST) > 0 and list_offset(raw, "g46", ts=EARLIEST),
                           what="retention")
        snapshots = [None]

        def settled():       # two equal looks 0.2 s apart: retention has finished its pass
            snapshots.append((bases("log"), bases("txnindex")))
            time.sleep(0.2)
            return snapshots[-1] == snapshots[-2] and snapshots[-1]

        logs, indexes = eventually(settled, what="retention to settle")
        deleted = indexed - logs
        assert deleted, (indexed, logs)                 # segments with an index were deleted...
        assert not deleted & indexes, deleted & indexes  # ...and their index files with them
        assert indexes <= logs, indexes - logs           # no orphan index file at all
        assert indexed & logs <= indexes                 # the surviving segments keep theirs
        # The log start as of now: retention may have gone on after the first look (regression:
        # the test compared the settled segments with the log start it saw first).
        start = list_offset(raw, "g46", ts=EARLIEST)
        assert min(logs) <= start
        rc = fetch(raw, "g46", offset=start, isolation=READ_COMMITTED)
        assert rc.error_code == NONE and rc.batches and rc.aborted


# -- KIP-890 part 1: verification ------------------------------------------------------------------------

def test_transactional_batch_to_a_partition_not_in_the_transaction(appliance):
    """With verification on (the default), a transactional batch (old client: Produce
    <= v11) for a partition that was never added to the Ongoing transaction fails - INVALID_TXN_STATE
    for Produce <= v10, TRANSACTION_ABORTABLE for v11 (Kafka's mapping) - and nothing is appended:
    no hanging transaction, the LSO stays at the high watermark. The same for a producer with no
    transaction at all."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g57", 2)
        t = Txn(raw, "g57-txn")
        t.must_add("g57", [0])
        t.must_send("g57", 0, [b"in"])
        for version in (3, 7, 9, 10):
            assert t.send("g57", 1, [b"out"], version=version).error_code == INVALID_TXN_STATE, version
        assert t.send("g57", 1, [b"out"], version=11).error_code == TRANSACTION_ABORTABLE
        assert end_offsets(raw, "g57", 1) == (0, 0)
        assert t.pid not in producers(raw, "g57", 1)
        assert txn_partitions(t.describe()) == [("g57", 0)]
        idle = Txn(raw, "g57-idle")
        assert idle.send("g57", 1, [b"none"]).error_code == INVALID_TXN_STATE
        assert end_offsets(raw, "g57", 1) == (0, 0)
        t.commit()
        assert fetch(raw, "g57", 0, isolation=READ_COMMITTED).values() == [b"in"]
        assert fetch(raw, "g57", 1).batches == []


def verify_only(raw, t: Txn, topic, partitions, *, version, pid=None, epoch=None) -> dict:
    """AddPartitionsToTxn v4+ VerifyOnly (the broker form) for one transaction."""
    r = raw.request(24, version, {"transactions": [{
        "transactional_id": t.txn_id, "producer_id": t.pid if pid is None else pid,
        "producer_epoch": t.epoch if epoch is None else epoch, "verify_only": True,
        "topics": [{"name": topic, "partitions": list(partitions)}]}]})
    assert r.error_code == NONE, r
    (res,) = r.results_by_transaction
    return {p.partition_index: p.partition_error_code for x in res.topic_results for p in x.results_by_partition}


def test_verify_only_answers_the_coordinators_own_codes_at_v4_and_v5(appliance):
    """KIP-890: a VerifyOnly gets what Kafka's coordinator answers (handleVerifyPartitionsInTransaction,
    passed through by KafkaApis at v4 as at v5): TRANSACTION_ABORTABLE for a partition outside the
    transaction (also once it completed: its partitions are gone), PRODUCER_FENCED for a stale
    epoch, INVALID_PRODUCER_ID_MAPPING for another producer id; the transaction is unchanged."""
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "g70", 2)
        t = Txn(raw, "g70-txn")
        t.must_add("g70", [0])
        for v in (4, 5):
            assert verify_only(raw, t, "g70", [0, 1], version=v) == {0: NONE, 1: TRANSACTION_ABORTABLE}, v
            assert verify_only(raw, t, "g70", [0], version=v, epoch=t.epoch + 1) == {0: PRODUCER_FENCED}, v
            assert verify_only(raw, t, "g70", [0], version=v, pid=t.pid + 1) == {0: INVALID_PRODUCER_ID_MAPPING}
        assert txn_partitions(t.describe()) == [("g70", 0)]
        t.commit()
        for v in (4, 5):
            assert verify_only(raw, t, "g70", [0], version=v) == {0: TRANSACTION_ABORTABLE}, v


def test_a_timed_out_transaction_fences_end_txn_and_add_offsets_at_every_version(appliance_factory):
    """Kafka 4.3: the coordinator's abort of a timed-out transaction bumps the epoch, so the
    producer's EndTxn, AddOffsetsToTxn and AddPartitionsToTxn get PRODUCER_FENCED (v2+; v0-1
    INVALID_PRODUCER_EPOCH), never TRANSACTION_ABORTABLE, although EndTxn v4+ and AddOffsetsToTxn
    v4+ carry that code: the coordinator writes it only when a verification fails."""
    a = appliance_factory(transactions={"abort_timed_out_interval_ms": 200})
    with RawClient(a.bootstrap) as raw:
        create_topic(raw, "g71", 1)
        t = Txn(raw, "g71-txn", timeout_ms=300)
        t.must_add("g71", [0])
        t.must_send("g71", 0, [b"late"])
        t.wait_state("CompleteAbort")
        fenced = lambda v: PRODUCER_FENCED if v >= 2 else INVALID_PRODUCER_EPOCH  # noqa: E731
        for v in range(6):
            for commit in (True, False):
                assert end_txn(raw, t.txn_id, t.pid, t.epoch, commit, v).error_code == fenced(v), (v, commit)
        for v in range(5):
            assert add_offsets(raw, t.txn_id, t.pid, t.epoch, "g71-group", v) == fenced(v), v
        for v in range(4):
            assert set(t.add("g71", [0], version=v).values()) == {fenced(v)}, v
        assert t.describe().transaction_state == "CompleteAbort"
        assert end_offsets(raw, "g71", 0) == (2, 2)             # the record and the abort marker
        assert fetch(raw, "g71", 0, isolation=READ_COMMITTED).aborted == [(t.pid, 0)]


def test_java_4_producer_aborts_after_transaction_abortable_and_commits_the_next(appliance_factory,
                                                                                java4_program):
    """kafka-clients 4.3 at transaction.version 1 (Produce v11, EndTxn v4): a batch for a partition
    the producer never added to its transaction is refused with TRANSACTION_ABORTABLE by the
    verification (KIP-890) and never appended; the producer is abortable, not fenced (KIP-1050):
    commitTransaction refuses, abortTransaction ends the transaction, and the next transaction of
    the same producer commits (the same producer id; the client may bump its own epoch after the
    abort, KIP-360, to reset the sequence of the failed partition)."""
    a = appliance_factory(transactions={"transaction_version": 1})
    with RawClient(a.bootstrap) as raw:
        create_topic(raw, "g72", 2)
        got = java4_program("TxnAbortable4", a.bootstrap, "g72", "g72-java")
        assert got["send1"] == "TransactionAbortableException", got
        assert got["commit1"].endswith("/TransactionAbortableException"), got
        assert got["abort1"] == "ok" and got["commit2"] == "ok", got
        pid, epoch = map(int, got["pid"].split("/"))
        # The same producer, not fenced; whether the client bumps its own epoch after the abort
        # depends on whether the failed batch had settled by then (KIP-360).
        assert got["pid2"] in (f"{pid}/{epoch}", f"{pid}/{epoch + 1}"), got
        p0 = fetch(raw, "g72", 0, isolation=READ_COMMITTED)    # t1 aborted, t2 committed
        assert p0.values() == [b"t1-p0", b"t2-p0"] and p0.aborted == [(int(got["pid"].split("/")[0]), 0)]
        assert fetch(raw, "g72", 1, isolation=READ_COMMITTED).values() == [b"t2-p1"]
        # partition 1: t2's record and its commit marker only; the refused batch left nothing
        assert end_offsets(raw, "g72", 1) == (2, 2)
        d = describe(raw, "g72-java")
        assert d.transaction_state == "CompleteCommit" and f"{d.producer_id}/{d.producer_epoch}" == got["pid2"]


def test_verification_disabled_appends_without_asking_the_coordinator(appliance_factory):
    """With transactions.partition_verification_enable = false a transactional batch is
    appended without any coordinator check: to a partition never added to the transaction, and
    even while the coordinator is stopped (it could not have answered). The batch opens a
    transaction on the partition (LSO pinned) that no marker will end - the hazard KIP-890
    closes when verification is on."""
    app = appliance_factory(transactions={"partition_verification_enable": False})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g59", 2)
        t = Txn(raw, "g59-txn")
        t.must_add("g59", [0])
        with stopped(coordinator_pid(app)):
            t0 = time.monotonic()
            assert t.send("g59", 1, [b"unchecked"], timeout_ms=3000).error_code == NONE
            assert t.send("g59", 0, [b"added"], timeout_ms=3000).error_code == NONE
            assert time.monotonic() - t0 < 2
        assert end_offsets(raw, "g59", 1) == (1, 0)
        assert producers(raw, "g59", 1)[t.pid].current_txn_start_offset == 0
        t.commit()          # the coordinator only knows partition 0
        assert fetch(raw, "g59", 0, isolation=READ_COMMITTED).values() == [b"added"]
        assert end_offsets(raw, "g59", 1) == (1, 0)            # hanging on partition 1


def test_coordinator_unavailable_during_verification_is_retriable(appliance_factory):
    """When the coordinator cannot answer a KIP-890 verification (stopped with SIGSTOP;
    server.internal_request_timeout_ms bounds the wait), the old client's transactional Produce
    fails with the retriable NOT_ENOUGH_REPLICAS - never a fatal code - and nothing is appended;
    the retry after the coordinator is back is appended."""
    app = appliance_factory(server={"internal_request_timeout_ms": 1000})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g62")
        t = Txn(raw, "g62-txn")
        t.must_add("g62", [0])
        with stopped(coordinator_pid(app)):
            for version in (9, 11):
                t0 = time.monotonic()
                p = t.send("g62", 0, [b"v"], version=version, timeout_ms=10000)
                assert p.error_code == NOT_ENOUGH_REPLICAS, (version, p)
                assert time.monotonic() - t0 < 5
            assert end_offsets(raw, "g62") == (0, 0)
        assert t.must_send("g62", 0, [b"v"]) == 0
        t.commit()
        assert fetch(raw, "g62", isolation=READ_COMMITTED).values() == [b"v"]


# -- authorization ------------------------------------------------------------------------------------------

def test_producing_to_the_transaction_state_topic_is_refused(appliance):
    """A Produce to ``__transaction_state`` (or ``__consumer_offsets``) is refused with
    INVALID_TOPIC_EXCEPTION, Kafka's answer for a client append to an internal topic
    (ReplicaManager: "Cannot append to internal topic"): not retriable, so a client fails at once
    instead of retrying an unknown partition. The topic cannot be created either, and the
    transaction log is untouched."""
    with RawClient(appliance.bootstrap) as raw:
        t = Txn(raw, "g74-txn")
        before = _txn_log_batches(appliance)
        for topic in ("__transaction_state", "__consumer_offsets"):
            p = produce(raw, topic, 0, build_batch(records_of([b"evil"])))
            assert p.error_code == INVALID_TOPIC_EXCEPTION, (topic, p)
            p = produce(raw, topic, 0, t.batch(topic, 0, [b"evil"]), txn_id="g74-txn")
            assert p.error_code == INVALID_TOPIC_EXCEPTION, (topic, p)
            r = raw.request(19, 7, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                                "assignments": [], "configs": []}], "timeout_ms": 10000})
            assert r.topics[0].error_code == INVALID_TOPIC_EXCEPTION
        md = raw.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        assert not [x.name for x in md.topics if x.name.startswith("__")]
        assert _txn_log_batches(appliance) == before
        assert t.describe().transaction_state == "Empty"
