"""Helpers for the tests of the appliance's own client (``appliance.client``): unique names, topic
creation, reading a whole partition set back with our consumer, and the raw batch headers the
broker stores (producer id, epoch, sequence, codec), read with RawClient so that no client code is
trusted to describe itself."""

from __future__ import annotations

import time
import uuid

from appliance.client import Consumer
from appliance.protocol.records import iter_batch_headers
from clients import driver
from rawclient import RawClient

TIMEOUT_S = 60.0


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


def create(bootstrap: str, topics: dict[str, int]) -> None:
    driver("confluent").create_topics(bootstrap, {t: (n, {}) for t, n in topics.items()})


def settle(bootstrap: str, topic: str, partitions: int) -> None:
    """Wait until no transaction is open on the partitions (LSO == high watermark). EndTxn is
    answered once the outcome is logged; the markers follow, so a transaction just committed may
    still pin the LSO for a moment."""
    tps = [(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=bootstrap) as rc, \
            Consumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted") as ru:
        deadline = time.monotonic() + TIMEOUT_S
        while rc.end_offsets(tps) != ru.end_offsets(tps):
            assert time.monotonic() < deadline, f"{topic}: a transaction stays open"
            time.sleep(0.05)


def read_all(bootstrap: str, topic: str, partitions: int, level: str = "read_committed", *,
             settled: bool = True, **config) -> dict[int, list]:
    """partition -> every record our consumer returns from offset 0 up to the end offset of its
    isolation level (high watermark, or the LSO for read_committed). Stops on positions, not on
    a count, so an extra record cannot hide. ``settled``: first wait until no transaction is
    open (pass False where a test expects one to stay open)."""
    if settled:
        settle(bootstrap, topic, partitions)
    c = Consumer(bootstrap_servers=bootstrap, isolation_level=level, **config)
    try:
        tps = [(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning()
        end = c.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + TIMEOUT_S
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"positions {[c.position(tp) for tp in tps]} < {end}"
            for r in c.poll(500):
                out[r.partition].append(r)
        for p, recs in out.items():
            offs = [r.offset for r in recs]
            assert offs == sorted(set(offs)), f"partition {p}: offsets {offs}"
        return out
    finally:
        c.close()


def values_of(by_partition: dict[int, list]) -> dict[int, list[bytes]]:
    return {p: [r.value for r in recs] for p, recs in by_partition.items() if recs}


def stored_batches(bootstrap: str, topic: str, partition: int) -> list:
    """Every batch header the broker holds for the partition (Fetch v12, read_uncommitted)."""
    out = []
    offset = 0
    with RawClient(bootstrap) as raw:
        while True:
            r = raw.request(1, 12, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 16 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                     "log_start_offset": -1, "last_fetched_epoch": -1,
                     "partition_max_bytes": 16 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""})
            p = r.responses[0].partitions[0]
            assert p.error_code == 0, p
            got = [h for _, h in iter_batch_headers(bytes(p.records or b""))]
            out.extend(got)
            if not got or got[-1].last_offset + 1 >= p.high_watermark:
                return out
            offset = got[-1].last_offset + 1


def committed_offset(bootstrap: str, group: str, topic: str, partition: int) -> int:
    """OffsetFetch v7 with RequireStable: the group's committed offset (-1 when none)."""
    with RawClient(bootstrap) as raw:
        for _ in range(600):
            r = raw.request(9, 7, {"group_id": group, "require_stable": True,
                                   "topics": [{"name": topic, "partition_indexes": [partition]}]})
            p = r.topics[0].partitions[0]
            if p.error_code == 88:              # UNSTABLE_OFFSET_COMMIT: markers on their way
                time.sleep(0.05)
                continue
            assert p.error_code == 0 and r.error_code == 0, r
            return p.committed_offset
    raise AssertionError("offsets stayed unstable")
