"""The share partition's run-based window (appliance.group.share_partition, Kafka's
InFlightBatch ranges) against a per-offset model of the same rules (the dict of one state per
offset it replaced): random acquisitions, whole-batch acquisitions, acknowledgements of whole and
partial runs, member releases, lock expiries, log start moves, snapshots and restores must give
the same answers, windows and snapshots."""

from __future__ import annotations

import random

import pytest

from appliance.errors import ErrorCode as E
from appliance.group.share_partition import (ACCEPT, ACKNOWLEDGED, ACQUIRED, ARCHIVED, AVAILABLE,
                                             GAP, REJECT, RELEASE, SharePartition)


class Model:
    """One (state, delivery count, member, deadline) per in-flight offset: the rules in their
    plainest form."""

    def __init__(self, start: int) -> None:
        self.start = self.end = start
        self.f: dict[int, list] = {}

    def _get(self, o: int) -> list:
        return self.f.setdefault(o, [AVAILABLE, 0, "", 0])

    def _free(self, f: list, limit: int) -> None:
        f[0] = ARCHIVED if f[1] >= limit else AVAILABLE
        f[2], f[3] = "", 0

    def expire(self, now: int, limit: int) -> None:
        for f in self.f.values():
            if f[0] == ACQUIRED and f[3] <= now:
                self._free(f, limit)
        self._advance()

    def acquire(self, m, n, hw, log_start, now, lock, limit, max_locks):
        self.expire(now, limit)
        if log_start > self.start:
            for o in range(self.start, min(log_start, self.end)):
                self.f.pop(o, None)
            self.start = log_start
            self.end = max(self.end, log_start)
            self._advance()
        got = []
        o = self.start
        while n > 0 and o < hw:
            if o >= self.end:
                if o - self.start >= max_locks:
                    break
                self.end = o + 1
            f = self._get(o)
            if f[0] == AVAILABLE:
                f[0], f[1], f[2], f[3] = ACQUIRED, f[1] + 1, m, now + lock
                n -= 1
                if got and got[-1][1] == o - 1 and got[-1][2] == f[1]:
                    got[-1] = (got[-1][0], o, f[1])
                else:
                    got.append((o, o, f[1]))
            o += 1
        return got

    def acquire_through(self, m, first, last, hw, now, lock):
        last = min(last, hw - 1)
        first = max(first, self.start)
        if first > self.end or last < first:
            return []
        got = []
        for o in range(first, last + 1):
            f = self._get(o)
            if f[0] != AVAILABLE:
                continue
            f[0], f[1], f[2], f[3] = ACQUIRED, f[1] + 1, m, now + lock
            if got and got[-1][1] == o - 1 and got[-1][2] == f[1]:
                got[-1] = (got[-1][0], o, f[1])
            else:
                got.append((o, o, f[1]))
        self.end = max(self.end, last + 1)
        return got

    def acknowledge(self, m, batches, limit):
        todo = []
        for first, last, types in batches:
            for i, o in enumerate(range(first, last + 1)):
                t = types[0] if len(types) == 1 else types[i]
                f = self.f.get(o)
                if not self.start <= o < self.end or f is None or f[0] != ACQUIRED or f[2] != m:
                    return E.invalid_record_state
                todo.append((f, t))
        for f, t in todo:
            if t == ACCEPT:
                f[0], f[2], f[3] = ACKNOWLEDGED, "", 0
            elif t == RELEASE:
                self._free(f, limit)
            else:
                f[0], f[2], f[3] = ARCHIVED, "", 0
        self._advance()
        return E.none

    def release(self, m, limit):
        for f in self.f.values():
            if f[0] == ACQUIRED and f[2] == m:
                self._free(f, limit)
        self._advance()

    def _advance(self):
        while self.start < self.end and self._get(self.start)[0] in (ACKNOWLEDGED, ARCHIVED):
            del self.f[self.start]
            self.start += 1

    def offsets(self):
        return {o: (self._get(o)[0], self._get(o)[1]) for o in range(self.start, self.end)}

    def holds(self, m):
        return any(f[0] == ACQUIRED and f[2] == m for f in self.f.values())


MEMBERS = ("a", "b", "c")
LIMIT, LOCK = 3, 50


def _acks(rnd: random.Random, model: Model, m: str):
    """Non-overlapping acknowledgement batches, mostly over what ``m`` holds, sometimes not."""
    held = sorted(o for o, f in model.f.items() if f[0] == ACQUIRED and f[2] == m)
    if not held or rnd.random() < 0.1:
        o = rnd.randrange(max(1, model.end + 3))
        return [(o, o + rnd.randrange(3), [ACCEPT])]
    out, i = [], 0
    while i < len(held):
        j = i
        while j + 1 < len(held) and held[j + 1] == held[j] + 1 and rnd.random() < 0.9:
            j += 1
        if rnd.random() < 0.7:
            first, last = held[i], held[j]
            if rnd.random() < 0.3:
                types = [rnd.choice((GAP, ACCEPT, RELEASE, REJECT)) for _ in range(last - first + 1)]
            else:
                types = [rnd.choice((ACCEPT, ACCEPT, RELEASE, REJECT))]
            out.append((first, last, types))
        i = j + 1
    return out or [(held[0], held[0], [ACCEPT])]


@pytest.mark.parametrize("seed", range(12))
def test_runs_agree_with_the_per_offset_model(seed: int) -> None:
    rnd = random.Random(seed)
    sp, model = SharePartition(0), Model(0)
    hw, log_start, now = 0, 0, 0
    for _step in range(400):
        now += rnd.randrange(20)
        op = rnd.random()
        m = rnd.choice(MEMBERS)
        if op < 0.1:
            hw += rnd.randrange(1, 40)
        elif op < 0.45:
            n, locks = rnd.randrange(1, 30), rnd.choice((10, 25, 2000))
            assert sp.acquire(m, n, hw, log_start, now, LOCK, LIMIT, locks) == model.acquire(
                m, n, hw, log_start, now, LOCK, LIMIT, locks)
        elif op < 0.55:
            first = rnd.randrange(max(1, model.end + 2))
            last = first + rnd.randrange(15)
            assert sp.acquire_through(m, first, last, hw, now, LOCK) == model.acquire_through(
                m, first, last, hw, now, LOCK)
        elif op < 0.85:
            acks = _acks(rnd, model, m)
            assert sp.acknowledge(m, acks, LIMIT) == model.acknowledge(m, acks, LIMIT)
        elif op < 0.9:
            sp.release_member(m, LIMIT)
            model.release(m, LIMIT)
        elif op < 0.95:
            sp.expire(now, LIMIT)
            model.expire(now, LIMIT)
        elif hw:
            log_start = min(hw, log_start + rnd.randrange(10))
        assert (sp.start_offset, sp.end_offset) == (model.start, model.end)
        assert sp.offsets() == model.offsets()
        assert all(sp.holds(x) == model.holds(x) for x in MEMBERS)
        runs = sp.runs
        assert all(r.first <= r.last for r in runs)
        assert all(a.last + 1 == b.first and not a.same(b) for a, b in zip(runs, runs[1:]))
        assert not runs or (runs[0].first, runs[-1].last + 1) == (sp.start_offset, sp.end_offset)
        back = SharePartition.restore(sp.start_offset, 1, sp.snapshot())
        assert back.offsets() == {o: (AVAILABLE if st == ACQUIRED else st, n)
                                  for o, (st, n) in sp.offsets().items()}


def test_a_whole_batch_acquired_and_acknowledged_stays_one_run() -> None:
    sp = SharePartition(0)
    assert sp.acquire("a", 5000, 10_000, 0, 0, LOCK, LIMIT, 10_000) == [(0, 4999, 1)]
    assert len(sp.runs) == 1
    assert sp.acquire_through("a", 5000, 7599, 10_000, 0, LOCK) == [(5000, 7599, 1)]
    assert len(sp.runs) == 1 and sp.held == {"a": 7600}
    assert sp.acknowledge("a", [(0, 7599, [ACCEPT])], LIMIT) == E.none
    assert sp.runs == [] and sp.start_offset == 7600 and sp.held == {}
    assert sp.snapshot() == []


def test_overlapping_acknowledgement_batches_are_refused() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 10, 10, 0, 0, LOCK, LIMIT)
    assert sp.acknowledge("a", [(0, 5, [ACCEPT]), (5, 9, [RELEASE])], LIMIT) == E.invalid_request
    assert sp.held == {"a": 10} and sp.counts() == {ACQUIRED: 10}


def test_regression_another_members_acquisition_took_the_rest_of_the_batch_before_the_extension() -> None:
    # The acquisition ends at max_records inside a log batch; the rest of it was acquired only
    # after the frontend's read (a second call), and a member acquiring in between took it: the
    # batch went whole to both, and the second call got nothing (575 of 680 in an 8-member run).
    # Batch ends a read has seen now make acquisitions end where their batch ends.
    sp = SharePartition(0)
    sp.learn_bounds([589, 1179, 1769])
    assert sp.acquire("a", 500, 5000, 0, 0, LOCK, LIMIT) == [(0, 589, 1)]
    assert sp.acquire("b", 500, 5000, 0, 0, LOCK, LIMIT) == [(590, 1179, 1)]
    assert sp.acquire("c", 400, 5000, 0, 0, LOCK, LIMIT) == [(1180, 1769, 1)]
    # an unknown end (past what was read): held to max_records, as before
    assert sp.acquire("d", 100, 5000, 0, 0, LOCK, LIMIT) == [(1770, 1869, 1)]
    # bounds below the start offset are forgotten
    assert sp.acknowledge("a", [(0, 589, [ACCEPT])], LIMIT) == E.none
    assert sp.acknowledge("b", [(590, 1179, [ACCEPT])], LIMIT) == E.none
    assert sp.bounds == [1769]
    # a bound past the high watermark (read_committed's last stable offset) is not crossed
    sp2 = SharePartition(0)
    sp2.learn_bounds([99])
    assert sp2.acquire("a", 10, 50, 0, 0, LOCK, LIMIT) == [(0, 49, 1)]


def test_record_limit_acquisitions_are_never_rounded_up_to_a_known_batch_end() -> None:
    # ShareFetch v2's share_acquire_mode record_limit (KIP-1206): max_records is a hard limit
    sp = SharePartition(0)
    sp.learn_bounds([589])
    assert sp.acquire("a", 500, 5000, 0, 0, LOCK, LIMIT, whole_batches=False) == [(0, 499, 1)]
    assert sp.acquire("b", 50, 5000, 0, 0, LOCK, LIMIT) == [(500, 589, 1)]
