"""One share partition's in-flight state (KIP-932's SharePartition): which offsets of a
topic-partition a share group has delivered, to whom, under which lock, and how often.

Runs in the coordinator worker (``appliance.group.share_group`` holds one per group and
partition); single-threaded and sans-IO: the caller persists ``snapshot()`` in the share-state
log (``appliance.group.share_store``) before it answers an acknowledgement, and hands the clock in.

The window is ``[start_offset, end_offset)``: below ``start_offset`` every record is done
(acknowledged or archived); from ``end_offset`` on nothing was ever acquired. Inside it each
offset has a state (Kafka's RecordState: AVAILABLE 0, ACQUIRED 1, ACKNOWLEDGED 2, ARCHIVED 4),
a delivery count, and while ACQUIRED its member and lock deadline. As Kafka's SharePartition
keeps its cachedState of InFlightBatches, the window is held as runs (``InFlightRun``): a run is
a range of offsets with one state, delivery count, member and deadline, the runs contiguous and
in offset order from the start offset to the end offset. An acquisition makes one run per
range it takes, an acknowledgement of a whole run changes it in place, and a run is split only
where an acknowledgement, an acquisition or an expiry covers part of it (Kafka splits an
InFlightBatch into per-offset states then); neighbours that agree again are merged. So
acquiring, acknowledging, expiring and the snapshot cost per run, not per offset.

Rules (Kafka's SharePartition): an acquisition takes AVAILABLE offsets from the start, then new
ones below the high watermark, up to ``max_records``, each one's delivery count incremented and
locked for ``group.share.record.lock.duration.ms``. ACCEPT makes an ACQUIRED offset ACKNOWLEDGED,
REJECT (and GAP) ARCHIVED, RELEASE AVAILABLE again, RENEW (KIP-1222) restarts its lock; a released or expired offset that reached
``group.share.delivery.count.limit`` deliveries is ARCHIVED instead. Only the member holding an
offset may acknowledge it: anything else is INVALID_RECORD_STATE. The start offset moves past
every leading ACKNOWLEDGED/ARCHIVED offset, and up to the log start offset when retention
deleted records under it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from appliance.errors import ErrorCode

__all__ = ["AVAILABLE", "ACQUIRED", "ACKNOWLEDGED", "ARCHIVED", "GAP", "ACCEPT", "RELEASE",
           "REJECT", "RENEW", "SharePartition", "StateBatch", "InFlightRun"]

E = ErrorCode

# RecordState (Kafka's org.apache.kafka.server.share.fetch... RecordState ids)
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
DONE = (ACKNOWLEDGED, ARCHIVED)
# AcknowledgeType on the wire (KIP-932): 0 is the GAP of an offset the batch did not hold.
GAP, ACCEPT, RELEASE, REJECT = 0, 1, 2, 3
# KIP-1222 (ShareFetch / ShareAcknowledge v2 with is_renew_ack): the record stays ACQUIRED by its
# member, its lock restarted for the group's record lock duration; its delivery count unchanged.
RENEW = 4
# Most offsets in flight per share partition by default (Kafka's
# group.share.partition.max.record.locks, 2000; ``[groups] share_partition_max_record_locks``):
# the window never grows past it (but for the rest of one log batch, ``acquire_through``), so
# that neither a huge max_records nor a backlog makes the coordinator hold millions of records.
MAX_RECORD_LOCKS = 2000
# Most batch ends a share partition remembers (``SharePartition.bounds``).
MAX_BOUNDS = 256


@dataclass(slots=True)
class InFlightRun:
    """Offsets ``first..last`` with one state (Kafka's InFlightBatch, or a piece of one)."""
    first: int
    last: int
    state: int
    delivery_count: int
    member: str = ""
    deadline_ms: int = 0

    def same(self, o: "InFlightRun") -> bool:
        return (self.state == o.state and self.delivery_count == o.delivery_count
                and self.member == o.member and self.deadline_ms == o.deadline_ms)


@dataclass(frozen=True, slots=True)
class StateBatch:
    """A run of offsets with one persisted state and delivery count (ShareSnapshot's
    StateBatch)."""
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


def _first(r: InFlightRun) -> int:
    return r.first


@dataclass(slots=True)
class SharePartition:
    start_offset: int
    state_epoch: int = 0
    end_offset: int = -1                   # -1: the start offset
    runs: list[InFlightRun] = field(default_factory=list)
    # member -> how many offsets it holds ACQUIRED here: whether a member holds anything (the
    # coordinator never parks a holder's ShareFetch) and whether a lock is out at all, without
    # a walk over the window.
    held: dict[str, int] = field(default_factory=dict)
    # Last offsets of log batches at or past the start offset that a frontend's read saw
    # (``learn_bounds``), sorted: an acquisition that would end inside such a batch takes the
    # rest of it at once (Kafka acquires from the batches it has just read, so it never ends
    # inside one; here the read comes after the acquisition). Without them the rest of the
    # batch is acquired by a second call once the read has seen it (``acquire_through``), and
    # another member's acquisition in between takes it first: the batch then goes, whole, to
    # both members, and the second call was for nothing.
    bounds: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.end_offset < self.start_offset:
            self.end_offset = self.start_offset

    def clone(self) -> "SharePartition":
        """An independent copy (the state to go back to when an acknowledgement's write fails)."""
        return SharePartition(self.start_offset, self.state_epoch, self.end_offset,
                              [InFlightRun(r.first, r.last, r.state, r.delivery_count, r.member,
                                           r.deadline_ms) for r in self.runs],
                              dict(self.held), list(self.bounds))

    # -- persistence ------------------------------------------------------------------------------
    @classmethod
    def restore(cls, start_offset: int, state_epoch: int, batches: list[StateBatch]) -> "SharePartition":
        """The partition as a snapshot left it: acquisitions are not persisted, so what was
        ACQUIRED comes back AVAILABLE (with the delivery count it had when last written)."""
        sp = cls(start_offset, state_epoch)
        for b in sorted(batches, key=lambda b: b.first_offset):
            first = max(b.first_offset, sp.end_offset)
            if b.last_offset >= first:
                if first > sp.end_offset:                  # never acquired: AVAILABLE, none yet
                    sp.runs.append(InFlightRun(sp.end_offset, first - 1, AVAILABLE, 0))
                st = AVAILABLE if b.delivery_state == ACQUIRED else b.delivery_state
                sp.runs.append(InFlightRun(first, b.last_offset, st, b.delivery_count))
            sp.end_offset = max(sp.end_offset, b.last_offset + 1)
        sp._coalesce()
        sp._advance()
        return sp

    def snapshot(self) -> list[StateBatch]:
        """The in-flight window as runs of (state, delivery count), ACQUIRED written as
        AVAILABLE: a restart redelivers what was not acknowledged."""
        out: list[StateBatch] = []
        run = None
        for r in self.runs:
            st = AVAILABLE if r.state == ACQUIRED else r.state
            if run is not None and run[2] == st and run[3] == r.delivery_count:
                run[1] = r.last
            else:
                if run is not None:
                    out.append(StateBatch(*run))
                run = [r.first, r.last, st, r.delivery_count]
        if run is not None:
            out.append(StateBatch(*run))
        return out

    def offsets(self) -> dict[int, tuple[int, int]]:
        """offset -> (state, delivery count) of every offset in the window (tests, debugging)."""
        return {o: (r.state, r.delivery_count) for r in self.runs
                for o in range(r.first, r.last + 1)}

    # -- acquisition ------------------------------------------------------------------------------
    def acquire(self, member: str, max_records: int, high_watermark: int, log_start: int,
                now_ms: int, lock_ms: int, limit: int, max_locks: int = MAX_RECORD_LOCKS,
                whole_batches: bool = True) -> list[tuple[int, int, int]]:
        """Acquire up to ``max_records`` offsets for ``member``: (first, last, delivery count)
        ranges in offset order; no new offset ``max_locks`` or more past the start offset.
        With ``whole_batches`` (batch_optimized) an acquisition ending inside a batch whose end
        is known (``bounds``) takes the rest of it; without (record_limit), never more than
        ``max_records``."""
        self.expire(now_ms, limit)
        if log_start > self.start_offset:
            self._move_start(log_start)
        got: list[tuple[int, int, int]] = []
        left = max_records
        deadline = now_ms + lock_ms
        runs = self.runs
        i = 0
        while left > 0 and i < len(runs):
            r = runs[i]
            if r.first >= high_watermark:
                break
            if r.state == AVAILABLE:
                last = min(r.last, r.first + left - 1, high_watermark - 1)
                if last < r.last:
                    self._split(i, last + 1)
                self._take(r, member, deadline, got)
                left -= r.last - r.first + 1
            i += 1
        if left > 0 and self.end_offset < high_watermark:
            first = self.end_offset
            last = min(high_watermark - 1, first + left - 1, self.start_offset + max_locks - 1)
            if last >= first:
                r = InFlightRun(first, last, AVAILABLE, 0)
                runs.append(r)
                self.end_offset = last + 1
                self._take(r, member, deadline, got)
        if got:
            self._coalesce()
            if self.bounds and whole_batches:
                # Ended inside a batch whose end a read has seen: the rest of it too.
                last = got[-1][1]
                k = bisect.bisect_left(self.bounds, last)
                if k < len(self.bounds) and self.bounds[k] > last:
                    more = self.acquire_through(member, last + 1, self.bounds[k], high_watermark,
                                                now_ms, lock_ms)
                    for f, l, n in more:
                        if got[-1][1] == f - 1 and got[-1][2] == n:
                            got[-1] = (got[-1][0], l, n)
                        else:
                            got.append((f, l, n))
        return got

    def learn_bounds(self, lasts: list[int]) -> None:
        """Remember where log batches end (their last offsets, as a read saw them); at most
        ``MAX_BOUNDS``, the lowest kept (the next acquisitions are there)."""
        start = self.start_offset
        merged = sorted(set(self.bounds).union(o for o in lasts if o >= start))
        self.bounds = merged[:MAX_BOUNDS]

    def bounds_past(self, offset: int) -> int:
        """How many batch ends past ``offset`` are known: when few are, the next read looks
        ahead for more (``BOUNDS_AHEAD`` in ``appliance.api.share_fetch``)."""
        return len(self.bounds) - bisect.bisect_right(self.bounds, offset)

    def acquire_through(self, member: str, first: int, last: int, high_watermark: int,
                        now_ms: int, lock_ms: int) -> list[tuple[int, int, int]]:
        """Acquire for ``member`` the AVAILABLE offsets of ``[first, last]`` (below the high
        watermark): the rest of the log batch an acquisition ended inside, which the response
        carries anyway (Kafka's SharePartition acquires whole fetched batches: ``max_records``
        is a soft limit, ShareAcquireMode batch_optimized). Not held to ``MAX_RECORD_LOCKS``:
        the range is at most one batch past what was just acquired. Only from inside the
        window or its end (``first <= end_offset``), so that the window stays contiguous."""
        last = min(last, high_watermark - 1)
        first = max(first, self.start_offset)
        if first > self.end_offset or last < first:
            return []
        got: list[tuple[int, int, int]] = []
        deadline = now_ms + lock_ms
        inside = min(last, self.end_offset - 1)
        if first <= inside:
            i, j = self._isolate(first, inside)
            for r in self.runs[i:j]:
                if r.state == AVAILABLE:
                    self._take(r, member, deadline, got)
        if last >= self.end_offset:
            r = InFlightRun(self.end_offset, last, AVAILABLE, 0)
            self.runs.append(r)
            self.end_offset = last + 1
            self._take(r, member, deadline, got)
        self._coalesce()
        return got

    def unacquire(self, member: str, first: int, last: int) -> None:
        """Undo ``member``'s acquisition of ``[first, last]``: offsets a ShareFetch acquired but
        could not send (its max_bytes ended before their batch). AVAILABLE again with their
        delivery count as before, as if never acquired: Kafka acquires only the batches a fetch
        read, so such records were never delivered and must not move toward the delivery count
        limit (or be taken for gaps by the client)."""
        first, last = max(first, self.start_offset), min(last, self.end_offset - 1)
        if last < first or member not in self.held:
            return
        i, j = self._isolate(first, last)
        for r in self.runs[i:j]:
            if r.state == ACQUIRED and r.member == member:
                self._held_less(member, r.last - r.first + 1)
                r.state, r.member, r.deadline_ms = AVAILABLE, "", 0
                r.delivery_count -= 1
        self._coalesce()

    # -- acknowledgement --------------------------------------------------------------------------
    def acknowledge(self, member: str, batches: list[tuple[int, int, list[int]]],
                    limit: int, renew_until_ms: int | None = None) -> ErrorCode:
        """Apply (first, last, types) acknowledgement batches of ``member`` (one type for the
        whole range, or one per offset). All or nothing: INVALID_RECORD_STATE (nothing applied)
        when an offset is not ACQUIRED by this member, INVALID_REQUEST for a malformed batch
        (or batches that overlap). RENEW is taken only from a request that says it renews
        (``renew_until_ms``: the new lock deadline), else INVALID_REQUEST."""
        allowed = (GAP, ACCEPT, RELEASE, REJECT) if renew_until_ms is None else (
            GAP, ACCEPT, RELEASE, REJECT, RENEW)
        todo: list[tuple[int, int, int]] = []          # (first, last, type)
        for first, last, types in batches:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                return E.invalid_request
            if any(t not in allowed for t in types):
                return E.invalid_request
            if not self._held_by(member, first, last):
                return E.invalid_record_state
            if len(types) == 1:
                todo.append((first, last, types[0]))
            else:                     # per-offset types: one range per run of equal types
                a = first
                for k in range(1, len(types) + 1):
                    if k == len(types) or types[k] != types[k - 1]:
                        todo.append((a, first + k - 1, types[k - 1]))
                        a = first + k
        todo.sort()
        for (_f, l0, _t), (f1, _l, _t1) in zip(todo, todo[1:]):
            if f1 <= l0:
                return E.invalid_request
        for first, last, t in todo:
            i, j = self._isolate(first, last)
            for r in self.runs[i:j]:
                if t == RENEW:
                    r.deadline_ms = renew_until_ms
                    continue
                self._held_less(r.member, r.last - r.first + 1)
                if t == ACCEPT:
                    r.state = ACKNOWLEDGED
                elif t == RELEASE:
                    r.state = ARCHIVED if r.delivery_count >= limit else AVAILABLE
                else:
                    r.state = ARCHIVED
                r.member, r.deadline_ms = "", 0
        self._coalesce()
        self._advance()
        return E.none

    def release_member(self, member: str, limit: int) -> bool:
        """Give back every offset ``member`` holds (its session closed or it left the group).
        True if anything changed."""
        if member not in self.held:
            return False
        for r in self.runs:
            if r.state == ACQUIRED and r.member == member:
                r.state = ARCHIVED if r.delivery_count >= limit else AVAILABLE
                r.member, r.deadline_ms = "", 0
        del self.held[member]
        self._coalesce()
        self._advance()
        return True

    def expire(self, now_ms: int, limit: int) -> bool:
        """Locks past their deadline: the offsets are AVAILABLE again (ARCHIVED at the delivery
        count limit). True if anything changed."""
        if not self.held:
            return False
        changed = False
        for r in self.runs:
            if r.state == ACQUIRED and r.deadline_ms <= now_ms:
                self._held_less(r.member, r.last - r.first + 1)
                r.state = ARCHIVED if r.delivery_count >= limit else AVAILABLE
                r.member, r.deadline_ms = "", 0
                changed = True
        if changed:
            self._coalesce()
            self._advance()
        return changed

    def holds(self, member: str) -> bool:
        """Whether ``member`` holds any offset of this partition ACQUIRED."""
        return member in self.held

    def waits_on_locks(self, end: int) -> bool:
        """After an acquisition that got nothing: whether records below ``end`` (the high
        watermark, or the last stable offset) are there that a lock being freed (an
        acknowledgement, a release, an expiry) would make acquirable: locks are out, or the
        window is full with records past it. False when everything is done and the member can
        only wait for new records (the fetcher's long poll)."""
        return bool(self.held) or self.end_offset < end

    def next_deadline_ms(self) -> int | None:
        if not self.held:
            return None
        ds = [r.deadline_ms for r in self.runs if r.state == ACQUIRED]
        return min(ds) if ds else None

    def counts(self) -> dict[int, int]:
        """state -> how many in-flight offsets are in it (describe, metrics)."""
        out: dict[int, int] = {}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + r.last - r.first + 1
        return out

    def done_from(self, offset: int) -> int:
        """How many offsets at or past ``offset`` in the window are done (acknowledged or
        archived): Kafka's deliveryCompleteCount, for the lag."""
        return sum(r.last - max(r.first, offset) + 1 for r in self.runs
                   if r.state in DONE and r.last >= offset)

    def in_flight(self) -> int:
        """Offsets in the window not done yet (the in-flight gauge)."""
        return sum(r.last - r.first + 1 for r in self.runs if r.state not in DONE)

    # -- runs -------------------------------------------------------------------------------------
    def _take(self, r: InFlightRun, member: str, deadline: int, got: list) -> None:
        """``r`` (AVAILABLE) acquired by ``member``: its delivery count up, the range in ``got``."""
        r.state, r.member, r.deadline_ms = ACQUIRED, member, deadline
        r.delivery_count += 1
        self.held[member] = self.held.get(member, 0) + r.last - r.first + 1
        if got and got[-1][1] == r.first - 1 and got[-1][2] == r.delivery_count:
            got[-1] = (got[-1][0], r.last, r.delivery_count)
        else:
            got.append((r.first, r.last, r.delivery_count))

    def _held_less(self, member: str, n: int) -> None:
        left = self.held.get(member, 0) - n
        if left > 0:
            self.held[member] = left
        else:
            self.held.pop(member, None)

    def _held_by(self, member: str, first: int, last: int) -> bool:
        """Every offset of ``[first, last]`` is ACQUIRED by ``member``."""
        if member not in self.held or first < self.start_offset or last >= self.end_offset:
            return False
        runs = self.runs
        i = bisect.bisect_right(runs, first, key=_first) - 1
        while i < len(runs) and runs[i].first <= last:
            r = runs[i]
            if r.state != ACQUIRED or r.member != member:
                return False
            i += 1
        return True

    def _split(self, i: int, at: int) -> None:
        """Run ``i`` cut before offset ``at`` (inside it, not its first)."""
        r = self.runs[i]
        self.runs.insert(i + 1, InFlightRun(at, r.last, r.state, r.delivery_count, r.member,
                                            r.deadline_ms))
        r.last = at - 1

    def _isolate(self, first: int, last: int) -> tuple[int, int]:
        """Split runs so that ``[first, last]`` (inside the window) is covered by whole runs
        ``runs[i:j]``; returns (i, j)."""
        runs = self.runs
        i = bisect.bisect_right(runs, first, key=_first) - 1
        if runs[i].first < first:
            self._split(i, first)
            i += 1
        j = i
        while j < len(runs) and runs[j].last < last:
            j += 1
        if runs[j].last > last:
            self._split(j, last + 1)
        return i, j + 1

    def _coalesce(self) -> None:
        """Neighbouring runs that agree in everything merged (the window stays a few runs)."""
        runs = self.runs
        if len(runs) < 2:
            return
        out = [runs[0]]
        for r in runs[1:]:
            p = out[-1]
            if p.same(r):
                p.last = r.last
            else:
                out.append(r)
        if len(out) != len(runs):
            self.runs = out

    # -- the start offset -------------------------------------------------------------------------
    def _advance(self) -> None:
        runs = self.runs
        k = 0
        while k < len(runs) and runs[k].state in DONE:
            k += 1
        if k:
            del runs[:k]
        self.start_offset = runs[0].first if runs else self.end_offset
        if self.bounds and self.bounds[0] < self.start_offset:
            del self.bounds[:bisect.bisect_left(self.bounds, self.start_offset)]

    def _move_start(self, offset: int) -> None:
        runs = self.runs
        k = 0
        while k < len(runs) and runs[k].last < offset:
            r = runs[k]
            if r.state == ACQUIRED:
                self._held_less(r.member, r.last - r.first + 1)
            k += 1
        del runs[:k]
        if runs and runs[0].first < offset:
            r = runs[0]
            if r.state == ACQUIRED:
                self._held_less(r.member, offset - r.first)
            r.first = offset
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)
        self._advance()
