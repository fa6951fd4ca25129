"""Topic administration and timestamps through real clients.

- Producing to a topic that does not exist auto-creates it through Metadata, with
  ``topics.default_partitions`` (1) partitions, and the record lands at offset 0.
- DescribeConfigs of a topic through each client's admin API: the effective topic configs, with
  values set at creation reported as topic configs (source 1) and the rest as defaults (source 5).
- DeleteTopics through each client's admin API removes the topic (Metadata answers
  UNKNOWN_TOPIC_OR_PARTITION); a topic re-created under the same name starts empty at offset 0.
- A topic created with message.timestamp.type=LogAppendTime: consumers see the broker's clock
  (timestamp type LogAppendTime; 2 in confluent-kafka) inside the produce window, whatever
  CreateTime the producer set, and the producer is told the same time.
- ListOffsets MAX_TIMESTAMP (KIP-734) through the admin APIs that have it.

One appliance for the module (one frontend, see APPLIANCE_CONFIG); topics are named per case.
"""

from __future__ import annotations

import math
import time
import zlib

import pytest

from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import CLIENTS, EARLIEST, LATEST, MAX_TIMESTAMP, OTHER, case_topic, driver
from client_records import (LOG_APPEND_TIME, Rec, assert_same_records, expected_positions,
                            make_records, partition_counts)
from raw_wire import raw_batches, raw_topic_error

BASE_TS = int(time.time() * 1000) - 3_600_000
# One frontend: the delete / re-create test then reads the old and the new topic through the same
# frontend process (a frontend that kept its map of the old segment used to serve it again).
APPLIANCE_CONFIG = {"server": {"frontends": 1}}
UNKNOWN_TOPIC_OR_PARTITION = 3
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5          # Kafka's ConfigSource ids


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_to_a_new_name_auto_creates_one_partition(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("auto", client)
    assert raw_topic_error(b, topic) == UNKNOWN_TOPIC_OR_PARTITION
    recs = [Rec(0, b"k%d" % i, b"v%d" % i, (("h", b"x"),), BASE_TS + i) for i in range(5)]
    reports = d.produce(b, topic, recs, "none")
    assert [(p, off) for p, off, _ in reports] == [(0, i) for i in range(5)]
    assert d.topic_partitions(b).get(topic) == 1
    assert raw_topic_error(b, topic) == 0
    got = d.consume(b, topic, {0: 0}, 5)
    assert_same_records(expected_positions(recs, [(0, i) for i in range(5)]), got, who=client)


@pytest.mark.parametrize("client", CLIENTS)
def test_describe_topic_configs(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    plain, tuned = case_topic("cfg-plain", client), case_topic("cfg-tuned", client)
    d.create_topics(b, {plain: (1, {}),
                        tuned: (2, {"retention.ms": "3600000", "max.message.bytes": "2000000",
                                    "message.timestamp.type": "LogAppendTime"})})
    cfg = d.describe_topic_configs(b, plain)
    assert cfg["retention.ms"] == ("604800000", DEFAULT_CONFIG)
    assert cfg["retention.bytes"] == ("-1", DEFAULT_CONFIG)
    assert cfg["segment.bytes"] == ("1073741824", DEFAULT_CONFIG)
    assert cfg["max.message.bytes"] == ("1048588", DEFAULT_CONFIG)
    assert cfg["cleanup.policy"] == ("delete", DEFAULT_CONFIG)
    assert cfg["message.timestamp.type"] == ("CreateTime", DEFAULT_CONFIG)
    cfg = d.describe_topic_configs(b, tuned)
    assert cfg["retention.ms"] == ("3600000", DYNAMIC_TOPIC_CONFIG)
    assert cfg["max.message.bytes"] == ("2000000", DYNAMIC_TOPIC_CONFIG)
    assert cfg["message.timestamp.type"] == ("LogAppendTime", DYNAMIC_TOPIC_CONFIG)
    assert cfg["segment.bytes"] == ("1073741824", DEFAULT_CONFIG)


@pytest.mark.parametrize("client", CLIENTS)
def test_delete_topic_then_recreate_starts_empty(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("del", client)
    d.create_topics(b, {topic: (3, {})})
    old = make_records(300, 3, d.caps, seed=zlib.crc32(topic.encode()), base_ts=BASE_TS)
    reports = d.produce(b, topic, old, "gzip")
    assert d.list_offsets(b, topic, dict.fromkeys(range(3), LATEST)) == {
        p: (n, None) for p, n in partition_counts(old, 3).items()}
    # Read the old records, so that the (single) frontend has the old segments mapped.
    got = d.consume(b, topic, dict.fromkeys(range(3), 0), len(old))
    assert_same_records(expected_positions(old, [(p, off) for p, off, _ in reports]), got, who=client)

    d.delete_topics(b, [topic])
    assert raw_topic_error(b, topic) == UNKNOWN_TOPIC_OR_PARTITION
    assert topic not in d.topic_partitions(b)

    d.create_topics(b, {topic: (3, {})})
    assert d.topic_partitions(b).get(topic) == 3
    parts = range(3)
    assert d.list_offsets(b, topic, dict.fromkeys(parts, EARLIEST)) == dict.fromkeys(parts, (0, None))
    assert d.list_offsets(b, topic, dict.fromkeys(parts, LATEST)) == dict.fromkeys(parts, (0, None))
    new = make_records(6, 3, d.caps, seed=1, base_ts=BASE_TS + 10_000)
    reports = d.produce(b, topic, new, "none")
    expected = expected_positions(new, [(p, off) for p, off, _ in reports])   # offsets from 0 again
    got = d.consume(b, topic, dict.fromkeys(parts, 0), len(new))
    assert_same_records(expected, got, who=f"{client} after re-create")


@pytest.mark.parametrize("client", CLIENTS)
def test_log_append_time_topic(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("lat", client)
    d.create_topics(b, {topic: (2, {"message.timestamp.type": "LogAppendTime"})})
    # CreateTimes a day old: the broker must replace them with its clock.
    recs = make_records(1000, 2, d.caps, seed=zlib.crc32(topic.encode()), base_ts=BASE_TS - 86_400_000)
    before = math.floor(time.time() * 1000)
    reports = d.produce(b, topic, recs, "lz4")
    after = math.ceil(time.time() * 1000)
    expected = expected_positions(recs, [(p, off) for p, off, _ in reports])
    reported = {(p, off): ts for p, off, ts in reports}

    for x in raw_batches(b, topic, 0) + raw_batches(b, topic, 1):
        assert x.timestamp_type == LOG_APPEND_TIME and before <= x.max_timestamp <= after, (x, before, after)
    for reader in (d, driver(OTHER[client])):
        got = reader.consume(b, topic, {0: 0, 1: 0}, len(recs))
        assert_same_records(expected, got, timestamp_type=LOG_APPEND_TIME, who=f"{reader.name} reads {topic}")
        outside = [g for g in got if not before <= g.timestamp <= after]
        assert not outside, f"{reader.name}: timestamps outside [{before}, {after}]: {outside[:3]}"
        # The producer was told the broker's time (ProduceResponse log_append_time_ms).
        differ = [(g.partition, g.offset, g.timestamp, reported[(g.partition, g.offset)]) for g in got
                  if reported[(g.partition, g.offset)] is not None
                  and reported[(g.partition, g.offset)] != g.timestamp]
        assert not differ, f"producer-reported times differ from the stored ones: {differ[:5]}"

    # By timestamp, the broker's times count: the first record of each partition is found from
    # ``before`` on (with the time of its batch), and nothing from the largest time + 1 on.
    batches = {p: raw_batches(b, topic, p) for p in (0, 1)}
    first = d.list_offsets(b, topic, {0: before, 1: before})
    for p in (0, 1):
        assert first[p] is not None and first[p][0] == 0, first
        assert first[p][1] in (None, batches[p][0].max_timestamp), (first, batches[p][0])
    last = {p: max(x.max_timestamp for x in batches[p]) for p in (0, 1)}
    assert d.list_offsets(b, topic, {p: last[p] + 1 for p in (0, 1)}) == {0: None, 1: None}


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_list_offsets_max_timestamp(shared_appliance, client):
    # Regression: MAX_TIMESTAMP (-3) used to crash the fetcher (LogReader had no max_timestamp).
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("maxts", client)
    d.create_topics(b, {topic: (1, {})})
    # Timestamps go up and down; the largest is in the middle of the log, held by two records
    # (Kafka answers the first of them).
    stamps = [BASE_TS + (i * 37) % 101 for i in range(300)]
    top = 120
    stamps[top] = stamps[top + 50] = BASE_TS + 1000
    recs = [Rec(0, b"k", b"v%d" % i, (), t) for i, t in enumerate(stamps)]
    d.produce(b, topic, recs, "none", **({"linger.ms": 50} if client == "confluent" else {"linger_ms": 50}))
    assert len(raw_batches(b, topic, 0)) < len(recs)     # the records share batches
    got = d.list_offsets(b, topic, {0: MAX_TIMESTAMP}, via="admin")
    assert got == {0: (top, BASE_TS + 1000)}
