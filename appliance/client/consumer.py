"""The consumer: partitions by assignment (no group membership), positions, Fetch, and the
read_committed filter.

Owns the assignment, the position per partition (the next offset to hand out) and the records
fetched but not yet returned. ``poll`` sends one Fetch per leader for every assigned partition
that has no records waiting, long-polling up to ``fetch_max_wait_ms`` (bounded by the poll's
timeout), and returns what came back. A partition without a position gets one from ListOffsets
(``auto_offset_reset``: earliest or latest; ``none`` raises); so does one answered
OFFSET_OUT_OF_RANGE. Leader errors drop the topic's metadata and the partition is fetched again
at the next round.

read_committed (the default; ``isolation_level="read_uncommitted"`` reads everything): the broker
returns data only up to the last stable offset, plus the list of aborted transactions (producer
id, first offset) overlapping it. ``filter_fetched`` walks the batches in offset order, as Kafka's
consumer does: an aborted transaction's producer id becomes "aborted" once a batch reaches its
first offset, and stays so until that producer's ABORT marker; transactional batches of an
aborted producer are skipped, control batches are never returned, and the position moves past
every batch either way (so a consumer never stalls on a marker).
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from appliance.client.config import consumer_config
from appliance.client.errors import (ErrorCode, KafkaConnectionError, KafkaError,
                                     KafkaTimeoutError, error_code)
from appliance.client.metadata import Cluster, Deadline
from appliance.errors import CorruptRecord
from appliance.protocol.records import (CONTROL_ABORT, batch_crc_ok, decode_records,
                                        iter_batch_headers, parse_control_record)

__all__ = ["Consumer", "ConsumerRecord", "filter_fetched", "READ_COMMITTED", "READ_UNCOMMITTED"]

FETCH, LIST_OFFSETS, OFFSET_FETCH = 1, 2, 9
COORDINATOR_GROUP = 0
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
EARLIEST, LATEST = -2, -1
_LEADER_ERRORS = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition,
                            ErrorCode.leader_not_available, ErrorCode.fenced_leader_epoch,
                            ErrorCode.unknown_leader_epoch, ErrorCode.unknown_topic_id,
                            ErrorCode.kafka_storage_error})

TopicPartition = tuple[str, int]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_type: int = 0     # 0 CreateTime, 1 LogAppendTime (the batch's attribute)


class Fetched(NamedTuple):
    """What one partition's fetched bytes yield: records at or after the position, the position
    after the last complete batch, and how many batches were skipped as aborted.
    ``log_append_time`` holds the offsets of returned records whose batch is LogAppendTime
    (usually empty: CreateTime is the default)."""
    records: list[Any]          # appliance.protocol.records.DecodedRecord
    next_position: int
    aborted_batches: int
    control_batches: int
    log_append_time: frozenset[int] = frozenset()


def filter_fetched(data: bytes | memoryview, position: int,
                   aborted: Iterable[tuple[int, int]] | None, read_committed: bool, *,
                   check_crcs: bool = True) -> Fetched:
    """The records of a Fetch answer for one partition that the consumer should see.

    ``aborted`` is the partition's AbortedTransactions list as (producer id, first offset).
    Batches wholly before ``position`` and records before it inside a batch (a fetch from the
    middle of a compressed batch returns the whole batch) are dropped. A torn last batch (cut by
    the byte limit) is ignored: the next fetch starts at it.
    """
    mv = memoryview(data)
    pending = sorted(aborted or (), key=lambda a: a[1])
    idx = 0
    aborted_pids: set[int] = set()
    out: list[Any] = []
    next_pos = position
    skipped = controls = 0
    log_append: set[int] = set()
    for pos, h in iter_batch_headers(mv):
        if h.last_offset < next_pos:
            continue
        size = h.size
        if check_crcs and not batch_crc_ok(mv, pos, size, h.crc):
            raise CorruptRecord(f"record batch at offset {h.base_offset} failed its CRC check")
        if read_committed and h.is_transactional:
            while idx < len(pending) and pending[idx][1] <= h.last_offset:
                aborted_pids.add(pending[idx][0])
                idx += 1
        if h.is_control:
            controls += 1
            if read_committed and h.is_transactional:
                ctype, _ = parse_control_record(mv[pos:pos + size])
                if ctype == CONTROL_ABORT:
                    aborted_pids.discard(h.producer_id)
            next_pos = h.last_offset + 1
            continue
        if read_committed and h.is_transactional and h.producer_id in aborted_pids:
            skipped += 1
            next_pos = h.last_offset + 1
            continue
        for rec in decode_records(mv[pos:pos + size]):
            if rec.offset >= next_pos:
                out.append(rec)
                if h.timestamp_type:
                    log_append.add(rec.offset)
        next_pos = h.last_offset + 1
    return Fetched(out, next_pos, skipped, controls, frozenset(log_append))


class Consumer:
    """A consumer by assignment. Configuration as for ``Producer`` (keywords or a mapping, Kafka's
    dotted names accepted); see ``appliance.client.config.CONSUMER_DEFAULTS``."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        cfg = self.config = consumer_config(config, kwargs)
        self.cluster = Cluster(cfg["bootstrap_servers"], client_id=cfg["client_id"],
                               request_timeout_ms=cfg["request_timeout_ms"] + cfg["fetch_max_wait_ms"],
                               retry_backoff_ms=cfg["retry_backoff_ms"],
                               metadata_timeout_ms=cfg["metadata_timeout_ms"],
                               allow_auto_create_topics=cfg["allow_auto_create_topics"],
                               max_versions=cfg["max_versions"], security=cfg["security"])
        self.isolation = READ_COMMITTED if cfg["isolation_level"] == "read_committed" else READ_UNCOMMITTED
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._buffered: dict[TopicPartition, deque[ConsumerRecord]] = {}
        self._closed = False

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- assignment and positions ------------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these (topic, partition) pairs; positions of kept ones are kept."""
        new = [(t, int(p)) for t, p in partitions]
        keep = set(new)
        self._assignment = new
        self._positions = {tp: off for tp, off in self._positions.items() if tp in keep}
        self._buffered = {tp: q for tp, q in self._buffered.items() if tp in keep}

    def assignment(self) -> list[TopicPartition]:
        return list(self._assignment)

    def _check_assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = (tp[0], int(tp[1]))
        if tp not in self._assignment:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"{tp} is not assigned")
        return tp

    def seek(self, tp: TopicPartition, offset: int) -> None:
        tp = self._check_assigned(tp)
        if offset < 0:
            raise ValueError(f"offset {offset} < 0")
        self._positions[tp] = offset
        self._buffered.pop(tp, None)

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        tps = [self._check_assigned(tp) for tp in (partitions or self._assignment)]
        for tp, off in self.beginning_offsets(tps).items():
            self.seek(tp, off)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        tps = [self._check_assigned(tp) for tp in (partitions or self._assignment)]
        for tp, off in self.end_offsets(tps).items():
            self.seek(tp, off)

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record ``poll`` returns for ``tp``."""
        tp = self._check_assigned(tp)
        q = self._buffered.get(tp)
        if q:
            return q[0].offset
        if tp not in self._positions:
            self._reset_positions([tp])
        return self._positions[tp]

    def _reset_positions(self, tps: list[TopicPartition]) -> None:
        policy = self.config["auto_offset_reset"]
        if policy == "none":
            raise KafkaError(ErrorCode.offset_out_of_range, f"no position for {tps} and auto_offset_reset=none")
        offsets = self._list_offsets(tps, EARLIEST if policy == "earliest" else LATEST)
        self._positions.update(offsets)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._list_offsets(list(partitions), EARLIEST)

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The end of each partition for this consumer's isolation level: the high watermark,
        or under read_committed the last stable offset."""
        return self._list_offsets(list(partitions), LATEST)

    def _list_offsets(self, tps: list[TopicPartition], spec: int) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        todo = [(t, int(p)) for t, p in tps]
        last: KafkaError = KafkaTimeoutError("ListOffsets: no answer")
        for _ in Deadline(self.config["metadata_timeout_ms"], self.config["retry_backoff_ms"]):
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in todo:
                by_leader.setdefault(self.cluster.leader(*tp), []).append(tp)
            retry: list[TopicPartition] = []
            for leader, group in by_leader.items():
                topics: dict[str, list[dict]] = {}
                for t, p in group:
                    topics.setdefault(t, []).append({"partition_index": p, "current_leader_epoch": -1,
                                                     "timestamp": spec})
                body = {"replica_id": -1, "isolation_level": self.isolation,
                        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
                try:
                    resp = self.cluster.connection(leader).request(LIST_OFFSETS, body)
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    last = exc
                    retry.extend(group)
                    continue
                for t in resp.topics:
                    for p in t.partitions:
                        code = error_code(p.error_code)
                        tp = (t.name, p.partition_index)
                        if code == ErrorCode.none:
                            out[tp] = p.offset
                        elif code.retriable:
                            if code in _LEADER_ERRORS:
                                self.cluster.invalidate(t.name)
                            last = KafkaError(code, f"ListOffsets {tp}")
                            retry.append(tp)
                        else:
                            raise KafkaError(code, f"ListOffsets {tp}")
            todo = retry
            if not todo:
                return out
        raise last

    # -- committed offsets ----------------------------------------------------------------------
    def committed(self, partitions: Iterable[TopicPartition], group_id: str, *,
                  require_stable: bool = True) -> dict[TopicPartition, int | None]:
        """The offsets ``group_id`` committed for ``partitions`` (None where it has none), by
        OffsetFetch to the group's coordinator. ``require_stable`` (KIP-447) waits out offsets
        that an open transaction has committed but not yet completed, instead of returning the
        older value."""
        tps = [(t, int(p)) for t, p in partitions]
        topics: dict[str, list[int]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append(p)
        body = {"group_id": group_id, "require_stable": require_stable,
                "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}
        last: KafkaError = KafkaTimeoutError("OffsetFetch: no answer")
        for _ in Deadline(self.config["metadata_timeout_ms"], self.config["retry_backoff_ms"]):
            try:
                conn = self.cluster.coordinator(group_id, COORDINATOR_GROUP)
                resp = conn.request(OFFSET_FETCH, body, version=min(7, conn.version(OFFSET_FETCH,
                                                                                   minimum=7)))
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                self.cluster.forget_coordinator(group_id, COORDINATOR_GROUP)
                last = exc
                continue
            codes = [error_code(resp.error_code)] + [error_code(p.error_code) for t in resp.topics
                                                     for p in t.partitions]
            bad = next((c for c in codes if c != ErrorCode.none), None)
            if bad is None:
                return {(t.name, p.partition_index): (p.committed_offset if p.committed_offset >= 0 else None)
                        for t in resp.topics for p in t.partitions}
            if not bad.retriable:
                raise KafkaError(bad, f"OffsetFetch {group_id!r}")
            if bad in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available):
                self.cluster.forget_coordinator(group_id, COORDINATOR_GROUP)
            last = KafkaError(bad, f"OffsetFetch {group_id!r}")
        raise last

    # -- fetching -------------------------------------------------------------------------------
    def poll(self, timeout_ms: float = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout_ms`` for some."""
        if self._closed:
            raise KafkaError(ErrorCode.unknown_server_error, "the consumer is closed")
        if not self._assignment:
            return []
        end = time.monotonic() + timeout_ms / 1000.0
        while True:
            out = self._take_buffered(max_records)
            if out:
                return out
            left_ms = max(0.0, (end - time.monotonic()) * 1000.0)
            self._fetch_round(int(min(left_ms, self.config["fetch_max_wait_ms"])))
            if time.monotonic() >= end:
                return self._take_buffered(max_records)

    def _take_buffered(self, max_records: int | None) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        for tp in self._assignment:
            q = self._buffered.get(tp)
            while q and (max_records is None or len(out) < max_records):
                out.append(q.popleft())
            if q is not None and not q:
                del self._buffered[tp]
        return out

    def _fetch_round(self, max_wait_ms: int) -> None:
        want = [tp for tp in self._assignment if not self._buffered.get(tp)]
        missing = [tp for tp in want if tp not in self._positions]
        if missing:
            self._reset_positions(missing)
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in want:
            try:
                by_leader.setdefault(self.cluster.leader(*tp), []).append(tp)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
        if not by_leader:
            time.sleep(self.config["retry_backoff_ms"] / 1000.0)
            return
        for leader, group in by_leader.items():
            try:
                self._fetch(leader, group, max_wait_ms)
            except (KafkaConnectionError, KafkaTimeoutError):
                time.sleep(self.config["retry_backoff_ms"] / 1000.0)

    def _fetch(self, leader: int, tps: list[TopicPartition], max_wait_ms: int) -> None:
        conn = self.cluster.connection(leader)
        version = conn.version(FETCH)
        ids: dict[str, uuid.UUID | None] = {t: self.cluster.topic(t).topic_id for t, _ in tps}
        if version >= 13 and any(v is None for v in ids.values()):
            version = 12                              # topic ids unknown: fetch by name
        topics: dict[str, list[dict]] = {}
        for t, p in tps:
            topics.setdefault(t, []).append({
                "partition": p, "current_leader_epoch": -1, "fetch_offset": self._positions[(t, p)],
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": self.config["max_partition_fetch_bytes"]})
        body = {"replica_id": -1, "replica_state": {"replica_id": -1, "replica_epoch": -1},
                "max_wait_ms": max_wait_ms, "min_bytes": self.config["fetch_min_bytes"],
                "max_bytes": self.config["fetch_max_bytes"], "isolation_level": self.isolation,
                "session_id": 0, "session_epoch": -1, "cluster_id": None,
                "topics": [{"topic": t, "topic_id": ids[t], "partitions": ps} for t, ps in topics.items()],
                "forgotten_topics_data": [], "rack_id": ""}
        resp = conn.request(FETCH, body, version=version)
        top = error_code(getattr(resp, "error_code", ErrorCode.none))
        if top != ErrorCode.none:
            raise KafkaError(top, "Fetch")
        for t in resp.responses:
            name = t.topic if version < 13 else self.cluster.topic_name(t.topic_id)
            if name is None:
                continue
            for p in t.partitions:
                self._handle_partition(name, p)

    def _handle_partition(self, topic: str, p: Any) -> None:
        tp = (topic, p.partition_index)
        if tp not in self._positions or tp not in self._assignment:
            return
        code = error_code(p.error_code)
        if code == ErrorCode.offset_out_of_range:
            del self._positions[tp]
            self._reset_positions([tp])
            return
        if code in _LEADER_ERRORS:
            self.cluster.invalidate(topic)
            return
        if code != ErrorCode.none:
            if code.retriable:
                return
            raise KafkaError(code, f"Fetch {topic}-{p.partition_index}")
        data = p.records or b""
        if not data:
            return
        position = self._positions[tp]
        aborted = [(a.producer_id, a.first_offset) for a in (p.aborted_transactions or ())]
        got = filter_fetched(data, position, aborted, self.isolation == READ_COMMITTED)
        if got.next_position == position:
            raise KafkaError(ErrorCode.record_list_too_large,
                             f"{topic}-{p.partition_index}: the batch at offset {position} is larger "
                             f"than max_partition_fetch_bytes ({self.config['max_partition_fetch_bytes']})")
        self._positions[tp] = got.next_position
        if got.records:
            lat = got.log_append_time
            self._buffered[tp] = deque(ConsumerRecord(topic, tp[1], r.offset, r.timestamp, r.key, r.value,
                                                      tuple(r.headers), 1 if r.offset in lat else 0)
                                       for r in got.records)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.cluster.close()
