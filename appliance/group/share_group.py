"""Share groups (KIP-932) in the coordinator worker: membership, share sessions, and the share
partitions with their durable state.

Runs in the coordinator worker (``workers/coordinator.py`` registers ``ShareService`` with its
``appliance.service.Registry``); single-threaded and sans-IO apart from the share-state log
(``appliance.group.share_store``) it appends to. Owns, for every share group: its members and
epochs (ShareGroupHeartbeat, ShareGroupDescribe), the share sessions of its members (Kafka's
ShareSessionCache), and one ``appliance.group.share_partition.SharePartition`` per partition it
reads (ShareFetch, ShareAcknowledge). Where each lives and why: docs/architecture.md, "Share
groups".

Assignment: Kafka's ``simple`` assignor (``appliance.group.share_assignor``): balanced, a
partition shared only when members outnumber partitions, sticky; computed for the whole group at each
heartbeat and kept as the group's target, each member taking its part at its own heartbeat
(share partitions are read by many members at once, so there is no revocation step and a
member's epoch simply follows the group epoch when its assignment changes). Membership is not persisted (Kafka writes it to ``__consumer_offsets``):
after a restart members get UNKNOWN_MEMBER_ID and join again, which every client does; the share
partitions' state is what must survive, and does. The admin side (ListGroups, DeleteGroups, the
share-group offsets APIs 90-92) is ``appliance.group.share_admin``.

Sessions (KIP-932 "Share sessions"): a ShareFetch with epoch 0 opens the member's session (at most
``groups.share_max_share_sessions``, else SHARE_SESSION_LIMIT_REACHED) with the partitions it
names; each later request must carry the session's next epoch (INVALID_SHARE_SESSION_EPOCH
otherwise; SHARE_SESSION_NOT_FOUND without a session) and may add partitions or forget them;
epoch -1 closes the session after its acknowledgements, releasing what the member still holds.
A member that leaves or whose heartbeats stop for ``share_session_timeout_ms`` loses its session
and its records the same way, and so does a member whose session's connection closes (the
connection of its epoch-0 ShareFetch; ``connection_closed``, Kafka's ShareSessionCache
disconnect listener): a consumer killed -9 has its records redelivered when its socket closes,
not at its locks' end. A session reopened on another connection is no longer the old one's. A
frontend that restarts closes the sessions of its earlier process's connections
(``frontend_started``), which that process, killed, could not announce.

Parked fetches (Kafka's DelayedShareFetch, ``serve_fetch``): a frontend's second try that would
acquire nothing, for a member that holds nothing on its session's partitions while others hold
the records there (or the window is full), waits here until a lock of its group is freed, the
tick sees new records, or its ``wait_ms`` runs out; the registry's late answer (``Responder``)
is kept meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

import msgspec

from appliance.errors import ErrorCode
from appliance.group.messages import (DescribedShareGroup, DescribedShareMember,
                                      ShareConnectionClosed, ShareConnectionClosedResult,
                                      ShareFrontendStarted,
                                      ShareFetchRequest, ShareFetchResult, ShareGroupDescribeRequest,
                                      ShareGroupDescribeResult, ShareGroupHeartbeatRequest,
                                      ShareGroupHeartbeatResult, SharePartResult, TopicPartitions)
from appliance.group.share_admin import ShareAdmin, SharePartitions
from appliance.group.share_assignor import assign
from appliance.group.share_partition import MAX_RECORD_LOCKS, RENEW, SharePartition
from appliance.group.share_store import ShareKey, ShareLogWriteError, ShareSnapshot, ShareStateStore
from appliance.service import Responder, serves

log = logging.getLogger("appliance.group.share")
E = ErrorCode

INITIAL_EPOCH, FINAL_EPOCH = 0, -1
INT32_MAX = 2**31 - 1
TICK_MS = 100
# How long the share session of a member that left waits for its final ShareAcknowledge/
# ShareFetch (epoch -1) before it closes and its records are released.
LEFT_SESSION_GRACE_MS = 5000


def next_epoch(epoch: int) -> int:
    return 1 if epoch == INT32_MAX else epoch + 1


@dataclass(frozen=True)
class ShareConfig:
    heartbeat_interval_ms: int = 5000          # group.share.heartbeat.interval.ms
    session_timeout_ms: int = 45000            # group.share.session.timeout.ms
    record_lock_duration_ms: int = 30000       # group.share.record.lock.duration.ms
    delivery_count_limit: int = 5              # group.share.delivery.count.limit
    auto_offset_reset: str = "latest"          # share.auto.offset.reset
    max_size: int = 200                        # group.share.max.size
    max_share_sessions: int = 2000             # group.share.max.share.sessions
    isolation_level: str = "read_uncommitted"  # share.isolation.level (a group config only)
    max_record_locks: int = MAX_RECORD_LOCKS   # group.share.partition.max.record.locks (and
                                               # the group's share.partition.max.record.locks)


# GROUP config resources (appliance.group_config) over [groups]: name -> (field, type).
_GROUP_OVERRIDES = {"share.heartbeat.interval.ms": ("heartbeat_interval_ms", int),
                    "share.session.timeout.ms": ("session_timeout_ms", int),
                    "share.record.lock.duration.ms": ("record_lock_duration_ms", int),
                    "share.delivery.count.limit": ("delivery_count_limit", int),
                    "share.auto.offset.reset": ("auto_offset_reset", str),
                    "share.isolation.level": ("isolation_level", str),
                    # KIP-1240: the group's in-flight window per share partition
                    "share.partition.max.record.locks": ("max_record_locks", int)}


def share_config(groups_cfg) -> ShareConfig:
    return ShareConfig(groups_cfg.share_heartbeat_interval_ms, groups_cfg.share_session_timeout_ms,
                       groups_cfg.share_record_lock_duration_ms,
                       groups_cfg.share_delivery_count_limit, groups_cfg.share_auto_offset_reset,
                       groups_cfg.share_max_size, groups_cfg.share_max_share_sessions,
                       max_record_locks=groups_cfg.share_partition_max_record_locks)


@dataclass
class ShareMember:
    member_id: str
    epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed: list[str] = field(default_factory=list)
    assignment: list[tuple[bytes, int]] = field(default_factory=list)
    last_seen_ms: int = 0


@dataclass
class ShareGroup:
    group_id: str
    epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    # The assignor's last answer: member -> its target partitions (share_assignor), and what
    # it was computed from (members, their subscriptions, those topics' ids and partitions).
    target: dict[str, list[tuple[bytes, int]]] = field(default_factory=dict)
    target_for: tuple | None = None


@dataclass(slots=True)
class _Parked:
    req: ShareFetchRequest
    respond: Responder
    deadline_ms: int


@dataclass
class ShareSession:
    epoch: int
    parts: dict[tuple[bytes, int], None] = field(default_factory=dict)    # ordered set
    connection: str = ""        # the frontend connection of its epoch-0 ShareFetch


class ShareService(ShareAdmin):
    def __init__(self, store: ShareStateStore, cfg: ShareConfig, now_ms: Callable[[], int],
                 topics: Callable[[], dict[str, tuple[bytes, int]]],
                 marks: Callable[[bytes, int], tuple[int, int] | None],
                 other_group: Callable[[str], bool] = lambda g: False,
                 group_configs: Callable[[str], dict[str, str]] = lambda g: {}) -> None:
        """``topics``: name -> (topic id, partitions) of the catalog; ``marks(topic id,
        partition)``: its (high watermark, log start offset[, last stable offset]), None when it
        does not exist; ``other_group(id)``: a classic or consumer group has that id;
        ``group_configs(id)``: the group's GROUP config resource (``share.*`` override the
        ``[groups]`` defaults in ``cfg``, as Kafka's GroupConfig does)."""
        self.store = store
        self.cfg = cfg
        self.now = now_ms
        self.topics = topics
        self.marks = marks
        self.other_group = other_group
        self.group_configs = group_configs
        self.groups: dict[str, ShareGroup] = {}
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.partitions: SharePartitions = SharePartitions()   # ShareKey -> SharePartition
        self._snapshot_epochs: dict[ShareKey, tuple[int, int]] = {}   # (snapshot epoch, created)
        self._next_tick = 0
        self._due: int | None = None
        # Sessions of members that left the group: (group, member) -> when they close anyway.
        self._left: dict[tuple[str, str], int] = {}
        # ShareFetches waiting for a lock to be freed (``serve_fetch``), in the order they
        # came, and the groups where one was freed since they last tried.
        self._parked: list[_Parked] = []
        self._freed: set[str] = set()

    def gcfg(self, group_id: str) -> ShareConfig:
        """The share configs of one group: its GROUP config resource over ``cfg``."""
        own = self.group_configs(group_id)
        if not own:
            return self.cfg
        changes = {}
        for name, value in own.items():
            o = _GROUP_OVERRIDES.get(name)
            if o is not None:
                try:
                    changes[o[0]] = o[1](value)
                except ValueError:
                    log.warning("group %s: config %s=%r ignored", group_id, name, value)
        return dataclasses.replace(self.cfg, **changes) if changes else self.cfg

    def load(self) -> None:
        for key, snap in self.store.load().items():
            self.partitions[key] = SharePartition.restore(snap.start_offset, snap.state_epoch,
                                                          snap.batches)
            self._snapshot_epochs[key] = (snap.snapshot_epoch, snap.create_timestamp)
        log.info("share coordinator loaded %d share partitions", len(self.partitions))

    def close(self, clean: bool = True) -> None:
        self.store.close(clean)

    # -- membership -------------------------------------------------------------------------------
    @serves(ShareGroupHeartbeatRequest)
    def heartbeat(self, req: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResult:
        now = self.now()
        if not req.group_id:
            return ShareGroupHeartbeatResult(E.invalid_request, "GroupId can't be empty.")
        if not req.member_id:
            return ShareGroupHeartbeatResult(E.invalid_request, "MemberId can't be empty.")
        if self.other_group(req.group_id):
            return ShareGroupHeartbeatResult(E.group_id_not_found,
                                             f"Group {req.group_id} is not a share group.")
        g = self.groups.get(req.group_id)
        if req.member_epoch == -1:
            if g is not None and req.member_id in g.members:
                self._remove_member(g, req.member_id, leaving=True)
            return ShareGroupHeartbeatResult(E.none, member_id=req.member_id, member_epoch=-1)
        m = g.members.get(req.member_id) if g is not None else None
        if req.member_epoch == 0:
            if m is None:
                if not req.subscribed_topic_names:
                    return ShareGroupHeartbeatResult(
                        E.invalid_request, "SubscribedTopicNames must be set in first request.")
                if g is None:
                    g = self.groups[req.group_id] = ShareGroup(req.group_id)
                if len(g.members) >= self.cfg.max_size:
                    return ShareGroupHeartbeatResult(
                        E.group_max_size_reached,
                        f"The share group has reached its maximum capacity of {self.cfg.max_size} members.")
                m = g.members[req.member_id] = ShareMember(req.member_id)
                self._left.pop((req.group_id, req.member_id), None)     # back: session kept
        elif m is None:
            return ShareGroupHeartbeatResult(
                E.unknown_member_id, f"Member {req.member_id} is not a member of group {req.group_id}.")
        elif req.member_epoch != m.epoch:
            return ShareGroupHeartbeatResult(E.fenced_member_epoch,
                                             "The share group member has a smaller member epoch "
                                             f"({req.member_epoch}) than the one known by the "
                                             f"group coordinator ({m.epoch}).")
        assert g is not None
        if req.subscribed_topic_names is not None:
            m.subscribed = sorted(set(req.subscribed_topic_names))
        m.rack_id = req.rack_id if req.rack_id is not None else m.rack_id
        m.client_id, m.client_host, m.last_seen_ms = req.client_id, req.client_host, now
        target = self._assign(g)[m.member_id]
        send = req.member_epoch == 0
        if target != m.assignment or m.epoch == 0:
            g.epoch += 1
            m.epoch = g.epoch
            m.assignment = target
            send = True
        assignment = None
        if send:
            by_topic: dict[bytes, list[int]] = {}
            for tid, p in m.assignment:
                by_topic.setdefault(tid, []).append(p)
            assignment = [TopicPartitions(t, ps) for t, ps in by_topic.items()]
        return ShareGroupHeartbeatResult(E.none, None, m.member_id, m.epoch,
                                         self.gcfg(req.group_id).heartbeat_interval_ms, assignment)

    def _assign(self, g: ShareGroup) -> dict[str, list[tuple[bytes, int]]]:
        """The group's target assignment (Kafka's SimpleAssignor over every member), kept as
        ``g.target`` so that what one heartbeat deals out is what the others see held. Computed
        again only when the members, their subscriptions or those topics change (Kafka: when the
        group epoch moves); the assignor's answer is its own fixed point, so this is what
        computing it at every heartbeat would give."""
        topics = self.topics()
        key = (tuple((mid, tuple(m.subscribed)) for mid, m in g.members.items()),
               tuple((n, topics.get(n)) for n in sorted({n for m in g.members.values()
                                                         for n in m.subscribed})))
        if key == g.target_for:
            return g.target
        subs = {}
        for mid, member in g.members.items():
            parts = []
            for name in member.subscribed:
                t = topics.get(name)
                if t is not None:
                    parts.extend((t[0], p) for p in range(t[1]))
            subs[mid] = parts
        current = {mid: g.target.get(mid, member.assignment) for mid, member in g.members.items()}
        g.target, g.target_for = assign(subs, current), key
        return g.target

    def _remove_member(self, g: ShareGroup, member_id: str, leaving: bool = False) -> None:
        """A member out of the group. One that leaves (heartbeat epoch -1) keeps its share
        session for ``LEFT_SESSION_GRACE_MS``: a closing client sends the leave and its final
        ShareAcknowledge (epoch -1) at once on two connections (librdkafka does), and the
        acknowledgements must apply, not meet SHARE_SESSION_NOT_FOUND with their records
        released to the others (Kafka's share sessions live apart from membership, in the
        broker's ShareSessionCache). A member whose heartbeats stopped loses its session and
        its records at once."""
        g.members.pop(member_id, None)
        g.target.pop(member_id, None)
        g.target_for = None
        g.epoch += 1
        key = (g.group_id, member_id)
        if leaving and key in self.sessions:
            self._left[key] = self.now() + LEFT_SESSION_GRACE_MS
            return
        self.sessions.pop(key, None)
        self._release(g.group_id, member_id)

    @serves(ShareConnectionClosed)
    def connection_closed(self, req: ShareConnectionClosed) -> ShareConnectionClosedResult:
        """A client connection closed: each session it opened that is still its own closes,
        and what its member holds goes back to the others (Kafka's ShareSessionCache
        ConnectionDisconnectListener -> onMemberLeave -> SharePartitionManager.releaseSession).
        The member stays in the group while its heartbeats go on (membership is the heartbeat's);
        a session opened again on another connection is left alone (Kafka marks the old
        connection's entry stale)."""
        closed = 0
        for key in req.sessions:
            session = self.sessions.get(key)
            if session is None or not session.connection or session.connection != req.connection:
                continue
            self._close_session(key, "connection closed")
            closed += 1
        if self._freed:
            self._wake()
        return ShareConnectionClosedResult(E.none, closed)

    @serves(ShareFrontendStarted)
    def frontend_started(self, req: ShareFrontendStarted) -> ShareConnectionClosedResult:
        """A frontend (re)started: the sessions opened on connections of its earlier process
        (connection ids ``<frontend>/<pid>/<serial>``, ``KafkaConnection.connection_id``) went
        with that process, unannounced, and close now as ``connection_closed`` closes them."""
        prefix, current = f"{req.frontend}/", f"{req.frontend}/{req.pid}/"
        gone = [k for k, s in self.sessions.items()
                if s.connection.startswith(prefix) and not s.connection.startswith(current)]
        for key in gone:
            self._close_session(key, "frontend restarted")
        if self._freed:
            self._wake()
        return ShareConnectionClosedResult(E.none, len(gone))

    def _close_session(self, key: tuple[str, str], why: str) -> None:
        del self.sessions[key]
        self._left.pop(key, None)
        self._unpark(*key)
        log.info("share group %s: member %s's %s; its share session is closed and its records "
                 "are released", key[0], key[1], why)
        self._release(*key)

    def _release(self, group: str, member: str) -> None:
        limit = self.gcfg(group).delivery_count_limit
        for (gid, _t, _p), sp in self.partitions.items():
            if gid == group and sp.release_member(member, limit):
                self._freed.add(group)

    @serves(ShareGroupDescribeRequest)
    def describe(self, req: ShareGroupDescribeRequest) -> ShareGroupDescribeResult:
        out = []
        for gid in req.group_ids:
            g = self.groups.get(gid)
            if g is None:
                if self.other_group(gid):
                    out.append(DescribedShareGroup(gid, E.group_id_not_found,
                                                   f"Group {gid} is not a share group."))
                elif any(k[0] == gid for k in self.partitions):
                    out.append(DescribedShareGroup(gid, E.none, None, "Empty", 0, 0, []))
                else:
                    out.append(DescribedShareGroup(gid, E.group_id_not_found,
                                                   f"Group {gid} not found."))
                continue
            members = []
            for m in g.members.values():
                by_topic: dict[bytes, list[int]] = {}
                for tid, p in m.assignment:
                    by_topic.setdefault(tid, []).append(p)
                members.append(DescribedShareMember(
                    m.member_id, m.rack_id, m.epoch, m.client_id, m.client_host, list(m.subscribed),
                    [TopicPartitions(t, ps) for t, ps in by_topic.items()]))
            out.append(DescribedShareGroup(gid, E.none, None,
                                           "Stable" if g.members else "Empty", g.epoch, g.epoch,
                                           members))
        return ShareGroupDescribeResult(out)

    # -- timers -----------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        """Members whose heartbeats stopped leave, giving their records back; expired locks make
        their records available again. At most every ``TICK_MS`` (the coordinator calls this
        every turn; a walk over the in-flight records per request would cost the hot path):
        a lock expires up to that late, and an acquisition always expires the locks it meets."""
        if self._parked:
            self._parked_deadlines(now_ms)
        if now_ms < self._next_tick:
            return
        self._next_tick = now_ms + TICK_MS
        for g in self.groups.values():
            timeout = self.gcfg(g.group_id).session_timeout_ms
            for m in [m for m in g.members.values() if m.last_seen_ms + timeout < now_ms]:
                log.info("share group %s: member %s's session timed out", g.group_id, m.member_id)
                self._remove_member(g, m.member_id)
        for key in [k for k, t in self._left.items() if t <= now_ms]:
            del self._left[key]
            if self.sessions.pop(key, None) is not None:
                log.info("share group %s: the share session of member %s, which left, closed "
                         "without its final request; its records are released", *key)
                self._release(*key)
        limits: dict[str, int] = {}
        due = None
        for (gid, _t, _p), sp in self.partitions.items():
            limit = limits.get(gid)
            if limit is None:
                limit = limits[gid] = self.gcfg(gid).delivery_count_limit
            if sp.expire(now_ms, limit):
                self._freed.add(gid)
            d = sp.next_deadline_ms()
            if d is not None and (due is None or d < due):
                due = d
        self._due = due
        # Every tick all parked fetches try again: new records (a high watermark that moved)
        # free nothing the coordinator is told of.
        self._wake(everyone=True)

    def _parked_deadlines(self, now_ms: int) -> None:
        """Parked ShareFetches whose wait ran out: answered with nothing acquired."""
        keep = []
        for w in self._parked:
            if w.deadline_ms <= now_ms:
                w.respond(ShareFetchResult(E.none, None, [],
                                           self.gcfg(w.req.group_id).record_lock_duration_ms))
            else:
                keep.append(w)
        self._parked = keep

    # -- ShareFetch and ShareAcknowledge ----------------------------------------------------------
    @serves(ShareFetchRequest, late=True)
    def serve_fetch(self, req: ShareFetchRequest, respond: Responder) -> None:
        """ShareFetch and ShareAcknowledge from a frontend (``fetch``), with Kafka's
        DelayedShareFetch: the frontend's second try (``again``) with ``wait_ms`` that would
        acquire nothing and whose answer says ``park`` waits here until a lock of its group is
        freed (``_wake``), new records come (``tick``) or ``wait_ms`` runs out. Acknowledgements
        are never held: they come in first tries, answered at once."""
        if req.acquire and not req.again:
            # A new ShareFetch of a member ends what it had waiting (its client gave up on it):
            # acquisitions must not go to an answer nobody reads.
            self._unpark(req.group_id, req.member_id)
        r = self.fetch(req)
        if r.park and req.wait_ms > 0 and not req.extend and (req.again or _parks_first(req, r)):
            # A first try parks as the second one it stands for (its session epoch is moved
            # once, here; the tries after a freed lock or a tick are ``again``).
            again = req if req.again else msgspec.structs.replace(req, again=True, parts=[],
                                                                  forgotten=[])
            self._parked.append(_Parked(again, respond, self.now() + req.wait_ms))
        else:
            respond(r)
        if self._freed:
            self._wake()

    def _unpark(self, group: str, member: str) -> None:
        for w in [w for w in self._parked if w.req.member_id == member and w.req.group_id == group]:
            self._parked.remove(w)
            w.respond(ShareFetchResult(E.none, None, [], self.gcfg(group).record_lock_duration_ms))

    def _wake(self, everyone: bool = False) -> None:
        """Parked ShareFetches of the groups where a lock was freed (or all of them) try again;
        those that acquire are answered, in the order they parked."""
        freed, self._freed = self._freed, set()
        if not self._parked:
            return
        keep = []
        for w in self._parked:
            if everyone or w.req.group_id in freed:
                r = self.fetch(w.req)
                if not r.park or r.error != E.none:
                    w.respond(r)
                    continue
            keep.append(w)
        self._parked = keep
        self._freed.clear()             # what these acquisitions changed frees nothing

    def fetch(self, req: ShareFetchRequest) -> ShareFetchResult:
        now = self.now()
        key = (req.group_id, req.member_id)
        epoch = req.session_epoch
        session = self.sessions.get(key)
        has_acks = any(p.acks for p in req.parts)
        close = False
        if req.again:
            if session is None:
                return ShareFetchResult(E.share_session_not_found)
            if req.extend or req.unacquire or req.bounds:
                return self._extend(req, now)
        elif req.acquire and epoch == INITIAL_EPOCH:
            if has_acks:
                return ShareFetchResult(E.invalid_request, "Acknowledge data present on initial "
                                        "fetch for a share session.")
            if session is None and len(self.sessions) >= self.cfg.max_share_sessions:
                return ShareFetchResult(E.share_session_limit_reached)
            if session is not None:
                # A new session of the same member: what it held goes back (Kafka's
                # ShareSessionCache replaces the session and its acquisitions are released).
                log.info("share group %s: member %s opened a new share session; its records "
                         "are released", req.group_id, req.member_id)
                self._release(req.group_id, req.member_id)
            session = self.sessions[key] = ShareSession(next_epoch(0), connection=req.connection)
            self._left.pop(key, None)
        elif epoch == INITIAL_EPOCH:          # ShareAcknowledge may not open a session
            return ShareFetchResult(E.invalid_share_session_epoch)
        elif session is None:
            return ShareFetchResult(E.share_session_not_found)
        elif epoch == FINAL_EPOCH:
            close = True
        elif epoch != session.epoch:
            return ShareFetchResult(E.invalid_share_session_epoch)
        else:
            session.epoch = next_epoch(epoch)
        if req.acquire and not req.again and not close:
            for p in req.parts:
                session.parts[(bytes(p.topic_id), p.partition)] = None
            for tp in req.forgotten:
                session.parts.pop((bytes(tp[0]), tp[1]), None)
        results: dict[tuple[bytes, int], dict] = {}
        dirty: dict[ShareKey, SharePartition] = {}
        before: dict[ShareKey, SharePartition] = {}     # the acknowledged partitions as they were
        cfg = self.gcfg(req.group_id)
        limit = cfg.delivery_count_limit
        for p in req.parts:
            tp = (bytes(p.topic_id), p.partition)
            r = results.setdefault(tp, {})
            if self.marks(*tp) is None:
                r["error"] = E.unknown_topic_or_partition
                continue
            if not p.acks:
                continue
            r["acked"] = True
            sk = (req.group_id, tp[0], tp[1])
            sp = self.partitions.get(sk)
            if sp is not None and sk not in before:
                before[sk] = sp.clone()
            err = E.invalid_record_state if sp is None else sp.acknowledge(
                req.member_id, [(b.first_offset, b.last_offset, b.types) for b in p.acks], limit,
                now + cfg.record_lock_duration_ms if req.renew else None)
            if err != E.none:
                r["ack_error"] = err
            elif not all(t == RENEW for b in p.acks for t in b.types):
                dirty[sk] = sp
                self._freed.add(req.group_id)
            # RENEW alone (KIP-1222) moves only a lock's deadline, which the snapshot does not
            # carry (ACQUIRED is written as AVAILABLE): nothing to write, nothing freed.
        if dirty:
            # The acknowledgements are answered only once written; when the write fails they
            # are undone, as Kafka's SharePartition rolls its state back on a failed persister
            # write: the member keeps the records ACQUIRED until their locks expire, and they
            # are delivered again (regression: they stayed done in memory, never delivered
            # again, while the member was told its acknowledgement failed).
            err = self._persist(dirty, now)
            if err != E.none:
                for sk in dirty:
                    self.partitions[sk] = before[sk]
                    r = results.get((sk[1], sk[2]))
                    if r is not None:
                        r["ack_error"] = err
            dirty = {}
        if close:
            self.sessions.pop(key, None)
            self._left.pop(key, None)
            self._release(req.group_id, req.member_id)
        park = False
        if not close and req.acquire and not req.acquire_none:
            wanted = left = req.max_records if req.max_records > 0 else 500
            blocked = holds = False
            for tp in session.parts:
                if left <= 0:
                    break
                mk = self.marks(*tp)
                if mk is None:
                    continue
                hw, log_start = mk[0], mk[1]
                # share.isolation.level=read_committed: nothing at or past the last stable
                # offset is acquired (Kafka's SharePartition reads up to the LSO then)
                end = mk[2] if cfg.isolation_level == "read_committed" and len(mk) > 2 else hw
                sk = (req.group_id, tp[0], tp[1])
                sp = self.partitions.get(sk)
                if sp is None:
                    # "earliest" (and KIP-1106's by_duration, which needs a time index lookup
                    # the coordinator does not make: from the log start) or "latest"
                    start = hw if cfg.auto_offset_reset == "latest" else log_start
                    sp = self.partitions[sk] = SharePartition(start, state_epoch=1)
                    dirty[sk] = sp
                got = sp.acquire(req.member_id, left, end, log_start, now,
                                 cfg.record_lock_duration_ms, limit, cfg.max_record_locks,
                                 whole_batches=not req.record_limit)
                r = results.setdefault(tp, {})
                r["next_offset"] = sp.end_offset
                if got:
                    r["acquired"] = got
                    r["bounds_left"] = sp.bounds_past(got[-1][1])
                    left -= sum(last - first + 1 for first, last, _ in got)
                elif sp.holds(req.member_id):
                    holds = True
                elif sp.waits_on_locks(end):
                    blocked = True
            # Kafka's DelayedShareFetch, with the rule librdkafka's fetching ahead needs: only a
            # member that got nothing and holds nothing waits for a lock to be freed. A holder's
            # next ShareFetch is what carries its acknowledgements (one ShareFetch in flight per
            # broker), so parking it would park the window's release with it.
            park = blocked and not holds and left == wanted
        if dirty:
            # Share partitions made by this fetch: their start offset (their acquisitions are
            # not written; a failed write is logged, and the next write carries them).
            self._persist(dirty, now)
        parts = [SharePartResult(tp[0], tp[1], r.get("error", E.none), r.get("ack_error", E.none),
                                 r.get("acquired", []), r.get("next_offset", -1),
                                 r.get("acked", False), r.get("bounds_left", 0))
                 for tp, r in results.items()]
        return ShareFetchResult(E.none, None, parts, cfg.record_lock_duration_ms,
                                [] if close or session is None else list(session.parts),
                                1 if cfg.isolation_level == "read_committed" else 0, park)

    def _extend(self, req: ShareFetchRequest, now: int) -> ShareFetchResult:
        """The rest of the log batches a ShareFetch's read ended inside (``req.extend``),
        acquired for the member when AVAILABLE (``SharePartition.acquire_through``), and the
        acquired offsets its read could not carry given back (``req.unacquire``,
        ``SharePartition.unacquire``). Nothing is written: acquisitions are not persisted."""
        cfg = self.gcfg(req.group_id)
        for tid, p, lasts in req.bounds:
            sp = self.partitions.get((req.group_id, bytes(tid), p))
            if sp is not None:
                sp.learn_bounds(lasts)
        parts = []
        for tid, p, first, last in req.unacquire:
            sp = self.partitions.get((req.group_id, bytes(tid), p))
            if sp is not None:
                sp.unacquire(req.member_id, first, last)
                self._freed.add(req.group_id)       # parked fetches may take them
        for tid, p, first, last in req.extend:
            tid = bytes(tid)
            sp = self.partitions.get((req.group_id, tid, p))
            mk = self.marks(tid, p)
            if sp is None or mk is None:
                continue
            end = mk[2] if cfg.isolation_level == "read_committed" and len(mk) > 2 else mk[0]
            got = sp.acquire_through(req.member_id, first, last, end, now,
                                     cfg.record_lock_duration_ms)
            if got:
                parts.append(SharePartResult(tid, p, acquired=got, next_offset=sp.end_offset))
        return ShareFetchResult(E.none, None, parts, cfg.record_lock_duration_ms)

    def _persist(self, dirty: dict[ShareKey, SharePartition], now: int) -> ErrorCode:
        """Write the snapshots of ``dirty`` (one batch) before the answer goes out."""
        items = []
        for sk, sp in dirty.items():
            epoch, created = self._snapshot_epochs.get(sk, (-1, now))
            items.append((sk, ShareSnapshot(epoch + 1, sp.state_epoch, sp.start_offset, created,
                                            now, sp.snapshot())))
        try:
            self.store.write(items, now)
        except ShareLogWriteError as e:
            log.error("share-state log write failed: %s", e)
            return E.coordinator_not_available
        for sk, snap in items:
            self._snapshot_epochs[sk] = (snap.snapshot_epoch, snap.create_timestamp)
        return E.none

    def next_deadline_ms(self) -> int | None:
        """The earliest lock deadline as the last tick saw it (later acquisitions are seen by
        the next tick, which the coordinator runs at least every 200 ms anyway); with parked
        ShareFetches, the next tick (they look for new records then) or the first wait's end."""
        due = None if self._due is None else max(self._due, self._next_tick)
        if self._parked:
            first = min(min(w.deadline_ms for w in self._parked), self._next_tick)
            due = first if due is None else min(due, first)
        return due


def _parks_first(req: ShareFetchRequest, r: ShareFetchResult) -> bool:
    """Whether a first try (not ``again``) that acquired nothing may wait here at once, saving
    the frontend the second call (a hop per ShareFetch of a member that waits for the window):
    only an incremental fetch (epoch > 0: an opening or closing one answers its partitions)
    without acknowledgements (they are answered before any wait) and without a partition
    error, whose answer would be empty anyway."""
    return (req.session_epoch > 0 and not any(p.acks for p in req.parts)
            and all(p.error == E.none for p in r.parts))
