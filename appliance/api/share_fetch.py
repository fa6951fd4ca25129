"""ShareFetch (key 78), versions 1-2: a share-group member acknowledges what it got and acquires
more records (KIP-932).

Runs in frontends. Two hops (docs/architecture.md, "Share groups"): the coordinator worker's share
coordinator (``appliance.group.share_group``) checks the share session, applies the
acknowledgements, and acquires up to ``max_records`` offsets of the session's partitions under
locks; then a fetcher (``workers/fetcher.py``) finds the records from the first acquired offset,
as for Fetch, and they are sent with the acquired ranges (the client keeps only the records inside
them). The batches past the last acquired offset are cut off; offsets acquired past the last
batch the read carried (its max_bytes) are given back as if never acquired. When nothing could
be acquired and the coordinator says ``park`` (others hold the records, or the in-flight window
is full) the coordinator holds the request until a lock is freed (Kafka's DelayedShareFetch):
an incremental fetch without acknowledgements carries ``wait_ms = max_wait`` in its first call
and waits there; any other is answered first and the handler asks once more with it. Otherwise
it long-polls the fetcher on the partitions' next offsets for up to ``max_wait`` and asks the
coordinator once more. The answer is written by ``appliance.protocol.share_fetch_response``
(the records' segment views spliced in), kio's entity only when a quota may throttle it.

A ShareFetch of MaxBytes 0 acquires nothing and answers no records after max_wait (its read
could carry nothing; Kafka answers it no records).

A group with ``share.isolation.level=read_committed`` (its GROUP config) acquires only below the
last stable offset (the coordinator); the frontend reads as a read_committed fetch does and, as
Kafka's SharePartition, archives the records of aborted transactions it acquired (REJECTed at the
coordinator on the member's behalf, left out of the acquired ranges the client gets).

Acquisition is by whole log batches (Kafka's batch_optimized mode, the only one below v2): when
the read ends with a batch the acquisition ended inside, the rest of that batch is acquired too
(a second, short call to the coordinator), so ``max_records`` is a soft limit. v2 (KIP-1206,
KIP-1222) adds ``share_acquire_mode`` (record_limit: ``max_records`` is a hard limit, nothing
is added) and RENEW acknowledgements (``is_renew_ack``, KIP-1222: the request only
acknowledges, RENEW restarting the locks of records the member holds; fetch parameters or a
partition without acknowledgements are INVALID_REQUEST). Authorization (Kafka's KafkaApis.handleShareFetchRequest): Read on the group, else
GROUP_AUTHORIZATION_FAILED for the whole request; Read on each topic, else
TOPIC_AUTHORIZATION_FAILED on its partitions.
"""

from __future__ import annotations

import asyncio
import datetime
import logging

from appliance import ipc
from appliance.api import handles
from appliance.api._share import partitions, refused
from appliance.data_layout import partition_dir
from appliance.errors import ErrorCode, KafkaError
from appliance.group.messages import ShareAckBatch, ShareFetchPart, ShareFetchRequest
from appliance.group.share_partition import REJECT
from appliance.protocol.messages import build
from appliance.protocol.share_fetch_response import (SharePartitionData, ShareTopic,
                                                    encode_share_fetch_response)
from appliance.protocol.records import (CONTROL_ABORT, LEADER_EPOCH, InvalidRecord,
                                        iter_batch_headers, parse_control_record)

log = logging.getLogger(__name__)

FINAL_EPOCH = -1
DEFAULT_MAX_RECORDS = 500
BATCH_OPTIMIZED = 0                 # ShareAcquireMode (v2, KIP-1206): 1 is record_limit
BOUNDS_AHEAD = 32                   # batch ends past a read told to the coordinator


def _error(ctx, code: ErrorCode, message: str | None = None):
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0), error_code=code,
                 error_message=message, acquisition_lock_timeout=datetime.timedelta(0),
                 responses=(), node_endpoints=())


@handles(78, "ShareFetch", 1, 2)
async def handle(ctx, req):
    broker = ctx.broker
    no = refused(ctx, req, _error)
    if no is not None:
        return no
    asks, errors = partitions(ctx, req.topics, lambda t: t.partitions,
                              lambda p: p.acknowledgement_batches)
    forgotten = [(t.topic_id.bytes, p) for t in req.forgotten_topics_data
                 if t.topic_id is not None for p in t.partitions]
    max_records = req.max_records if req.max_records > 0 else DEFAULT_MAX_RECORDS
    record_limit = getattr(req, "share_acquire_mode", BATCH_OPTIMIZED) != BATCH_OPTIMIZED
    # MaxBytes 0 reads nothing, so nothing is acquired (Kafka acquires what its read carried):
    # the acknowledgements and the session are applied, no records are answered, and the answer
    # waits out max_wait as an empty fetch does, so that a client keeps to its pace (librdkafka
    # 0180 fetch_max_bytes_zero: as against Kafka and the Java client, no records).
    renew = bool(getattr(req, "is_renew_ack", False))
    if renew and (req.max_bytes or req.min_bytes or req.max_records or req.max_wait.total_seconds()
                  or any(not p.acknowledgement_batches for t in req.topics for p in t.partitions)):
        # KIP-1222: a renewing ShareFetch only acknowledges (its time is the renewed lock's):
        # no fetch parameters, and acknowledgements for every partition it names.
        return _error(ctx, ErrorCode.invalid_request,
                      "A ShareFetch with renew acknowledgements must not fetch.")
    acquire = req.max_bytes > 0 and not renew
    conn = getattr(ctx, "connection", None)
    connection_id = getattr(conn, "connection_id", "")
    max_wait_ms = int(req.max_wait.total_seconds() * 1000)
    timeout_s = broker.cfg.server.internal_request_timeout_ms / 1000
    # An incremental fetch that acknowledges nothing may wait in the coordinator at once when
    # others hold the records (Kafka's DelayedShareFetch): one hop instead of two for the
    # members that wait for the in-flight window.
    wait_ms = max_wait_ms if (acquire and req.share_session_epoch > 0 and not any(
        a.acks for a in asks)) else 0
    ask = ShareFetchRequest(req.group_id, req.member_id, req.share_session_epoch, asks, forgotten,
                            True, max_records, record_limit=record_limit,
                            acquire_none=not acquire, renew=renew, connection=connection_id,
                            wait_ms=wait_ms)
    r = await broker.call_coordinator(ask, wait_ms / 1000 + timeout_s if wait_ms else None)
    if r.error != ErrorCode.none:
        return _error(ctx, r.error, r.error_message)
    if connection_id and req.share_session_epoch in (0, FINAL_EPOCH):
        # The session opened at epoch 0 is this connection's: when the connection closes, the
        # coordinator closes it and releases what its member holds (KIP-932; Kafka's
        # ShareSessionCache disconnect listener), so that a consumer killed -9 does not hold
        # its records until their locks end. Epoch -1 closed it.
        if req.share_session_epoch == 0:
            conn.share_sessions.add((req.group_id, req.member_id))
        else:
            conn.share_sessions.discard((req.group_id, req.member_id))
    results = {(bytes(p.topic_id), p.partition): p for p in r.parts}
    acquired = {tp: list(p.acquired) for tp, p in results.items() if p.acquired}
    known = {tp: p.bounds_left for tp, p in results.items() if p.acquired}
    isolation = r.isolation_level
    if not acquire:
        if req.share_session_epoch != FINAL_EPOCH and max_wait_ms > 0:
            await asyncio.sleep(max_wait_ms / 1000)
    elif (not acquired and req.share_session_epoch != FINAL_EPOCH and max_wait_ms > 0
            and r.session):
        # Nothing to hand out: wait for new records on a session partition (the fetcher's long
        # poll on the writers' doorbells), then ask once more.
        polls = [ipc.FetchPart(p.topic_id, p.partition, p.next_offset, 1)
                 for p in r.parts if p.next_offset >= 0]
        again = None
        if r.park:
            # Records are there but others hold them (or the in-flight window is full): the
            # fetcher's long poll would end at once. Wait in the coordinator for a lock to be
            # freed instead (Kafka's DelayedShareFetch; the coordinator decides, and never
            # parks a member that holds records: its next fetch carries their acks).
            again = await broker.call_coordinator(ShareFetchRequest(
                req.group_id, req.member_id, req.share_session_epoch, [], [], True, max_records,
                again=True, wait_ms=max_wait_ms, record_limit=record_limit),
                max_wait_ms / 1000 + timeout_s)
        elif polls:
            await broker.call_fetcher(ipc.FetchRequest(max_wait_ms, 1, 1, 0, polls),
                                      ctx.connection.fetcher, max_wait_ms / 1000 + timeout_s,
                                      ErrorCode.not_leader_or_follower)
            again = await broker.call_coordinator(ShareFetchRequest(
                req.group_id, req.member_id, req.share_session_epoch, [], [], True, max_records,
                again=True, record_limit=record_limit))
        if again is not None:
            if again.error == ErrorCode.none:
                # The isolation level of the answer that acquired: the group's config may have
                # changed during the wait (regression: a fetch that began read_committed read the
                # records a read_uncommitted acquisition got as read_committed, and archived those
                # of aborted transactions: librdkafka 0177 dynamic_committed_to_uncommitted).
                isolation = again.isolation_level
                for p in again.parts:
                    if p.acquired:
                        tp = (bytes(p.topic_id), p.partition)
                        acquired[tp] = list(p.acquired)
                        known[tp] = p.bounds_left
                        results.setdefault(tp, p)
    committed = isolation == 1
    records, ends, aborted, bounds, sent, read_errors = (
        await _read(ctx, acquired, req.max_bytes, timeout_s, committed,
                    # Look ahead for batch ends only when the share partition knows few past
                    # this acquisition: most reads walk just the batches they send.
                    {tp: BOUNDS_AHEAD if n < BOUNDS_AHEAD // 2 else 0 for tp, n in known.items()})
        if acquired else ({}, {}, {}, {}, {}, {}))
    extend = [] if record_limit else [
        (tid, p, acquired[(tid, p)][-1][1] + 1, end) for (tid, p), end in ends.items()
        if end > acquired[(tid, p)][-1][1]]
    # What was acquired past the last batch the read carried (max_bytes ended first, or the
    # read failed: its error goes to the client, which backs off) goes back, as if never
    # acquired: sent as acquired without its records, the client would acknowledge those
    # offsets as gaps (archived: never delivered), or hold them until their lock expired
    # (librdkafka 0171 fetch_max_bytes_small).
    unacquire = []
    for tp in list(acquired):
        kept, back = _split_at(acquired[tp], sent.get(tp, -1))
        unacquire += [(tp[0], tp[1], f, last) for f, last in back]
        if kept:
            acquired[tp] = kept
        else:
            del acquired[tp]
    if extend or unacquire:
        # extend: the read ends with the whole log batch the acquisition ended inside: acquire
        # the rest of it too, as Kafka's SharePartition acquires whole fetched batches
        # (max_records is a soft limit in batch_optimized mode, KIP-1206): one more hop to
        # the coordinator, but a batch of a large producer is delivered in one fetch instead
        # of being sent again, whole, to every member that acquires a slice of it.
        more = await broker.call_coordinator(ShareFetchRequest(
            req.group_id, req.member_id, req.share_session_epoch, [], [], True, 0, again=True,
            extend=extend, unacquire=unacquire,
            bounds=[(tid, p, lasts) for (tid, p), lasts in bounds.items() if lasts] if extend
            else []))
        if more.error == ErrorCode.none:
            for p in more.parts:
                tp = (bytes(p.topic_id), p.partition)
                if tp in acquired:
                    acquired[tp] = _joined(acquired[tp], list(p.acquired))
    elif (ahead := [(tid, p, lasts) for (tid, p), lasts in bounds.items() if len(lasts) > 1]):
        # The read looked ahead and needed no extension: the batch ends it saw go to the
        # coordinator without the answer waiting for them (they only shape later acquisitions).
        _tell(broker, ShareFetchRequest(req.group_id, req.member_id, req.share_session_epoch,
                                        [], [], True, 0, again=True, bounds=ahead))
    aborted = {tp: inside for tp, spans in aborted.items()
               if (inside := _within(spans, acquired.get(tp, [])))}
    if aborted:
        # Kafka's SharePartition (read_committed): records of aborted transactions are archived,
        # not delivered.
        gone = await broker.call_coordinator(ShareFetchRequest(
            req.group_id, req.member_id, req.share_session_epoch,
            [ShareFetchPart(tid, p, [ShareAckBatch(f, last, [REJECT]) for f, last in spans])
             for (tid, p), spans in aborted.items()], [], False, 0, again=True))
        if gone.error == ErrorCode.none:
            for tp, spans in aborted.items():
                acquired[tp] = _without(acquired[tp], spans)
    by_topic: dict[bytes, list] = {}
    keys = list(errors) + [tp for tp in results if tp not in errors]
    for tp in keys:
        err = errors.get(tp, ErrorCode.none)
        p = results.get(tp)
        if err == ErrorCode.none and p is not None:
            err = p.error
        if err == ErrorCode.none:
            err = read_errors.get(tp, ErrorCode.none)
        ack_err = p.ack_error if p is not None else ErrorCode.none
        got = acquired.get(tp, [])
        named = any(bytes(a.topic_id) == tp[0] and a.partition == tp[1] for a in asks)
        if err == ErrorCode.none and not got and not (p is not None and p.acked) and not (
                named and req.share_session_epoch == 0):
            continue            # an incremental answer names only partitions with news
        by_topic.setdefault(tp[0], []).append(SharePartitionData(
            tp[1], int(err), None, int(ack_err), None, (broker.node_id, LEADER_EPOCH),
            records.get(tp, ()) if got else (), got))
    topics = [ShareTopic(tid, ps) for tid, ps in by_topic.items()]
    if not broker.quotas.any:
        # The hand-written encoder, the records' segment views spliced in as they are
        # (appliance.protocol.share_fetch_response): kio's entities and writer were about a
        # third of the frontend's time per ShareFetch.
        return encode_share_fetch_response(ctx.header.api_version, 0, 0, None, r.lock_ms,
                                           topics)[0]
    # With quotas the connection may set the throttle time in the answer: kio's entity.
    return kio_answer(ctx.response_class(), r.lock_ms, topics)


def kio_answer(cls, lock_ms: int, topics: list) -> object:
    """The answer as kio's entity of ``cls`` (the same bytes as the hand encoder's), for the
    connection to set a quota's throttle time in."""
    return build(cls, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none,
                 error_message=None, acquisition_lock_timeout=datetime.timedelta(milliseconds=lock_ms),
                 responses=tuple(dict(topic_id=t.topic_id, partitions=tuple(dict(
                     partition_index=q.partition_index, error_code=q.error_code,
                     error_message=None, acknowledge_error_code=q.acknowledge_error_code,
                     acknowledge_error_message=None,
                     current_leader=dict(leader_id=q.current_leader[0],
                                         leader_epoch=q.current_leader[1]),
                     records=b"".join(bytes(c) for c in q.records),
                     acquired_records=tuple(dict(first_offset=f, last_offset=last,
                                                 delivery_count=n)
                                            for f, last, n in q.acquired_records))
                     for q in t.partitions)) for t in topics),
                 node_endpoints=())


_TOLD: set = set()          # bounds-only calls under way (a reference keeps each task alive)


def _tell(broker, ask: ShareFetchRequest) -> None:
    """Send ``ask`` to the coordinator without waiting for its answer: a hint whose loss costs
    at most an extension call later."""
    async def send() -> None:
        try:
            await broker.call_coordinator(ask)
        except Exception:           # noqa: BLE001 (a hint: nobody waits for it)
            log.debug("bounds for share group %s not delivered", ask.group_id, exc_info=True)

    task = asyncio.ensure_future(send())
    _TOLD.add(task)
    task.add_done_callback(_TOLD.discard)


def _joined(ranges: list, more: list) -> list:
    """Acquired (first, last, delivery count) ranges followed by ``more`` (all past them),
    adjacent runs of one delivery count merged."""
    out = list(ranges)
    for f, last, n in more:
        if out and out[-1][1] == f - 1 and out[-1][2] == n:
            out[-1] = (out[-1][0], last, n)
        else:
            out.append((f, last, n))
    return out


def _split_at(ranges: list, last_sent: int) -> tuple[list, list[tuple[int, int]]]:
    """The acquired (first, last, delivery count) ``ranges`` up to ``last_sent``, and the
    (first, last) spans past it."""
    kept, back = [], []
    for f, last, n in ranges:
        if last <= last_sent:
            kept.append((f, last, n))
        elif f > last_sent:
            back.append((f, last))
        else:
            kept.append((f, last_sent, n))
            back.append((last_sent + 1, last))
    return kept, back


def _within(spans: list, ranges: list) -> list[tuple[int, int]]:
    """The parts of the (first, last) ``spans`` inside the acquired (first, last, count)
    ``ranges``: only what the member holds may be rejected on its behalf."""
    out = []
    for f, last in spans:
        for a, b, _n in ranges:
            lo, hi = max(f, a), min(last, b)
            if lo <= hi:
                out.append((lo, hi))
    return out


def _without(ranges: list, spans: list) -> list:
    """The acquired (first, last, delivery count) ranges minus the (first, last) ``spans``."""
    out = []
    for first, last, n in ranges:
        pieces = [(first, last)]
        for f, l in spans:
            nxt = []
            for a, b in pieces:
                if l < a or f > b:
                    nxt.append((a, b))
                    continue
                if a < f:
                    nxt.append((a, f - 1))
                if l < b:
                    nxt.append((l + 1, b))
            pieces = nxt
        out += [(a, b, n) for a, b in pieces]
    return out


def _aborted_spans(mv, aborted_txns, ranges) -> list[tuple[int, int]]:
    """The offsets, inside the acquired ``ranges``, of data batches of aborted transactions in
    ``mv`` (as Kafka's consumer filters a read_committed fetch: a producer's batches from its
    aborted transaction's first offset up to its ABORT marker)."""
    pending = sorted(aborted_txns or (), key=lambda a: a[1])
    active: set[int] = set()
    spans = []
    i = 0
    for pos, h in iter_batch_headers(mv, 0, len(mv)):
        last = h.base_offset + h.last_offset_delta
        while i < len(pending) and pending[i][1] <= last:
            active.add(pending[i][0])
            i += 1
        if h.is_control:
            try:
                if parse_control_record(mv[pos:pos + h.batch_length + 12])[0] == CONTROL_ABORT:
                    active.discard(h.producer_id)
            except InvalidRecord:
                pass
        elif h.is_transactional and h.producer_id in active:
            for f, l, _n in ranges:
                a, b = max(f, h.base_offset), min(l, last)
                if a <= b:
                    spans.append((a, b))
    return spans


async def _read(ctx, acquired: dict, max_bytes: int, timeout_s: float,
                committed: bool = False, ahead: dict | None = None
                ) -> tuple[dict, dict, dict, dict, dict, dict]:
    """The records from each partition's first acquired offset through its last (segment
    views, spliced into the answer as Fetch's are), read by a fetcher as Fetch reads them; the
    batches after the last acquired offset cut off. Also, per partition, the last offset of the
    batch holding the last acquired one when the read got that far; with ``committed``
    (read_committed), the offsets of aborted transactions in what was read; the last offsets of
    the batches the read saw from that one on (up to ``ahead[partition]``, default
    ``BOUNDS_AHEAD``); the last offset of the last batch sent (absent: nothing read); and the
    error of a partition the fetcher could not read."""
    broker = ctx.broker
    order = list(acquired)
    # Each read ends with the batch holding the last acquired offset and the BOUNDS_AHEAD after
    # it, so that one partition's read neither walks the log to max_bytes nor takes the bytes
    # of the session's other partitions.
    ahead = ahead or {}
    asks = [ipc.FetchPart(tid, p, acquired[(tid, p)][0][0], max(max_bytes, 1),
                          acquired[(tid, p)][-1][1], ahead.get((tid, p), BOUNDS_AHEAD))
            for tid, p in order]
    resp = await broker.call_fetcher(ipc.FetchRequest(0, 0, max(max_bytes, 1), int(committed),
                                                      asks),
                                     ctx.connection.fetcher, timeout_s,
                                     ErrorCode.not_leader_or_follower)
    out, ends, aborted, bounds, sent, errs = {}, {}, {}, {}, {}, {}
    everything = [(0, 2**63 - 1, 0)]
    views = broker.segment_views
    catalog = broker.catalog
    for (tid, p), res in zip(order, resp.parts):
        info = catalog.by_id(tid)
        if res.error_code or info is None:
            errs[(tid, p)] = ErrorCode(res.error_code) if res.error_code else \
                ErrorCode.unknown_topic_id
            continue
        last = acquired[(tid, p)][-1][1]
        directory = partition_dir(broker.ctx.data_dir, info.name, p)
        chunks = []
        try:
            seen = bounds.setdefault((tid, p), [])
            for s in res.slices:
                mv = views.view(directory, s.segment_base, s.position, s.length, s.inode)
                end, done = 0, False
                for pos, h in iter_batch_headers(mv, 0, len(mv)):
                    if done:
                        # Past what is sent: where the next batches end, for the coordinator
                        # to acquire by whole batches (ShareFetchRequest.bounds).
                        if len(seen) > ahead.get((tid, p), BOUNDS_AHEAD):
                            break
                        seen.append(h.base_offset + h.last_offset_delta)
                        continue
                    end = pos + h.batch_length + 12
                    sent[(tid, p)] = h.base_offset + h.last_offset_delta
                    if h.base_offset + h.last_offset_delta >= last:
                        done = True
                        ends[(tid, p)] = h.base_offset + h.last_offset_delta
                        seen.append(ends[(tid, p)])
                if end:
                    chunks.append(mv[:end])
                if committed and res.aborted:
                    spans = _aborted_spans(mv[:end], res.aborted, everything)
                    if spans:
                        aborted.setdefault((tid, p), []).extend(spans)
                if done:
                    break
        except KafkaError:
            chunks = []          # retention or a cleaner swap took the segment: given back
            ends.pop((tid, p), None)
            sent.pop((tid, p), None)
        out[(tid, p)] = chunks
    return out, ends, aborted, bounds, sent, errs
