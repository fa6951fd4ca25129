"""ShareFetch (key 78), versions 1-2: a share-group member acknowledges what it got and acquires
more records (KIP-932).

Runs in frontends. Two hops (docs/architecture.md, "Share groups"): the coordinator worker's share
coordinator (``appliance.group.share_group``) checks the share session, applies the
acknowledgements, and acquires up to ``max_records`` offsets of the session's partitions under
locks; then a fetcher (``workers/fetcher.py``) finds the records from the first acquired offset,
as for Fetch, and they are sent with the acquired ranges (the client keeps only the records inside
them). The batches past the last acquired offset are cut off. When nothing could be acquired the
handler long-polls the fetcher on the partitions' next offsets for up to ``max_wait`` and asks the
coordinator once more.

v2 (KIP-1222) adds ``share_acquire_mode`` (record_limit: ``max_records`` is a hard limit, which
it always is here) and RENEW acknowledgements (``is_renew_ack``; not supported: INVALID_REQUEST on
the partition). Authorization (Kafka's KafkaApis.handleShareFetchRequest): Read on the group, else
GROUP_AUTHORIZATION_FAILED for the whole request; Read on each topic, else
TOPIC_AUTHORIZATION_FAILED on its partitions.
"""

from __future__ import annotations

import datetime

from appliance import ipc
from appliance.api import handles
from appliance.api._share import partitions, refused
from appliance.data_layout import partition_dir
from appliance.errors import ErrorCode, KafkaError
from appliance.group.messages import ShareFetchRequest
from appliance.protocol.messages import build
from appliance.protocol.records import LEADER_EPOCH, iter_batch_headers

FINAL_EPOCH = -1
DEFAULT_MAX_RECORDS = 500


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
    ask = ShareFetchRequest(req.group_id, req.member_id, req.share_session_epoch, asks, forgotten,
                            True, max_records)
    r = await broker.call_coordinator(ask)
    if r.error != ErrorCode.none:
        return _error(ctx, r.error, r.error_message)
    results = {(bytes(p.topic_id), p.partition): p for p in r.parts}
    acquired = {tp: list(p.acquired) for tp, p in results.items() if p.acquired}
    max_wait_ms = int(req.max_wait.total_seconds() * 1000)
    timeout_s = broker.cfg.server.internal_request_timeout_ms / 1000
    if (not acquired and req.share_session_epoch != FINAL_EPOCH and max_wait_ms > 0
            and r.session):
        # Nothing to hand out: wait for new records on a session partition (the fetcher's long
        # poll on the writers' doorbells), then ask once more.
        polls = [ipc.FetchPart(p.topic_id, p.partition, p.next_offset, 1)
                 for p in r.parts if p.next_offset >= 0]
        if polls:
            await broker.call_fetcher(ipc.FetchRequest(max_wait_ms, 1, 1, 0, polls),
                                      ctx.connection.fetcher, max_wait_ms / 1000 + timeout_s,
                                      ErrorCode.not_leader_or_follower)
            again = await broker.call_coordinator(ShareFetchRequest(
                req.group_id, req.member_id, req.share_session_epoch, [], [], True, max_records,
                again=True))
            if again.error == ErrorCode.none:
                for p in again.parts:
                    if p.acquired:
                        tp = (bytes(p.topic_id), p.partition)
                        acquired[tp] = list(p.acquired)
                        results.setdefault(tp, p)
    records = await _read(ctx, acquired, req.max_bytes, timeout_s) if acquired else {}
    by_topic: dict[bytes, list] = {}
    keys = list(errors) + [tp for tp in results if tp not in errors]
    for tp in keys:
        err = errors.get(tp, ErrorCode.none)
        p = results.get(tp)
        if err == ErrorCode.none and p is not None:
            err = p.error
        ack_err = p.ack_error if p is not None else ErrorCode.none
        got = acquired.get(tp, [])
        named = any(bytes(a.topic_id) == tp[0] and a.partition == tp[1] for a in asks)
        if err == ErrorCode.none and not got and not (p is not None and p.acked) and not (
                named and req.share_session_epoch == 0):
            continue            # an incremental answer names only partitions with news
        by_topic.setdefault(tp[0], []).append(dict(
            partition_index=tp[1], error_code=err, error_message=None,
            acknowledge_error_code=ack_err, acknowledge_error_message=None,
            current_leader=dict(leader_id=broker.node_id, leader_epoch=LEADER_EPOCH),
            records=records.get(tp, b"") if got else b"",
            acquired_records=tuple(dict(first_offset=f, last_offset=last, delivery_count=n)
                                   for f, last, n in got)))
    return build(ctx.response_class(), throttle_time=datetime.timedelta(0),
                 error_code=ErrorCode.none, error_message=None,
                 acquisition_lock_timeout=datetime.timedelta(milliseconds=r.lock_ms),
                 responses=tuple(dict(topic_id=tid, partitions=tuple(ps))
                                 for tid, ps in by_topic.items()),
                 node_endpoints=())


async def _read(ctx, acquired: dict, max_bytes: int, timeout_s: float) -> dict:
    """The records from each partition's first acquired offset through its last, read by a
    fetcher as Fetch reads them; the batches after the last acquired offset cut off."""
    broker = ctx.broker
    order = list(acquired)
    asks = [ipc.FetchPart(tid, p, acquired[(tid, p)][0][0], max(max_bytes, 1)) for tid, p in order]
    resp = await broker.call_fetcher(ipc.FetchRequest(0, 0, max(max_bytes, 1), 0, asks),
                                     ctx.connection.fetcher, timeout_s,
                                     ErrorCode.not_leader_or_follower)
    out = {}
    views = broker.segment_views
    catalog = broker.catalog
    for (tid, p), res in zip(order, resp.parts):
        info = catalog.by_id(tid)
        if res.error_code or info is None:
            continue
        last = acquired[(tid, p)][-1][1]
        directory = partition_dir(broker.ctx.data_dir, info.name, p)
        chunks = []
        try:
            for s in res.slices:
                mv = views.view(directory, s.segment_base, s.position, s.length, s.inode)
                end, done = 0, False
                for pos, h in iter_batch_headers(mv, 0, len(mv)):
                    end = pos + h.batch_length + 12
                    if h.base_offset + h.last_offset_delta >= last:
                        done = True
                        break
                chunks.append(bytes(mv[:end]))
                if done:
                    break
        except KafkaError:
            chunks = []          # retention or a cleaner swap took the segment: redelivered later
        out[(tid, p)] = b"".join(chunks)
    return out
