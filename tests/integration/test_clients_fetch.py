"""Fetch edge cases through real clients: starting inside a batch, and fetch limits below a batch.

- A consumer that seeks to an offset in the middle of a (possibly compressed) batch gets the
  records from that offset on: the broker answers with the whole batch that contains the offset
  (Kafka never splits a batch), and the client drops the records before the offset.
- A consumer whose max.partition.fetch.bytes / fetch.max.bytes are far below the batch sizes still
  makes progress (KIP-74: the first batch of the response is returned whole even when it exceeds
  the limits).

One appliance for the module; topics are named per case.
"""

from __future__ import annotations

import time
import zlib

import pytest

from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import CLIENTS, case_topic, driver
from client_records import Caps, assert_same_records, expected_positions, make_records
from raw_wire import raw_batches, raw_fetch_sizes

BASE_TS = int(time.time() * 1000) - 3_600_000

# Producer settings that make big multi-record batches (long linger, 1 MiB batches).
BIG_BATCHES = {
    "confluent": {"linger.ms": 100, "batch.num.messages": 100000, "batch.size": 1 << 20},
    "kafka-python": {"linger_ms": 100, "batch_size": 1 << 20},
    "aiokafka": {"linger_ms": 100, "max_batch_size": 1 << 20},
}
# Consumer limits far below one batch.
TINY_FETCH = {
    "confluent": {"fetch.max.bytes": 1024, "max.partition.fetch.bytes": 1024, "message.max.bytes": 1000,
                  "receive.message.max.bytes": 1 << 20},
    "kafka-python": {"fetch_max_bytes": 1024, "max_partition_fetch_bytes": 1024},
    "aiokafka": {"fetch_max_bytes": 1024, "max_partition_fetch_bytes": 1024},
}


@pytest.mark.parametrize("codec", ["none", "zstd"])
@pytest.mark.parametrize("client", CLIENTS)
def test_consume_from_the_middle_of_a_batch(shared_appliance, client, codec):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("mid", client, codec)
    d.create_topics(b, {topic: (1, {})})
    recs = make_records(2000, 1, d.caps, seed=zlib.crc32(topic.encode()), base_ts=BASE_TS)
    reports = d.produce(b, topic, recs, codec, **BIG_BATCHES[client])
    expected = expected_positions(recs, [(p, off) for p, off, _ in reports])

    batches = [x for x in raw_batches(b, topic, 0) if x.last_offset - x.base_offset >= 2]
    assert len(batches) >= 2, f"the producer made no multi-record batches: {raw_batches(b, topic, 0)[:5]}"
    first, last = batches[0], batches[-1]
    starts = [first.base_offset + 1, (last.base_offset + last.last_offset) // 2, last.last_offset]
    for off in starts:
        # The broker returns the whole batch that holds the offset...
        _, got_batches = raw_fetch_sizes(b, topic, 0, off, 1 << 20, 1 << 20)
        containing = next(x for x in batches if x.base_offset <= off <= x.last_offset)
        assert got_batches[0].base_offset == containing.base_offset, (off, got_batches[0], containing)
        # ... and the client hands out the records from the offset on, nothing before it.
        got = d.consume(b, topic, {0: off}, len(recs) - off)
        assert got and got[0].offset == off, (off, got[:1])
        assert_same_records(expected, got, start={0: off}, who=f"{client} from offset {off}")


@pytest.mark.parametrize("client", CLIENTS)
def test_tiny_fetch_limits_still_progress(shared_appliance, client):
    b = shared_appliance.bootstrap
    producer = driver("confluent")
    topic = case_topic("tiny-fetch", client)
    producer.create_topics(b, {topic: (2, {})})
    # 40 records of ~40 KiB per partition, in multi-record batches far above the 1 KiB limits.
    recs = make_records(80, 2, Caps(True, True), seed=zlib.crc32(topic.encode()), base_ts=BASE_TS)
    recs = [r._replace(value=(r.value or b"v") * (40960 // len(r.value or b"v") + 1)) for r in recs]
    reports = producer.produce(b, topic, recs, "none", **BIG_BATCHES["confluent"])
    expected = expected_positions(recs, [(p, off) for p, off, _ in reports])
    for p in (0, 1):
        batches = raw_batches(b, topic, p)
        assert all(x.size > 1024 for x in batches)
        assert any(x.last_offset > x.base_offset for x in batches), batches
        # KIP-74: the first batch comes back whole although it exceeds both limits ...
        nbytes, got_batches = raw_fetch_sizes(b, topic, p, 0, 1024, 1024)
        assert [(x.base_offset, x.size) for x in got_batches] == [(0, batches[0].size)]
        assert nbytes == batches[0].size
    got = driver(client).consume(b, topic, {0: 0, 1: 0}, len(recs), **TINY_FETCH[client])
    assert_same_records(expected, got, who=f"{client} with 1 KiB fetch limits")
