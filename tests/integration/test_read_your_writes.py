"""A Fetch sent right after a Produce's answer finds what the answer said was written.

Regression: the partition writer put an acks=1 answer into the frontend's ring before it
published the new high watermark on its state page, so a client that fetched at the base offset
it was just given could get OFFSET_OUT_OF_RANGE (seen under load by the connection load test).
Kafka moves the leader's log end offset before it answers a Produce."""

from __future__ import annotations

import asyncio
import time

from appliance.protocol.records import Record, build_batch
from raw_wire import RawClient, produce_then_fetch

CONNECTIONS = 20
SECONDS = 4.0


async def _produce_then_fetch(port: int, i: int, until: float, batch: bytes, seen: dict) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    corr = 0
    try:
        while time.monotonic() < until:
            p, f = await produce_then_fetch(reader, writer, corr + 1, "ryw", i % 2, batch)
            corr += 2
            assert p.error_code == 0, p
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
