"""ConsumerGroupHeartbeat and ConsumerGroupDescribe (KIP-848): the consumer group protocol's
decisions, sans-IO (``ConsumerGroupProtocol``).

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, as a collaborator
of ``appliance.group.membership.GroupCoordinator`` over its ``appliance.group.table.GroupTable``
(the one namespace of group ids it shares with the classic groups), beside the classic
``membership_join.RebalanceProtocol``. Owns no state of its own: the groups
(``consumer_group.ConsumerGroup``) are in the table, their timers in the table's heap
(kinds ``SESSION`` and ``REBALANCE``). Topic metadata comes from ``topics()``: name ->
(topic id, partition count), the coordinator's view of the catalog, a new dict whenever the
catalog changes (the regex matches are cached per dict).

Behaviour is Kafka's GroupMetadataManager.consumerGroupHeartbeat (group-coordinator module):

- request checks (INVALID_REQUEST with Kafka's messages): v1+ needs a client-generated member id
  (KIP-1082; v0 with epoch 0 may send none and gets one); the first request (epoch 0) carries
  the rebalance timeout, a subscription and empty owned partitions; epoch -2 needs an instance
  id; an unknown ``server_assignor`` is UNSUPPORTED_ASSIGNOR;
- a member joins with epoch 0; any other epoch must be the member's current one, or its
  previous one when the partitions it owns are a subset of its assignment (the answer that
  bumped it was lost), else FENCED_MEMBER_EPOCH; an unknown member UNKNOWN_MEMBER_ID;
- the group epoch is bumped by a member joining or leaving, a changed subscription or assignor,
  a subscribed topic created, deleted or grown; each bump computes the target assignment at
  once (``assignors``), and each member reconciles towards it at its own heartbeats
  (``ConsumerGroup.reconcile``: revoke first, assign what is free);
- the server decides the heartbeat interval (the group's ``consumer.heartbeat.interval.ms``
  GROUP config, else ``[groups] consumer_heartbeat_interval_ms``) and the session timeout
  (``consumer.session.timeout.ms``, else ``consumer_session_timeout_ms``; a change applies from
  each member's next heartbeat, as in Kafka): a member not heard of for that long is
  fenced (removed, the group epoch bumped); a member that does not revoke within its rebalance
  timeout is fenced too;
- epoch -1 leaves; -2 is a static member's temporary leave (KIP-848 static membership): it keeps
  its assignment until a member with the same instance id joins in its place (inheriting epoch
  and assignment, no rebalance) or its session times out; a join with an instance id held by a
  member that did not leave is UNRELEASED_INSTANCE_ID;
- the answer carries the assignment when the member joined (epoch 0), sent a full request, or
  its assignment changed (Kafka's rule);
- an empty classic group of the same id becomes a consumer group; a non-empty one is upgraded
  online when ``[groups] consumer_migration_policy`` allows (``appliance.group.migration``),
  else answers GROUP_ID_NOT_FOUND ("not a consumer group"); the last member using this protocol
  leaving a group of classic members downgrades it likewise.

Durability: every change is written to the group log (``consumer_records``, Kafka's record
types) before the heartbeat is answered (``GroupTable.store_consumer_group``); a restart restores
the groups and gives every member a fresh session timeout. A member
heartbeating with a non-zero epoch to a group this coordinator does not have (deleted once empty,
or only offsets left) gets GROUP_ID_NOT_FOUND, as from Kafka's getOrMaybeCreateConsumerGroup
(librdkafka treats it as fatal, as it does against Kafka).

Regex subscriptions (v1 SubscribedTopicRegex, KIP-848): evaluated here with RE2 (google-re2)
full-match semantics, as Kafka's RE2/J; a pattern RE2 refuses is INVALID_REGULAR_EXPRESSION; the
matches are re-evaluated whenever the catalog changes (a created or deleted topic bumps the group
epoch through the subscription metadata). A regex no member of the group had before is resolved
after the heartbeat that brings it, as Kafka resolves it asynchronously: that heartbeat's target
has the member's literal topics, the matches come with the epoch the resolution bumps (timer kind
``REGEX``, due at once). "" clears a member's regex (librdkafka sends it when it subscribes by
names). With the authorizer on, a member's matches are only the topics it may
Describe (``member_topics``).
"""

from __future__ import annotations

import base64
import logging
import os
from collections import Counter
from typing import Any, Callable

import re2

from appliance.errors import ErrorCode
from appliance.group.assignors import ASSIGNORS
from appliance.group.classic_group import CLASSIC_GROUP_TYPE, GroupState
from appliance.group.consumer_group import (CONSUMER_GROUP_TYPE, LEAVE_GROUP_MEMBER_EPOCH,
                                            LEAVE_GROUP_STATIC_MEMBER_EPOCH, Assignment,
                                            ConsumerGroup, ConsumerMember, MemberState,
                                            is_subset)
from appliance.group.messages import (ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResult,
                                      DescribedConsumerGroup, DescribedConsumerMember,
                                      TopicPartitions)
from appliance.group.table import GroupTable

__all__ = ["ConsumerGroupProtocol", "SESSION", "REBALANCE", "JOIN_TIMEOUT", "SYNC_TIMEOUT",
           "new_member_id"]

log = logging.getLogger("appliance.group.consumer")

E = ErrorCode
# timer kinds in the table's heap (classic ones are 0-3); JOIN_TIMEOUT and SYNC_TIMEOUT are the
# timeouts of classic members inside a consumer group (``appliance.group.migration``); REGEX
# resolves a group's new regular expression after the heartbeat that brought it
SESSION, REBALANCE, JOIN_TIMEOUT, SYNC_TIMEOUT, REGEX = 10, 11, 12, 13, 14


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False          # a bad pattern is the client's error, not ours to log


def _text(e: Exception) -> str:
    a = e.args[0] if e.args else e
    return a.decode(errors="replace") if isinstance(a, bytes) else str(a)


def new_member_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()


class _Invalid(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _assignment(tps: list[TopicPartitions] | None) -> Assignment | None:
    if tps is None:
        return None
    out: dict[bytes, frozenset[int]] = {}
    for t in tps:
        if t.partitions:
            out[bytes(t.topic_id)] = out.get(bytes(t.topic_id), frozenset()) | frozenset(t.partitions)
    return out


def _wire(a: Assignment) -> list[TopicPartitions]:
    return [TopicPartitions(tid, sorted(ps)) for tid, ps in sorted(a.items()) if ps]


class ConsumerGroupProtocol:
    """ConsumerGroupHeartbeat, its timers and ConsumerGroupDescribe over a GroupTable."""

    def __init__(self, table: GroupTable, topics: Callable[[], dict[str, tuple[bytes, int]]],
                 new_member_id: Callable[[], str] = new_member_id,
                 describe_topic: Callable[[str, str, str], bool] | None = None) -> None:
        self.table = table
        self.topics = topics
        # (principal, address, topic) -> may it Describe the topic? None: the authorizer is off
        self.describe_topic = describe_topic
        self.new_member_id = new_member_id
        self.rebalances = 0      # target assignments computed (Kafka's consumer-group-rebalance)
        self._compiled: dict[str, Any] = {}
        self._regex_hits: dict[str, tuple[dict, frozenset[str]]] = {}
        # the online migration (``migration.GroupMigration`` sets itself here); None: none
        self.migration: Any = None
        # classic groups converted by the heartbeat being decided: put back if it fails
        self._upgraded: list[tuple[str, Any]] = []

    # -- ConsumerGroupHeartbeat -------------------------------------------------------------------
    def heartbeat(self, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResult:
        t = self.table
        t.enter()
        self._upgraded = []
        try:
            result = self._heartbeat(req)
            for _gid, classic in self._upgraded:
                classic.state = GroupState.Dead          # the conversion is stored
            return result
        except _Invalid as e:
            self._revert_upgrades()
            if e.code == E.invalid_request:
                # clients treat it as fatal without showing the message: keep it here
                log.info("group %r: heartbeat of member %r (epoch %d) is invalid: %s",
                         req.group_id, req.member_id, req.member_epoch, e.message)
            return ConsumerGroupHeartbeatResult(e.code, e.message)
        except Exception:
            self._revert_upgrades()
            log.exception("consumer group heartbeat of %r failed", req.group_id)
            return ConsumerGroupHeartbeatResult(E.unknown_server_error)
        finally:
            self._upgraded = []
            t.leave()

    def _revert_upgrades(self) -> None:
        """A heartbeat that upgraded a classic group and then failed wrote nothing: the classic
        group is the group again (Kafka's records of the conversion are not appended)."""
        for gid, classic in self._upgraded:
            cur = self.table.groups.get(gid)
            if cur is not None and cur is not classic:
                cur.dead = True
            self.table.groups[gid] = classic
            log.info("group %r: the upgrade to a consumer group is undone (heartbeat failed)", gid)

    def _validate(self, req: ConsumerGroupHeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        def bad(msg: str) -> None:
            raise _Invalid(E.invalid_request, msg)
        if (req.api_version >= 1 or req.member_epoch != 0) and not req.member_id:
            bad("MemberId can't be empty.")
        if not req.group_id:
            bad("GroupId can't be empty.")
        if req.rack_id is not None and not req.rack_id:
            bad("RackId can't be empty.")
        if req.instance_id is not None and not req.instance_id:
            bad("InstanceId can't be empty.")
        if req.member_epoch == 0:
            if req.rebalance_timeout_ms == -1:
                bad("RebalanceTimeoutMs must be provided in first request.")
            if req.topic_partitions is None or req.topic_partitions:
                bad("TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                bad("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if req.instance_id is None:
                bad("InstanceId can't be null.")
        elif req.member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            bad(f"MemberEpoch {req.member_epoch} is invalid.")
        if req.subscribed_topic_regex:
            try:
                self._regex(req.subscribed_topic_regex)
            except re2.error as e:
                raise _Invalid(E.invalid_regular_expression,
                               f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is not a "
                               f"valid regular expression: {_text(e)}.") from None
        if (req.server_assignor is not None
                and req.server_assignor not in self.table.config.consumer_assignors):
            raise _Invalid(E.unsupported_assignor,
                           f"ServerAssignor {req.server_assignor} is not supported. Supported "
                           f"assignors: {', '.join(self.table.config.consumer_assignors)}.")

    def _heartbeat(self, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResult:
        t = self.table
        self._validate(req)
        if not t.loaded:
            return ConsumerGroupHeartbeatResult(E.coordinator_load_in_progress)
        if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(req)
        cfg = t.config
        group = self._group(req.group_id, create=req.member_epoch == 0)
        now = t.now()
        owned = _assignment(req.topic_partitions)
        mid = req.member_id or self.new_member_id()
        member = group.members.get(mid)
        seen = None if member is None else _snapshot(member)
        bump = False
        if member is None:
            if req.member_epoch != 0:
                raise _Invalid(E.unknown_member_id,
                               f"Member {mid} is not a member of group {req.group_id}.")
            old = None
            if req.instance_id is not None:
                old_id = group.static_members.get(req.instance_id)
                old = group.members.get(old_id) if old_id is not None else None
                if old is not None and old.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise _Invalid(E.unreleased_instance_id,
                                   f"Static member {old.member_id} with instance id "
                                   f"{req.instance_id} is not released yet.")
            if old is None and group.size >= cfg.consumer_max_size:
                raise _Invalid(E.group_max_size_reached,
                               f"The consumer group has reached its maximum capacity of "
                               f"{cfg.consumer_max_size} members.")
            member = ConsumerMember(mid, req.instance_id, req.rack_id, req.client_id,
                                    req.client_host, req.rebalance_timeout_ms)
            if old is not None:
                member.subscribed_topic_names = old.subscribed_topic_names
                member.server_assignor = old.server_assignor
                group.replace_static_member(old, member)
            else:
                group.add_member(member)
                bump = True
        elif req.member_epoch == 0:
            # The member rejoins (it lost its partitions, e.g. fenced on its side): it owns
            # nothing now and reconciles from scratch.
            group._release(member)
            member.assigned = {}
            member.pending_revocation = {}
            member.assignment_epochs = {}
            member.state = MemberState.STABLE
            member.member_epoch = 0
        elif req.member_epoch > member.member_epoch or (
                req.member_epoch < member.member_epoch
                and (req.member_epoch != member.previous_member_epoch
                     or not is_subset(owned, member.assigned))):
            raise _Invalid(E.fenced_member_epoch,
                           f"The consumer group member has a smaller member epoch "
                           f"({req.member_epoch}) than the one known by the group coordinator "
                           f"({member.member_epoch}). The member must abandon all its "
                           f"partitions and rejoin."
                           if req.member_epoch < member.member_epoch else
                           f"The consumer group member has a greater member epoch "
                           f"({req.member_epoch}) than the one known by the group coordinator "
                           f"({member.member_epoch}). The member must abandon all its "
                           f"partitions and rejoin.")
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        member.client_id = req.client_id
        member.client_host = req.client_host
        if req.principal:
            member.principal, member.address = req.principal, req.address
        if req.subscribed_topic_names is not None:
            names = tuple(sorted(set(req.subscribed_topic_names)))
            if names != member.subscribed_topic_names:
                member.subscribed_topic_names = names
                bump = True
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None       # "": no regex (any more)
            if regex != member.subscribed_topic_regex:
                member.subscribed_topic_regex = regex
                if regex is not None and not any(
                        o.subscribed_topic_regex == regex for o in group.members.values()
                        if o is not member):
                    # Kafka resolves a regex no member of the group had yet off the request
                    # path (maybeUpdateRegularExpressions): this heartbeat's target has the
                    # literal topics only, the matches come with the epoch the resolution bumps
                    group.unresolved_regexes.add(regex)
                    t.push(now, REGEX, group, regex)
                else:
                    bump = True
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            bump = True
        meta = self._subscription_metadata(group)
        if meta != group.subscription_metadata:
            group.subscription_metadata = meta
            bump = True
        if bump:
            self._bump(group)
        before = member.assigned
        if group.reconcile(member, owned):
            member.rebalance_seq = t.push(now + member.rebalance_timeout_ms, REBALANCE, member,
                                          group)
        member.session_seq = t.push(now + t.consumer_session_timeout_ms(group.group_id), SESSION,
                                    member, group)
        if _snapshot(member) != seen or bump:
            # Kafka answers once the records are written: a restart keeps what members were told
            err = t.store_consumer_group(group)
            if err != E.none:
                raise _Invalid(err, "The group's records could not be written.")
        full = (req.rebalance_timeout_ms != -1 and req.subscribed_topic_names is not None
                and req.topic_partitions is not None)
        send = req.member_epoch == 0 or full or member.assigned != before
        return ConsumerGroupHeartbeatResult(
            E.none, None, member.member_id, member.member_epoch,
            t.consumer_heartbeat_interval_ms(group.group_id),
            _wire(member.assigned) if send else None)

    def _leave(self, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResult:
        t = self.table
        group = self._group(req.group_id, create=False)
        member = group.members.get(req.member_id)
        if member is None and req.instance_id is not None:
            mid = group.static_members.get(req.instance_id)
            member = group.members.get(mid) if mid is not None else None
        if member is None:
            raise _Invalid(E.unknown_member_id,
                           f"Member {req.member_id} is not a member of group {req.group_id}.")
        if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH and member.instance_id is not None:
            # KIP-848: the static member keeps its assignment while it is away (a restart);
            # its session timeout still runs.
            member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
            member.session_seq = t.push(t.now() + t.consumer_session_timeout_ms(group.group_id),
                                        SESSION, member, group)
            log.info("group %r: static member %r (%s) left temporarily", group.group_id,
                     member.member_id, member.instance_id)
        else:
            self._fence(group, member, "left the group")
        err = t.store_consumer_group(group)
        if err != E.none:
            raise _Invalid(err, "The group's records could not be written.")
        return ConsumerGroupHeartbeatResult(E.none, None, member.member_id, req.member_epoch, 0)

    # -- group epoch and target -------------------------------------------------------------------
    def _group(self, group_id: str, *, create: bool) -> ConsumerGroup:
        """Kafka's getOrMaybeCreateConsumerGroup: a heartbeat with a non-zero epoch (or a leave)
        to a group that does not exist, or is not a consumer group, is GROUP_ID_NOT_FOUND
        (librdkafka and the Java client stop on it: Kafka never loses a live group)."""
        t = self.table
        group = t.groups.get(group_id)
        if group is None and not create:
            raise _Invalid(E.group_id_not_found, f"Consumer group {group_id} not found.")
        if group is not None and group.group_type != CONSUMER_GROUP_TYPE:
            empty_classic = group.group_type == CLASSIC_GROUP_TYPE and group.is_(GroupState.Empty)
            if (create and not empty_classic and group.group_type == CLASSIC_GROUP_TYPE
                    and self.migration is not None and self.migration.can_upgrade(group)):
                # KIP-848 online upgrade (Kafka's convertToConsumerGroup)
                try:
                    converted = self.migration.upgrade(group)
                except ValueError:
                    raise _Invalid(E.group_id_not_found,
                                   f"Cannot upgrade the classic group {group_id} to consumer "
                                   f"group because the embedded consumer protocol is "
                                   f"malformed.") from None
                t.groups[group_id] = converted
                self._upgraded.append((group_id, group))
                return converted
            if not (empty_classic and create):
                raise _Invalid(E.group_id_not_found, f"Group {group_id} is not a consumer group.")
            # Kafka's maybeDeleteEmptyClassicGroup: an empty classic group (offsets only, or
            # members gone) becomes a consumer group; its offsets stay. (The consumer group's
            # records are written by the heartbeat that made it.)
            err = t.store(group_id, None)
            if err != E.none:
                raise _Invalid(err, f"Converting the empty classic group {group_id} failed.")
            group.transition_to(GroupState.Dead, t.now())
            del t.groups[group_id]
            group = None
        if group is None:
            group = ConsumerGroup(group_id, t.now())
            t.groups[group_id] = group
            log.info("consumer group %r created", group_id)
        return group

    def _regex(self, pattern: str):
        r = self._compiled.get(pattern)
        if r is None:
            r = re2.compile(pattern, _RE2_OPTIONS)
            if len(self._compiled) > 1024:
                self._compiled.clear()
            self._compiled[pattern] = r
        return r

    def _matches(self, pattern: str, topics: dict) -> frozenset[str]:
        """The topics a regex subscription names: RE2 full-match semantics, as Kafka's RE2/J
        (KIP-848); internal topics (``__``) are left out. Cached per catalog snapshot."""
        hit = self._regex_hits.get(pattern)
        if hit is not None and hit[0] is topics:
            return hit[1]
        r = self._regex(pattern)
        got = frozenset(n for n in topics if not n.startswith("__") and r.fullmatch(n))
        if len(self._regex_hits) > 1024:
            self._regex_hits.clear()
        self._regex_hits[pattern] = (topics, got)
        return got

    def member_topics(self, m: ConsumerMember, topics: dict,
                      group: ConsumerGroup | None = None) -> frozenset[str]:
        """A member's subscription: its topic names and its regex's matches; with the
        authorizer on, only the matches the member may Describe (Kafka's KAFKA-18813 filters a
        refreshed regex by the ACLs of the member whose heartbeat refreshed it; here each
        member's by its own). (ours) After a restart, until the member's first heartbeat brings
        its principal, its matches are kept to the topics already in the group's subscription."""
        if m.subscribed_topic_regex is None or (
                group is not None and m.subscribed_topic_regex in group.unresolved_regexes):
            return frozenset(m.subscribed_topic_names)
        hits = self._matches(m.subscribed_topic_regex, topics)
        allowed = self.describe_topic
        if allowed is not None and hits:
            if m.principal:
                hits = frozenset(n for n in hits if allowed(m.principal, m.address, n))
            elif group is not None:
                hits = hits & group.subscription_metadata.keys()
            else:
                hits = frozenset()
        return frozenset(m.subscribed_topic_names) | hits

    def _subscription_metadata(self, group: ConsumerGroup) -> dict[str, tuple[bytes, int]]:
        if not group.members:
            return {}
        topics = self.topics()
        names = set()
        for m in group.members.values():
            names |= self.member_topics(m, topics, group)
        return {n: topics[n] for n in names if n in topics}

    def _bump(self, group: ConsumerGroup) -> None:
        """A new group epoch and its target assignment (Kafka's TargetAssignmentBuilder)."""
        cfg = self.table.config
        group.group_epoch += 1
        self.rebalances += 1
        if group.members:
            votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
            name = votes.most_common(1)[0][0] if votes else cfg.consumer_assignors[0]
            topics = self.topics()
            specs = {mid: (self.member_topics(m, topics, group), group.target.get(mid, {}))
                     for mid, m in group.members.items()}
            group.target = ASSIGNORS[name](specs, group.subscription_metadata)
            group.assignor = name
        else:
            group.target = {}
        group.assignment_epoch = group.group_epoch
        log.debug("group %r: epoch %d, target %s", group.group_id, group.group_epoch, group.target)

    def _fence(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        t = self.table
        if self.migration is not None and member.classic is None:
            if self.migration.maybe_downgrade(group, member):
                log.info("group %r: member %r %s", group.group_id, member.member_id, why)
                return
        group.remove_member(member.member_id)
        member.session_seq = member.rebalance_seq = -1
        log.info("group %r: member %r %s", group.group_id, member.member_id, why)
        group.subscription_metadata = self._subscription_metadata(group)
        self._bump(group)
        if not group.members:
            group.state_timestamp = t.now()
            t.notify_empty(group)

    # -- timers -----------------------------------------------------------------------------------
    def fire(self, kind: int, seq: int, obj: Any, extra: Any, now: int) -> None:
        if kind == REGEX:
            return self._resolve_regex(obj, extra)
        member: ConsumerMember = obj
        group: ConsumerGroup = extra
        if t_live(self.table, group) and group.members.get(member.member_id) is member:
            if kind == SESSION and member.session_seq == seq:
                self._fence(group, member, "session timed out")
            elif (kind == REBALANCE and member.rebalance_seq == seq
                  and member.state is MemberState.UNREVOKED_PARTITIONS):
                self._fence(group, member, "did not revoke its partitions within its rebalance "
                                           "timeout")
            elif kind == JOIN_TIMEOUT and member.join_seq == seq:
                member.join_seq = 0
                self._fence(group, member, "(a classic member) did not rejoin within its "
                                           "rebalance timeout")
            elif kind == SYNC_TIMEOUT and member.sync_seq == seq:
                member.sync_seq = 0
                self._fence(group, member, "(a classic member) did not sync within its "
                                           "rebalance timeout")
            else:
                return
            if self.table.store_consumer_group(group) != E.none:
                log.error("group %r: the fence of %r is not stored; a restart may bring the "
                          "member back until its session times out again", group.group_id,
                          member.member_id)

    def _resolve_regex(self, group: ConsumerGroup, regex: str) -> None:
        """Kafka's handleRegularExpressionsResult: the regex's matches join the subscription;
        a new subscription metadata bumps the group epoch (and its target)."""
        if not t_live(self.table, group) or regex not in group.unresolved_regexes:
            return
        group.unresolved_regexes.discard(regex)
        meta = self._subscription_metadata(group)
        if meta == group.subscription_metadata:
            return
        group.subscription_metadata = meta
        self._bump(group)
        if self.table.store_consumer_group(group) != E.none:
            log.error("group %r: the epoch bumped by regex %r is not stored", group.group_id,
                      regex)

    # -- ConsumerGroupDescribe --------------------------------------------------------------------
    def describe(self, group_ids: list[str]) -> list[DescribedConsumerGroup]:
        out = []
        for gid in group_ids:
            if not self.table.loaded:
                out.append(DescribedConsumerGroup(E.coordinator_load_in_progress, gid))
                continue
            group = self.table.groups.get(gid)
            if group is None or group.group_type != CONSUMER_GROUP_TYPE or group.dead:
                msg = (f"Group {gid} not found." if group is None
                       else f"Group {gid} is not a consumer group.")
                out.append(DescribedConsumerGroup(E.group_id_not_found, gid, msg))
                continue
            members = [DescribedConsumerMember(
                m.member_id, m.instance_id, m.rack_id, m.member_epoch, m.client_id,
                m.client_host, list(m.subscribed_topic_names), m.subscribed_topic_regex,
                _wire(m.assigned), _wire(group.target.get(m.member_id, {})),
                0 if m.classic is not None else 1)
                for m in group.members.values()]
            out.append(DescribedConsumerGroup(
                E.none, gid, None, group.state.value, group.group_epoch, group.assignment_epoch,
                group.assignor or self.table.config.consumer_assignors[0], members))
        return out


def _snapshot(m: ConsumerMember) -> tuple:
    """What of a member its records hold, to tell whether a heartbeat changed it."""
    return (m.member_epoch, m.previous_member_epoch, m.state, m.assigned, m.pending_revocation,
            m.rebalance_timeout_ms, m.client_id, m.client_host, m.rack_id, m.instance_id,
            m.subscribed_topic_names, m.server_assignor)


def restore_timers(table: GroupTable, group: ConsumerGroup) -> None:
    """After a load: every member gets a fresh session (and, mid-revocation, rebalance)
    timeout, as Kafka's onLoaded schedules them."""
    now = table.now()
    for m in group.members.values():
        timeout = (m.classic.session_timeout_ms if m.classic is not None
                   else table.consumer_session_timeout_ms(group.group_id))
        m.session_seq = table.push(now + timeout, SESSION, m, group)
        if m.state is MemberState.UNREVOKED_PARTITIONS:
            m.rebalance_seq = table.push(now + m.rebalance_timeout_ms, REBALANCE, m, group)


def t_live(table: GroupTable, group: ConsumerGroup) -> bool:
    return not group.dead and table.groups.get(group.group_id) is group
