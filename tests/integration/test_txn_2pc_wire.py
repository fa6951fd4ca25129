"""Two-phase commit (KIP-939) at the wire level, against the real appliance: InitProducerId v6
with Enable2Pc and KeepPreparedTxn, driven by hand with ``RawClient``: what KIP-939 asks of the
broker, and every row of the two state-transition examples of its "Persisted Data Format Changes".

The coordinator's state after each step is read from its transaction log on disk
(``<data_dir>/__coordinator/txn-log``): the coordinator appends a record before it answers, so
the last record of a transactional id is its state when the reply arrives. Epochs near
Short.MAX_VALUE are reached by writing a record into the log of a stopped appliance (what
32,000 InitProducerId calls would leave there) and starting it again.
"""

from __future__ import annotations

import glob
import os
import time

import pytest

from appliance.protocol.records import decode_records, scan_valid
from appliance.txn.metadata import MAX_EPOCH, TransactionMetadata, TransactionState
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.records import decode_key, decode_value
from appliance.txn.state_manager import TransactionStateManager
from raw_wire import READ_COMMITTED, RawClient, create_topic, fetch
from txn_wire import Txn, describe

NONE = 0
INVALID_REQUEST = 42
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
CONCURRENT_TRANSACTIONS = 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
PRODUCER_FENCED = 90

TWO_PC = {"transactions": {"two_phase_commit_enable": True, "abort_timed_out_interval_ms": 100,
                           "max_timeout_ms": 2000}}


# -- helpers --------------------------------------------------------------------------------------

def init_v6(raw, txn_id, *, enable_2pc=False, keep=False, timeout_ms=1000, pid=-1, epoch=-1):
    return raw.request(22, 6, {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                               "producer_id": pid, "producer_epoch": epoch,
                               "enable2_pc": enable_2pc, "keep_prepared_txn": keep})


def init_until_done(raw, txn_id, **kw):
    """InitProducerId, retried while the coordinator answers CONCURRENT_TRANSACTIONS (it is
    aborting or completing a transaction first), as clients do."""
    deadline = time.monotonic() + 20
    while True:
        r = init_v6(raw, txn_id, **kw)
        if r.error_code != CONCURRENT_TRANSACTIONS:
            return r
        assert time.monotonic() < deadline, "InitProducerId kept answering CONCURRENT_TRANSACTIONS"
        time.sleep(0.05)


def wait_for_an_abort_scan(raw, txn_id, topic, timeout_ms):
    """Opens a plain transaction ``txn_id`` on ``topic`` with ``timeout_ms`` and waits until the
    coordinator aborted it: an abort scan has run at least ``timeout_ms`` after this call."""
    probe = Txn(raw, txn_id, timeout_ms=timeout_ms)
    probe.must_add(topic, [0])
    wait_state(raw, txn_id, "CompleteAbort")


def end_txn(raw, txn_id, pid, epoch, commit, version=5):
    return raw.request(26, version, {"transactional_id": txn_id, "producer_id": pid,
                                     "producer_epoch": epoch, "committed": commit})


def pair(r):
    return (r.producer_id, r.producer_epoch)


def ongoing(r):
    return (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch)


def log_states(app, txn_id) -> list[dict]:
    """Every transaction-log record of ``txn_id``, oldest first, as the fields KIP-939's
    examples name."""
    out = []
    for path in sorted(glob.glob(os.path.join(app.data_dir, "__coordinator", "txn-log", "*.log"))):
        with open(path, "rb") as f:
            data = f.read()
        valid, _ = scan_valid(data)
        for pos, h in valid:
            for rec in decode_records(memoryview(data)[pos:pos + h.size]):
                if rec.key is None or decode_key(rec.key) != txn_id or rec.value is None:
                    continue
                v = decode_value(rec.value)
                out.append({"state": TransactionState(v.transaction_status).name,
                            "pid": v.producer_id, "epoch": v.producer_epoch,
                            "prev": v.previous_producer_id, "next": v.next_producer_id,
                            "next_epoch": v.next_producer_epoch,
                            "timeout": v.transaction_timeout_ms})
    return out


def tc_state(app, txn_id) -> dict:
    states = log_states(app, txn_id)
    assert states, f"no transaction-log record for {txn_id}"
    return states[-1]


def expect(app, txn_id, state, pid, epoch, prev, nxt, next_epoch):
    got = tc_state(app, txn_id)
    want = {"state": state, "pid": pid, "epoch": epoch, "prev": prev, "next": nxt, "next_epoch": next_epoch}
    assert {k: got[k] for k in want} == want


def seed_state(app, txn_id, epoch, timeout_ms=60000) -> int:
    """With the appliance stopped: a new producer id, and an Empty record of ``txn_id`` with it
    at ``epoch`` in the transaction log. Returns the producer id."""
    cdir = os.path.join(app.data_dir, "__coordinator")
    os.makedirs(cdir, exist_ok=True)
    pid = ProducerIdManager(cdir).next_id()
    sm = TransactionStateManager(cdir)
    sm.load()
    sm.append(TransactionMetadata(txn_id, pid, epoch, timeout_ms, TransactionState.Empty))
    sm.close()
    return pid


def committed_values(raw, topic, partitions=(0,)):
    """What a read_committed consumer delivers: the fetched data batches minus those of
    aborted transactions (from a producer's first aborted offset up to its abort marker)."""
    out = []
    for p in partitions:
        f = fetch(raw, topic, p, isolation=READ_COMMITTED)
        assert f.error_code == NONE, f
        starts = sorted(f.aborted or [], key=lambda a: a[1])
        aborting: set[int] = set()
        for b in f.batches:
            while starts and starts[0][1] <= b.base_offset:
                aborting.add(starts.pop(0)[0])
            if b.control:
                aborting.discard(b.producer_id)
            elif not (b.transactional and b.producer_id in aborting):
                out += b.values
    return out


def wait_state(raw, txn_id, state, timeout=15.0):
    deadline = time.monotonic() + timeout
    while (d := describe(raw, txn_id)).transaction_state != state:
        assert time.monotonic() < deadline, f"{txn_id} stuck in {d.transaction_state}, not {state}"
        time.sleep(0.02)
    return d


def open_2pc_txn(raw, txn_id, topic, values, partitions=(0,)) -> Txn:
    """InitProducerId(Enable2Pc) and a transaction holding ``values`` on each partition."""
    r = init_v6(raw, txn_id, enable_2pc=True)
    assert r.error_code == NONE and ongoing(r) == (-1, -1), r
    t = Txn(raw, txn_id, pid=r.producer_id, epoch=r.producer_epoch)
    t.must_add(topic, list(partitions))
    for p in partitions:
        t.must_send(topic, p, values)
    return t


# -- KIP-939 behaviour ----------------------------------------------------------------------------

def test_enable_2pc_refused_when_the_broker_switch_is_off(appliance):
    with RawClient(appliance.bootstrap) as raw:
        r = init_v6(raw, "g63", enable_2pc=True)
        assert r.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED and pair(r) == (-1, -1), r
        assert r.ongoing_txn_producer_id == -1
        # nothing was created for the id
        assert describe(raw, "g63").error_code == 105           # TRANSACTIONAL_ID_NOT_FOUND
        # KeepPreparedTxn alone needs no switch (KIP-939: "could be set to true even if Enable2Pc
        # is false"); an idempotent producer cannot ask for either
        r = init_v6(raw, "g63", keep=True)
        assert r.error_code == NONE and ongoing(r) == (-1, -1), r
        assert init_v6(raw, None, enable_2pc=True).error_code == INVALID_REQUEST
        # v5 and older keep working as before
        r = raw.request(22, 5, {"transactional_id": "g63-v5", "transaction_timeout_ms": 1000,
                                "producer_id": -1, "producer_epoch": -1})
        assert r.error_code == NONE


def test_kept_2pc_transaction_outlives_every_timeout_and_commits(appliance_factory):
    app = appliance_factory(**TWO_PC)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g64", partitions=2)
        t = open_2pc_txn(raw, "g64", "g64", [b"a", b"b"], partitions=(0, 1))
        st = tc_state(app, "g64")
        assert st["timeout"] == -1 and st["state"] == "Ongoing", st       # stored as -1 (KIP-939)
        # a plain transaction with the maximum timeout, started at the same time, is aborted
        plain = Txn(raw, "g64-plain", timeout_ms=2000)
        plain.must_add("g64", [0])
        plain.must_send("g64", 0, [b"plain"])
        wait_state(raw, "g64-plain", "CompleteAbort")
        wait_for_an_abort_scan(raw, "g64-probe", "g64", 1000)   # well past max_timeout_ms as well
        assert describe(raw, "g64").transaction_state == "Ongoing"    
        assert committed_values(raw, "g64", (0, 1)) == []
        # the producer "crashed"; a new incarnation keeps the prepared transaction
        r = init_v6(raw, "g64", enable_2pc=True, keep=True)
        assert r.error_code == NONE, r
        assert ongoing(r) == (t.pid, t.epoch), r
        assert pair(r) == (t.pid, t.epoch + 1), r
        assert describe(raw, "g64").transaction_state == "Ongoing"
        assert committed_values(raw, "g64", (0, 1)) == []       # still invisible
        expect(app, "g64", "Ongoing", t.pid, t.epoch, -1, t.pid, t.epoch + 1)
        # commit with the new pair: the original records appear on every partition
        e = end_txn(raw, "g64", *pair(r), True)
        assert e.error_code == NONE and pair(e) == (t.pid, t.epoch + 2), e
        wait_state(raw, "g64", "CompleteCommit")
        assert committed_values(raw, "g64", (0, 1)) == [b"a", b"b", b"a", b"b"]
        # one COMMIT marker per partition, with the ongoing producer id and its epoch + 1
        for p in (0, 1):
            (ctrl,) = [b for b in fetch(raw, "g64", p).batches if b.control and b.producer_id == t.pid]
            assert ctrl.values[0][0] == 1 and ctrl.producer_epoch == t.epoch + 1, ctrl
        expect(app, "g64", "CompleteCommit", t.pid, t.epoch + 2, t.pid, -1, -1)
        # no open transaction -> the ongoing fields are -1, and it is a plain epoch bump
        r = init_v6(raw, "g64", enable_2pc=True, keep=True)
        assert r.error_code == NONE and ongoing(r) == (-1, -1) and pair(r) == (t.pid, t.epoch + 3), r


def test_repeated_keep_prepared_bumps_and_fences_every_earlier_incarnation(appliance_factory):
    app = appliance_factory(**TWO_PC)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g67")
        t = open_2pc_txn(raw, "g67", "g67", [b"x"])
        pairs = []
        for _ in range(3):
            r = init_v6(raw, "g67", enable_2pc=True, keep=True)
            assert r.error_code == NONE and ongoing(r) == (t.pid, t.epoch), r
            pairs.append(pair(r))
        assert pairs == [(t.pid, t.epoch + k) for k in (1, 2, 3)]
        # the original incarnation is fenced: its adds, produce, commit
        assert set(t.add("g67", [0]).values()) == {PRODUCER_FENCED}
        assert t.send("g67", 0, [b"zombie"]).error_code in (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
        assert end_txn(raw, "g67", t.pid, t.epoch, True).error_code == PRODUCER_FENCED
        # an earlier kept incarnation is fenced too
        assert end_txn(raw, "g67", *pairs[0], True).error_code == PRODUCER_FENCED
        # the newest may only commit or abort: no new partitions, no offsets
        newest = Txn(raw, "g67", pid=pairs[-1][0], epoch=pairs[-1][1])
        assert set(newest.add("g67", [0]).values()) == {INVALID_TXN_STATE}
        assert newest.add_offsets("g67-group") == INVALID_TXN_STATE
        assert describe(raw, "g67").transaction_state == "Ongoing"
        # abort with the newest pair
        e = end_txn(raw, "g67", *pairs[-1], False)
        assert e.error_code == NONE and pair(e) == (t.pid, t.epoch + 4), e
        wait_state(raw, "g67", "CompleteAbort")
        f = fetch(raw, "g67", 0, isolation=READ_COMMITTED)
        assert f.aborted == [(t.pid, 0)] and committed_values(raw, "g67") == [], f
        # a retry of the same EndTxn is answered with the same pair; the other command is refused
        e = end_txn(raw, "g67", *pairs[-1], False)
        assert e.error_code == NONE and pair(e) == (t.pid, t.epoch + 4), e
        assert end_txn(raw, "g67", *pairs[-1], True).error_code == INVALID_TXN_STATE


def test_force_terminate_aborts_a_kept_2pc_transaction(appliance_factory):
    app = appliance_factory(**TWO_PC)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g69")
        t = open_2pc_txn(raw, "g69", "g69", [b"doomed"])
        kept = init_v6(raw, "g69", enable_2pc=True, keep=True)
        assert kept.error_code == NONE
        # forceTerminateTransaction: InitProducerId with KeepPreparedTxn=false
        r = init_until_done(raw, "g69", timeout_ms=1000)
        assert r.error_code == NONE and ongoing(r) == (-1, -1), r
        assert r.producer_id == t.pid and r.producer_epoch > kept.producer_epoch, (r, kept)
        d = describe(raw, "g69")
        assert d.transaction_state == "Empty"
        f = fetch(raw, "g69", 0, isolation=READ_COMMITTED)
        assert f.aborted == [(t.pid, 0)] and committed_values(raw, "g69") == [], f
        # both earlier incarnations are fenced
        assert end_txn(raw, "g69", *pair(kept), True).error_code == PRODUCER_FENCED
        assert end_txn(raw, "g69", t.pid, t.epoch, True).error_code == PRODUCER_FENCED


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_prepared_2pc_transaction_survives_a_broker_restart(appliance_factory, how):
    app = appliance_factory(**TWO_PC)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "g70")
        t = open_2pc_txn(raw, "g70", "g70", [b"kept"])
        kept = init_v6(raw, "g70", enable_2pc=True, keep=True)
        assert kept.error_code == NONE
    if how == "kill9":
        app.kill9_all()
    else:
        assert app.terminate() == 0
    app.restart()
    with RawClient(app.bootstrap) as raw:
        wait_for_an_abort_scan(raw, "g70-probe", "g70", 1)     # the restarted coordinator's scans ran
        d = describe(raw, "g70")
        assert d.transaction_state == "Ongoing" and d.transaction_timeout_ms == -1, d
        assert (d.producer_id, d.producer_epoch) == (t.pid, t.epoch)
        expect(app, "g70", "Ongoing", t.pid, t.epoch, -1, *pair(kept))
        assert committed_values(raw, "g70") == []
        # the next incarnation after the restart takes over from the restored pair
        again = init_v6(raw, "g70", enable_2pc=True, keep=True)
        assert again.error_code == NONE and ongoing(again) == (t.pid, t.epoch), again
        assert pair(again) == (t.pid, kept.producer_epoch + 1)
        e = end_txn(raw, "g70", *pair(again), True)
        assert e.error_code == NONE, e
        wait_state(raw, "g70", "CompleteCommit")
        assert committed_values(raw, "g70") == [b"kept"]


# -- KIP-939's state-transition examples ("Persisted Data Format Changes") ------------------------

def test_kip939_example_1_vanilla_kip890_transaction_with_epoch_overflow(appliance_factory):
    app = appliance_factory(start=False, **TWO_PC)
    os.makedirs(app.data_dir, exist_ok=True)
    x = seed_state(app, "ex1", MAX_EPOCH - 2)
    app.start()
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "ex1")
        # 1. InitProducerId(false)
        r = init_v6(raw, "ex1")
        assert r.error_code == NONE and pair(r) == (x, MAX_EPOCH - 1) and ongoing(r) == (-1, -1), r
        expect(app, "ex1", "Empty", x, MAX_EPOCH - 1, -1, -1, -1)
        # 2. AddPartitionsToTxn
        t = Txn(raw, "ex1", pid=x, epoch=MAX_EPOCH - 1)
        t.must_add("ex1", [0])
        t.must_send("ex1", 0, [b"one"])
        expect(app, "ex1", "Ongoing", x, MAX_EPOCH - 1, -1, -1, -1)
        # 3. Commit: PrepareCommit with epoch MAX and a new producer id for the next transaction
        e = end_txn(raw, "ex1", x, MAX_EPOCH - 1, True)
        assert e.error_code == NONE, e
        z = e.producer_id
        assert z not in (x, -1) and e.producer_epoch == 0, e
        prepare = [s for s in log_states(app, "ex1") if s["state"] == "PrepareCommit"]
        assert prepare[-1] | {"timeout": 0} == {"state": "PrepareCommit", "pid": x, "epoch": MAX_EPOCH,
                                                "prev": x, "next": z, "next_epoch": 0, "timeout": 0}
        # 4. CompleteCommit: the new id is current
        wait_state(raw, "ex1", "CompleteCommit")
        expect(app, "ex1", "CompleteCommit", z, 0, x, -1, -1)
        # a retry of the commit with the old pair is recognised (PrevProducerId)
        e2 = end_txn(raw, "ex1", x, MAX_EPOCH - 1, True)
        assert e2.error_code == NONE and pair(e2) == (z, 0), e2
        assert committed_values(raw, "ex1") == [b"one"]


def test_kip939_example_2_two_phase_commit_with_two_epoch_overflows(appliance_factory):
    app = appliance_factory(start=False, **TWO_PC)
    os.makedirs(app.data_dir, exist_ok=True)
    x = seed_state(app, "ex2", MAX_EPOCH - 2)
    app.start()
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "ex2")
        # 1. InitProducerId(false), here with Enable2Pc
        r = init_v6(raw, "ex2", enable_2pc=True)
        assert r.error_code == NONE and pair(r) == (x, MAX_EPOCH - 1) and ongoing(r) == (-1, -1), r
        expect(app, "ex2", "Empty", x, MAX_EPOCH - 1, -1, -1, -1)
        # 2. AddPartitionsToTxn (and a record)
        t = Txn(raw, "ex2", pid=x, epoch=MAX_EPOCH - 1)
        t.must_add("ex2", [0])
        t.must_send("ex2", 0, [b"prepared"])
        expect(app, "ex2", "Ongoing", x, MAX_EPOCH - 1, -1, -1, -1)
        # 3.-4. the client prepared and crashed; InitProducerId(true): a new id for the next pair,
        # because the ongoing epoch is MAX-1 and MAX is kept for the markers
        r = init_v6(raw, "ex2", enable_2pc=True, keep=True)
        y = r.producer_id
        assert r.error_code == NONE and y not in (x, -1) and r.producer_epoch == 0, r
        assert ongoing(r) == (x, MAX_EPOCH - 1), r
        expect(app, "ex2", "Ongoing", x, MAX_EPOCH - 1, -1, y, 0)
        # 5.-6. crash again: the next epoch is bumped, the ongoing pair stays
        r = init_v6(raw, "ex2", enable_2pc=True, keep=True)
        assert r.error_code == NONE and pair(r) == (y, 1) and ongoing(r) == (x, MAX_EPOCH - 1), r
        expect(app, "ex2", "Ongoing", x, MAX_EPOCH - 1, -1, y, 1)
    # 7. crash a few thousand times more: NextProducerEpoch reaches MAX-1
    assert app.terminate() == 0
    cdir = os.path.join(app.data_dir, "__coordinator")
    sm = TransactionStateManager(cdir)
    md = sm.load()["ex2"]
    assert (md.next_producer_id, md.next_producer_epoch) == (y, 1)
    md.next_producer_epoch = MAX_EPOCH - 1
    sm.append(md)
    sm.close()
    app.restart()
    # The harness's readiness (an ApiVersions answer) can come before the coordinator has loaded
    # its log (regression: COORDINATOR_NOT_AVAILABLE to the next call).
    app.wait_for(app.all_workers_ready, 30, "every worker READY")
    with RawClient(app.bootstrap) as raw:
        # 8. InitProducerId(true): next epoch MAX
        r = init_v6(raw, "ex2", enable_2pc=True, keep=True)
        assert r.error_code == NONE and pair(r) == (y, MAX_EPOCH) and ongoing(r) == (x, MAX_EPOCH - 1), r
        expect(app, "ex2", "Ongoing", x, MAX_EPOCH - 1, -1, y, MAX_EPOCH)
        # 9. Commit with (y, MAX): markers (x, MAX); three distinct producer ids in PrepareCommit
        e = end_txn(raw, "ex2", y, MAX_EPOCH, True)
        assert e.error_code == NONE, e
        z = e.producer_id
        assert z not in (x, y, -1) and e.producer_epoch == 0, e
        prepare = [s for s in log_states(app, "ex2") if s["state"] == "PrepareCommit"]
        assert {k: prepare[-1][k] for k in ("pid", "epoch", "prev", "next", "next_epoch")} == \
            {"pid": x, "epoch": MAX_EPOCH, "prev": y, "next": z, "next_epoch": 0}, prepare[-1]
        # 10. CompleteCommit
        wait_state(raw, "ex2", "CompleteCommit")
        expect(app, "ex2", "CompleteCommit", z, 0, y, -1, -1)
        (ctrl,) = [b for b in fetch(raw, "ex2", 0).batches if b.control]
        assert (ctrl.producer_id, ctrl.producer_epoch) == (x, MAX_EPOCH)
        assert committed_values(raw, "ex2") == [b"prepared"]
        # a retry with (y, MAX) after completion gets the pair for the next transaction
        e2 = end_txn(raw, "ex2", y, MAX_EPOCH, True)
        assert e2.error_code == NONE and pair(e2) == (z, 0), e2
        # and the next transaction runs on (z, 0)
        t2 = Txn(raw, "ex2", pid=z, epoch=0)
        t2.must_add("ex2", [0])
        t2.must_send("ex2", 0, [b"next"])
        e3 = end_txn(raw, "ex2", z, 0, True)
        assert e3.error_code == NONE and pair(e3) == (z, 1), e3
        wait_state(raw, "ex2", "CompleteCommit")
        assert committed_values(raw, "ex2") == [b"prepared", b"next"]


def test_kept_transaction_committed_with_transaction_version_1(appliance_factory):
    """EndTxn v4 (no epoch bump per transaction) on a kept transaction: markers with the ongoing
    epoch + 1, and the client goes on with the pair it was given."""
    app = appliance_factory(**TWO_PC)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "tv1")
        t = open_2pc_txn(raw, "tv1", "tv1", [b"v1"])
        r = init_v6(raw, "tv1", enable_2pc=True, keep=True)
        assert r.error_code == NONE
        e = end_txn(raw, "tv1", *pair(r), True, version=4)
        assert e.error_code == NONE, e
        wait_state(raw, "tv1", "CompleteCommit")
        expect(app, "tv1", "CompleteCommit", t.pid, t.epoch + 1, t.pid, -1, -1)
        assert committed_values(raw, "tv1") == [b"v1"]
        t2 = Txn(raw, "tv1", pid=r.producer_id, epoch=r.producer_epoch)
        t2.must_add("tv1", [0])
        t2.must_send("tv1", 0, [b"after"])
        assert end_txn(raw, "tv1", *pair(r), True, version=4).error_code == NONE
        wait_state(raw, "tv1", "CompleteCommit")
        assert committed_values(raw, "tv1") == [b"v1", b"after"]
