"""Property test: the writer side of transactions against a simple model.

Random interleavings of several producers' transactional batches, plain batches, commits and
aborts (also of producers with nothing open on the partition), TV2-style epoch bumps in markers,
rolls (small segments, random batch sizes), snapshots, and crash/reopen points (unclean close,
optionally losing the recovery point so that sealed segments are recovered too, or a clean
restart). The harness drives PartitionLog + ProducerStateManager the way the partition writer
does. After every step the LSO must equal the model's (KIP-98: smallest first offset of an
open transaction, else the high watermark; never decreasing); the aborted-transaction index must
hold exactly the model's entries, LSO stamps included, before and after every reopen; and
collect_aborted for random ranges, and for the ranges real reads return, must list exactly the
aborted transactions intersecting them (Fetch's AbortedTransactions, incl. abort-marker-only ones).
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.log.files import RECOVERY_POINT_FILE
from appliance.log.partition_log import LogSettings, PartitionLog
from appliance.log.producer_state import ProducerStateManager
from appliance.log.reader import LogReader
from appliance.log.txn_index import AbortedTxn
from appliance.protocol.records import Record, build_batch, read_header

TXN_PIDS = (1, 2, 3, 4)
IDEMPOTENT_PID = 10
SETTINGS = LogSettings(segment_bytes=700, index_interval_bytes=100, segment_index_bytes=1024,
                       retention_ms=-1, retention_bytes=-1)


class Harness:
    def __init__(self, d: str) -> None:
        self.d = d
        self.now = 1_000
        # model
        self.epoch: dict[int, int] = {}
        self.seq: dict[int, int] = {}
        self.open: dict[int, int] = {}
        self.aborted: list[AbortedTxn] = []
        self.lso_seen = 0
        self._open_log()
        self.psm = ProducerStateManager(d, 10**12)
        self.psm.load(self.log.log_end_offset, self.log.headers_from, self.now)
        self.log.roll_listener = self.psm.take_snapshot

    def _open_log(self) -> None:
        self.log = PartitionLog.open(self.d, SETTINGS, self.now)
        self.reader = LogReader(self.d)

    @property
    def hw(self) -> int:
        return self.log.log_end_offset

    def model_lso(self) -> int:
        return min(self.open.values()) if self.open else self.hw

    # -- operations -------------------------------------------------------------------------
    def data(self, pid: int, size: int, n: int, transactional: bool) -> None:
        seq = self.seq.get(pid, 0) if pid >= 0 else -1
        b = bytearray(build_batch([Record(b"k", b"v" * size)] * n, producer_id=pid,
                                  producer_epoch=self.epoch.get(pid, 0) if pid >= 0 else -1,
                                  base_sequence=seq, transactional=transactional,
                                  base_timestamp=self.now))
        h = read_header(b)
        if pid >= 0:
            assert self.psm.needs_verification(h) == (transactional and pid not in self.open)
            if self.psm.needs_verification(h):
                token = self.psm.start_verification(pid, h.producer_epoch)
                assert self.psm.verification_valid(pid, token)
            assert self.psm.check(h) is None
        info = self.log.append(b, self.now)
        if pid >= 0:
            self.psm.update(h, info.base_offset, self.now)
            self.seq[pid] = seq + n
        if transactional:
            self.open.setdefault(pid, info.base_offset)

    def marker(self, pid: int, commit: bool, bump: bool) -> None:
        epoch = self.epoch.get(pid, 0) + (1 if bump else 0)
        self.psm.check_marker(pid, epoch, 0)
        info = self.log.append_control(pid, epoch, commit, 0, self.now)
        done = self.psm.complete_txn(pid, epoch, 0, info.base_offset, not commit, self.now)
        first = self.open.pop(pid, info.base_offset)
        assert (done.producer_id, done.first_offset, done.last_offset, done.aborted) == \
               (pid, first, info.base_offset, not commit)
        if done.aborted:
            # written before the writer would publish an HW/LSO past the marker
            self.log.append_aborted(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                               self.psm.last_stable_offset(self.hw)))
            self.aborted.append(AbortedTxn(pid, first, info.base_offset, self.model_lso()))
        if bump:
            self.epoch[pid] = epoch
            self.seq[pid] = 0

    def snapshot(self) -> None:
        self.psm.take_snapshot(self.hw)

    def state(self):
        return ({p: (e.epoch, e.coordinator_epoch, e.txn_first_offset, list(e.batches))
                 for p, e in self.psm.entries.items()},
                self.psm.open_transactions(), self.psm.last_stable_offset(self.hw),
                self.psm.first_unstable_offset(), self.log.aborted_entries(), self.hw)

    def reopen(self, clean: bool, drop_recovery_point: bool) -> None:
        before = self.state()
        self.reader.close()
        if clean:
            self.psm.take_snapshot(self.hw)
            self.log.close(clean=True)
        else:
            self.log.close(clean=False)
            if drop_recovery_point:
                os.unlink(os.path.join(self.d, RECOVERY_POINT_FILE))
        self.now += 1
        self._open_log()
        lg = self.log
        rebuild_from = lg.txn_index_rebuild_from
        if clean:
            assert rebuild_from == lg.log_end_offset
        elif drop_recovery_point:
            assert rebuild_from == lg.segment_bases()[0]
        else:
            assert rebuild_from <= lg.active_segment_base

        def rebuilt(done, lso):
            if done.aborted and done.last_offset >= rebuild_from:
                lg.append_aborted(AbortedTxn(done.producer_id, done.first_offset, done.last_offset, lso))

        self.psm = ProducerStateManager(self.d, 10**12)
        self.psm.load(lg.log_end_offset, lg.headers_from, self.now, on_completed=rebuilt,
                      max_start_offset=rebuild_from)
        lg.finish_txn_index_rebuild()
        lg.roll_listener = self.psm.take_snapshot
        after = self.state()
        assert after == before

    # -- checks -----------------------------------------------------------------------------
    def check_lso(self) -> None:
        lso = self.psm.last_stable_offset(self.hw)
        assert lso == self.model_lso()
        fu = self.psm.first_unstable_offset()
        assert fu == (min(self.open.values()) if self.open else -1)
        assert lso >= self.lso_seen
        self.lso_seen = lso

    def check_index(self) -> None:
        assert self.log.aborted_entries() == self.aborted

    def expected(self, fetch: int, upper: int) -> list[tuple[int, int]]:
        return [(t.producer_id, t.first_offset) for t in self.aborted
                if t.last_offset >= fetch and t.first_offset < upper]

    def query(self, a: float, b: float, max_bytes: int) -> None:
        hw = self.hw
        if hw == 0:
            return
        self.reader.refresh()
        fetch = min(int(a * hw), hw - 1)
        upper = fetch + 1 + min(int(b * (hw - fetch)), hw - fetch - 1)
        assert self.reader.collect_aborted(fetch, upper, hw) == self.expected(fetch, upper)
        # as a read_committed fetch does: read up to the LSO, bound the search by next_offset
        # (a fetch offset between the LSO and the HW is an empty read, not out of range)
        lso = self.psm.last_stable_offset(hw)
        fetch = min(int(a * (hw + 1)), hw)
        rr = self.reader.read(fetch, max_bytes, high_watermark=hw, max_offset=lso, log_start_offset=0,
                              min_one_batch=True)
        if fetch >= lso:
            assert rr.slices == []
        if not rr.slices:
            assert rr.next_offset == fetch
            return
        assert fetch < rr.next_offset <= lso
        assert self.reader.collect_aborted(fetch, rr.next_offset, hw) == self.expected(fetch, rr.next_offset)

    def close(self) -> None:
        self.reader.close()
        self.log.close(clean=False)


op = st.one_of(
    st.tuples(st.just("txn"), st.sampled_from(TXN_PIDS), st.integers(1, 180), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.sampled_from((-1, IDEMPOTENT_PID)), st.integers(1, 180),
              st.integers(1, 3)),
    st.tuples(st.just("end"), st.sampled_from(TXN_PIDS), st.booleans(), st.booleans()),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("crash"), st.booleans()),
    st.tuples(st.just("restart")),
    st.tuples(st.just("query"), st.floats(0, 1), st.floats(0, 1), st.integers(1, 2000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=60))
def test_lso_and_aborted_index_follow_the_model(ops):
    with tempfile.TemporaryDirectory() as d:
        hs = Harness(d)
        try:
            for o in ops:
                kind = o[0]
                if kind == "txn":
                    hs.data(o[1], o[2], o[3], True)
                elif kind == "plain":
                    hs.data(o[1], o[2], o[3], False)
                elif kind == "end":
                    hs.marker(o[1], o[2], o[3])
                elif kind == "snapshot":
                    hs.snapshot()
                elif kind == "crash":
                    hs.reopen(False, o[1])
                elif kind == "restart":
                    hs.reopen(True, False)
                else:
                    hs.query(o[1], o[2], o[3])
                hs.check_lso()
                hs.check_index()
            hs.reader.refresh()
            for fetch in range(hs.hw):
                for upper in range(fetch + 1, hs.hw + 1, 3):
                    assert hs.reader.collect_aborted(fetch, upper, hs.hw) == hs.expected(fetch, upper)
        finally:
            hs.close()
