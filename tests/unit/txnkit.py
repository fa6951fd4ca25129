"""The transaction coordinator under test, for the unit tests of ``appliance.txn`` (no fork): a
fake clock; restarts build a new coordinator on the same directory with the next coordinator
epoch, as the worker does (``workers/coordinator.py``). Shared by test_txn_init_producer_id,
test_txn_end_txn, test_txn_expiry, test_txn_metadata_cache, test_txn_verification,
test_txn_admin and test_txn_service."""

import pytest

from appliance.config import TransactionsConfig
from appliance.errors import ErrorCode as E
from appliance.txn.coordinator import TransactionCoordinator
from appliance.txn.metadata import TransactionMetadata, TransactionState as S
from appliance.txn.producer_ids import ProducerIdManager
from appliance.txn.state_manager import TransactionStateManager, bump_coordinator_epoch

T0 = 1_700_000_000_000
TIMEOUT = 60_000
INTERVAL = 10_000


class Env:
    def __init__(self, path, flush="os", **cfg):
        self.dir = str(path)
        self.clock = T0
        self.flush = flush
        self.cfg = TransactionsConfig(**{"abort_timed_out_interval_ms": INTERVAL, **cfg})
        self.start()

    def now(self) -> int:
        return self.clock

    def start(self) -> None:
        self.sm = TransactionStateManager(self.dir, self.flush, self.now)
        self.tc = TransactionCoordinator(self.sm, ProducerIdManager(self.dir), self.cfg,
                                         bump_coordinator_epoch(self.dir), self.now)
        self.tc.load()

    def crash_restart(self) -> TransactionCoordinator:
        """kill -9 and start again: the log is not closed cleanly."""
        self.sm.close(clean=False)
        self.start()
        return self.tc

    def advance(self, ms: int) -> None:
        self.clock += ms
        self.tc.tick(self.clock)

    def init(self, tid="t", timeout=TIMEOUT, **kw):
        r = self.tc.init_producer_id(tid, timeout, api_version=kw.pop("api_version", 4), **kw)
        assert r.error == E.none, r
        return r.producer_id, r.producer_epoch

    def begin(self, tid="t", parts=(("a", 0), ("b", 1))):
        pid, ep = self.init(tid)
        assert set(self.tc.add_partitions(tid, pid, ep, list(parts), api_version=3).values()) == {E.none}
        return pid, ep

    def ack_all(self, jobs=None) -> list:
        jobs = self.tc.markers.take_marker_jobs() if jobs is None else jobs
        for job in jobs:
            for p in job.partitions:
                self.tc.markers.on_marker_result(job.job_id, p, E.none)
        return jobs

    def state(self, tid="t") -> S:
        return self.tc.get(tid).state


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.sm.close()


def snapshot(md: TransactionMetadata):
    return (md.producer_id, md.producer_epoch, md.state, frozenset(md.partitions), md.txn_start_ms,
            md.pending_state, md.txn_timeout_ms)


def at_epoch(env, epoch: int, tid="t"):
    """An Empty transactional id whose epoch is ``epoch`` (written through the log and
    reloaded, as if 32k InitProducerIds had happened)."""
    pid, _ = env.init(tid)
    m = env.tc.get(tid).copy()
    m.producer_epoch = epoch
    env.sm.append(m)
    env.crash_restart()
    return pid
