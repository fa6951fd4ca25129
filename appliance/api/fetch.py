"""Fetch (key 1), versions 4-18: hand the read to a fetcher, splice the bytes into the response.

Runs in frontends. The fetcher (``workers/fetcher.py``) finds for each partition the byte ranges
to return and long-polls for ``min_bytes`` up to ``max_wait_ms``; this handler then copies nothing:
it passes read-only memoryviews of the segment files to the socket through the hand-written
encoder in ``appliance.protocol.fetch_response``.

Fetch sessions (KIP-227, v7+; ``appliance.fetch_session``, one cache per frontend): a full fetch
with epoch 0 is answered with a new session's id when the cache has room; an incremental fetch
names only the partitions that changed, the session's whole partition list is read and only the
partitions with something new are answered. A session this frontend does not know is
FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH, as Kafka's FetchManager
answers.

Authorization (Kafka's KafkaApis.handleFetchRequest): a consumer needs Read on each topic (else
TOPIC_AUTHORIZATION_FAILED, checked before the topic's existence); a follower (replica id >= 0)
needs ClusterAction on the Cluster, else every partition gets TOPIC_AUTHORIZATION_FAILED. An
unknown topic id (v13+) is UNKNOWN_TOPIC_ID first, as ids are not secret. v18 (KIP-1166) adds a
follower's high watermark to each partition, which a single node has no use for; its response is
v17's.
"""

from __future__ import annotations

import time
from collections import Counter

from appliance import ipc
from appliance.acl.model import AclOperation, ResourceType
from appliance.api import handles
from appliance.data_layout import partition_dir
from appliance.errors import ErrorCode, KafkaError
from appliance.fetch_session import answer_incremental
from appliance.protocol.fetch_response import FetchPartition, FetchTopic, encode_fetch_response
from appliance.quota.rates import FETCH as FETCH_QUOTA

READ_COMMITTED = 1
BYTES_OUT = "kafka_server_brokertopicmetrics_bytesout"
FAILED_FETCH = "kafka_server_brokertopicmetrics_failedfetchrequests"
# FailedFetchRequestsPerSec counts unexpected failures only (Kafka's ReplicaManager.readFromLog:
# "not incremented for known exceptions"): not UNKNOWN_TOPIC_OR_PARTITION,
# NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH, FENCED_LEADER_EPOCH, REPLICA_NOT_AVAILABLE,
# KAFKA_STORAGE_ERROR, INCONSISTENT_TOPIC_ID, OFFSET_OUT_OF_RANGE (handled apart), nor what
# KafkaApis decides before reading (TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID).
EXPECTED_FETCH_ERRORS = frozenset(int(e) for e in (
    ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower,
    ErrorCode.unknown_leader_epoch, ErrorCode.fenced_leader_epoch,
    ErrorCode.replica_not_available, ErrorCode.kafka_storage_error,
    ErrorCode.inconsistent_topic_id, ErrorCode.offset_out_of_range,
    ErrorCode.topic_authorization_failed, ErrorCode.unknown_topic_id))


@handles(1, "Fetch", 4, 18)
async def handle(ctx, req):
    v = ctx.version
    broker = ctx.broker
    # A partition named twice is fetched once, at its first place with its last fetch position:
    # Kafka keeps a full fetch's partitions in a LinkedHashMap (regression: a request repeating
    # one partition 40,000 times was answered with 40,000 copies of its records, 18 MB).
    requested: dict[tuple, object] = {}
    for t in req.topics:
        tkey = t.topic_id if v >= 13 else t.topic
        for p in t.partitions:
            requested[(tkey, p.partition)] = p
    forgotten = [(t.topic_id if v >= 13 else t.topic, p)
                 for t in getattr(req, "forgotten_topics_data", ()) for p in t.partitions]
    sessions = broker.fetch_sessions
    session_ctx = sessions.context(getattr(req, "session_id", 0), getattr(req, "session_epoch", -1),
                                   v, requested, forgotten, time.monotonic() * 1000)
    if session_ctx.error:
        ctx.errors = Counter({session_ctx.error: 1})
        parts, _ = encode_fetch_response(v, 0, session_ctx.error, 0, [])
        return parts
    entries = session_ctx.partitions
    catalog = broker.catalog
    isolation = getattr(req, "isolation_level", 0)
    asks: list[ipc.FetchPart] = []
    topics: list[FetchTopic] = []
    plan: list[tuple[FetchPartition, int, str]] = []   # (response partition, ask index, dir)
    follower_denied = False
    if broker.authorizer.enabled:
        state = getattr(req, "replica_state", None)
        replica_id = state.replica_id if state is not None else getattr(req, "replica_id", -1)
        if replica_id >= 0:
            follower_denied = not ctx.authorize_cluster(AclOperation.CLUSTER_ACTION)
        authorize = None if replica_id >= 0 else ctx.authorize
    else:
        authorize = None
    answered: list[tuple[tuple, FetchPartition, FetchTopic]] = []   # every one read, in order
    ft, ft_key, info, missing, denied = None, None, None, ErrorCode.unknown_topic_or_partition, False
    for key, p in entries.items():
        tkey = key[0]
        if ft is None or tkey != ft_key:
            ft_key = tkey
            if v >= 13:
                info = catalog.by_id(tkey.bytes) if tkey is not None else None
                missing = ErrorCode.unknown_topic_id
                ft = FetchTopic(info.name if info else "", tkey)
                name = info.name if info else None
            else:
                info = catalog.topics.get(tkey)
                missing = ErrorCode.unknown_topic_or_partition
                ft = FetchTopic(tkey, info.topic_id if info else None)
                name = tkey
            topics.append(ft)
            denied = follower_denied or (authorize is not None and name is not None and not
                                         authorize(AclOperation.READ, ResourceType.TOPIC, name))
        fp = FetchPartition(p.partition)
        ft.partitions.append(fp)
        answered.append((key, fp, ft))
        if denied:
            fp.error_code = int(ErrorCode.topic_authorization_failed)
            continue
        if info is None or not 0 <= p.partition < info.partitions:
            fp.error_code = int(missing if info is None else ErrorCode.unknown_topic_or_partition)
            continue
        if v < 10 and catalog.settings(info, broker.cfg.log).compression_type == "zstd":
            # KIP-110 (KafkaApis' maybeConvertFetchedData): a client too old for zstd cannot read
            # a topic whose compression.type is zstd; Kafka answers the partition with no records.
            fp.error_code = int(ErrorCode.unsupported_compression_type)
            continue
        plan.append((fp, len(asks), info.name))
        asks.append(ipc.FetchPart(info.topic_id, p.partition, p.fetch_offset, p.partition_max_bytes))
    if asks:
        max_wait_ms = int(req.max_wait.total_seconds() * 1000)
        # Kafka's KafkaApis: min(the request's max_bytes, the broker's fetch.max.bytes).
        max_bytes = min(getattr(req, "max_bytes", 0x7FFFFFFF), broker.cfg.server.fetch_max_bytes)
        resp = await broker.call_fetcher(
            ipc.FetchRequest(max_wait_ms, req.min_bytes, max_bytes, isolation, asks),
            ctx.connection.fetcher, max_wait_ms / 1000 + broker.cfg.server.internal_request_timeout_ms / 1000,
            ErrorCode.not_leader_or_follower)
        results = resp.parts
        views = broker.segment_views
        for fp, i, topic_name in plan:
            r = results[i]
            fp.error_code = r.error_code
            fp.high_watermark = r.high_watermark
            fp.last_stable_offset = r.last_stable_offset
            fp.log_start_offset = r.log_start_offset
            fp.aborted_transactions = r.aborted if isolation == READ_COMMITTED else None
            if isolation == READ_COMMITTED and fp.aborted_transactions is None and not r.error_code:
                fp.aborted_transactions = []
            records = []
            try:
                if r.slices:
                    # Only for a partition with records: joined for every partition of every
                    # fetch it was a twelfth of a frontend at 1,024 partitions (issue 32 goal 5).
                    directory = partition_dir(broker.ctx.data_dir, topic_name, fp.partition_index)
                for s in r.slices:
                    records.append(views.view(directory, s.segment_base, s.position, s.length,
                                              s.inode))
            except KafkaError:
                # Retention deleted the segment between the lookup and now (the client's next
                # fetch gets OFFSET_OUT_OF_RANGE), or a cleaner swap replaced it and its old file
                # is gone too: answer nothing for this partition; the next fetch reads anew.
                records = []
            fp.records = records
    session_id = 0
    incremental = session_ctx.session is not None
    if incremental:
        session_id = session_ctx.session.id
        if session_ctx.session.epoch != session_ctx.expected_epoch:
            # Another fetch of this session came and moved its epoch while this one was read
            # (Kafka's IncrementalFetchContext.updateAndGenerateResponseData).
            ctx.errors = Counter({int(ErrorCode.invalid_fetch_session_epoch): 1})
            parts, _ = encode_fetch_response(v, 0, int(ErrorCode.invalid_fetch_session_epoch),
                                             session_id, [])
            return parts
    quotas = broker.quotas.any
    if incremental:
        # Without quotas the answer surely goes out, so the session remembers what it says at
        # once; with them it is only sized first (a throttled answer sends none of it).
        topics = _regroup(answered, answer_incremental(session_ctx, answered, update=not quotas))
    parts = None
    if quotas:
        # KIP-13: the response's bytes against consumer_byte_rate, the request's time against
        # request_percentage. Throttled by either, Kafka's handleFetchRequest answers no records
        # (FetchContext.getThrottledResponse: error NONE, the throttle time, session id 0 for a
        # full fetch, no partitions), takes the bytes back from the byte-rate quota
        # (unrecordQuotaSensor) and mutes the connection for the throttle time (KIP-219); the
        # client fetches the same offsets again after it. Nothing was sent: no bytes out. A
        # full fetch's throttled answer creates no session; an incremental one keeps its
        # session, whose cached partitions are not updated (they were not sent).
        parts, size = encode_fetch_response(v, 0, 0, session_id, topics)
        throttle = ctx.throttle(FETCH_QUOTA, size)
        if throttle:
            ctx.unrecord(FETCH_QUOTA, size)
            parts, _ = encode_fetch_response(v, throttle, 0, session_id, [])
            _count(ctx, catalog, [])
            return parts
        if incremental:
            answer_incremental(session_ctx, answered)
    if session_ctx.create:
        session_id = sessions.create(v, [(k, entries[k], fp) for k, fp, _ in answered],
                                     time.monotonic() * 1000)
        parts = None
    if parts is None:
        parts, _ = encode_fetch_response(v, 0, 0, session_id, topics)
    _count(ctx, catalog, topics)
    return parts


def _regroup(answered: list[tuple[tuple, FetchPartition, FetchTopic]], sent: set
             ) -> list[FetchTopic]:
    """An incremental answer: the partitions in ``sent``, in reading order, a topic entry for
    each run of one topic's partitions (as Kafka's FetchResponse.toMessage groups them)."""
    topics: list[FetchTopic] = []
    last = None
    for key, fp, ft in answered:
        if key not in sent:
            continue
        if last is None or last[0] is not ft:
            last = (ft, FetchTopic(ft.name, ft.topic_id))
            topics.append(last[1])
        last[1].partitions.append(fp)
    return topics


def _count(ctx, catalog, topics: list[FetchTopic]) -> None:
    """Metrics: the answer's error codes (the top level's NONE too, as Kafka counts them), bytes
    out and failed partitions per existing topic (``EXPECTED_FETCH_ERRORS`` left out)."""
    errors: Counter = Counter({0: 1})
    counters = ctx.broker.counters
    for ft in topics:
        known = ft.name in catalog.topics
        out = 0
        for fp in ft.partitions:
            errors[fp.error_code] += 1
            if fp.error_code:
                if known and fp.error_code not in EXPECTED_FETCH_ERRORS:
                    counters.topic(FAILED_FETCH, ft.name)
            elif fp.records:
                out += sum(len(r) for r in fp.records)
        if out and known:
            counters.topic(BYTES_OUT, ft.name, out)
    ctx.errors = errors
