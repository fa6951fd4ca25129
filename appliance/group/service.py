"""Group requests of the coordinator worker: IPC messages in, IPC messages out (issue 5).

Runs in the coordinator worker, single-threaded; sans-IO apart from the group log the
``OffsetManager`` writes. Owns the wiring between the membership side
(``appliance.group.membership.GroupCoordinator``), the offsets side
(``appliance.group.offsets.OffsetManager`` over ``appliance.group.store.GroupStateStore``) and the
transaction coordinator (KIP-98 transactional offsets, KIP-447 fencing, KIP-890 verification):

    frontend --JoinGroupReq...--> handle(src, msg, reply) --> GroupCoordinator / OffsetManager
                                         |                         |
                                         +-- reply(src, resp) <----+  (JoinGroup/SyncGroup: later)

``reply(src, msg)`` posts an answer to the frontend ``src``; JoinGroup and SyncGroup answers come
from later calls (another member's request, or ``tick``), which is why replies go through a
callback rather than a return value.

TxnOffsetCommit (Kafka's GroupCoordinator.handleTxnCommitOffsets with KIP-890 part 1's
verification): the producer must have an Ongoing transaction with this id and epoch that holds the
group's ``__consumer_offsets`` partition (AddOffsetsToTxn) - which is also what guarantees that a
marker (commit, abort, or timeout abort) will come and clear the pending offsets; then, from v3
and only when the request carries group metadata, the KIP-447 generation/member/instance checks;
then the offsets are stored pending. Retriable coordinator answers become COORDINATOR_NOT_AVAILABLE
(KIP-890 "old clients": Kafka's verification turns CONCURRENT_TRANSACTIONS and the other retriable
answers into NOT_ENOUGH_REPLICAS, which its group manager answers as COORDINATOR_NOT_AVAILABLE;
every client retries that one, not all retry CONCURRENT_TRANSACTIONS here), a stale epoch INVALID_PRODUCER_EPOCH (fatal "fenced" in every client), a
transaction without the offsets partition INVALID_TXN_STATE for v0-3 and TRANSACTION_ABORTABLE for
v4 (as Kafka's AddPartitionsToTxnManager maps its coordinator's answer).
v5 (transaction version 2) adds the partition to the transaction instead of requiring it.
"""

from __future__ import annotations

import logging
from typing import Callable

from appliance import ipc
from appliance.errors import ErrorCode
from appliance.group.membership import (GroupCoordinator, HeartbeatRequest, JoinGroupRequest,
                                        LeaveMember, MembershipConfig, SyncGroupRequest)
from appliance.group.offsets import OffsetManager
from appliance.group.store import GroupStateStore
from appliance.txn.coordinator import OFFSETS_TOPIC, partition_for

log = logging.getLogger("appliance.group")
E = ErrorCode

_RETRIABLE_TO_NOT_AVAILABLE = {E.concurrent_transactions, E.coordinator_load_in_progress,
                               E.not_coordinator, E.coordinator_not_available,
                               E.request_timed_out}


class GroupService:
    def __init__(self, directory: str, groups_cfg, flush_policy: str, tc, now_ms: Callable[[], int]) -> None:
        self.cfg = groups_cfg
        self.tc = tc
        self.now = now_ms
        self.store = GroupStateStore(directory, flush_policy, now_ms())
        self.offsets = OffsetManager(self.store, offset_metadata_max_bytes=groups_cfg.offset_metadata_max_bytes)
        self.groups = GroupCoordinator(
            MembershipConfig(groups_cfg.min_session_timeout_ms, groups_cfg.max_session_timeout_ms,
                             groups_cfg.initial_rebalance_delay_ms, groups_cfg.max_size),
            persist=lambda g, r: self.offsets.store_group(g, r, self.now()), now_ms=now_ms)
        self._next_expiry = 0

    def load(self) -> None:
        records = self.offsets.load()
        self.groups.load(records, offset_groups=self.offsets.groups_with_offsets())
        log.info("group coordinator loaded %d groups (%d with offsets)", len(self.groups.group_ids()),
                 len(self.offsets.groups_with_offsets()))

    def close(self, clean: bool = True) -> None:
        self.offsets.close(clean)

    # -- timers -----------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        self.groups.tick(now_ms)
        if now_ms >= self._next_expiry:
            self._next_expiry = now_ms + self.cfg.offsets_retention_check_interval_ms
            r = self.offsets.expire_offsets(now_ms, self.cfg.offsets_retention_ms,
                                            self.groups.is_empty_or_dead,
                                            empty_since=self.groups.empty_since,
                                            subscribed_topics=self.groups.subscribed_topics)
            for g in r.deleted_groups:
                self.groups.forget_group(g)
            n = sum(len(v) for v in r.expired.values())
            if n:
                log.info("expired %d offsets of %d groups", n, len(r.expired))

    def next_deadline_ms(self) -> int | None:
        return self.groups.next_deadline_ms()

    # -- markers ----------------------------------------------------------------------------------
    def complete_txn(self, producer_id: int, producer_epoch: int, commit: bool,
                     coordinator_epoch: int) -> ErrorCode:
        """A commit/abort marker for an ``__consumer_offsets`` partition: the producer's pending
        offsets become committed or vanish (every group: one marker covers them all)."""
        return self.offsets.complete_txn(producer_id, producer_epoch, commit, self.now(),
                                         coordinator_epoch=coordinator_epoch)

    # -- requests ---------------------------------------------------------------------------------
    def handle(self, src: str, msg, reply: Callable[[str, object], None]) -> bool:
        """Serve a group message; False if ``msg`` is not one."""
        rid = msg.req_id
        if isinstance(msg, ipc.JoinGroupReq):
            req = JoinGroupRequest(msg.group_id, msg.member_id, msg.session_timeout_ms,
                                   msg.rebalance_timeout_ms, msg.protocol_type,
                                   [(p.name, p.metadata) for p in msg.protocols],
                                   msg.group_instance_id, msg.client_id, msg.client_host,
                                   msg.version, msg.reason)
            self.groups.join_group(req, lambda r: reply(src, _join_resp(rid, r)))
        elif isinstance(msg, ipc.SyncGroupReq):
            req = SyncGroupRequest(msg.group_id, msg.generation_id, msg.member_id,
                                   [(a.name, a.metadata) for a in msg.assignments],
                                   msg.group_instance_id, msg.protocol_type, msg.protocol_name,
                                   msg.version)
            self.groups.sync_group(req, lambda r: reply(src, ipc.SyncGroupResp(
                rid, int(r.error), r.protocol_type, r.protocol_name, r.assignment)))
        elif isinstance(msg, ipc.HeartbeatReq):
            err = self.groups.heartbeat(HeartbeatRequest(msg.group_id, msg.generation_id, msg.member_id,
                                                         msg.group_instance_id))
            reply(src, ipc.GroupResp(rid, int(err)))
        elif isinstance(msg, ipc.LeaveGroupReq):
            r = self.groups.leave_group(msg.group_id, [LeaveMember(m.member_id, m.group_instance_id, m.reason)
                                                       for m in msg.members])
            reply(src, ipc.LeaveGroupResp(rid, int(r.error), [
                ipc.LeavingMember(m.member_id, m.group_instance_id, None, int(m.error)) for m in r.members]))
        elif isinstance(msg, ipc.OffsetCommitReq):
            reply(src, self._offset_commit(msg))
        elif isinstance(msg, ipc.TxnOffsetCommitReq):
            reply(src, self._txn_offset_commit(msg))
        elif isinstance(msg, ipc.OffsetFetchReq):
            reply(src, self._offset_fetch(msg))
        elif isinstance(msg, ipc.OffsetDeleteReq):
            reply(src, self._offset_delete(msg))
        elif isinstance(msg, ipc.DescribeGroupsReq):
            reply(src, ipc.DescribeGroupsResp(rid, [
                ipc.DescribedGroup(int(d.error), d.group_id, d.group_state, d.protocol_type,
                                   d.protocol_data, [ipc.DescribedMember(
                                       m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                       m.member_metadata, m.member_assignment) for m in d.members])
                for d in self.groups.describe_groups(msg.group_ids)]))
        elif isinstance(msg, ipc.ListGroupsReq):
            r = self.groups.list_groups(msg.states, msg.types)
            reply(src, ipc.ListGroupsResp(rid, int(r.error), [
                ipc.ListedGroup(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in r.groups]))
        elif isinstance(msg, ipc.DeleteGroupsReq):
            res = self.groups.delete_groups(msg.group_ids,
                                            lambda g: self.offsets.delete_group(g, self.now()))
            reply(src, ipc.DeleteGroupsResp(rid, [ipc.GroupError(g, int(res.get(g, E.none)))
                                                  for g in msg.group_ids]))
        else:
            return False
        return True

    def _offset_commit(self, msg: ipc.OffsetCommitReq) -> ipc.OffsetsResp:
        err = self.groups.validate_offset_commit(msg.group_id, msg.generation_id, msg.member_id,
                                                 msg.group_instance_id, api_version=msg.version)
        if err != E.none:
            return ipc.OffsetsResp(msg.req_id, int(err))
        res = self.offsets.commit_offsets(
            msg.group_id, [(o.topic, o.partition, o.offset, o.leader_epoch, o.metadata) for o in msg.offsets],
            self.now())
        return ipc.OffsetsResp(msg.req_id, 0, _entries(msg.offsets, res))

    def _txn_offset_commit(self, msg: ipc.TxnOffsetCommitReq) -> ipc.OffsetsResp:
        part = (OFFSETS_TOPIC, partition_for(msg.group_id, self.tc.offsets_topic_partitions))
        # v5 (transaction version 2): the request itself adds the partition (KIP-890 part 2).
        err = self.tc.verify_partition(msg.transactional_id, msg.producer_id, msg.producer_epoch,
                                       part, add=msg.version >= 5)
        if err in _RETRIABLE_TO_NOT_AVAILABLE:
            err = E.coordinator_not_available
        elif err == E.invalid_txn_state and msg.version == 4:
            # The offsets partition is not in the transaction (no AddOffsetsToTxn): Kafka's
            # coordinator says TRANSACTION_ABORTABLE, which its broker passes on to v4 clients
            # (KIP-890 ``genericError``) and turns into INVALID_TXN_STATE for v0-3.
            err = E.transaction_abortable
        if err == E.none and msg.version >= 3:
            err = self.groups.validate_txn_offset_commit(msg.group_id, msg.generation_id,
                                                         msg.member_id, msg.group_instance_id)
        if err != E.none:
            return ipc.OffsetsResp(msg.req_id, int(err))
        res = self.offsets.txn_commit_offsets(
            msg.group_id, msg.producer_id, msg.producer_epoch,
            [(o.topic, o.partition, o.offset, o.leader_epoch, o.metadata) for o in msg.offsets], self.now())
        return ipc.OffsetsResp(msg.req_id, 0, _entries(msg.offsets, res))

    def _offset_fetch(self, msg: ipc.OffsetFetchReq) -> ipc.OffsetFetchResp:
        out = []
        for g in msg.groups:
            gate = self.offsets.unavailable()
            if gate is not None:
                out.append(ipc.OffsetFetchGroup(g.group_id, [], int(gate)))
                continue
            wanted = None if g.partitions is None else [(e.topic, e.partition) for e in g.partitions]
            got = self.offsets.fetch_offsets(g.group_id, wanted, msg.require_stable)
            out.append(ipc.OffsetFetchGroup(g.group_id, [
                ipc.OffsetEntry(f.topic, f.partition, f.offset, f.leader_epoch, f.metadata, int(f.error))
                for f in got]))
        return ipc.OffsetFetchResp(msg.req_id, out)

    def _offset_delete(self, msg: ipc.OffsetDeleteReq) -> ipc.OffsetsResp:
        state = self.groups.group_state(msg.group_id)
        if state is None and not self.offsets.has_offsets(msg.group_id):
            return ipc.OffsetsResp(msg.req_id, int(E.group_id_not_found))
        subscribed = self.groups.subscribed_topics(msg.group_id) or set()
        results: dict = {}
        doomed = []
        for e in msg.partitions:
            if e.topic in subscribed:
                # KIP-496: offsets of a topic the group's members consume cannot be deleted.
                results[(e.topic, e.partition)] = E.group_subscribed_to_topic
            else:
                doomed.append((e.topic, e.partition))
        if doomed:
            results.update(self.offsets.delete_offsets(msg.group_id, doomed, self.now()))
        return ipc.OffsetsResp(msg.req_id, 0, _entries(msg.partitions, results))


def _entries(asked, results: dict) -> list[ipc.OffsetEntry]:
    return [ipc.OffsetEntry(o.topic, o.partition, error_code=int(results.get((o.topic, o.partition), E.none)))
            for o in asked]


def _join_resp(rid: int, r) -> ipc.JoinGroupResp:
    return ipc.JoinGroupResp(rid, int(r.error), r.generation_id, r.protocol_type, r.protocol_name,
                             r.leader, r.skip_assignment, r.member_id,
                             [ipc.GroupMember(m.member_id, m.group_instance_id, m.metadata) for m in r.members])
