"""Fetch semantics (long-poll, byte limits, whole batches) and storage (roll, retention) end to end."""

import threading
import time

from appliance.protocol.records import Record, build_batch, decode_records, iter_batch_headers
from raw_wire import RawClient


def create(raw, name, partitions=1, configs=()):
    r = raw.request(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                        "assignments": [], "configs": [{"name": k, "value": v} for k, v in configs]}],
                            "timeout_ms": 10000})
    assert r.topics[0].error_code == 0, r


def produce(raw, topic, batch, partition=0):
    r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                           "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
    p = r.responses[0].partition_responses[0]
    assert p.error_code == 0, p
    return p


def fetch(raw, topic, offset, *, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, part_max=1 << 20, version=11):
    r = raw.request(1, version, {"max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes,
                                 "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                 "topics": [{"topic": topic, "partitions": [
                                     {"partition": 0, "fetch_offset": offset, "partition_max_bytes": part_max}]}],
                                 "forgotten_topics_data": [], "rack_id": ""})
    return r.responses[0].partitions[0]


def list_offset(raw, topic, ts):
    r = raw.request(2, 7, {"replica_id": -1, "isolation_level": 0,
                           "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": ts}]}]})
    p = r.topics[0].partitions[0]
    assert p.error_code == 0, p
    return p.offset, p.timestamp


def batch_of(n, start=0, size=100, ts=None):
    return build_batch([Record(key=b"%d" % (start + i), value=b"x" * size, timestamp=ts) for i in range(n)])


def test_long_poll_is_woken_by_a_produce(appliance):
    with RawClient(appliance.bootstrap) as raw, RawClient(appliance.bootstrap) as other:
        create(raw, "lp")
        result = {}

        def poll():
            t0 = time.monotonic()
            result["p"] = fetch(raw, "lp", 0, max_wait_ms=20000, min_bytes=1)
            result["elapsed"] = time.monotonic() - t0

        t = threading.Thread(target=poll)
        t.start()
        # Produce only once the fetch is parked: produced earlier, the fetch would find the data
        # at once and the wake-up would go untested.
        appliance.wait_for(lambda: appliance.fetch_parked("lp"), 30, "the fetch to be parked")
        assert t.is_alive()
        produce(other, "lp", batch_of(3))
        t.join(30)
        assert result["p"].error_code == 0 and result["p"].records
        # Woken by the append, not by the 20 s deadline.
        assert result["elapsed"] < 10
        assert not appliance.fetch_parked("lp")              # the fetcher let go of it


def test_long_poll_times_out_empty(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "lp2")
        p = fetch(raw, "lp2", 0, max_wait_ms=300, min_bytes=1)
        assert p.error_code == 0 and not p.records and p.high_watermark == 0


def test_min_bytes_waits_for_enough_data(appliance):
    with RawClient(appliance.bootstrap) as raw, RawClient(appliance.bootstrap) as other:
        create(raw, "mb")
        produce(other, "mb", batch_of(1))                # ~150 bytes: below min_bytes
        out = {}
        t = threading.Thread(target=lambda: out.update(p=fetch(raw, "mb", 0, max_wait_ms=20000, min_bytes=2000)))
        t.start()
        # Parked: 1 small batch < min_bytes (answered at once, it would never park).
        appliance.wait_for(lambda: appliance.fetch_parked("mb"), 30, "the fetch to be parked")
        assert t.is_alive()
        produce(other, "mb", batch_of(20))
        t.join(30)
        assert sum(1 for _ in iter_batch_headers(out["p"].records)) == 2


def test_first_batch_larger_than_limits_is_still_returned(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "big")
        produce(raw, "big", batch_of(10, size=5000))      # one ~50 KB batch
        produce(raw, "big", batch_of(10, start=10, size=5000))
        p = fetch(raw, "big", 0, max_bytes=1000, part_max=1000)
        heads = [h for _, h in iter_batch_headers(p.records)]
        assert len(heads) == 1 and heads[0].base_offset == 0      # progress: one whole batch
        p = fetch(raw, "big", 0, max_bytes=1 << 20, part_max=60000)
        assert len(list(iter_batch_headers(p.records))) == 1      # partition limit respected


def test_fetch_inside_a_batch_returns_the_whole_batch(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "mid")
        produce(raw, "mid", batch_of(10))
        p = fetch(raw, "mid", 7)
        recs = decode_records(bytes(p.records))
        assert [r.offset for r in recs] == list(range(10))


def test_list_offsets_by_timestamp(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "ts")
        produce(raw, "ts", batch_of(5, ts=1_000_000))
        produce(raw, "ts", batch_of(5, start=5, ts=2_000_000))
        assert list_offset(raw, "ts", -2) == (0, -1)
        assert list_offset(raw, "ts", -1) == (10, -1)
        assert list_offset(raw, "ts", 1_500_000) == (5, 2_000_000)
        assert list_offset(raw, "ts", 500) == (0, 1_000_000)
        assert list_offset(raw, "ts", 3_000_000) == (-1, -1)


def test_segments_roll_and_retention_advances_log_start(appliance_factory):
    app = appliance_factory(log={"retention_check_interval_ms": 200})
    with RawClient(app.bootstrap) as raw:
        create(raw, "ret", configs=[("segment.bytes", "20000"), ("retention.bytes", "40000")])
        # ~1.1 KB batches: 110 KB in 20 KB segments; Kafka deletes a segment only while the
        # rest stays >= retention.bytes, so about three segments go.
        for i in range(100):
            produce(raw, "ret", batch_of(10, start=i * 10, size=100))
        first = app.wait_for(lambda: list_offset(raw, "ret", -2)[0] or None, what="log start to advance")
        assert first > 0
        p = fetch(raw, "ret", 0)
        assert p.error_code == 1 and p.log_start_offset >= first        # OFFSET_OUT_OF_RANGE

        def read_at_log_start():
            # A retention pass may have run while the batches were still coming (a loaded
            # machine): the next pass moves the start on, and a fetch at the start read just
            # before it is out of range. What must hold: a fetch at the current start reads it.
            start = fetch(raw, "ret", 0).log_start_offset
            q = fetch(raw, "ret", start)
            return (start, q) if q.error_code == 0 else None
        start, p = app.wait_for(read_at_log_start, what="a fetch at the log start")
        assert start >= first and decode_records(bytes(p.records[:]))[0].offset == start
        assert list_offset(raw, "ret", -1)[0] == 1000
    # survives a restart
    app.terminate()
    app.start()
    with RawClient(app.bootstrap) as raw:
        assert list_offset(raw, "ret", -2)[0] >= start
        assert list_offset(raw, "ret", -1)[0] == 1000


def test_time_retention(appliance_factory):
    app = appliance_factory(log={"retention_check_interval_ms": 200})
    with RawClient(app.bootstrap) as raw:
        create(raw, "tret", configs=[("segment.bytes", "5000"), ("retention.ms", "1000")])
        old = int(time.time() * 1000) - 10_000
        for i in range(10):
            produce(raw, "tret", batch_of(10, start=i * 10, ts=old))
        app.wait_for(lambda: list_offset(raw, "tret", -2)[0] > 0, what="time retention")


def test_list_offsets_max_timestamp(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "maxts")
        produce(raw, "maxts", build_batch([Record(key=None, value=b"a", timestamp=t) for t in (5, 900, 7)]))
        produce(raw, "maxts", build_batch([Record(key=None, value=b"b", timestamp=t) for t in (100, 200)]))
        assert list_offset(raw, "maxts", -3) == (1, 900)


def test_recreated_topic_does_not_serve_the_old_files(appliance):
    """Regression: frontends cached segment maps by partition dir; a topic deleted and created
    again under the same name has the same dir and base offset, so a fetch returned the bytes of
    the deleted topic's file."""
    with RawClient(appliance.bootstrap) as raw:
        create(raw, "again")
        produce(raw, "again", build_batch([Record(key=None, value=b"old" * 10)]))
        assert decode_records(bytes(fetch(raw, "again", 0).records))[0].value == b"old" * 10
        r = raw.request(20, 4, {"topic_names": ["again"], "timeout_ms": 10000})
        assert r.responses[0].error_code == 0
        create(raw, "again")
        produce(raw, "again", build_batch([Record(key=None, value=b"new" * 10)]))
        for _ in range(4):      # every frontend connection path: new connections land anywhere
            with RawClient(appliance.bootstrap) as r2:
                assert decode_records(bytes(fetch(r2, "again", 0).records))[0].value == b"new" * 10
        assert decode_records(bytes(fetch(raw, "again", 0).records))[0].value == b"new" * 10


def test_the_brokers_fetch_max_bytes_caps_every_answer_but_a_first_batch_goes_whole(appliance_factory):
    """Kafka's broker fetch.max.bytes: the answer is min(the request's max_bytes, it); a first
    batch larger than the limit is still sent whole (KIP-74), so that a consumer progresses."""
    app = appliance_factory(server={"fetch_max_bytes": 3000})
    with RawClient(app.bootstrap) as raw:
        create(raw, "cap")
        for i in range(4):
            produce(raw, "cap", batch_of(10, start=10 * i))              # ~1.2 KB each
        produce(raw, "cap", batch_of(40, start=40))                       # ~4.5 KB
        sizes = []
        offset = 0
        while offset < 80:
            p = fetch(raw, "cap", offset, max_bytes=50 << 20, part_max=50 << 20)
            assert p.error_code == 0, p
            batches = [h for _, h in iter_batch_headers(bytes(p.records or b""))]
            assert batches, offset
            sizes.append((len(batches), len(bytes(p.records))))
            offset = batches[-1].last_offset + 1
        # Two small batches fit in 3,000 bytes, a third does not; the big one goes alone, whole.
        assert [n for n, _ in sizes] == [2, 2, 1], sizes
        assert all(size <= 3000 for _, size in sizes[:2]) and sizes[2][1] > 3000, sizes
