"""One share partition's in-flight state (KIP-932's SharePartition): which offsets of a
topic-partition a share group has delivered, to whom, under which lock, and how often.

Runs in the coordinator worker (``appliance.group.share_group`` holds one per group and
partition); single-threaded and sans-IO: the caller persists ``snapshot()`` in the share-state
log (``appliance.group.share_store``) before it answers an acknowledgement, and hands the clock in.

The window is ``[start_offset, end_offset)``: below ``start_offset`` every record is done
(acknowledged or archived); from ``end_offset`` on nothing was ever acquired. Inside it each
offset has a state (Kafka's RecordState: AVAILABLE 0, ACQUIRED 1, ACKNOWLEDGED 2, ARCHIVED 4),
a delivery count, and while ACQUIRED its member and lock deadline. Kafka keeps this as ranges of
batches; a dict per in-flight offset is the first shape here (a window is at most
``max.poll.records`` times the members ahead of the start offset, and the snapshot merges runs).

Rules (Kafka's SharePartition): an acquisition takes AVAILABLE offsets from the start, then new
ones below the high watermark, up to ``max_records``, each one's delivery count incremented and
locked for ``group.share.record.lock.duration.ms``. ACCEPT makes an ACQUIRED offset ACKNOWLEDGED,
REJECT (and GAP) ARCHIVED, RELEASE AVAILABLE again; a released or expired offset that reached
``group.share.delivery.count.limit`` deliveries is ARCHIVED instead. Only the member holding an
offset may acknowledge it: anything else is INVALID_RECORD_STATE. The start offset moves past
every leading ACKNOWLEDGED/ARCHIVED offset, and up to the log start offset when retention
deleted records under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from appliance.errors import ErrorCode

__all__ = ["AVAILABLE", "ACQUIRED", "ACKNOWLEDGED", "ARCHIVED", "GAP", "ACCEPT", "RELEASE",
           "REJECT", "SharePartition", "StateBatch"]

E = ErrorCode

# RecordState (Kafka's org.apache.kafka.server.share.fetch... RecordState ids)
AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = 0, 1, 2, 4
# AcknowledgeType on the wire (KIP-932): 0 is the GAP of an offset the batch did not hold.
GAP, ACCEPT, RELEASE, REJECT = 0, 1, 2, 3
# Most offsets in flight per share partition by default (Kafka's
# group.share.partition.max.record.locks, 2000; ``[groups] share_partition_max_record_locks``):
# the window never grows past it (but for the rest of one log batch, ``acquire_through``), so
# that neither a huge max_records nor a backlog makes the coordinator hold (or walk) millions
# of records.
MAX_RECORD_LOCKS = 2000


@dataclass(slots=True)
class InFlight:
    state: int
    delivery_count: int
    member: str = ""
    deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class StateBatch:
    """A run of offsets with one persisted state and delivery count (ShareSnapshot's
    StateBatch)."""
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


@dataclass(slots=True)
class SharePartition:
    start_offset: int
    state_epoch: int = 0
    end_offset: int = -1                   # -1: the start offset
    inflight: dict[int, InFlight] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.end_offset < self.start_offset:
            self.end_offset = self.start_offset

    # -- persistence ------------------------------------------------------------------------------
    @classmethod
    def restore(cls, start_offset: int, state_epoch: int, batches: list[StateBatch]) -> "SharePartition":
        """The partition as a snapshot left it: acquisitions are not persisted, so what was
        ACQUIRED comes back AVAILABLE (with the delivery count it had when last written)."""
        sp = cls(start_offset, state_epoch)
        for b in batches:
            for o in range(max(b.first_offset, start_offset), b.last_offset + 1):
                st = AVAILABLE if b.delivery_state == ACQUIRED else b.delivery_state
                sp.inflight[o] = InFlight(st, b.delivery_count)
            sp.end_offset = max(sp.end_offset, b.last_offset + 1)
        sp._advance()
        return sp

    def snapshot(self) -> list[StateBatch]:
        """The in-flight window as runs of (state, delivery count), ACQUIRED written as
        AVAILABLE: a restart redelivers what was not acknowledged."""
        out: list[StateBatch] = []
        run = None
        for o in range(self.start_offset, self.end_offset):
            f = self.inflight.get(o)
            st, n = (AVAILABLE, 0) if f is None else (
                AVAILABLE if f.state == ACQUIRED else f.state, f.delivery_count)
            if run is not None and run[1] == o - 1 and run[2] == st and run[3] == n:
                run[1] = o
            else:
                if run is not None:
                    out.append(StateBatch(*run))
                run = [o, o, st, n]
        if run is not None:
            out.append(StateBatch(*run))
        return out

    # -- acquisition ------------------------------------------------------------------------------
    def acquire(self, member: str, max_records: int, high_watermark: int, log_start: int,
                now_ms: int, lock_ms: int, limit: int,
                max_locks: int = MAX_RECORD_LOCKS) -> list[tuple[int, int, int]]:
        """Acquire up to ``max_records`` offsets for ``member``: (first, last, delivery count)
        ranges in offset order; no new offset ``max_locks`` or more past the start offset."""
        self.expire(now_ms, limit)
        if log_start > self.start_offset:
            self._move_start(log_start)
        got: list[tuple[int, int, int]] = []
        left = max_records
        deadline = now_ms + lock_ms
        o = self.start_offset
        while left > 0 and o < high_watermark:
            f = self.inflight.get(o)
            if o >= self.end_offset:
                if o - self.start_offset >= max_locks:
                    break
                f = self.inflight[o] = InFlight(AVAILABLE, 0)
                self.end_offset = o + 1
            elif f is None:
                f = self.inflight[o] = InFlight(AVAILABLE, 0)
            if f.state == AVAILABLE:
                f.state, f.member, f.deadline_ms = ACQUIRED, member, deadline
                f.delivery_count += 1
                left -= 1
                if got and got[-1][1] == o - 1 and got[-1][2] == f.delivery_count:
                    got[-1] = (got[-1][0], o, f.delivery_count)
                else:
                    got.append((o, o, f.delivery_count))
            o += 1
        return got

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
        inflight = self.inflight
        for o in range(first, last + 1):
            f = inflight.get(o)
            if f is None:
                f = inflight[o] = InFlight(AVAILABLE, 0)
            if f.state != AVAILABLE:
                continue
            f.state, f.member, f.deadline_ms = ACQUIRED, member, deadline
            f.delivery_count += 1
            if got and got[-1][1] == o - 1 and got[-1][2] == f.delivery_count:
                got[-1] = (got[-1][0], o, f.delivery_count)
            else:
                got.append((o, o, f.delivery_count))
        self.end_offset = max(self.end_offset, last + 1)
        return got

    # -- acknowledgement --------------------------------------------------------------------------
    def acknowledge(self, member: str, batches: list[tuple[int, int, list[int]]],
                    limit: int) -> ErrorCode:
        """Apply (first, last, types) acknowledgement batches of ``member`` (one type for the
        whole range, or one per offset). All or nothing: INVALID_RECORD_STATE (nothing applied)
        when an offset is not ACQUIRED by this member, INVALID_REQUEST for a malformed batch."""
        todo: list[tuple[InFlight, int]] = []
        for first, last, types in batches:
            if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
                return E.invalid_request
            for i, o in enumerate(range(first, last + 1)):
                t = types[0] if len(types) == 1 else types[i]
                if t not in (GAP, ACCEPT, RELEASE, REJECT):
                    return E.invalid_request
                f = self.inflight.get(o)
                if f is None or f.state != ACQUIRED or f.member != member:
                    return E.invalid_record_state
                todo.append((f, t))
        for f, t in todo:
            if t == ACCEPT:
                f.state = ACKNOWLEDGED
            elif t == RELEASE:
                f.state = ARCHIVED if f.delivery_count >= limit else AVAILABLE
            else:
                f.state = ARCHIVED
            f.member, f.deadline_ms = "", 0
        self._advance()
        return E.none

    def release_member(self, member: str, limit: int) -> bool:
        """Give back every offset ``member`` holds (its session closed or it left the group).
        True if anything changed."""
        changed = False
        for f in self.inflight.values():
            if f.state == ACQUIRED and f.member == member:
                f.state = ARCHIVED if f.delivery_count >= limit else AVAILABLE
                f.member, f.deadline_ms = "", 0
                changed = True
        if changed:
            self._advance()
        return changed

    def expire(self, now_ms: int, limit: int) -> bool:
        """Locks past their deadline: the offsets are AVAILABLE again (ARCHIVED at the delivery
        count limit). True if anything changed."""
        changed = False
        for f in self.inflight.values():
            if f.state == ACQUIRED and f.deadline_ms <= now_ms:
                f.state = ARCHIVED if f.delivery_count >= limit else AVAILABLE
                f.member, f.deadline_ms = "", 0
                changed = True
        if changed:
            self._advance()
        return changed

    def next_deadline_ms(self) -> int | None:
        ds = [f.deadline_ms for f in self.inflight.values() if f.state == ACQUIRED]
        return min(ds) if ds else None

    def counts(self) -> dict[int, int]:
        """state -> how many in-flight offsets are in it (describe, metrics)."""
        out: dict[int, int] = {}
        for f in self.inflight.values():
            out[f.state] = out.get(f.state, 0) + 1
        return out

    # -- the start offset -------------------------------------------------------------------------
    def _advance(self) -> None:
        o = self.start_offset
        while o < self.end_offset:
            f = self.inflight.get(o)
            if f is None or f.state not in (ACKNOWLEDGED, ARCHIVED):
                break
            del self.inflight[o]
            o += 1
        self.start_offset = o

    def _move_start(self, offset: int) -> None:
        for o in range(self.start_offset, min(offset, self.end_offset)):
            self.inflight.pop(o, None)
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)
        self._advance()
