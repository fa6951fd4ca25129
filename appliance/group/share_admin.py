"""The admin side of share groups (KIP-932): ListGroups, DescribeGroups and DeleteGroups' view of
them, and the share-group offsets APIs DescribeShareGroupOffsets (90), AlterShareGroupOffsets
(91) and DeleteShareGroupOffsets (92).

Runs in the coordinator worker as part of ``appliance.group.share_group.ShareService`` (a mixin
over its state: ``groups``, ``partitions``, the share-state log); single-threaded, sans-IO apart
from that log. ListGroups, DescribeGroups and DeleteGroups come to the group service
(``appliance.group.service``), which asks this side for the ids it holds, as Kafka's one
GroupMetadataManager holds every type in one namespace.

A share group exists while it has members or any share partition with state (membership is not
persisted: after a restart a group without state is gone until a member joins again). Its state
is Kafka's ShareGroupState name: "Stable" with members, else "Empty"; protocol type and group
type "share".

Kafka's behaviour kept (GroupCoordinatorService and GroupMetadataManager, 4.x):
- DescribeShareGroupOffsets with topics: no group check; a partition with no state (or a topic
  not in the catalog, topic id zero) answers start offset -1 and lag -1. With null topics (v1):
  every partition with state, GROUP_ID_NOT_FOUND for a group that is not a share group. Lag
  (v1, KIP-1226) = high watermark - start offset - the records already done above the start
  offset (Kafka's deliveryCompleteCount).
- AlterShareGroupOffsets and DeleteShareGroupOffsets: GROUP_ID_NOT_FOUND for an unknown id or
  one of another type, NON_EMPTY_GROUP while the group has members (the offsets of a group
  being read cannot move under it). Alter sets each partition's start offset and forgets its
  in-flight records (a new state epoch, as Kafka's InitializeShareGroupState); an unknown topic
  or partition is UNKNOWN_TOPIC_OR_PARTITION. Delete removes the state of every partition of a
  topic (tombstones in the share-state log); a topic without state answers
  UNKNOWN_TOPIC_OR_PARTITION "There is no offset information to delete.".
- DeleteGroups: NON_EMPTY_GROUP with members, else its partitions' state is deleted.
"""

from __future__ import annotations

import logging

from appliance.errors import ErrorCode
from appliance.group.messages import (AlterShareOffsetsRequest, DeleteShareOffsetsRequest,
                                      DescribeShareOffsetsRequest, DescribeShareOffsetsResult,
                                      ListedGroup, ShareOffsetPartition, ShareOffsetsChangeResult,
                                      ShareOffsetsGroup, ShareOffsetsTopic)
from appliance.group.share_partition import SharePartition
from appliance.group.share_store import ShareLogWriteError
from appliance.service import serves

log = logging.getLogger("appliance.group.share")
E = ErrorCode

SHARE_TYPE = "share"                 # ShareGroup.PROTOCOL_TYPE and KIP-848's GroupType
ZERO_ID = bytes(16)
NO_OFFSETS = "There is no offset information to delete."


class SharePartitions(dict):
    """(group, topic id, partition) -> SharePartition, counting the partitions of each group, so
    that "does a share group hold this id" is one lookup on the hot paths of the other group
    types (OffsetCommit, heartbeats), not a walk over every share partition."""

    def __init__(self) -> None:
        super().__init__()
        self.per_group: dict[str, int] = {}

    def __setitem__(self, key, value) -> None:
        if key not in self:
            self.per_group[key[0]] = self.per_group.get(key[0], 0) + 1
        super().__setitem__(key, value)

    def pop(self, key, *default):
        if key in self:
            n = self.per_group[key[0]] - 1
            if n:
                self.per_group[key[0]] = n
            else:
                del self.per_group[key[0]]
        return super().pop(key, *default)

    def update(self, other) -> None:            # type: ignore[override]
        for k, v in other.items():
            self[k] = v


class ShareAdmin:
    """Mixin of ShareService: needs ``groups``, ``partitions``, ``store``, ``topics``, ``marks``,
    ``other_group``, ``_snapshot_epochs``, ``_persist`` and ``now``."""

    # -- the group namespace ----------------------------------------------------------------------
    def share_group_ids(self) -> set[str]:
        return set(self.groups) | set(self.partitions.per_group)

    def is_share_group(self, group_id: str) -> bool:
        return group_id in self.groups or group_id in self.partitions.per_group

    def share_state(self, group_id: str) -> str:
        g = self.groups.get(group_id)
        return "Stable" if g is not None and g.members else "Empty"

    def list_share_groups(self, states, types) -> list[ListedGroup]:
        """ListGroups' rows for share groups: states (v4) and types (v5) match
        case-insensitively, as for the other types."""
        wanted = {s.lower() for s in states}
        kinds = {t.lower() for t in types}
        if kinds and SHARE_TYPE not in kinds:
            return []
        out = []
        for gid in sorted(self.share_group_ids()):
            state = self.share_state(gid)
            if not wanted or state.lower() in wanted:
                out.append(ListedGroup(gid, SHARE_TYPE, state, SHARE_TYPE))
        return out

    def delete_share_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a share group: NON_EMPTY_GROUP with members; else the state of its
        partitions goes (tombstones) and the group with it."""
        g = self.groups.get(group_id)
        if g is not None and g.members:
            return E.non_empty_group
        err = self._drop_state([k for k in self.partitions if k[0] == group_id])
        if err != E.none:
            return err
        self.groups.pop(group_id, None)
        log.info("share group %r deleted", group_id)
        return E.none

    def _drop_state(self, keys) -> ErrorCode:
        if not keys:
            return E.none
        try:
            self.store.write([(k, None) for k in keys], self.now())
        except ShareLogWriteError as e:
            log.error("share-state log write failed: %s", e)
            return E.coordinator_not_available
        for k in keys:
            self.partitions.pop(k, None)
            self._snapshot_epochs.pop(k, None)
        return E.none

    def _admin_refusal(self, group_id: str) -> tuple[ErrorCode, str | None] | None:
        if not group_id:
            return E.invalid_group_id, None
        if self.other_group(group_id):
            return E.group_id_not_found, f"Group {group_id} is not a share group."
        if not self.is_share_group(group_id):
            return E.group_id_not_found, f"Share group {group_id} not found."
        g = self.groups.get(group_id)
        if g is not None and g.members:
            return E.non_empty_group, None
        return None

    # -- metrics ----------------------------------------------------------------------------------
    def share_metrics(self) -> tuple[dict[str, int], list[tuple[str, str, int, int, int]]]:
        """Share groups by state (lower case, Kafka's share-group-count label), and per share
        partition (group, topic, partition, in-flight records, lag) for the metrics."""
        by_state = {"empty": 0, "stable": 0}
        for gid in self.share_group_ids():
            by_state[self.share_state(gid).lower()] += 1
        names = {tid: name for name, (tid, _n) in self.topics().items()}
        rows = []
        for (gid, tid, p), sp in self.partitions.items():
            name = names.get(tid)
            if name is not None:
                rows.append((gid, name, p, sp.in_flight(), self._lag(tid, p, sp)[1]))
        return by_state, rows

    # -- DescribeShareGroupOffsets (90) -----------------------------------------------------------
    def _lag(self, tid: bytes, p: int, sp: SharePartition | None) -> tuple[int, int]:
        mk = self.marks(tid, p)
        if sp is None or mk is None:
            return -1, -1
        hw, log_start = mk[0], mk[1]
        start = max(sp.start_offset, log_start)
        done = sp.done_from(start)
        return start, max(0, hw - start - done)

    @serves(DescribeShareOffsetsRequest)
    def describe_share_offsets(self, req: DescribeShareOffsetsRequest) -> DescribeShareOffsetsResult:
        topics = self.topics()
        names = {tid: name for name, (tid, _n) in topics.items()}
        out = []
        for ask in req.groups:
            gid = ask.group_id
            if ask.topics is None:
                if self.other_group(gid) or not self.is_share_group(gid):
                    msg = (f"Group {gid} is not a share group." if self.other_group(gid)
                           else f"Group {gid} not found.")
                    out.append(ShareOffsetsGroup(gid, [], E.group_id_not_found, msg))
                    continue
                by_topic: dict[bytes, list[int]] = {}
                for (g, tid, p) in self.partitions:
                    if g == gid and tid in names:
                        by_topic.setdefault(tid, []).append(p)
                wanted = [(names[tid], sorted(ps)) for tid, ps in by_topic.items()]
            else:
                wanted = ask.topics
            rows = []
            for name, parts in wanted:
                t = topics.get(name)
                tid = t[0] if t is not None else ZERO_ID
                ps = []
                for p in parts:
                    sp = self.partitions.get((gid, tid, p)) if t is not None else None
                    start, lag = self._lag(tid, p, sp)
                    ps.append(ShareOffsetPartition(p, start, lag))
                rows.append(ShareOffsetsTopic(name, tid, ps))
            out.append(ShareOffsetsGroup(gid, rows))
        return DescribeShareOffsetsResult(out)

    # -- AlterShareGroupOffsets (91) --------------------------------------------------------------
    @serves(AlterShareOffsetsRequest)
    def alter_share_offsets(self, req: AlterShareOffsetsRequest) -> ShareOffsetsChangeResult:
        refusal = self._admin_refusal(req.group_id)
        if refusal is not None:
            return ShareOffsetsChangeResult(*refusal)
        topics = self.topics()
        dirty = {}
        rows = []
        for name, parts in req.topics:
            t = topics.get(name)
            tid = t[0] if t is not None else ZERO_ID
            ps = []
            for p, offset in parts:
                if t is None or not 0 <= p < t[1] or self.marks(tid, p) is None:
                    ps.append(ShareOffsetPartition(p, error=E.unknown_topic_or_partition,
                                                   error_message="This server does not host "
                                                   "this topic-partition."))
                    continue
                if offset < 0:
                    ps.append(ShareOffsetPartition(p, error=E.invalid_request,
                                                   error_message="The start offset must not "
                                                   "be negative."))
                    continue
                key = (req.group_id, tid, p)
                old = self.partitions.get(key)
                sp = SharePartition(offset, state_epoch=(old.state_epoch if old else 0) + 1)
                dirty[key] = sp
                ps.append(ShareOffsetPartition(p))
            rows.append(ShareOffsetsTopic(name, tid, ps))
        if dirty:
            before = {k: self.partitions.get(k) for k in dirty}
            self.partitions.update(dirty)
            err = self._persist(dirty, self.now())
            if err != E.none:
                for k, sp in before.items():
                    if sp is None:
                        self.partitions.pop(k, None)
                    else:
                        self.partitions[k] = sp
                return ShareOffsetsChangeResult(err)
        return ShareOffsetsChangeResult(E.none, None, rows)

    # -- DeleteShareGroupOffsets (92) -------------------------------------------------------------
    @serves(DeleteShareOffsetsRequest)
    def delete_share_offsets(self, req: DeleteShareOffsetsRequest) -> ShareOffsetsChangeResult:
        refusal = self._admin_refusal(req.group_id)
        if refusal is not None:
            return ShareOffsetsChangeResult(*refusal)
        topics = self.topics()
        rows, doomed = [], []
        for name in dict.fromkeys(req.topics):
            t = topics.get(name)
            if t is None:
                rows.append(ShareOffsetsTopic(name, ZERO_ID, [], E.unknown_topic_or_partition,
                                              "This server does not host this topic-partition."))
                continue
            keys = [k for k in self.partitions if k[0] == req.group_id and k[1] == t[0]]
            if not keys:
                rows.append(ShareOffsetsTopic(name, t[0], [], E.unknown_topic_or_partition,
                                              NO_OFFSETS))
                continue
            doomed.extend(keys)
            rows.insert(sum(1 for r in rows if r.error == E.none),
                        ShareOffsetsTopic(name, t[0], []))
        err = self._drop_state(doomed)
        if err != E.none:
            return ShareOffsetsChangeResult(err)
        return ShareOffsetsChangeResult(E.none, None, rows)
