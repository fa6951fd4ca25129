"""Incremental fetch sessions (KIP-227): Kafka's FetchSessionCache, FetchSession and
CachedPartition, sans-IO.

Owned by each frontend process (one cache per frontend, built by its ``Broker``; single-threaded
asyncio): a session lives in the frontend whose connection created it. A client that reconnects
to another frontend names a session that frontend does not know and gets
FETCH_SESSION_ID_NOT_FOUND, on which Kafka's clients fall back to a full fetch, as after an
eviction. Session ids carry the frontend's index in their low bits, so two frontends never hand
out the same id.

A full fetch (epoch 0) asks for a session: the answer carries its id when the cache has room
(``max_incremental_fetch_session_cache_slots``, split among the frontends) or can evict a
session unused for ``EVICTION_MS`` or one with fewer partitions; else id 0, and the client goes
on with full fetches. Epoch -1 asks for none and closes the session it names. An incremental
fetch (the session's id, its next epoch) names only the partitions whose fetch position or
limit changed and those to forget; the session keeps the rest and is read whole. Its answer
carries only the partitions with records, a changed high watermark or log start offset, or an
error (Kafka's CachedPartition.maybeUpdateResponseData: the last stable offset is not
compared), and moves those to the end of the session's order, so that partitions cut by the
request's max_bytes are read first the next time.

The handler (``appliance.api.fetch``) asks ``context()`` what to read, reads it, and asks the
context which of the answered partitions to send.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from appliance.errors import ErrorCode

# Kafka's min.incremental.fetch.session.eviction.ms (an internal broker config): a session unused
# this long can be evicted by any new one.
EVICTION_MS = 120_000
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_ID = 0x7FFFFFFF


class CachedPartition:
    """One partition of a session: the client's last fetch position and limit, and what the
    session last told the client of it (-1: nothing yet, or an error since)."""

    __slots__ = ("partition", "fetch_offset", "partition_max_bytes", "high_watermark",
                 "log_start_offset")

    def __init__(self, partition: int, fetch_offset: int, partition_max_bytes: int) -> None:
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.partition_max_bytes = partition_max_bytes
        self.high_watermark = -1
        self.log_start_offset = -1

    def must_respond(self, has_records: bool, error: int, high_watermark: int,
                     log_start_offset: int, update: bool = True) -> bool:
        """Whether an incremental answer carries this partition; with ``update``, remembers
        what it says (without: the size of a maybe throttled answer, Kafka's getResponseSize)."""
        must = (has_records or error != 0 or high_watermark != self.high_watermark
                or log_start_offset != self.log_start_offset)
        if update:
            self.high_watermark = high_watermark
            self.log_start_offset = log_start_offset
            if error:
                # Sent again when the error goes away: the high watermark is then "changed".
                self.high_watermark = -1
        return must


@dataclass(eq=False)
class FetchSession:
    id: int
    uses_topic_ids: bool            # created by a v13+ fetch: partitions keyed by topic id
    # (topic id or name, partition) -> CachedPartition, in reading order.
    partitions: dict[tuple, CachedPartition]
    epoch: int                      # the epoch the next incremental fetch must carry
    last_used_ms: float

    def update(self, fetch: dict[tuple, object], forgotten: list[tuple]) -> None:
        """An incremental fetch's partitions (added or with a new position) and forgotten ones
        (Kafka's FetchSession.update)."""
        for key, p in fetch.items():
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = CachedPartition(p.partition, p.fetch_offset,
                                                       p.partition_max_bytes)
            else:
                cached.fetch_offset = p.fetch_offset
                cached.partition_max_bytes = p.partition_max_bytes
        for key in forgotten:
            self.partitions.pop(key, None)


@dataclass
class Context:
    """What one Fetch reads and how it is answered.

    ``error``: answer it with this top-level error and nothing else (SessionErrorContext).
    ``partitions``: (topic key, partition) -> an object with ``partition``, ``fetch_offset``,
    ``partition_max_bytes``, in reading order. ``session``: the incremental session read
    (``answer`` then filters), else None; ``create``: a full fetch asking for a session."""
    error: int = 0
    partitions: dict = field(default_factory=dict)
    session: FetchSession | None = None
    create: bool = False
    expected_epoch: int = 0


class FetchSessionCache:
    """This frontend's sessions (Kafka's FetchSessionCache; consumers' sessions only, so no
    privileged class: a single node has no followers)."""

    def __init__(self, slots: int, index: int = 0, frontends: int = 1, rng=None) -> None:
        self.slots = slots
        self._index = index
        self._stride = max(1, frontends)
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}
        self.evictions = 0

    def partitions_cached(self) -> int:
        return sum(len(s.partitions) for s in self.sessions.values())

    def context(self, session_id: int, epoch: int, version: int, fetch: dict[tuple, object],
                forgotten: list[tuple], now_ms: float) -> Context:
        """Kafka's FetchManager.newContext."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            # A full fetch closes the session it names, and asks for a new one unless its epoch
            # is the final one.
            if session_id:
                self.sessions.pop(session_id, None)
            return Context(partitions=fetch, create=epoch == INITIAL_EPOCH and version >= 7
                           and self.slots > 0)
        session = self.sessions.get(session_id)
        if session is None:
            return Context(error=int(ErrorCode.fetch_session_id_not_found))
        if session.epoch != epoch:
            return Context(error=int(ErrorCode.invalid_fetch_session_epoch))
        if session.uses_topic_ids != (version >= 13):
            # A session keyed by topic ids used by a fetch keyed by names, or the other way.
            return Context(error=int(ErrorCode.fetch_session_topic_id_error))
        session.update(fetch, forgotten)
        if not session.partitions:
            del self.sessions[session_id]
            return Context(partitions=fetch)
        session.last_used_ms = now_ms
        session.epoch = next_epoch(session.epoch)
        return Context(partitions=session.partitions, session=session,
                       expected_epoch=session.epoch)

    def create(self, version: int, answered: list[tuple[tuple, object, object]],
               now_ms: float) -> int:
        """A session for a full fetch's answer: [(key, the request's partition, the answered
        partition)]; its id, or 0 when the cache has no room (Kafka's maybeCreateSession)."""
        if not answered or (len(self.sessions) >= self.slots
                            and not self._evict(len(answered), now_ms)):
            return 0
        partitions: dict[tuple, CachedPartition] = {}
        for key, p, fp in answered:
            c = CachedPartition(p.partition, p.fetch_offset, p.partition_max_bytes)
            if not fp.error_code:
                c.high_watermark = fp.high_watermark
                c.log_start_offset = fp.log_start_offset
            partitions[key] = c
        sid = self._new_id()
        self.sessions[sid] = FetchSession(sid, version >= 13, partitions,
                                          next_epoch(INITIAL_EPOCH), now_ms)
        return sid

    def _new_id(self) -> int:
        top = MAX_ID // self._stride
        while True:
            # Below top * stride <= MAX_ID, never 0.
            sid = self._rng.randint(1, top - 1) * self._stride + self._index
            if sid not in self.sessions:
                return sid

    def _evict(self, size: int, now_ms: float) -> bool:
        """Room for a session of ``size`` partitions: the least recently used session when it
        is stale, else the smallest (the oldest id among equals) when the new one is larger."""
        if not self.sessions:
            return False
        oldest = min(self.sessions.values(), key=lambda s: s.last_used_ms)
        if now_ms - oldest.last_used_ms > EVICTION_MS:
            victim = oldest
        else:
            victim = min(self.sessions.values(), key=lambda s: (len(s.partitions), s.id))
            if size <= len(victim.partitions):
                return False
        del self.sessions[victim.id]
        self.evictions += 1
        return True


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: 1 after 0, wrapping from MAX_INT to 1."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_ID else epoch + 1


def answer_incremental(ctx: Context, answered: list[tuple], update: bool = True) -> set[tuple]:
    """The keys of an incremental answer's partitions ([(key, answered partition, ...)] in
    reading order) that the client is told of; with ``update`` (the answer is sent) those move
    to the end of the session's order and the session remembers what they said."""
    partitions = ctx.session.partitions
    sent = []
    for key, fp, *_ in answered:
        cached = partitions.get(key)
        if cached is not None and cached.must_respond(
                bool(fp.records), fp.error_code, fp.high_watermark, fp.log_start_offset, update):
            sent.append(key)
    if update:
        for key in sent:
            partitions[key] = partitions.pop(key)
    return set(sent)
