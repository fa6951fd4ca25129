"""Partition: one partition as its writer holds it, and the leader's requests that are log
operations (Kafka's ``kafka.cluster.Partition`` for a single replica).

Owned by the partition's writer process (``workers/partition_writer.py``, single-threaded). The
state object its decisions share: the ``PartitionLog`` (segments, indexes, log start) and the
``ProducerStateManager`` (sequence windows, open transactions, LSO), plus the KIP-939 fences.
Its collaborators, each in its own module and each given this object (or its producer state):

* ``verification.TransactionVerifier``: KIP-890 park / ask / verified / expire;
* ``markers.MarkerWriter``: COMMIT/ABORT markers, their order against the aborted-transaction
  index and the producer state, and the undo on a full disk;
* ``group_commit.GroupCommit``: when an ack may leave (after the publish, after the fsync).

Served here (``@serves``; the writer's registry holds this object beside the writer): KIP-939
fences, DescribeProducers and the cleaner's begin, which answer from this state alone. DeleteRecords
and the cleaner's swap are methods that answer and say whether the page must be published again
(the writer carries that out). Nothing here touches a ring, a bell or the state page.

Share groups (KIP-932), next: the per-partition share state (Kafka's ``SharePartition``: the
acquired offset ranges, their acquisition locks and delivery counts, the share-partition start
offset) is owned by this partition's writer. It goes in ``appliance/log/share_partition.py``, one
``SharePartition`` per share group, held in ``Partition.share_partitions`` (by group id), and is
served here beside the requests above (acquisitions for ShareFetch, ShareAcknowledge, lock
expiry as a timer of the writer's turn); its persistence (Kafka's share-group state topic) is
the coordinator's.
"""

from __future__ import annotations

import logging

from appliance import ipc
from appliance.errors import ErrorCode
from appliance.log import swap
from appliance.log.cleaner import messages as cm
from appliance.durable import DeferredSync, is_no_space
from appliance.log.partition_log import PartitionLog
from appliance.log.producer_state import ProducerStateManager, snapshot_path
from appliance.topic_config import LogSettings
from appliance.log.txn_index import AbortedTxn
from appliance.service import serves

__all__ = ["Partition", "load_producer_state"]

log = logging.getLogger("appliance.writer")

# Topic configs whose change is enforced at once (a smaller retention.ms deletes its segments
# now, not at the next retention check); the others apply to what follows.
ENFORCED_AT_ONCE = {"retention_ms", "retention_bytes", "segment_ms", "cleanup_policy",
                    "max_compaction_lag_ms"}


def load_producer_state(lg: PartitionLog, psm: ProducerStateManager, now_ms: int) -> int:
    """Producer state for a just-opened log: the newest snapshot plus a replay of the batches
    after it, which also rebuilds the aborted-transaction index of the segments recovery had to
    scan; then a snapshot at every roll. Returns the offset the replay started from."""
    rebuild_from = lg.txn_index_rebuild_from

    def rebuilt(done, lso):
        if done.aborted and done.last_offset >= rebuild_from:
            lg.append_aborted(AbortedTxn(done.producer_id, done.first_offset,
                                         done.last_offset, lso))

    # Replay must start at or below the first segment whose index recovery dropped, or the
    # entries of its aborts would never come back.
    replayed_from = psm.load(lg.log_end_offset, lg.headers_from, now_ms,
                             on_completed=rebuilt, max_start_offset=rebuild_from)
    lg.finish_txn_index_rebuild()
    # Producer snapshots at each roll (Kafka's onSegmentRolled), so that a recovery
    # replays from the newest segment rather than from an older snapshot.
    # At a roll the recovery point's checkpoint comes right after and fsyncs the directory.
    lg.roll_listener = lambda offset: psm.take_snapshot(offset, sync_dir=False)
    return replayed_from


class Partition:
    """One partition's log and producer state, and the requests answered from them alone."""

    def __init__(self, topic: str, index: int, lg: PartitionLog,
                 psm: ProducerStateManager) -> None:
        self.topic = topic
        self.index = index
        self.log = lg
        self.psm = psm
        # KIP-939: producer id -> lowest epoch whose data batches are taken (FenceProducerRequest),
        # until a marker of the producer lands (MarkerWriter). Read by the writer's fast path.
        self.fenced: dict[int, int] = {}
        # KIP-932 (next): share group id -> SharePartition (see the module docstring).
        self.share_partitions: dict[str, object] = {}
        self._tick_problem: str | None = None

    def last_stable_offset(self) -> int:
        """The LSO to publish: never below the log start (Kafka's
        maybeIncrementFirstUnstableOffset): DeleteRecords may move it past the start of an open
        transaction."""
        lg = self.log
        return max(self.psm.last_stable_offset(lg.log_end_offset), lg.log_start_offset)

    # -- requests answered from this state --------------------------------------------------------
    @serves(ipc.FenceProducerRequest)
    def fence(self, msg: ipc.FenceProducerRequest) -> None:
        if msg.producer_epoch > self.fenced.get(msg.producer_id, -1):
            self.fenced[msg.producer_id] = msg.producer_epoch

    @serves(ipc.DescribeProducersRequest)
    def describe_producers(self, msg: ipc.DescribeProducersRequest) -> ipc.DescribeProducersResult:
        return ipc.DescribeProducersResult(ErrorCode.none, [
            ipc.ProducerInfo(e.producer_id, e.epoch, e.last_seq, e.last_timestamp,
                             e.coordinator_epoch, e.txn_first_offset)
            for e in self.psm.active()])

    # -- the cleaner (appliance.log.cleaner: it reads and writes copies; the swap is ours) --------
    @serves(cm.CleanerBeginRequest)
    def cleaner_begin(self, req: cm.CleanerBeginRequest) -> cm.CleanerBeginResult:
        if req.cursor < 0:
            # A copy no swap of ours named: its cleaner died, or gave up, while writing it.
            swap.remove_cleaned(self.log.directory)
        items = sorted((e.producer_id, e.last_offset if e.batches else -1, e.epoch)
                       for e in self.psm.active() if e.producer_id > req.cursor)
        page = items[:cm.PRODUCERS_PER_ANSWER]
        more = page[-1][0] if len(items) > len(page) else -1
        return cm.CleanerBeginResult(ErrorCode.none, cm.pack_producers(page), more)

    def cleaner_swap(self, req: cm.CleanerSwapRequest,
                     delete_delay_s: float) -> tuple[cm.CleanerSwapResult, bool]:
        """Swap a cleaned copy in (``PartitionLog.replace_segments``); (the answer, whether the
        segments changed: readers re-list at the new segments_version). A full disk at the
        commit changes nothing and answers KAFKA_STORAGE_ERROR (the cleaner tries again after
        its back-off; the writer lives on, as for a produce on a full disk); after the commit
        nothing needs space. Another failure after the commit point is an OSError that stops
        the writer (its ``contain`` is off): the restart's open finishes the swap."""
        try:
            self.log.replace_segments([(base, [tuple(x) for x in old]) for base, old in req.groups],
                                      req.checkpoint, delete_delay_s)
        except swap.SwapNoSpace as e:
            log.warning("%s-%d: cleaned copies not swapped in: %s", self.topic, self.index, e)
            return cm.CleanerSwapResult(ErrorCode.kafka_storage_error, str(e)), False
        except swap.SwapRefused as e:
            log.info("%s-%d: cleaned copies refused: %s", self.topic, self.index, e)
            return cm.CleanerSwapResult(ErrorCode.invalid_request, str(e)), False
        return cm.CleanerSwapResult(ErrorCode.none), True

    # -- DeleteRecords ------------------------------------------------------------------------------
    def delete_records(self, req_offset: int) -> tuple[ipc.DeleteRecordsResult, bool]:
        """Kafka's Partition.deleteRecordsOnLeader: -1 means the high watermark; an offset past
        it is OFFSET_OUT_OF_RANGE; one below the log start changes nothing. The answer is the
        log start offset after it (the low watermark); the flag says whether the log start
        moved (the page is to be published at once)."""
        if not self.log.settings.delete:
            # Kafka's Partition.deleteRecordsOnLeader: only a log whose policy deletes.
            return ipc.DeleteRecordsResult(
                ErrorCode.policy_violation, -1,
                f"Records of partition {self.topic}-{self.index} can not be deleted due "
                f"to the configured policy"), False
        hw = self.log.log_end_offset
        offset = hw if req_offset == -1 else req_offset
        if offset < 0 or offset > hw:
            return ipc.DeleteRecordsResult(
                ErrorCode.offset_out_of_range, -1,
                f"Cannot increment the log start offset to {offset} of partition "
                f"{self.topic}-{self.index} since it is larger than the high watermark {hw}"
                if offset > hw else f"The offset {offset} is not valid"), False
        try:
            moved = self.log.delete_records(offset)
        except OSError as e:
            # The new log start could not be persisted (a full disk): nothing changed.
            return ipc.DeleteRecordsResult(ErrorCode.kafka_storage_error, -1,
                                           f"cannot persist the log start offset: {e}"), False
        if moved:
            log.info("%s-%d: records below %d deleted (DeleteRecords)", self.topic,
                     self.index, offset)
        return ipc.DeleteRecordsResult(ErrorCode.none, self.log.log_start_offset), moved

    # -- retention, rolls, settings ------------------------------------------------------------------
    def tick(self, now_ms: int) -> bool:
        """Retention, the time-based roll and producer-id expiry; whether segments went or
        rolled (the page is to be published). A full disk (or a failed checkpoint write): both
        are tried again at the next tick; appends meanwhile answer KAFKA_STORAGE_ERROR."""
        changed = False
        try:
            changed = self.log.enforce_retention(now_ms)
            changed = self.log.maybe_roll(now_ms) or changed
        except OSError as e:
            self._tick_trouble(str(e))
        else:
            self._tick_trouble(None)
        self.psm.expire(now_ms)
        return changed

    def _tick_trouble(self, problem: str | None) -> None:
        """Log a failing retention/roll once, and once when it works again."""
        if problem is not None and self._tick_problem is None:
            log.warning("%s-%d: retention or time-based roll failed (tried again each tick): %s",
                        self.topic, self.index, problem)
        elif problem is None and self._tick_problem is not None:
            log.info("%s-%d: retention and rolls work again", self.topic, self.index)
        self._tick_problem = problem

    def update_settings(self, new: LogSettings) -> bool:
        """Apply the topic's changed effective configs: segment size and index interval to the
        active segment, the rest to what follows. True when a changed retention (or roll,
        policy) is to be enforced now (``tick``)."""
        old = self.log.settings
        if new == old:
            return False
        changed = {f: getattr(new, f) for f in new.__struct_fields__
                   if getattr(new, f) != getattr(old, f)}
        log.info("%s-%d: settings changed: %s", self.topic, self.index,
                 ", ".join(f"{k}={v}" for k, v in changed.items()))
        self.log.update_settings(new)
        return bool(changed.keys() & ENFORCED_AT_ONCE)

    # -- closing --------------------------------------------------------------------------------
    def close(self, deleted: bool = False, deferred: DeferredSync | None = None) -> None:
        """Snapshot (no replay after a clean stop) and seal the log. On a full disk both are
        given up, never the stop: the next open replays and recovers the tail, as after a crash
        (the log itself is already in the page cache). A partition whose topic was deleted lets
        its files go as a crash would: the supervisor removes them, so the snapshot, the seal and
        their fsyncs (five a partition) would be work thrown away, and a DeleteTopics of 10,000
        partitions spent minutes in them. ``deferred``: the fsyncs and the clean-shutdown marker
        are left to it (``PartitionLog.close``)."""
        if deleted:
            self.log.close(clean=False)
            return
        try:
            # No directory fsync of its own: the seal's, next, makes the snapshot's name
            # durable before the clean-shutdown marker exists.
            offset = self.log.log_end_offset
            wrote = self.psm.take_snapshot(offset, sync_dir=False, unless_present=True,
                                           sync=deferred is None)
            if wrote and deferred is not None:
                deferred.file(snapshot_path(self.psm.directory, offset))
            self.log.close(clean=True, deferred=deferred)
        except OSError as e:
            if not is_no_space(e):
                raise
            log.warning("%s-%d: file system full at stop: closing without the clean-shutdown "
                        "marker (the next start recovers the tail)", self.topic, self.index)
