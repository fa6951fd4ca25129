"""DescribeGroups, ListGroups, DeleteGroups, and what the offsets side asks of the membership.

Part of ``appliance.group.membership.GroupCoordinator`` (a mixin, split out to keep modules
small; it runs in the coordinator worker like the rest and shares its state: ``_groups``,
``_loaded``, ``_store``...). See that module for the design; behaviour is Kafka's
GroupCoordinator handleDescribeGroup/handleListGroups/handleDeleteGroups, validateOffsetCommit
(KIP-447 for TxnOffsetCommit) and cleanupGroupMetadata.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple

from appliance.errors import ErrorCode
from appliance.group.classic_group import ClassicGroup, GroupState
from appliance.group.messages import DescribedGroup, ListedGroup, ListGroupsResult

if TYPE_CHECKING:
    from appliance.group.records import GroupRecord

__all__ = ["GroupAdmin", "GroupInfo", "CLASSIC_GROUP_TYPE"]

log = logging.getLogger("appliance.group.membership")

E = ErrorCode
S = GroupState
CLASSIC_GROUP_TYPE = "classic"


class GroupInfo(NamedTuple):
    state: str
    protocol_type: str | None
    generation_id: int
    state_timestamp: int | None
    subscribed_topics: frozenset[str] | None
    members: int


def _store_error(code: Any) -> ErrorCode:
    """Kafka's storeGroup mapping of a failed append to the error the members get."""
    try:
        code = E(int(code))
    except (TypeError, ValueError):
        return E.coordinator_not_available          # (ours) a failure without a Kafka code
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas,
                E.not_enough_replicas_after_append):
        return E.coordinator_not_available
    if code in (E.not_leader_or_follower, E.kafka_storage_error):
        return E.not_coordinator
    if code == E.request_timed_out:
        return E.rebalance_in_progress
    if code in (E.message_too_large, E.record_list_too_large, E.invalid_fetch_size):
        return E.unknown_server_error
    return code


class GroupAdmin:
    """Admin requests and queries; mixed into GroupCoordinator."""

    _groups: dict[str, ClassicGroup]
    _loaded: bool

    if TYPE_CHECKING:
        def _enter(self) -> None: ...
        def _leave(self) -> None: ...
        def _now(self) -> int: ...
        def _create(self, group_id: str) -> ClassicGroup: ...
        def _store(self, group_id: str, record: GroupRecord | None) -> ErrorCode: ...
        def _schedule_hb(self, group: ClassicGroup, member: Any, timeout_ms: int) -> None: ...

    # -- admin ------------------------------------------------------------------------------------
    def describe_groups(self, group_ids: Iterable[str]) -> list[DescribedGroup]:
        """DescribeGroups v0-5: an unknown group is described as Dead with no error."""
        out = []
        for gid in group_ids:
            if not self._loaded:
                out.append(DescribedGroup(E.coordinator_load_in_progress, gid, "", "", "", []))
                continue
            group = self._groups.get(gid)
            if group is None:
                out.append(DescribedGroup(E.none, gid, S.Dead.value, "", "", []))
                continue
            out.append(group.describe())
        return out

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> ListGroupsResult:
        """ListGroups: states (v4) match case-insensitively; types (v5): every group here is
        "classic", so a types filter without it lists nothing."""
        err = E.none if self._loaded else E.coordinator_load_in_progress
        wanted = {s.lower() for s in states}
        kinds = {t.lower() for t in types}
        if kinds and CLASSIC_GROUP_TYPE not in kinds:
            return ListGroupsResult(err, [])
        return ListGroupsResult(err, [
            ListedGroup(g.group_id, g.protocol_type or "", g.state.value, CLASSIC_GROUP_TYPE)
            for g in self._groups.values() if not wanted or g.state.lower in wanted])

    def delete_groups(self, group_ids: Iterable[str],
                      on_deleted: Callable[[str], Any]) -> dict[str, ErrorCode]:
        """DeleteGroups: only an Empty group can go (NON_EMPTY_GROUP otherwise; unknown:
        GROUP_ID_NOT_FOUND). For each, ``on_deleted(group_id)`` removes its offsets (it may
        return an ErrorCode: not NONE keeps the group and is reported, ours), then the metadata
        tombstone is persisted and the group becomes Dead and is dropped."""
        self._enter()
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
            self._leave()

    def _delete_group(self, gid: str, on_deleted: Callable[[str], Any]) -> ErrorCode:
        if not self._loaded:
            return E.coordinator_load_in_progress
        group = self._groups.get(gid)
        if group is None or group.is_(S.Dead):
            return E.group_id_not_found
        if not group.is_(S.Empty):
            return E.non_empty_group
        r = on_deleted(gid)
        if isinstance(r, int) and not isinstance(r, bool) and r != E.none:
            return _store_error(r)
        err = self._store(gid, None)
        if err != E.none:
            log.error("group %r: offsets removed but the metadata tombstone failed (%s)", gid,
                      err.name)
        self._drop(group)
        log.info("group %r deleted", gid)
        return E.none

    def _drop(self, group: ClassicGroup) -> None:
        group.transition_to(S.Dead, self._now())
        group.join_token = group.sync_token = None
        group.pending_members.clear()
        self._groups.pop(group.group_id, None)

    def forget_group(self, group_id: str) -> bool:
        """Drop a group the offsets side has deleted (its expire_offsets' ``deleted_groups``):
        nothing is written. Only an Empty group goes; True if it is gone (or was unknown)."""
        group = self._groups.get(group_id)
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
        self._enter()
        try:
            for group in list(self._groups.values()):
                if (group.is_(S.Empty) and not group.pending_members
                        and not has_offsets(group.group_id)):
                    if self._store(group.group_id, None) != E.none:
                        continue                          # retried at the next cleanup
                    self._drop(group)
                    gone.append(group.group_id)
        finally:
            self._leave()
        return gone

    def ensure_group(self, group_id: str) -> None:
        """An Empty group without protocol type for a group that only has offsets."""
        if group_id not in self._groups:
            self._create(group_id)

    # -- for the offsets side ---------------------------------------------------------------------
    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                               group_instance_id: str | None, *, api_version: int = 8) -> ErrorCode:
        """OffsetCommit's group checks (Kafka's validateOffsetCommit, non-transactional). A
        commit with generation < 0 to an unknown group creates it (Empty, a "simple" group). A
        member's commit in Stable/PreparingRebalance counts as a heartbeat."""
        self._enter()
        try:
            if not self._loaded:
                return E.coordinator_load_in_progress
            group = self._groups.get(group_id)
            if group is None:
                if generation_id < 0:
                    self._create(group_id)
                    return E.none
                return E.group_id_not_found if api_version >= 9 else E.illegal_generation
            err = group.validate_offset_commit(generation_id, member_id or "",
                                               group_instance_id, transactional=False)
            if err is not None:
                return err
            member = group.members.get(member_id or "")
            if member is not None and group.state in (S.Stable, S.PreparingRebalance):
                self._schedule_hb(group, member, member.session_timeout_ms)
            return E.none
        except Exception:
            log.exception("offset commit check for %r failed", group_id)
            return E.unknown_server_error
        finally:
            self._leave()

    def validate_txn_offset_commit(self, group_id: str, generation_id: int, member_id: str | None,
                                   group_instance_id: str | None) -> ErrorCode:
        """TxnOffsetCommit's group checks (KIP-447). Generation -1 with no member id and no
        instance id (v0-2 clients, standalone producers) passes without checks; otherwise the
        member must exist (UNKNOWN_MEMBER_ID), a static one must be current
        (FENCED_INSTANCE_ID), and the generation must be the group's (ILLEGAL_GENERATION).
        The group state does not matter. An unknown group: generation < 0 creates it (Empty),
        else ILLEGAL_GENERATION."""
        self._enter()
        try:
            if not self._loaded:
                return E.coordinator_load_in_progress
            group = self._groups.get(group_id)
            if group is None:
                if generation_id < 0:
                    self._create(group_id)
                    return E.none
                return E.illegal_generation
            err = group.validate_offset_commit(generation_id, member_id or "",
                                               group_instance_id, transactional=True)
            return E.none if err is None else err
        except Exception:
            log.exception("txn offset commit check for %r failed", group_id)
            return E.unknown_server_error
        finally:
            self._leave()

    def group_state(self, group_id: str) -> str | None:
        """Kafka's state name, or None for an unknown group."""
        group = self._groups.get(group_id)
        return None if group is None else group.state.value

    def is_empty_or_dead(self, group_id: str) -> bool:
        """True when the group has no members (also for a group unknown here)."""
        group = self._groups.get(group_id)
        return group is None or group.state in (S.Empty, S.Dead)

    def empty_since(self, group_id: str) -> int | None:
        """When an Empty group became Empty (its state timestamp), else None. None too for a
        group without protocol type (a standalone consumer's): Kafka counts the retention of
        its offsets from each commit instead."""
        group = self._groups.get(group_id)
        if group is None or not group.is_(S.Empty) or group.protocol_type is None:
            return None
        return group.state_timestamp

    def subscribed_topics(self, group_id: str) -> set[str] | None:
        """The topics a Stable "consumer" group subscribes to (KIP-496), else None."""
        group = self._groups.get(group_id)
        if group is None or not group.is_(S.Stable) or group.subscribed_topics is None:
            return None
        return set(group.subscribed_topics)

    def group_info(self, group_id: str) -> GroupInfo | None:
        group = self._groups.get(group_id)
        if group is None:
            return None
        return GroupInfo(group.state.value, group.protocol_type, group.generation_id,
                         group.state_timestamp, group.subscribed_topics, group.size)

    def summaries(self) -> list[tuple[str, str, int]]:
        """(group id, Kafka's state name, members) of every group, for the metrics."""
        return [(g.group_id, g.state.value, g.size) for g in self._groups.values()]

    def group_ids(self) -> list[str]:
        return list(self._groups)

