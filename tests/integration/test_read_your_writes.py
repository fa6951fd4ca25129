"""A Fetch sent right after a Produce's answer finds what the answer said was written.

Regression: the partition writer put an acks=1 answer into the frontend's ring before it
published the new high watermark on its state page, so a client that fetched at the base offset
it was just given could get OFFSET_OUT_OF_RANGE (seen under load by the connection load test).
Kafka moves the leader's log end offset before it answers a Produce."""

from __future__ import annotations

import asyncio
import time

from appliance.protocol.records import Record, build_batch
from rawclient import RawClient, encode_request, read_response

CONNECTIONS = 20
SECONDS = 4.0


async def _produce_then_fetch(port: int, i: int, until: float, batch: bytes, seen: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    corr = 0
    try:
        while time.monotonic() < until:
            corr += 1
            writer.write(encode_request(0, 9, corr, {"transactional_id": None, "acks": 1, "timeout_ms": 30000,
                                               "topic_data": [{"name": "ryw", "partition_data": [
                                                   {"index": i % 2, "records": batch}]}]}))
            p = (await read_response(reader, 0, 9)).responses[0].partition_responses[0]
            assert p.error_code == 0, p
            corr += 1
            writer.write(encode_request(1, 12, corr, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 16,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": "ryw", "partitions": [
                    {"partition": i % 2, "current_leader_epoch": -1, "fetch_offset": p.base_offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 16}]}],
                "forgotten_topics_data": [], "rack_id": ""}))
            f = (await read_response(reader, 1, 12)).responses[0].partitions[0]
            key = ("ok" if f.error_code == 0 and f.records else f"error {f.error_code}"
                   if f.error_code else "empty")
            seen[key] = seen.get(key, 0) + 1
    finally:
        writer.close()
        await writer.wait_closed()


def test_fetch_right_after_an_acks_1_answer_finds_the_records(appliance_factory):
    app = appliance_factory()
    with RawClient(app.bootstrap) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "ryw", "num_partitions": 2, "replication_factor": 1,
                                            "assignments": [], "configs": []}], "timeout_ms": 30000})
        assert r.topics[0].error_code == 0
    batch = build_batch([Record(key=b"k", value=b"v" * 100) for _ in range(3)])
    seen: dict[str, int] = {}

    async def run():
        until = time.monotonic() + SECONDS
        await asyncio.gather(*[_produce_then_fetch(app.port, i, until, batch, seen)
                               for i in range(CONNECTIONS)])
    asyncio.run(run())
    assert seen.get("ok", 0) > 0 and set(seen) == {"ok"}, seen
