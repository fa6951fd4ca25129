"""DescribeGroups, ListGroups, DeleteGroups, the group checks of OffsetCommit/TxnOffsetCommit,
and what the offsets side asks of the membership (``GroupAdmin``), sans-IO.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded, as a collaborator
of ``appliance.group.membership.GroupCoordinator`` over its ``appliance.group.table.GroupTable``;
owns no state of its own. These are the requests that look a group up by id whatever its type
(the table's one namespace, ``group_type`` on each group: "classic" or KIP-848's "consumer",
whose commits and fetches are checked by member epoch, ``_consumer_check``); it
gets the ``membership_join.RebalanceProtocol`` at construction for the one rebalance operation it
needs (a member's OffsetCommit counts as a heartbeat, ``schedule_hb``). See
``appliance.group.membership`` for the design; behaviour is Kafka's GroupCoordinator
handleDescribeGroup/handleListGroups/handleDeleteGroups, validateOffsetCommit (KIP-447 for
TxnOffsetCommit) and cleanupGroupMetadata.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, NamedTuple

from appliance.errors import ErrorCode
from appliance.group.classic_group import CLASSIC_GROUP_TYPE, ClassicGroup, GroupState
from appliance.group.consumer_group import (CONSUMER_GROUP_TYPE, ConsumerGroup,
                                           assigned_at_or_before)
from appliance.group.membership_join import RebalanceProtocol
from appliance.group.messages import DescribedGroup, ListedGroup, ListGroupsResult
from appliance.group.records import store_group_error
from appliance.group.table import GroupTable

__all__ = ["GroupAdmin", "GroupInfo", "CLASSIC_GROUP_TYPE"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState


class GroupInfo(NamedTuple):
    state: str
    protocol_type: str | None
    generation_id: int
    state_timestamp: int | None
    subscribed_topics: frozenset[str] | None
    members: int


class GroupAdmin:
    """Admin requests and queries over a GroupTable, with the RebalanceProtocol."""

    def __init__(self, table: GroupTable, rebalance: RebalanceProtocol,
                 topics: Callable[[], dict[str, tuple[bytes, int]]] = dict) -> None:
        self.table = table
        self.rebalance = rebalance
        self.topics = topics            # topic name -> (topic id, partitions): KIP-1251's check

    # -- admin ------------------------------------------------------------------------------------
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        """DescribeGroups v0-5: an unknown group is described as Dead with no error."""
        out = []
        for gid in group_ids:
            if not self.table.loaded:
                out.append(DescribedGroup(E.coordinator_load_in_progress, gid, "", "", "", []))
                continue
            group = self.table.groups.get(gid)
            if group is None:
                out.append(DescribedGroup(E.none, gid, S.Dead.value, "", "", []))
                continue
            out.append(group.describe())
        return out

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> ListGroupsResult:
        """ListGroups: states (v4) match case-insensitively; types (v5) match the group's type
        ("classic" or "consumer"), case-insensitively."""
        err = E.none if self.table.loaded else E.coordinator_load_in_progress
        wanted = {s.lower() for s in states}
        kinds = {t.lower() for t in types}
        return ListGroupsResult(err, [
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value, g.group_type)
            for g in self.table.groups.values()
            if (not wanted or g.state.lower in wanted) and (not kinds or g.group_type in kinds)])

    def delete_groups(self, group_ids: Iterable[str],
                      on_deleted: Callable[[str], Any]) -> dict[str, ErrorCode]:
        """DeleteGroups: only an Empty group can go (NON_EMPTY_GROUP otherwise; unknown:
        GROUP_ID_NOT_FOUND). For each, ``on_deleted(group_id)`` removes its offsets (it may
        return an ErrorCode: not NONE keeps the group and is reported, ours), then the metadata
        tombstone is persisted and the group becomes Dead and is dropped."""
        self.table.enter()
        try:
            result: dict[str, ErrorCode] = {}
            for gid in dict.fromkeys(group_ids):
                try:
                    result[gid] = self._delete_group(gid, on_deleted)
                except Exception:
                    log.exception("deleting group %r failed", gid)
                    result[gid] = E.unknown_server_error
            return result
        finally:
            self.table.leave()

    def _delete_group(self, gid: str, on_deleted: Callable[[str], Any]) -> ErrorCode:
        if not self.table.loaded:
            return E.coordinator_load_in_progress
        group = self.table.groups.get(gid)
        if group is None or group.is_(S.Dead):
            return E.group_id_not_found
        if not group.is_(S.Empty):
            return E.non_empty_group
        r = on_deleted(gid)
        if isinstance(r, int) and not isinstance(r, bool) and r != E.none:
            return store_group_error(r)
        err = self.table.store(gid, None)
        if err != E.none:
            log.error("group %r: offsets removed but the metadata tombstone failed (%s)", gid,
                      err.name)
        self._drop(group)
        log.info("group %r deleted", gid)
        return E.none

    def _drop(self, group: ClassicGroup) -> None:
        if group.group_type == CONSUMER_GROUP_TYPE and group.stored:
            if self.table.store_consumer_group(group, drop=True) != E.none:
                log.error("consumer group %r: its tombstones are not stored; a restart brings "
                          "it back empty", group.group_id)
        group.transition_to(S.Dead, self.table.now())
        group.join_token = group.sync_token = None
        group.pending_members.clear()
        self.table.groups.pop(group.group_id, None)

    def forget_group(self, group_id: str) -> bool:
        """Drop a group the offsets side has deleted (its expire_offsets' ``deleted_groups``):
        nothing is written. Only an Empty group goes; True if it is gone (or was unknown)."""
        group = self.table.groups.get(group_id)
        if group is None:
            return True
        if not group.is_(S.Empty):
            return False
        self._drop(group)
        return True

    def remove_empty_groups(self, has_offsets: Callable[[str], bool]) -> list[str]:
        """Kafka's cleanupGroupMetadata for groups: every Empty group with no offsets (and no
        pending KIP-394 id) becomes Dead; its metadata gets a tombstone. Returns their ids."""
        gone = []
        self.table.enter()
        try:
            for group in list(self.table.groups.values()):
                if (group.is_(S.Empty) and not group.pending_members
                        and not has_offsets(group.group_id)):
                    if self.table.store(group.group_id, None) != E.none:
                        continue                          # retried at the next cleanup
                    self._drop(group)
                    gone.append(group.group_id)
        finally:
            self.table.leave()
        return gone

    def ensure_group(self, group_id: str) -> None:
        """An Empty group without protocol type for a group that only has offsets."""
        if group_id not in self.table.groups:
            self.table.create_classic_group(group_id)

    # -- for the offsets side ---------------------------------------------------------------------
    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                               group_instance_id: str | None, *, api_version: int = 8,
                               partitions: list[tuple[str, int]] | None = None) -> ErrorCode:
        """OffsetCommit's group checks (Kafka's validateOffsetCommit, non-transactional). A
        commit with generation < 0 to an unknown group creates it (Empty, a "simple" group). A
        member's commit in Stable/PreparingRebalance counts as a heartbeat. ``partitions``
        (topic name, partition): what the commit names, for KIP-1251's assignment epochs."""
        self.table.enter()
        try:
            if not self.table.loaded:
                return E.coordinator_load_in_progress
            group = self.table.groups.get(group_id)
            if group is None:
                if generation_id < 0:
                    self.table.create_classic_group(group_id)
                    return E.none
                return E.group_id_not_found if api_version >= 9 else E.illegal_generation
            if group.group_type == CONSUMER_GROUP_TYPE:
                return _consumer_check(group, generation_id, member_id, transactional=False,
                                       api_version=api_version,
                                       partitions=lambda: self._ids(partitions))
            err = group.validate_offset_commit(generation_id, member_id or "",
                                               group_instance_id, transactional=False)
            if err is not None:
                return err
            member = group.members.get(member_id or "")
            if member is not None and group.state in (S.Stable, S.PreparingRebalance):
                self.rebalance.schedule_hb(group, member, member.session_timeout_ms)
            return E.none
        except Exception:
            log.exception("offset commit check for %r failed", group_id)
            return E.unknown_server_error
        finally:
            self.table.leave()

    def validate_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                                   group_instance_id: str | None,
                                   partitions: list[tuple[str, int]] | None = None) -> ErrorCode:
        """TxnOffsetCommit's group checks (KIP-447). Generation -1 with no member id and no
        instance id (v0-2 clients, standalone producers) passes without checks; otherwise the
        member must exist (UNKNOWN_MEMBER_ID), a static one must be current
        (FENCED_INSTANCE_ID), and the generation must be the group's (ILLEGAL_GENERATION).
        The group state does not matter. An unknown group: generation < 0 creates it (Empty),
        else ILLEGAL_GENERATION."""
        self.table.enter()
        try:
            if not self.table.loaded:
                return E.coordinator_load_in_progress
            group = self.table.groups.get(group_id)
            if group is None:
                if generation_id < 0:
                    self.table.create_classic_group(group_id)
                    return E.none
                return E.illegal_generation
            if group.group_type == CONSUMER_GROUP_TYPE:
                # KIP-848 carries KIP-447 over: the member epoch fences a zombie's commit
                return _consumer_check(group, generation_id, member_id, transactional=True,
                                       partitions=lambda: self._ids(partitions))
            err = group.validate_offset_commit(generation_id, member_id or "",
                                               group_instance_id, transactional=True)
            return E.none if err is None else err
        except Exception:
            log.exception("txn offset commit check for %r failed", group_id)
            return E.unknown_server_error
        finally:
            self.table.leave()

    def validate_offset_fetch(self, group_id: str, member_id: str | None,
                              member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+'s member checks (Kafka's validateOffsetFetch): only a consumer group
        checks them; no member id with epoch < 0 (an admin client) always passes."""
        group = self.table.groups.get(group_id)
        if group is None or group.group_type != CONSUMER_GROUP_TYPE:
            return E.none
        if member_id is None and member_epoch < 0:
            return E.none
        member = group.members.get(member_id or "")
        if member is None:
            return E.unknown_member_id
        if member_epoch == member.member_epoch:
            return E.none
        return E.illegal_generation if member.classic is not None else E.stale_member_epoch

    def _ids(self, partitions: list[tuple[str, int]] | None) -> list[tuple[bytes, int]] | None:
        """(topic id, partition) of named partitions; None when a topic is unknown (the
        commit then needs the member's current epoch)."""
        if not partitions:
            return None
        topics = self.topics()
        out = []
        for name, p in partitions:
            t = topics.get(name)
            if t is None:
                return None
            out.append((bytes(t[0]), p))
        return out

    def group_state(self, group_id: str) -> str | None:
        """Kafka's state name, or None for an unknown group."""
        group = self.table.groups.get(group_id)
        return None if group is None else group.state.value

    def is_empty_or_dead(self, group_id: str) -> bool:
        """True when the group has no members (also for a group unknown here)."""
        group = self.table.groups.get(group_id)
        return group is None or group.state in (S.Empty, S.Dead)

    def empty_since(self, group_id: str) -> int | None:
        """When an Empty group became Empty (its state timestamp), else None. None too for a
        group without protocol type (a standalone consumer's): Kafka counts the retention of
        its offsets from each commit instead."""
        group = self.table.groups.get(group_id)
        if group is None or not group.is_(S.Empty) or group.protocol_type is None:
            return None
        return group.state_timestamp

    def subscribed_topics(self, group_id: str) -> set[str] | None:
        """The topics a Stable "consumer" group subscribes to (KIP-496), else None."""
        group = self.table.groups.get(group_id)
        if group is not None and group.group_type == CONSUMER_GROUP_TYPE:
            topics = group.subscribed_topics          # Kafka: any non-empty consumer group
            return None if topics is None else set(topics)
        if group is None or not group.is_(S.Stable) or group.subscribed_topics is None:
            return None
        return set(group.subscribed_topics)

    def group_info(self, group_id: str) -> GroupInfo | None:
        group = self.table.groups.get(group_id)
        if group is None:
            return None
        return GroupInfo(group.state.value, group.protocol_type, group.generation_id,
                         group.state_timestamp, group.subscribed_topics, group.size)

    def summaries(self) -> list[tuple[str, str, int]]:
        """(group id, Kafka's state name, members) of every group, for the metrics."""
        return [(g.group_id, g.state.value, g.size) for g in self.table.groups.values()]

    def group_ids(self) -> list[str]:
        return list(self.table.groups)


def _consumer_check(group: ConsumerGroup, member_epoch: int, member_id: str | None, *,
                    transactional: bool, api_version: int = 9,
                    partitions: Callable[[], list[tuple[bytes, int]] | None] | None = None
                    ) -> ErrorCode:
    """Kafka's ConsumerGroup.validateOffsetCommit: epoch < 0 commits (admin clients, consumers
    without group management) only to an empty group; otherwise the member must exist
    (UNKNOWN_MEMBER_ID), commit with OffsetCommit v9+ (UNSUPPORTED_VERSION) unless it is
    transactional, and carry its current member epoch (STALE_MEMBER_EPOCH)."""
    if member_epoch < 0 and not group.members:
        return E.none
    member = group.members.get(member_id or "")
    if member is None:
        return E.unknown_member_id
    if not transactional and member.classic is None and api_version < 9:
        return E.unsupported_version
    if member_epoch == member.member_epoch:
        return E.none
    # KIP-1251 (assignment epochs): a commit with an older epoch is the owner's when every
    # partition it names has been the member's since that epoch or before. A member's epoch
    # moves at every new target assignment, and the client learns it only from its next
    # heartbeat: before, a consumer committing after each batch got STALE_MEMBER_EPOCH, and its
    # synchronous commit (so its partitions, kept ones too) waited up to a heartbeat interval.
    # (``partitions`` resolves the commit's topic names only here, off the common path)
    if (member.classic is None and 0 <= member_epoch < member.member_epoch
            and partitions is not None):
        named = partitions()
        if named is not None and assigned_at_or_before(member, member_epoch, named):
            return E.none
    # a classic member (KIP-848 migration) commits with its generation: Kafka's
    # validateMemberEpoch answers it as a classic group would
    return E.illegal_generation if member.classic is not None else E.stale_member_epoch
