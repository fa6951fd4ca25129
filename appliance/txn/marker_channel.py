"""Transaction markers: Kafka's TransactionMarkerChannelManager (and the handling of each answer,
its TransactionMarkerRequestCompletionHandler), for one node.

Runs in the coordinator worker (``workers/coordinator.py``), single-threaded; created by the
transaction coordinator's ``EndTxnHandler`` (``appliance.txn.end_txn``: it adds the jobs and
logs Complete* when they are done; ``TransactionCoordinator.markers``), and attached by the
worker to its rings (``attach``: the writers' links and the group log, injected, so that this
module is tested without processes). Owns the marker jobs and their delivery: which marker went
to which writer under which request id, when to send it again, and the KIP-939 fences.

Jobs
----
After PrepareCommit/PrepareAbort is logged the coordinator adds a job (``add_job``): producer id,
producer epoch, commit, coordinator epoch, partitions. The transaction keeps the pending state
Complete* until every partition has answered, so requests meanwhile get CONCURRENT_TRANSACTIONS
(as in Kafka, where the pending transition is set as soon as the markers are queued).
``take_marker_jobs`` hands out the new jobs and, under the same job id, the partitions whose retry
is due; ``on_marker_result(job_id, partition, error)`` takes each answer (idempotent: the first
NONE counts; anything for a finished partition or an unknown job id is ignored):

- NONE -> done. UNKNOWN_TOPIC_OR_PARTITION (the partition does not exist any more: Kafka skips
  partitions without a leader, "likely deleted"), UNSUPPORTED_VERSION,
  UNSUPPORTED_FOR_MESSAGE_FORMAT -> dropped from the job.
- INVALID_PRODUCER_EPOCH -> the job is abandoned (Kafka: "producer epoch has changed, this txn can
  now be ignored"); the transaction stays Prepare* and the coordinator's periodic scan starts a
  new job for it (a coordinator re-drives every Prepare* transaction it finds without markers
  in flight, as Kafka does after loading).
- TRANSACTION_COORDINATOR_FENCED -> a newer coordinator exists: every job is dropped and the
  coordinator is told (it answers NOT_COORDINATOR and restarts).
- anything else (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS*, REQUEST_TIMED_OUT,
  KAFKA_STORAGE_ERROR, and the ones Kafka treats as fatal bugs) -> retried after
  ``retry_backoff_ms`` (ours: never drop a partition on an error that might be transient).

When every partition is done the coordinator logs CompleteCommit/CompleteAbort (``on_complete``);
if that append fails, ``retry_completions`` (the coordinator's tick) tries again.

Delivery
--------
Each (job, partition) becomes a ``WriteMarkerRequest`` on the ring to that partition's writer,
under a fresh request id per post (a late answer to an earlier id is ignored). A marker is sent
again when the writer that took it from the ring died before answering: its generation changed
and the message ends at or before the ring head the new generation started from
(``coordinator_ring_head`` in the writer's state page, published before it takes anything). A
message still in the ring, or still queued in the outbox, is left to the new writer: resending
it too would append the marker twice. A duplicate marker is harmless to readers (Kafka's
coordinator resends markers after a failover too) but moves offsets, so it is kept to the case
where the first may or may not be in the log. As a last resort, a marker a live writer took
(the ring head passed it) and has not answered ``MARKER_RESEND_S`` after the post is sent again;
one not taken yet only pushes its deadline on (the writer is busy).

Markers for the ``__consumer_offsets`` partitions (added by AddOffsetsToTxn) never leave the
coordinator: the offsets live in its own group log, where the marker is a control record written
at once (``offsets_marker``: the producer's pending transactional offsets become committed or
vanish), as Kafka's group coordinator completes transactional offsets when the marker reaches its
offsets partition.

KIP-939 fences (ours): a transaction kept open by InitProducerId(keepPreparedTxn) still holds its
producer id and epoch on its partitions; each of their writers gets a ``FenceProducerRequest`` so
that it refuses the data batches of earlier incarnations, again whenever the writer restarted (the
fence lives in the writer's memory) and whenever the kept transactions changed.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple, Protocol

from appliance import ipc
from appliance.catalog.model import OFFSETS_TOPIC
from appliance.errors import ErrorCode

__all__ = ["TransactionMarkerChannelManager", "MarkerJob", "WriterLink", "MARKER_RESEND_S"]

log = logging.getLogger("appliance.txn.markers")

E = ErrorCode
Partition = tuple[str, int]
MARKER_RESEND_S = 15.0     # a marker taken by a live writer and never answered (last resort)

_DROP_PARTITION = frozenset({E.unknown_topic_or_partition, E.unsupported_version,
                             E.unsupported_for_message_format})


class MarkerJob(NamedTuple):
    """The markers of one transaction's end, for ``partitions``: all of the job's when it is
    added, the ones due when retried, none when handed to ``on_complete``."""
    job_id: int
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: list[Partition]


@dataclass(slots=True)
class _Job:
    """A job in flight: its markers (``marker``, every partition of the job) and the partitions
    that have not answered yet."""
    marker: MarkerJob
    pending: set[Partition]                                  # not acknowledged yet
    retry_at: dict[Partition, int] = field(default_factory=dict)
    complete_failed: bool = False                            # Complete* append to retry

    def markers_for(self, partitions: Iterable[Partition]) -> MarkerJob:
        return self.marker._replace(partitions=sorted(partitions))


class WriterLink(Protocol):
    """The coordinator's end of one partition writer (the worker's ``WriterLink``): the ring and
    page of the writer process that carries the partition, and the partition (``topic_id``,
    ``partition``) every message to it names."""

    name: str
    topic_id: bytes
    partition: int

    def state(self):
        """The writer's state page now: ``generation`` and ``coordinator_ring_head``."""

    def post(self, raw: bytes) -> int:
        """Put a record on the ring to the writer; its end position, or -1 if it was queued."""

    def is_queued(self, raw: bytes) -> bool:
        """Whether the record posted as this very object still waits in the outbox."""

    def consumed(self) -> int:
        """The ring's head: how far the writer has taken records."""


@dataclass
class SentMarker:
    job_id: int
    partition: Partition
    writer: str
    msg: ipc.WriteMarkerRequest
    # Set by each (re)post, _post:
    generation: int = 0     # the writer's generation when posted (or since seen to take over)
    deadline: float = 0.0
    raw: bytes = b""        # the posted record (identity: is it still in the outbox queue?)
    end: int = -1           # ring position just past it, -1 while unknown (it was queued)


class TransactionMarkerChannelManager:
    def __init__(self, now_ms: Callable[[], int], *,
                 on_complete: Callable[[MarkerJob], bool],
                 on_abandoned: Callable[[str], None],
                 on_fenced: Callable[[], None],
                 kept_fences: Callable[[], list[tuple[int, int, list[Partition]]]],
                 retry_backoff_ms: int = 100) -> None:
        """``on_complete(job)``: every partition answered; log Complete*, True when the job is
        finished (False: retry later). ``on_abandoned(transactional_id)``: the job was dropped
        on INVALID_PRODUCER_EPOCH. ``on_fenced()``: a newer coordinator exists.
        ``kept_fences()``: (producer id, lowest epoch allowed, partitions) of every transaction
        kept by InitProducerId(keepPreparedTxn)."""
        self._now = now_ms
        self._on_complete = on_complete
        self._on_abandoned = on_abandoned
        self._on_fenced = on_fenced
        self._kept_fences = kept_fences
        self.retry_backoff_ms = retry_backoff_ms
        self._jobs: dict[int, _Job] = {}
        self._job_of: dict[str, int] = {}                    # transactional id -> job id
        self._outbox: list[MarkerJob] = []
        self._retrying: set[int] = set()                     # job ids with partitions to retry
        self._job_ids = itertools.count(1)
        self.coordinator_fenced = False
        # Delivery, once attached:
        self._writer_for: Callable[[Partition], WriterLink | None] = lambda p: None
        self._offsets_marker: Callable[[int, int, bool, int], ErrorCode] | None = None
        self._ids = itertools.count(1)
        self.sent: dict[int, SentMarker] = {}                # request id -> marker in flight
        # KIP-939 fences sent: (partition, producer id) -> (writer generation, epoch)
        self.fenced: dict[tuple[Partition, int], tuple[int, int]] = {}
        self.fences_due = False

    def attach(self, writer_for: Callable[[Partition], WriterLink | None],
               offsets_marker: Callable[[int, int, bool, int], ErrorCode], first_id: int) -> None:
        """Connect to the rings: ``writer_for(partition)`` is the writer's link (None when the
        partition does not exist), ``offsets_marker(producer id, epoch, commit, coordinator
        epoch)`` writes a marker into the group log; request ids count from ``first_id``."""
        self._writer_for = writer_for
        self._offsets_marker = offsets_marker
        self._ids = itertools.count(first_id)

    # -- jobs -------------------------------------------------------------------------------------
    def add_job(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
                coordinator_epoch: int, partitions: Iterable[Partition]) -> None:
        pending = set(partitions)
        job = _Job(MarkerJob(next(self._job_ids), transactional_id, producer_id, producer_epoch,
                             commit, coordinator_epoch, sorted(pending)), pending)
        self._jobs[job.marker.job_id] = job
        self._job_of[transactional_id] = job.marker.job_id
        if job.pending:
            self._outbox.append(job.markers_for(job.pending))
        else:
            self._complete(job)          # no partitions: straight to Complete* (as Kafka)

    def has_job(self, transactional_id: str) -> bool:
        return transactional_id in self._job_of

    def take_marker_jobs(self) -> list[MarkerJob]:
        """Jobs added since the last call, plus partitions of earlier jobs whose retry is due
        (as MarkerJobs with the same job id and only those partitions)."""
        if self.coordinator_fenced:
            self._outbox.clear()
            return []
        out, self._outbox = self._outbox, []
        if self._retrying:
            now = self._now()
            for job_id in list(self._retrying):
                job = self._jobs.get(job_id)
                if job is None:
                    self._retrying.discard(job_id)
                    continue
                due = [p for p, t in job.retry_at.items() if t <= now]
                for p in due:
                    del job.retry_at[p]
                if not job.retry_at:
                    self._retrying.discard(job_id)
                if due:
                    out.append(job.markers_for(due))
        return out

    def next_retry_due_ms(self) -> int | None:
        """When the earliest marker retry is due (for the worker's sleep), or None."""
        due = [t for jid in self._retrying if (job := self._jobs.get(jid)) for t in job.retry_at.values()]
        return min(due) if due else None

    def on_marker_result(self, job_id: int, partition: Partition, error: ErrorCode | int) -> None:
        """The answer of one partition to one marker (see the module docstring for what each
        error means)."""
        job = self._jobs.get(job_id)
        if job is None or partition not in job.pending or self.coordinator_fenced:
            return                                           # stale or duplicate answer
        try:
            error = E(int(error))
        except ValueError:
            error = E.unknown_server_error
        if error == E.none or error in _DROP_PARTITION:
            if error != E.none:
                log.info("marker for %r dropped on %s-%d: %s", job.marker.transactional_id,
                         partition[0], partition[1], error.name)
            job.pending.discard(partition)
            job.retry_at.pop(partition, None)
            if not job.pending:
                self._complete(job)
        elif error == E.transaction_coordinator_fenced:
            log.error("coordinator epoch %d fenced by %s-%d: a newer coordinator exists; stopping",
                      job.marker.coordinator_epoch, partition[0], partition[1])
            self.coordinator_fenced = True
            self._jobs.clear()
            self._job_of.clear()
            self._retrying.clear()
            self._outbox.clear()
            self._on_fenced()
        elif error == E.invalid_producer_epoch:
            m = job.marker
            log.warning("marker for %r (producer %d epoch %d) refused by %s-%d: %s; job abandoned",
                        m.transactional_id, m.producer_id, m.producer_epoch, partition[0],
                        partition[1], error.name)
            self._drop_job(job)
            self._on_abandoned(job.marker.transactional_id)
        else:
            if partition not in job.retry_at:
                job.retry_at[partition] = self._now() + self.retry_backoff_ms
                self._retrying.add(job.marker.job_id)

    def retry_completions(self) -> None:
        """Log Complete* again for the jobs whose append failed."""
        for job in [j for j in self._jobs.values() if j.complete_failed and not j.pending]:
            job.complete_failed = False
            self._complete(job)

    def _complete(self, job: _Job) -> None:
        if self._on_complete(job.markers_for(())):
            self._drop_job(job)
        else:
            job.complete_failed = True

    def _drop_job(self, job: _Job) -> None:
        self._jobs.pop(job.marker.job_id, None)
        self._retrying.discard(job.marker.job_id)
        if self._job_of.get(job.marker.transactional_id) == job.marker.job_id:
            del self._job_of[job.marker.transactional_id]

    # -- delivery ---------------------------------------------------------------------------------
    def send_marker_jobs(self) -> None:
        """Post a marker for every (job, partition) due (each loop turn)."""
        for job in self.take_marker_jobs():
            for partition in job.partitions:
                self._send(job, partition)

    def _send(self, job: MarkerJob, partition: Partition) -> None:
        topic, _ = partition
        if topic == OFFSETS_TOPIC:
            # Pending transactional offsets live in the coordinator's group log: the marker is a
            # control record there, written now (KIP-98: the offsets partition gets its marker
            # like any other partition of the transaction).
            err = self._offsets_marker(job.producer_id, job.producer_epoch, job.commit,
                                       job.coordinator_epoch)
            self.on_marker_result(job.job_id, partition, err)
            return
        link = self._writer_for(partition)
        if link is None:
            self.on_marker_result(job.job_id, partition, E.unknown_topic_or_partition)
            return
        msg = ipc.WriteMarkerRequest(job.producer_id, job.producer_epoch, job.commit,
                                     job.coordinator_epoch, *_address(link))
        self._post(link, SentMarker(job.job_id, partition, link.name, msg), time.monotonic())

    def _post(self, link: WriterLink, s: SentMarker, now: float) -> None:
        """Post (again) under a fresh request id: a late answer to an earlier id is ignored."""
        req_id = next(self._ids)
        s.raw = ipc.encode(req_id, s.msg)
        s.generation = link.state().generation
        s.deadline = now + MARKER_RESEND_S
        self.sent[req_id] = s
        s.end = link.post(s.raw)

    def on_answer(self, req_id: int, answer: ipc.WriteMarkerResult) -> None:
        """A writer's answer to a marker."""
        s = self.sent.pop(req_id, None)
        if s is not None:
            self.on_marker_result(s.job_id, s.partition, answer.error)

    def check(self, now: float) -> None:
        """Resend the markers a dead writer took without answering (see the module docstring),
        and, as a last resort, those taken but unanswered long after the deadline."""
        for req_id, s in list(self.sent.items()):
            link = self._writer_for(s.partition)
            if link is None:
                del self.sent[req_id]
                self.on_marker_result(s.job_id, s.partition, E.unknown_topic_or_partition)
                continue
            page = link.state()
            if page.generation != s.generation:
                if link.is_queued(s.raw) or page.coordinator_ring_head < s.end:
                    s.generation = page.generation      # the new writer will take it and answer
                    continue
            elif now < s.deadline:
                continue
            elif link.is_queued(s.raw) or link.consumed() < s.end:
                s.deadline = now + MARKER_RESEND_S      # not taken yet: the writer is busy
                continue
            else:
                log.warning("%s took a marker (producer %d) %.0f s ago and has not answered: "
                            "sending it again", link.name, s.msg.producer_id, MARKER_RESEND_S)
            del self.sent[req_id]
            self._post(link, s, now)

    # -- KIP-939 fences ---------------------------------------------------------------------------
    def kept_changed(self) -> None:
        """A transaction was kept by InitProducerId(keepPreparedTxn): fence at the next turn."""
        self.fences_due = True

    def send_fences(self) -> None:
        """Tell the writers of every kept transaction's partitions to refuse the earlier
        incarnations' batches; again whenever a writer restarted."""
        self.fences_due = False
        live = set()
        for pid, epoch, partitions in self._kept_fences():
            for partition in partitions:
                link = self._writer_for(partition)
                if link is None:
                    continue
                key = (partition, pid)
                live.add(key)
                stamp = (link.state().generation, epoch)
                if self.fenced.get(key) != stamp:
                    self.fenced[key] = stamp
                    link.post(ipc.encode(0, ipc.FenceProducerRequest(pid, epoch,
                                                                     *_address(link))))
        for key in set(self.fenced) - live:
            del self.fenced[key]


def _address(link: WriterLink) -> tuple[bytes, int]:
    """The partition a message to ``link``'s writer names (its writer process carries many)."""
    return link.topic_id, link.partition
