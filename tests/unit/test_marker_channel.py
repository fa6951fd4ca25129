"""The TransactionMarkerChannelManager's delivery (appliance.txn.marker_channel), with the rings
replaced by fake writer links: when a marker is sent again (only if the writer that took it died,
or as a last resort long after a live writer took it), the __consumer_offsets markers that never
leave the coordinator, deleted partitions, and the KIP-939 fences."""

import time
from types import SimpleNamespace

import pytest

from appliance import ipc
from appliance.catalog.model import OFFSETS_TOPIC
from appliance.errors import ErrorCode as E
from appliance.txn.marker_channel import MARKER_RESEND_S, TransactionMarkerChannelManager


class Link:
    """A writer's end as the channel sees it: a ring (head = how far the writer took), an outbox
    queue for when the ring is full, and the writer's state page. It names no partition (the
    messages keep their defaults)."""

    topic_id = b""
    partition = -1

    def __init__(self, name: str) -> None:
        self.name = name
        self.generation = 1
        self.start_head = 0          # coordinator_ring_head of this generation
        self.ring: list[bytes] = []
        self.queue: list[bytes] = []
        self.tail = self.head = 0
        self.full = False

    def state(self):
        return SimpleNamespace(generation=self.generation, coordinator_ring_head=self.start_head)

    def post(self, raw: bytes) -> int:
        if self.full or self.queue:
            self.queue.append(raw)
            return -1
        self.ring.append(raw)
        self.tail += len(raw)
        return self.tail

    def is_queued(self, raw: bytes) -> bool:
        return any(r is raw for r in self.queue)

    def consumed(self) -> int:
        return self.head

    def drain_queue(self) -> None:
        self.full = False
        queued, self.queue = self.queue, []
        for raw in queued:
            self.post(raw)

    def take_all(self) -> list[tuple[int, ipc.Message]]:
        """The writer takes everything in the ring."""
        self.head = self.tail
        taken, self.ring = self.ring, []
        return [ipc.decode(raw) for raw in taken]

    def restart(self) -> None:
        """The writer dies and its successor starts reading where the ring's head is."""
        self.generation += 1
        self.start_head = self.head


class Env:
    def __init__(self) -> None:
        self.clock = 1_000
        self.completed: list = []
        self.abandoned: list = []
        self.fenced = False
        self.kept: list = []
        self.offsets_markers: list = []
        self.links = {("a", 0): Link("wa0"), ("b", 0): Link("wb0")}
        self.ch = TransactionMarkerChannelManager(
            lambda: self.clock, on_complete=self._complete, on_abandoned=self.abandoned.append,
            on_fenced=lambda: setattr(self, "fenced", True), kept_fences=lambda: self.kept)
        self.ch.attach(self.links.get, self._offsets_marker, first_id=100)

    def _complete(self, job) -> bool:
        self.completed.append(job.transactional_id)
        return True

    def _offsets_marker(self, pid, epoch, commit, coordinator_epoch):
        self.offsets_markers.append((pid, epoch, commit, coordinator_epoch))
        return E.none

    def start(self, tid="t", partitions=(("a", 0),)):
        self.ch.add_job(tid, 5, 2, True, 9, partitions)
        self.ch.send_marker_jobs()

    def answer(self, req_id, code=E.none):
        self.ch.on_answer(req_id, ipc.WriteMarkerResult(code))


@pytest.fixture
def env():
    return Env()


def later(seconds=0.0) -> float:
    return time.monotonic() + seconds


def test_a_marker_goes_to_its_writer_and_the_answer_completes_the_job(env):
    env.start(partitions=[("a", 0), ("b", 0)])
    (rid_a, msg), = env.links["a", 0].take_all()
    assert msg == ipc.WriteMarkerRequest(5, 2, True, 9)
    (rid_b, _), = env.links["b", 0].take_all()
    env.answer(rid_a)
    assert env.completed == []
    env.answer(rid_b)
    assert env.completed == ["t"] and env.ch.sent == {}


def test_a_marker_the_dead_writer_took_is_sent_again_under_a_new_request_id(env):
    link = env.links["a", 0]
    env.start()
    (old, _), = link.take_all()
    link.restart()                                     # took it, died before answering
    env.ch.check(later())
    (new, msg), = link.take_all()
    assert new != old and msg == ipc.WriteMarkerRequest(5, 2, True, 9)
    env.answer(old)                                    # a late answer to the first post
    assert env.completed == []
    env.answer(new)
    assert env.completed == ["t"]


def test_a_marker_still_in_the_ring_is_left_to_the_new_writer(env):
    link = env.links["a", 0]
    env.start()
    link.restart()                                     # died before taking it
    env.ch.check(later())
    assert len(link.ring) == 1                         # not posted twice: one marker in the log
    (rid, _), = link.take_all()
    env.ch.check(later())
    assert link.ring == []                             # the new generation took it: its to answer
    env.answer(rid)
    assert env.completed == ["t"]


def test_a_marker_still_queued_in_the_outbox_is_not_sent_again(env):
    link = env.links["a", 0]
    link.full = True
    env.start()
    assert len(link.queue) == 1
    link.restart()
    env.ch.check(later())
    link.drain_queue()
    assert len(link.ring) == 1


def test_a_marker_a_live_writer_took_and_never_answered_is_sent_again_after_the_deadline(env):
    link = env.links["a", 0]
    env.start()
    (old, _), = link.take_all()
    env.ch.check(later(MARKER_RESEND_S / 2))
    assert link.ring == []
    env.ch.check(later(MARKER_RESEND_S + 1))           # the last resort
    (new, _), = link.take_all()
    assert new != old


def test_a_marker_not_taken_by_the_deadline_only_waits_longer(env):
    link = env.links["a", 0]
    env.start()
    env.ch.check(later(MARKER_RESEND_S + 1))           # the writer is busy: deadline pushed on
    assert len(link.ring) == 1
    link.take_all()
    env.ch.check(later(MARKER_RESEND_S + 1))           # within the new deadline
    assert link.ring == []
    env.ch.check(later(2 * MARKER_RESEND_S + 2))
    assert len(link.ring) == 1


def test_a_deleted_partition_is_dropped_from_the_job(env):
    env.start(partitions=[("a", 0), ("gone", 0)])
    (rid, _), = env.links["a", 0].take_all()
    env.answer(rid)
    assert env.completed == ["t"]


def test_a_partition_deleted_while_its_marker_is_in_flight_is_dropped(env):
    env.start(partitions=[("a", 0), ("b", 0)])
    (rid, _), = env.links["a", 0].take_all()
    env.answer(rid)
    del env.links["b", 0]
    env.ch.check(later())
    assert env.completed == ["t"] and env.ch.sent == {}


def test_consumer_offsets_markers_are_written_to_the_group_log_not_sent(env):
    env.start(partitions=[(OFFSETS_TOPIC, 17)])
    assert env.offsets_markers == [(5, 2, True, 9)]
    assert env.completed == ["t"] and env.ch.sent == {}


def test_a_retriable_answer_is_retried_after_the_backoff(env):
    link = env.links["a", 0]
    env.start()
    (rid, _), = link.take_all()
    env.answer(rid, E.not_leader_or_follower)
    env.ch.send_marker_jobs()
    assert link.ring == []
    env.clock += env.ch.retry_backoff_ms
    env.ch.send_marker_jobs()
    (rid2, _), = link.take_all()
    env.answer(rid2)
    assert env.completed == ["t"]


def test_a_fenced_coordinator_drops_every_job_and_says_so(env):
    env.start("t1")
    env.start("t2", partitions=[("b", 0)])
    (rid, _), = env.links["a", 0].take_all()
    env.answer(rid, E.transaction_coordinator_fenced)
    assert env.fenced and not env.ch.has_job("t2") and env.ch.take_marker_jobs() == []


def test_a_stale_epoch_abandons_the_job(env):
    env.start()
    (rid, _), = env.links["a", 0].take_all()
    env.answer(rid, E.invalid_producer_epoch)
    assert env.abandoned == ["t"] and not env.ch.has_job("t") and env.completed == []


def test_kip939_fences_go_to_each_writer_once_per_generation(env):
    env.kept = [(5, 3, [("a", 0), ("b", 0), ("gone", 0)])]
    env.ch.kept_changed()
    assert env.ch.fences_due
    env.ch.send_fences()
    assert [m for _, m in env.links["a", 0].take_all()] == [ipc.FenceProducerRequest(5, 3)]
    assert [m for _, m in env.links["b", 0].take_all()] == [ipc.FenceProducerRequest(5, 3)]
    env.ch.send_fences()
    assert env.links["a", 0].ring == []                # nothing changed: not sent again
    env.links["a", 0].restart()                        # the fence lived in the dead writer
    env.ch.send_fences()
    assert [m for _, m in env.links["a", 0].take_all()] == [ipc.FenceProducerRequest(5, 3)]
    assert env.links["b", 0].ring == []
    env.kept = []
    env.ch.send_fences()
    assert env.ch.fenced == {}
