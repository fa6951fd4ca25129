"""GroupCommit: when a partition writer's answers may leave, and when its log is flushed.

Owned by the partition's writer process (``workers/partition_writer.py``; single-threaded). It
owns the answers the writer holds back and the flush policy's clock; it reads the durable offset
and the busy flag of the writer's ``Flusher`` (whose thread writes them) and never starts a
flush, posts an answer or publishes the page itself: its methods say what the writer is to do.

An answer waits for two things:

* the publish: an append's ack leaves only after the state page shows the append, so that a
  client that fetches what it was told is written finds it (Kafka moves the leader's log end
  offset before it answers; regression: a Fetch right after an acks=1 answer got
  OFFSET_OUT_OF_RANGE while the ring carried the ack ahead of the page). ``publish_due`` says the
  page is behind the log; the writer publishes once per drain of its rings and then posts
  ``held``. An answer that appended nothing is held too while a publish is due, so that a
  producer's answers stay in the order of its requests;
* the disk, for acks=-1 under a policy whose acks wait for an fdatasync (``log.flush.policy``
  ``batch`` or ``interval``; markers alike): ``waiting`` holds (end offset, peer, answer) until
  the flusher's durable offset reaches the end offset. A duplicate whose original is not durable
  yet waits as well: never ack more than the disk holds.

The group commit: a flush starts when answers wait for one (``batch``) or the interval came
(``interval``, also without waiting answers), never while one is running; the appends of its
fdatasync's time gather for the next one.

The policy is the partition's topic's (``policy_of``): its flush.messages and flush.ms, whose
defaults are ``[log.flush]``'s, so that one topic can ask for an fdatasync per batch while the
rest run on the OS's write-back. flush.messages=1 (or flush.ms=0) is ``batch``; a finite
flush.ms is ``interval``; a flush.messages above 1 also starts a flush once that many records
are not yet durable (Kafka's unflushedMessages check), without holding answers for it.

Per appended batch ``appended`` is the only call (the writer's fast path), with no allocation
beyond the held entry.
"""

from __future__ import annotations

from appliance.config import FlushPolicy

__all__ = ["GroupCommit", "policy_of"]

NEVER = 2**63 - 1


def policy_of(settings) -> tuple[FlushPolicy, float, int]:
    """(policy, interval in s, records threshold) of a topic's flush.messages and flush.ms
    (``LogSettings``; their defaults say what ``[log.flush]`` says)."""
    messages, ms = settings.flush_messages, settings.flush_ms
    if messages <= 1 or ms == 0:
        return FlushPolicy.BATCH, 1.0, NEVER
    if ms < NEVER:
        return FlushPolicy.INTERVAL, ms / 1000, messages
    return FlushPolicy.OS, 1.0, messages


class GroupCommit:
    __slots__ = ("flusher", "policy", "interval_s", "messages", "last_flush", "publish_due",
                 "held", "waiting")

    def __init__(self, policy: FlushPolicy, interval_s: float, now: float,
                 messages: int = NEVER) -> None:
        self.flusher = None          # the writer's Flusher, once its log is open
        self.policy = policy
        self.interval_s = interval_s
        self.messages = messages     # flush once this many records are not durable (NEVER: no)
        self.last_flush = now        # when the last flush started (monotonic s)
        self.publish_due = False     # something appended or changed that the page does not show
        self.held: list[tuple[str, bytes]] = []             # (peer, answer) after the publish
        self.waiting: list[tuple[int, str, bytes]] = []     # (end offset, peer, answer)

    def configure(self, policy: FlushPolicy, interval_s: float, messages: int = NEVER) -> bool:
        """New flush settings (a reload, the topic's flush configs changed). True: answers were
        promised an fdatasync that the new policy would no longer give them, flush now
        (synchronously)."""
        waited = self.policy.ack_waits_for_sync
        self.policy = policy
        self.interval_s = interval_s
        self.messages = messages
        return waited and not policy.ack_waits_for_sync and bool(self.waiting)

    # -- answers --------------------------------------------------------------------------------
    def appended(self, dst: str, acks: int, end: int, ack: bytes) -> None:
        """A batch was appended (up to ``end``): a publish is due; its ack (none for acks=0)
        leaves after it, or once durable."""
        self.publish_due = True
        if acks == 0:
            return
        if acks == -1 and end > self.flusher.durable and self.policy.ack_waits_for_sync:
            self.waiting.append((end, dst, ack))
        else:
            self.held.append((dst, ack))

    def reply(self, dst: str, acks: int, end: int, ack: bytes) -> bool:
        """An answer that appended nothing (an error, a duplicate whose original ends at
        ``end``, 0 when there is none): True when the writer is to post it now."""
        if acks == 0:
            return False
        if acks == -1 and end > self.flusher.durable and self.policy.ack_waits_for_sync:
            self.waiting.append((end, dst, ack))
        elif self.publish_due:
            self.held.append((dst, ack))
        else:
            return True
        return False

    def must_wait(self, end: int) -> bool:
        """Whether an answer for what ends at ``end`` (a marker) waits for the disk."""
        return self.policy.ack_waits_for_sync and end > self.flusher.durable

    def wait(self, end: int, dst: str, answer: bytes) -> None:
        """Hold ``answer`` until everything below ``end`` is durable."""
        self.waiting.append((end, dst, answer))

    def durable_answers(self) -> list[tuple[str, bytes]]:
        """Take the waiting answers whose end the flusher's durable offset has reached."""
        durable = self.flusher.durable
        out = []
        still = []
        for item in self.waiting:
            if item[0] <= durable:
                out.append((item[1], item[2]))
            else:
                still.append(item)
        self.waiting = still
        return out

    # -- flushes --------------------------------------------------------------------------------
    def flush_due(self, now: float, end: int) -> bool:
        """Whether to start a flush of everything below ``end`` now (noted as started)."""
        fl = self.flusher
        policy = self.policy
        if not fl.busy and fl.durable < end and (
                (policy.group_commit and self.waiting)
                or (policy.periodic and now - self.last_flush >= self.interval_s)
                or end - fl.durable >= self.messages):
            self.last_flush = now
            return True
        return False

    def flush_wait(self, now: float, end: int) -> float | None:
        """How long until the interval's flush is due (None: none is); 0 once flush.messages
        records are not durable (a flush is due as soon as the running one ends)."""
        if end - self.flusher.durable >= self.messages:
            return 0.0
        if self.policy.periodic and self.flusher.durable < end:
            return max(0.0, self.last_flush + self.interval_s - now)
        return None
