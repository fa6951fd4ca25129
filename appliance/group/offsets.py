"""Offsets of consumer groups: OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete, the end
of transactions that hold offsets, expiration, and the persistence of group metadata.

Owned by the coordinator worker (``workers/coordinator.py``; one process, single-threaded, not
thread-safe; sans-IO except for the group log, time passed in as ``now_ms``). The durable state is
``appliance.group.store.GroupStateStore`` (the group log, Kafka's ``__consumer_offsets``); this
module is the policy on top of it, Kafka's GroupMetadataManager / GroupMetadata offsets parts
(and the newer OffsetMetadataManager where the two differ). Group membership (JoinGroup,
SyncGroup, generations, ...) is ``appliance.group.membership``: it persists its groups through
``store_group`` and gets them back from ``load``; the generation / member checks of OffsetCommit
and TxnOffsetCommit v3+ (KIP-447: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) and
GROUP_SUBSCRIBED_TO_TOPIC of OffsetDelete are the caller's, made before calling in here.

Every write is in the log before the method returns (fdatasync'ed unless the flush policy is
``os``), so the caller answers the client after the data is durable.

Transactional offsets (KIP-98, KIP-447):

* ``txn_commit_offsets`` writes the offsets as a transactional batch of the producer and keeps
  them *pending* for that producer: OffsetFetch does not return them until the commit marker
  (KIP-98), and with RequireStable a partition holding one answers UNSTABLE_OFFSET_COMMIT
  (KIP-447).
* ``complete_txn`` is the marker for the offsets partition (WriteTxnMarkers on Kafka's
  ``__consumer_offsets``, then GroupMetadataManager.scheduleHandleTxnCompletion /
  handleTxnCompletion): it writes the control batch, then makes that producer's pending offsets
  committed (COMMIT; each only if more recent in the log than the committed one) or drops them
  (ABORT), in every group that has some.
* After a restart, ``load`` replays the log: pending offsets whose control batch is in the log
  are completed, the others stay pending and are completed by the marker that comes later
  (KIP-98's group coordinator startup).
* Pending offsets never stay stuck, because the transaction coordinator always ends the
  transaction on every partition it holds, and the group's offsets partition
  (``__consumer_offsets[partitionFor(group)]``) is one of them once AddOffsetsToTxn has added it:
  EndTxn(COMMIT) or EndTxn(ABORT) sends a marker; a transaction that times out is aborted with a
  marker (epoch bumped); InitProducerId of a new instance aborts (or commits, if
  PrepareCommit) the previous one's; a coordinator that restarts in PrepareCommit/PrepareAbort
  sends the markers again and retries until they are acknowledged (so ``complete_txn`` failing
  with a storage error only delays them). The caller must therefore accept TxnOffsetCommit only
  for a producer whose ongoing transaction holds the group's offsets partition (the KIP-890
  verification with the transaction coordinator; it also fences a stale producer id / epoch,
  as KIP-98 requires of TxnOffsetCommit). ``pending_producer_ids`` lists the producers with pending offsets, for a
  consistency check at start.

Errors of a failed write follow Kafka's maybeConvertOffsetCommitError / storeGroup mapping (the
latter is ``records.store_group_error``, the one the membership side maps with too):
KAFKA_STORAGE_ERROR -> NOT_COORDINATOR, a batch too large -> INVALID_COMMIT_OFFSET_SIZE (offset
commits) or UNKNOWN_SERVER_ERROR (group metadata). If a write may have reached the log although
it reported failure (the fdatasync failed), memory can no longer be trusted: the manager is
*broken* and answers NOT_COORDINATOR to everything (fetches included: they could return a stale
offset); the worker restarts to reload. Before ``load`` every call answers
COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, NamedTuple, Sequence

from appliance.errors import ErrorCode
from appliance.group.messages import OffsetPartition
from appliance.group.records import GroupRecord, store_group_error
from appliance.group.store import (GroupLogWriteError, GroupStateStore, OffsetEntry,
                                   TopicPartition)

__all__ = ["OffsetManager", "ExpireResult", "DEFAULT_OFFSET_METADATA_MAX_BYTES",
           "DEFAULT_OFFSETS_RETENTION_MS"]

log = logging.getLogger("appliance.group.offsets")

E = ErrorCode

FAILURE_LOG_INTERVAL_S = 10.0                       # failed group log writes: a report at most this often (s)
DEFAULT_OFFSET_METADATA_MAX_BYTES = 4096            # offset.metadata.max.bytes
DEFAULT_OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000  # offsets.retention.minutes = 10080
MAX_STRING_BYTES = 0x7FFF                           # an int16-length string in the record

# (topic, partition, offset, leader_epoch, metadata)
OffsetCommitItem = tuple[str, int, int, int, "str | None"]


class ExpireResult(NamedTuple):
    """What ``expire_offsets`` removed: per group the partitions whose offsets expired, and the
    groups that are gone (empty, no offset left, no pending offset; their metadata tombstoned
    when it was stored): the membership side drops them (Kafka: the group becomes Dead)."""

    expired: dict[str, list[TopicPartition]]
    deleted_groups: list[str]


def _java_length(s: str) -> int:
    """String.length() in Java (UTF-16 code units): what Kafka compares with
    offset.metadata.max.bytes."""
    if s.isascii():
        return len(s)
    return len(s.encode("utf-16-le")) // 2


def _commit_error(code: ErrorCode) -> ErrorCode:
    # Kafka's GroupMetadataManager.maybeConvertOffsetCommitError for log append errors.
    if code in (E.kafka_storage_error, E.not_leader_or_follower):
        return E.not_coordinator
    if code in (E.unknown_topic_or_partition, E.not_enough_replicas, E.not_enough_replicas_after_append):
        return E.coordinator_not_available
    if code in (E.message_too_large, E.record_list_too_large, E.invalid_fetch_size):
        return E.invalid_commit_offset_size
    return code


class OffsetManager:
    """Committed and pending offsets of every group, on top of a GroupStateStore."""

    def __init__(self, store: GroupStateStore, *,
                 offset_metadata_max_bytes: int = DEFAULT_OFFSET_METADATA_MAX_BYTES) -> None:
        self.store = store
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self._loaded = False
        self.broken = False
        self._clock = time.monotonic
        self._failure_logged_at = -FAILURE_LOG_INTERVAL_S
        self._failures_unlogged = 0

    # -- loading ----------------------------------------------------------------------------------
    def load(self) -> dict[str, GroupRecord]:
        """Replay the group log; returns the stored metadata of every group (for the membership
        side). Committed and pending offsets stay here (``groups_with_offsets`` names the groups
        that have offsets, with or without stored metadata: Kafka loads those without as Empty
        groups with no protocol type). Raises GroupLogCorrupt."""
        state = self.store.load()
        self._loaded = True
        self.broken = False
        return dict(state.groups)

    def unavailable(self) -> ErrorCode | None:
        """The error every call answers now (COORDINATOR_LOAD_IN_PROGRESS before ``load``,
        NOT_COORDINATOR once broken), or None. OffsetFetch of all partitions answers it as the
        group-level error (``fetch_offsets(group, None)`` then returns [])."""
        return self._gate()

    def _gate(self) -> ErrorCode | None:
        if self.broken:
            return E.not_coordinator
        if not self._loaded:
            return E.coordinator_load_in_progress
        return None

    def _failed(self, e: GroupLogWriteError, what: str) -> None:
        # At most one report per FAILURE_LOG_INTERVAL_S: on a full disk every commit of every
        # consumer fails, and one line per request flooded the log (the chaos suite's disk-full
        # fault: a dozen a second). The count of the others goes with the next report.
        now = self._clock()
        if now - self._failure_logged_at >= FAILURE_LOG_INTERVAL_S:
            more = (f" ({self._failures_unlogged} more failed writes since the last report)"
                    if self._failures_unlogged else "")
            log.error("group log: %s failed: %s%s", what, e, more)
            self._failure_logged_at = now
            self._failures_unlogged = 0
        else:
            self._failures_unlogged += 1
        if e.maybe_written:
            self.broken = True

    # -- OffsetCommit -----------------------------------------------------------------------------
    def _too_large(self, metadata: str) -> bool:
        return (_java_length(metadata) > self.offset_metadata_max_bytes
                or len(metadata.encode("utf-8")) > MAX_STRING_BYTES)

    def _prepare(self, offsets: Iterable[OffsetCommitItem], now_ms: int, expire_timestamp: int
                 ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetEntry]]:
        result: dict[TopicPartition, ErrorCode] = {}
        good: dict[TopicPartition, OffsetEntry] = {}
        for topic, partition, offset, leader_epoch, metadata in offsets:
            tp = (topic, partition)
            md = metadata or ""                       # null metadata is stored as ""
            good.pop(tp, None)                        # a repeated partition: the last one counts
            if self._too_large(md):
                result[tp] = E.offset_metadata_too_large
                continue
            result[tp] = E.none
            good[tp] = OffsetEntry(offset, leader_epoch if leader_epoch is not None else -1, md,
                                   now_ms, expire_timestamp)
        return result, good

    def commit_offsets(self, group_id: str, offsets: Sequence[OffsetCommitItem], now_ms: int,
                       expire_timestamp: int = -1) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit (after the caller's group checks). ``offsets``: (topic, partition,
        offset, leader_epoch (-1 = none), metadata (None = "")). ``expire_timestamp``: now +
        the request's retention time for OffsetCommit v2-v4 with a retention other than -1,
        else -1 (then the broker's retention applies, KIP-211). Partitions whose metadata is
        longer than ``offset_metadata_max_bytes`` get OFFSET_METADATA_TOO_LARGE and are not
        written; the others are written in one batch and are visible to fetches on return."""
        gate = self._gate()
        if gate is not None:
            return {(t, p): gate for t, p, *_ in offsets}
        result, good = self._prepare(offsets, now_ms, expire_timestamp)
        if good:
            try:
                self.store.commit_offsets(group_id, good, now_ms)
            except GroupLogWriteError as e:
                self._failed(e, f"offset commit of group {group_id!r}")
                code = _commit_error(e.code)
                for tp in good:
                    result[tp] = code
        return result

    # -- TxnOffsetCommit --------------------------------------------------------------------------
    def txn_commit_offsets(self, group_id: str, producer_id: int, producer_epoch: int,
                           offsets: Sequence[OffsetCommitItem], now_ms: int
                           ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit (after the caller's transaction verification and, for v3+, group
        checks): the offsets are written as a transactional batch of the producer and stay
        pending for it, invisible to fetches, until ``complete_txn``. An epoch below that of the
        producer's pending offsets is a zombie: INVALID_PRODUCER_EPOCH, nothing written."""
        if producer_id < 0:
            raise ValueError("a transactional offset commit needs a producer id")
        gate = self._gate()
        if gate is not None:
            return {(t, p): gate for t, p, *_ in offsets}
        newest = self._pending_epoch(producer_id)
        if newest is not None and producer_epoch < newest:
            return {(t, p): E.invalid_producer_epoch for t, p, *_ in offsets}
        result, good = self._prepare(offsets, now_ms, -1)
        if good:
            try:
                self.store.commit_offsets(group_id, good, now_ms, producer_id=producer_id,
                                          producer_epoch=producer_epoch)
            except GroupLogWriteError as e:
                self._failed(e, f"transactional offset commit of group {group_id!r}, "
                                f"producer {producer_id}")
                code = _commit_error(e.code)
                for tp in good:
                    result[tp] = code
        return result

    def _pending_epoch(self, producer_id: int) -> int | None:
        by_group = self.store.pending.get(producer_id)
        if not by_group:
            return None
        return max(e.producer_epoch for by_tp in by_group.values() for e in by_tp.values())

    def complete_txn(self, producer_id: int, producer_epoch: int, commit: bool, now_ms: int, *,
                     coordinator_epoch: int = 0) -> ErrorCode:
        """The COMMIT / ABORT marker of ``producer_id`` for the offsets partition: writes the
        control batch, then commits or drops the producer's pending offsets in every group.
        Nothing pending: NONE and nothing written (replaying such a marker would change
        nothing). A marker whose epoch is below that of the pending offsets is refused with
        INVALID_PRODUCER_EPOCH (KIP-98: the partition leader's check on a marker).
        An append error is returned as is, e.g. KAFKA_STORAGE_ERROR (the transaction
        coordinator retries the marker; NOT_COORDINATOR once the manager is broken)."""
        gate = self._gate()
        if gate is not None:
            return gate
        newest = self._pending_epoch(producer_id)
        if newest is None:
            return E.none
        if producer_epoch < newest:
            return E.invalid_producer_epoch
        try:
            groups = self.store.end_transaction(producer_id, producer_epoch, commit, now_ms,
                                                coordinator_epoch)
        except GroupLogWriteError as e:
            self._failed(e, f"{'commit' if commit else 'abort'} marker of producer {producer_id}")
            # As a partition writer answers a marker it cannot append (the transaction
            # coordinator retries KAFKA_STORAGE_ERROR like Kafka's marker channel manager).
            return e.code
        log.debug("producer %d: transactional offsets of %s %s", producer_id, groups,
                  "committed" if commit else "aborted")
        return E.none

    # -- OffsetFetch ------------------------------------------------------------------------------
    def fetch_offsets(self, group_id: str, partitions: Sequence[TopicPartition] | None,
                      require_stable: bool = False) -> list[OffsetPartition]:
        """OffsetFetch for one group: the committed offset of each partition asked for (None =
        every partition with a committed offset, sorted). With ``require_stable`` (v7+,
        KIP-447) a partition with pending transactional offsets gets UNSTABLE_OFFSET_COMMIT
        (offset -1); without it, the last committed offset, pending ones ignored. When the
        manager is unavailable every partition asked for carries that error (see
        ``unavailable``; with None, the answer is [])."""
        gate = self._gate()
        committed = self.store.offsets.get(group_id, {})
        if partitions is None:
            if gate is not None:
                return []
            partitions = sorted(committed)
        elif gate is not None:
            return [OffsetPartition(t, p, -1, -1, "", gate) for t, p in partitions]
        pending = self._pending_partitions(group_id) if require_stable else set()
        out = []
        for t, p in partitions:
            if (t, p) in pending:
                out.append(OffsetPartition(t, p, -1, -1, "", E.unstable_offset_commit))
                continue
            e = committed.get((t, p))
            if e is None:
                out.append(OffsetPartition(t, p, -1, -1, "", E.none))
            else:
                out.append(OffsetPartition(t, p, e.offset, e.leader_epoch, e.metadata, E.none))
        return out

    def _pending_partitions(self, group_id: str) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for pid in self.store.open_producers.get(group_id, ()):
            out.update(self.store.pending[pid][group_id])
        return out

    # -- queries ----------------------------------------------------------------------------------
    def has_pending(self, group_id: str) -> bool:
        """Whether a transaction holds pending offsets of the group."""
        return group_id in self.store.open_producers

    def pending_producers(self, group_id: str) -> set[int]:
        """The producer ids with pending offsets in the group."""
        return set(self.store.open_producers.get(group_id, ()))

    def pending_producer_ids(self) -> set[int]:
        """Every producer id with pending offsets (in any group)."""
        return set(self.store.pending)

    def has_offsets(self, group_id: str) -> bool:
        """Committed or pending offsets exist (Kafka's GroupMetadata.hasOffsets)."""
        return group_id in self.store.offsets or group_id in self.store.open_producers

    def groups_with_offsets(self) -> set[str]:
        return set(self.store.offsets) | set(self.store.open_producers)

    def committed(self, group_id: str) -> dict[TopicPartition, OffsetEntry]:
        """The committed offsets of a group (read-only view)."""
        return self.store.offsets.get(group_id, {})

    def stored_group(self, group_id: str) -> GroupRecord | None:
        e = self.store.groups.get(group_id)
        return None if e is None else e.record

    # -- group metadata ---------------------------------------------------------------------------
    def store_group(self, group_id: str, record: GroupRecord | None, now_ms: int) -> ErrorCode:
        """Persist the group's metadata (Kafka's storeGroup), or its tombstone (None; nothing
        is written when none is stored). Durable on NONE."""
        gate = self._gate()
        if gate is not None:
            return gate
        if record is None and group_id not in self.store.groups:
            return E.none
        return self._stored(lambda: self.store.store_group(group_id, record, now_ms),
                            f"metadata of group {group_id!r}")

    def store_consumer_group(self, group_id: str, changes: list, now_ms: int,
                             classic: GroupRecord | None | bool = False) -> ErrorCode:
        """Persist a KIP-848 consumer group's changed records (``consumer_records``; None values
        are tombstones) in one batch, with the group's classic record (or its tombstone; False:
        none) when it changes type (``store.GroupStore.store_consumer``). Durable on NONE;
        failures map as ``store_group``'s."""
        gate = self._gate()
        if gate is not None:
            return gate
        if classic is None and group_id not in self.store.groups:
            classic = False                          # no classic record to delete
        return self._stored(lambda: self.store.store_consumer(group_id, changes, now_ms, classic),
                            f"records of consumer group {group_id!r}")

    def _stored(self, write, what: str) -> ErrorCode:
        """``write()`` of group records, its failure mapped as Kafka's storeGroup maps it."""
        try:
            write()
        except GroupLogWriteError as e:
            self._failed(e, what)
            return store_group_error(e.code)
        except ValueError as e:                      # a string longer than a record can hold
            log.error("%s cannot be encoded: %s", what, e)
            return E.unknown_server_error
        return E.none

    def consumer_group_records(self) -> dict:
        """group -> {ConsumerKey: value} of every stored KIP-848 consumer group (for load)."""
        return {g: {k: e.value for k, e in by_key.items()}
                for g, by_key in self.store.consumer.items()}

    # -- deletion ---------------------------------------------------------------------------------
    def delete_group(self, group_id: str, now_ms: int) -> ErrorCode:
        """DeleteGroups (after the caller's checks: the group is empty): tombstones for every
        committed offset, every partition with only pending offsets (which the tombstones
        cancel, as Kafka's OffsetMetadataManager.deleteAllOffsets) and the stored metadata."""
        gate = self._gate()
        if gate is not None:
            return gate
        tps = set(self.store.offsets.get(group_id, ())) | self._pending_partitions(group_id)
        drop_group = group_id in self.store.groups
        if not tps and not drop_group:
            return E.none
        try:
            self.store.delete({group_id: (sorted(tps), drop_group)}, now_ms)
        except GroupLogWriteError as e:
            self._failed(e, f"deletion of group {group_id!r}")
            return store_group_error(e.code)
        return E.none

    def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition], now_ms: int
                       ) -> dict[TopicPartition, ErrorCode]:
        """OffsetDelete (GROUP_SUBSCRIBED_TO_TOPIC is the caller's check): a tombstone for each
        partition with a committed or pending offset; every partition answers NONE."""
        gate = self._gate()
        if gate is not None:
            return {tp: gate for tp in partitions}
        present = set(self.store.offsets.get(group_id, ())) | self._pending_partitions(group_id)
        doomed = sorted({tp for tp in partitions if tp in present})
        result = {tp: E.none for tp in partitions}
        if doomed:
            try:
                self.store.delete({group_id: (doomed, False)}, now_ms)
            except GroupLogWriteError as e:
                self._failed(e, f"offset deletion in group {group_id!r}")
                code = _commit_error(e.code)
                result = {tp: code for tp in partitions}
        return result

    # -- expiration -------------------------------------------------------------------------------
    def expire_offsets(self, now_ms: int, retention_ms: int, group_is_empty: Callable[[str], bool],
                       *, empty_since: Callable[[str], int | None] | None = None,
                       subscribed_topics: Callable[[str], "set[str] | None"] | None = None
                       ) -> ExpireResult:
        """Kafka's offsets.retention.minutes cleanup (KIP-211), run periodically
        (offsets.retention.check.interval.ms).

        ``group_is_empty(group)``: the group is in state Empty (True for a group the membership
        side does not know: a standalone consumer's). Offsets of a non-empty group never expire,
        except (KIP-496, optional ``subscribed_topics(group)`` returning the topics a Stable
        consumer-protocol group subscribes to, or None) those of topics it no longer
        subscribes to, counted from their commit. For an empty group an offset expires when
        ``now - base >= retention_ms`` where base is the time the group became empty:
        ``empty_since(group)`` if given and not None, else the stored metadata's
        current_state_timestamp when the group has a protocol type (the membership side stores
        the group when it becomes Empty, as Kafka does), else (standalone commits, old records)
        the commit timestamp. An offset written with an explicit expire timestamp (OffsetCommit
        v2-v4) expires at that time instead. A partition with pending transactional offsets
        keeps its offset (OffsetMetadataManager.cleanupExpiredOffsets).

        Then a group that is empty with no offset and no pending offset left is deleted: its
        stored metadata gets a tombstone (Kafka's cleanupGroupMetadata) and it is listed in
        ``deleted_groups``. Tombstones go out as one batch per group with one fdatasync; on a
        write error the cleanup stops (Kafka: retried at the next run)."""
        if self._gate() is not None:
            return ExpireResult({}, [])
        store = self.store
        deletions: dict[str, tuple[list[TopicPartition], bool]] = {}
        expired: dict[str, list[TopicPartition]] = {}
        deleted: list[str] = []
        for group in sorted(set(store.offsets) | set(store.groups) | set(store.open_producers)):
            committed = store.offsets.get(group, {})
            pending = self._pending_partitions(group)
            gentry = store.groups.get(group)
            record = gentry.record if gentry is not None else None
            empty = group_is_empty(group)
            doomed: list[TopicPartition] = []
            if empty:
                base_fixed: int | None = empty_since(group) if empty_since is not None else None
                if base_fixed is None and record is not None and record.protocol_type \
                        and record.current_state_timestamp >= 0:
                    base_fixed = record.current_state_timestamp
                for tp, e in committed.items():
                    if tp in pending:
                        continue
                    if e.expire_timestamp != -1:
                        gone = now_ms >= e.expire_timestamp
                    else:
                        base = base_fixed if base_fixed is not None else e.commit_timestamp
                        gone = now_ms - base >= retention_ms
                    if gone:
                        doomed.append(tp)
            elif subscribed_topics is not None:
                topics = subscribed_topics(group)
                if topics is not None:
                    for tp, e in committed.items():
                        if tp[0] in topics or tp in pending:
                            continue
                        if e.expire_timestamp != -1:
                            gone = now_ms >= e.expire_timestamp
                        else:
                            gone = now_ms - e.commit_timestamp >= retention_ms
                        if gone:
                            doomed.append(tp)
            dead = empty and len(doomed) == len(committed) and not pending
            if doomed or (dead and record is not None):
                deletions[group] = (sorted(doomed), dead and record is not None)
            if doomed:
                expired[group] = sorted(doomed)
            if dead:
                deleted.append(group)
        if deletions:
            try:
                store.delete(deletions, now_ms)
            except GroupLogWriteError as e:
                self._failed(e, "offset expiration")
                # what was written is applied; report only that
                expired = {g: tps for g, tps in expired.items()
                           if not any(tp in store.offsets.get(g, {}) for tp in tps)}
                deleted = [g for g in deleted
                           if g not in store.offsets and g not in store.groups]
        if expired:
            log.info("expired %d offsets of %d groups", sum(map(len, expired.values())), len(expired))
        return ExpireResult(expired, deleted)

    # -- closing ----------------------------------------------------------------------------------
    def close(self, clean: bool = True) -> None:
        self.store.close(clean)
