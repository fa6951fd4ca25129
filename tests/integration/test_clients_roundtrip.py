"""Round trip through real clients: every client x every codec, topics of 1 and 8 partitions.

For each (client, codec): the client's admin API creates the two topics, its producer sends 10,000
records to each (acks=all, no idempotence: the appliance has no InitProducerId yet), spread over
every partition by explicit partition numbers; then

- ``test_produce_and_fetch_back``: the same client reads everything back by assignment (no group),
  byte for byte: key, value, headers (order, duplicates, nulls), partition, offset order, CreateTime;
- ``test_fetch_by_other_client``: another client reads the same records (OTHER in client_drivers.py);
- ``test_list_offsets``: earliest, latest and by-timestamp ListOffsets through the client's consumer
  (and its admin API where it has one) agree with what was produced.

One appliance for the module; what was produced for a case is remembered (record seed + offsets)
so the three tests share one production run per case.
"""

from __future__ import annotations

import collections
import time
import zlib

import pytest

from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import CLIENTS, EARLIEST, LATEST, MAX_TIMESTAMP, OTHER, case_topic, driver
from client_records import (CODECS, assert_same_records, expected_offset_for_time,
                            expected_positions, make_records, partition_counts, time_targets)
from raw_wire import raw_batches

N_RECORDS = 10_000
PARTITION_COUNTS = (1, 8)
BASE_TS = int(time.time() * 1000) - 3_600_000     # an hour ago: well inside retention

_produced: dict[tuple[str, str], dict | Exception] = {}


def _case(appliance, client: str, codec: str) -> dict:
    """Create the case's topics and produce into them once; later calls reuse the result."""
    key = (client, codec)
    if key in _produced:
        got = _produced[key]
        if isinstance(got, Exception):
            pytest.fail(f"producing for {key} failed earlier: {got!r}")
        return got
    try:
        d = driver(client)
        b = appliance.bootstrap
        topics = {case_topic("rt", client, codec, n): n for n in PARTITION_COUNTS}
        d.create_topics(b, {t: (n, {}) for t, n in topics.items()})
        listed = d.topic_partitions(b)
        for t, n in topics.items():
            assert listed.get(t) == n, f"{client} metadata lists {t} with {listed.get(t)} partitions, not {n}"
        case = {}
        for topic, n in topics.items():
            seed = zlib.crc32(topic.encode())
            recs = make_records(N_RECORDS, n, d.caps, seed=seed, base_ts=BASE_TS)
            reports = d.produce(b, topic, recs, codec)
            expected = expected_positions(recs, [(p, off) for p, off, _ in reports])
            bad_ts = [(r.timestamp, ts) for r, (_, _, ts) in zip(recs, reports) if ts is not None and ts != r.timestamp]
            assert not bad_ts, f"{client} producer reports other timestamps than sent: {bad_ts[:5]}"
            _check_stored_codec(b, topic, n, codec)
            case[topic] = dict(partitions=n, expected=expected, counts=partition_counts(recs, n))
        _produced[key] = case
        return case
    except Exception as e:
        _produced[key] = e
        raise


def _check_stored_codec(bootstrap: str, topic: str, partitions: int, codec: str) -> None:
    """The batches are stored as the producer compressed them, so the codec under test really
    went through the broker (librdkafka may send a batch uncompressed when that is smaller)."""
    records = collections.Counter()        # codec -> records stored with it
    for p in range(partitions):
        for x in raw_batches(bootstrap, topic, p):
            records[x.codec] += x.last_offset - x.base_offset + 1
    assert set(records) <= {codec, "none"}, records
    assert records[codec] >= 0.5 * sum(records.values()), records


params = pytest.mark.parametrize("client,codec", [(c, k) for c in CLIENTS for k in CODECS])


@params
def test_produce_and_fetch_back(shared_appliance, client, codec):
    case = _case(shared_appliance, client, codec)
    d = driver(client)
    for topic, c in case.items():
        assert all(c["counts"].values()), c["counts"]
        got = d.consume(shared_appliance.bootstrap, topic, dict.fromkeys(range(c["partitions"]), 0), N_RECORDS)
        assert_same_records(c["expected"], got, who=f"{client} reads {topic}")


@params
def test_fetch_by_other_client(shared_appliance, client, codec):
    case = _case(shared_appliance, client, codec)
    other = driver(OTHER[client])
    for topic, c in case.items():
        got = other.consume(shared_appliance.bootstrap, topic, dict.fromkeys(range(c["partitions"]), 0),
                            N_RECORDS)
        assert_same_records(c["expected"], got, who=f"{other.name} reads {topic} ({client} produced)")


@params
def test_list_offsets(shared_appliance, client, codec):
    case = _case(shared_appliance, client, codec)
    d = driver(client)
    b = shared_appliance.bootstrap
    routes = ["consumer"] + (["admin"] if d.admin_list_offsets else [])
    for topic, c in case.items():
        parts = range(c["partitions"])
        expected = c["expected"]
        for via in routes:
            earliest = d.list_offsets(b, topic, dict.fromkeys(parts, EARLIEST), via=via)
            latest = d.list_offsets(b, topic, dict.fromkeys(parts, LATEST), via=via)
            assert {p: e[0] for p, e in earliest.items()} == dict.fromkeys(parts, 0), (via, earliest)
            assert {p: e[0] for p, e in latest.items()} == c["counts"], (via, latest)
            targets = {p: time_targets(expected, p) for p in parts}
            for i in range(len(targets[0])):
                ask = {p: targets[p][i] for p in parts}
                got = d.list_offsets(b, topic, ask, via=via)
                for p in parts:
                    want = expected_offset_for_time(expected, p, ask[p])
                    g = got[p]
                    if want is None or g is None:
                        assert g == want, (topic, via, p, ask[p], g, want)
                        continue
                    assert g[0] == want[0], (topic, via, p, ask[p], g, want)
                    if g[1] is not None:      # confluent's consumer API reports no timestamp
                        assert g[1] == want[1], (topic, via, p, ask[p], g, want)
            if via == "admin":
                # KIP-734: the first record carrying the partition's largest timestamp.
                got = d.list_offsets(b, topic, dict.fromkeys(parts, MAX_TIMESTAMP), via=via)
                assert got == {p: _max_timestamp(expected, p) for p in parts}, (topic, got)


def _max_timestamp(expected, partition):
    recs = [(off, r.timestamp) for (p, off), r in sorted(expected.items()) if p == partition]
    top = max(ts for _, ts in recs)
    return next((off, ts) for off, ts in recs if ts == top)
