"""The group coordinator's shared state: ``GroupTable`` (Kafka's GroupMetadataManager's map of
groups, with the timer and the deferred answers of the coordinator shard around it), sans-IO.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, inside
``appliance.group.membership.GroupCoordinator``, which builds one table and hands it to the
collaborators that decide the requests (``membership_join.RebalanceProtocol``,
``membership_sync.MemberRequests``, ``membership_admin.GroupAdmin``). It owns:

- the groups by id, of every type. The group-id namespace is shared across group types, as
  Kafka's GroupMetadataManager keeps one map for all of them: ListGroups, DescribeGroups,
  DeleteGroups and OffsetCommit look a group up here and read its ``group_type``: classic
  groups (``classic_group.ClassicGroup``, type ``"classic"``) and KIP-848 consumer groups
  (``consumer_group.ConsumerGroup``, type ``"consumer"``). The classic requests look up with
  ``classic`` (a group of another type is not theirs).
- the store: ``persist(group_id, record)`` and ``store``, which maps its failures with
  ``records.store_group_error`` (Kafka's storeGroup), the one mapping the offsets side uses too;
- the timers (Kafka's purgatories / CoordinatorTimer): one heap of ``(deadline, seq, kind, obj,
  extra)`` with its sequence numbers; ``tick`` pops the due entries and hands each to the
  ``fire`` callable of the collaborator that runs timers;
- the deferred answers: ``reply`` queues a ``Once`` answer; the queue is delivered when the
  outermost public call (``enter``/``leave``) returns, when the state is consistent;
- the clock: ``now()`` is the time of the ``tick`` being run, else ``now_ms()``;
- the broker's group.* configs (``config``), the loaded flag and the on_empty hook;
- the per-group configs (``group_configs(group_id)``, the GROUP config resources the
  catalog holds): ``consumer_session_timeout_ms`` / ``consumer_heartbeat_interval_ms`` read a
  group's own value first, then ``[groups]``, as Kafka's GroupMetadataManager does.

Consumer groups (KIP-848) live in ``groups`` beside the classic ones; their protocol
(``consumer_protocol.ConsumerGroupProtocol``) is a collaborator over this table like
``RebalanceProtocol``, with timer kinds of its own in the same heap. Share groups (KIP-932) would
plug in the same way.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from typing import Any, Callable

from appliance.errors import ErrorCode
from appliance.group import consumer_records
from appliance.group.classic_group import CLASSIC_GROUP_TYPE, ClassicGroup, GroupState
from appliance.group.records import GroupRecord, store_group_error

__all__ = ["GroupTable", "Once", "SUPERSEDED"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState
# (ours) the answer to a JoinGroup/SyncGroup parked for a member that sent a newer one (Kafka
# drops the older callback and never answers it; we promise to answer every request once)
SUPERSEDED = E.coordinator_not_available


class Once:
    """A respond callable that can be answered once only: the answer of a JoinGroup/SyncGroup
    that may be given later (from a timer or another member's request), exactly once."""

    __slots__ = ("fn", "done")

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn
        self.done = False


class GroupTable:
    """The groups of every type, the store, the timer heap, the deferred answers, the clock."""

    def __init__(self, config: Any, persist: Callable[[str, GroupRecord | None], Any],
                 now_ms: Callable[[], int], *,
                 on_empty: Callable[[str, int], None] | None = None,
                 persist_consumer: Callable[[str, list], Any] | None = None,
                 group_configs: Callable[[str], dict[str, str]] = lambda gid: {}) -> None:
        self.config = config
        # the configs set on a group's GROUP resource (KIP-848; appliance.group_config)
        self.group_configs = group_configs
        self.persist = persist
        self.persist_consumer = persist_consumer
        self.now_fn = now_ms
        self.on_empty = on_empty
        # one namespace for every group type (ClassicGroup, consumer_group.ConsumerGroup)
        self.groups: dict[str, Any] = {}
        self.heap: list[tuple[int, int, int, Any, Any]] = []
        self.seq = itertools.count(1)
        self.out: deque[tuple[Once, Any]] = deque()
        self.depth = 0
        self.clock: int | None = None
        self.loaded = False

    # -- plumbing ---------------------------------------------------------------------------------
    def consumer_session_timeout_ms(self, group_id: str) -> int:
        """Kafka's consumerGroupSessionTimeoutMs: the group's consumer.session.timeout.ms,
        else the broker's group.consumer.session.timeout.ms."""
        v = self.group_configs(group_id).get("consumer.session.timeout.ms")
        return int(v) if v is not None else self.config.consumer_session_timeout_ms

    def consumer_heartbeat_interval_ms(self, group_id: str) -> int:
        """Kafka's consumerGroupHeartbeatIntervalMs, likewise."""
        v = self.group_configs(group_id).get("consumer.heartbeat.interval.ms")
        return int(v) if v is not None else self.config.consumer_heartbeat_interval_ms

    def now(self) -> int:
        return self.clock if self.clock is not None else self.now_fn()

    def enter(self) -> None:
        self.depth += 1

    def leave(self) -> None:
        self.depth -= 1
        if self.depth:
            return
        self.depth += 1                      # replies made by a respond that re-enters wait here
        try:
            while self.out:
                once, result = self.out.popleft()
                try:
                    once.fn(result)
                except Exception:
                    log.exception("respond callback failed")
        finally:
            self.depth -= 1

    def reply(self, once: Once | None, result: Any) -> None:
        if once is None or once.done:
            return
        once.done = True
        self.out.append((once, result))

    # -- timers -----------------------------------------------------------------------------------
    def push(self, deadline: int, kind: int, obj: Any, extra: Any = None) -> int:
        seq = next(self.seq)
        heapq.heappush(self.heap, (deadline, seq, kind, obj, extra))
        return seq

    def next_deadline_ms(self) -> int | None:
        """The earliest timer (possibly one that will turn out to be stale), or None."""
        return self.heap[0][0] if self.heap else None

    def tick(self, now_ms: int | None, fire: Callable[[int, int, Any, Any, int], None]) -> None:
        """Fire every timer due at ``now_ms`` through ``fire(kind, seq, obj, extra, now)``.
        Timers a fired one starts are left for the next call, so a zero timeout cannot spin."""
        now = self.now_fn() if now_ms is None else now_ms
        self.enter()
        self.clock = now
        try:
            first_new = next(self.seq)
            heap = self.heap
            while heap and heap[0][0] <= now and heap[0][1] < first_new:
                _, seq, kind, obj, extra = heapq.heappop(heap)
                try:
                    fire(kind, seq, obj, extra, now)
                except Exception:
                    log.exception("group timer failed")
        finally:
            self.clock = None
            self.leave()

    # -- groups -----------------------------------------------------------------------------------
    def live(self, group: ClassicGroup) -> bool:
        return group.state is not S.Dead and self.groups.get(group.group_id) is group

    def classic(self, group_id: str) -> ClassicGroup | None:
        """The classic group of this id, or None (none, or a group of another type)."""
        group = self.groups.get(group_id)
        return group if group is not None and group.group_type == CLASSIC_GROUP_TYPE else None

    def create_classic_group(self, group_id: str) -> ClassicGroup:
        group = ClassicGroup(group_id, S.Empty, self.now())
        self.groups[group_id] = group
        return group

    def store(self, group_id: str, record: GroupRecord | None) -> ErrorCode:
        try:
            r = self.persist(group_id, record)
        except Exception as e:
            log.error("storing group %r failed: %r", group_id, e)
            return store_group_error(getattr(e, "code", None))
        if r is None or r is True or (not isinstance(r, bool) and r == E.none):
            return E.none
        log.error("storing group %r failed: %s", group_id, getattr(r, "name", r))
        return store_group_error(r)

    def store_consumer_group(self, group: Any, *, drop: bool = False,
                             classic: GroupRecord | None | bool = False) -> ErrorCode:
        """Persist what changed in a KIP-848 consumer group since its last store (its records,
        ``consumer_records.group_records``, against ``group.stored``); ``drop``: tombstones for
        every stored record (the group is deleted or gives way to a classic one). ``classic``:
        the group's classic record (None: its tombstone) in the same batch, for the conversions
        of KIP-848's online migration; a group converted from a classic one
        (``replaces_classic``) writes that tombstone with its first records. Mapped like
        ``store``. Without ``persist_consumer`` (unit tests of other parts) nothing is written.
        A group that is gone (converted back, deleted) writes nothing more unless ``drop``."""
        if group.dead and not drop and classic is False:
            return E.none
        now_records = {} if drop else consumer_records.group_records(group)
        changes = [(k, v) for k, v in now_records.items() if group.stored.get(k) != v]
        changes += [(k, None) for k in group.stored if k not in now_records]
        if classic is False and getattr(group, "replaces_classic", False):
            classic = None
        if (not changes and classic is False) or self.persist_consumer is None:
            group.stored = now_records
            group.replaces_classic = False
            return E.none
        try:
            r = (self.persist_consumer(group.group_id, changes) if classic is False
                 else self.persist_consumer(group.group_id, changes, classic))
        except Exception as e:
            log.error("storing consumer group %r failed: %r", group.group_id, e)
            return store_group_error(getattr(e, "code", None))
        if r is None or r is True or (not isinstance(r, bool) and r == E.none):
            group.stored = now_records
            group.replaces_classic = False
            return E.none
        log.error("storing consumer group %r failed: %s", group.group_id, getattr(r, "name", r))
        return store_group_error(r)

    def notify_empty(self, group: ClassicGroup) -> None:
        if self.on_empty is not None:
            try:
                ts = group.state_timestamp
                self.on_empty(group.group_id, self.now() if ts is None else ts)
            except Exception:
                log.exception("on_empty hook failed for group %r", group.group_id)
