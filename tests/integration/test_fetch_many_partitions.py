"""A consumer of more partitions than a fetch worker keeps handles for (workers/fetcher.py,
max_handles, held at MAX_HANDLES here through its test hook): every partition's long-poll holds its handle, so the handle opened next was the
only one the eviction could close, and it closed it under its caller: every Fetch and
ListOffsets of such a consumer failed with UNKNOWN_SERVER_ERROR (bench_consume.py at 10,000
partitions, 2,500 per consumer). Found 2026-12-02; regression test named after it."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from workers.fetcher import HANDLES_ENV, MAX_HANDLES

PARTITIONS = MAX_HANDLES + 100


def test_regression_a_consumer_of_more_partitions_than_the_fetchers_handles_got_unknown_server_error(
        appliance_factory):
    app = appliance_factory(server={"fetchers": 1}, topics={"auto_create": False},
                            env={HANDLES_ENV: str(MAX_HANDLES)})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    admin.create_topics([NewTopic("wide", PARTITIONS, 1)])["wide"].result(300)
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "wide", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 500})
    c.assign([TopicPartition("wide", p, 0) for p in range(PARTITIONS)])
    # Long-polls on every partition first (nothing to read), then records to read.
    for _ in range(5):
        assert c.poll(0.5) is None
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all"})
    picked = [0, 1, MAX_HANDLES, PARTITIONS - 1]
    for q in picked:
        p.produce("wide", value=b"v%d" % q, partition=q)
    assert p.flush(60) == 0
    got = {}
    app.wait_for(lambda: _poll_into(c, got) and len(got) == len(picked), timeout=120,
                 what="the records of the wide topic")
    assert got == {q: b"v%d" % q for q in picked}
    lo, hi = c.get_watermark_offsets(TopicPartition("wide", PARTITIONS - 1), timeout=30, cached=False)
    assert (lo, hi) == (0, 1)
    c.close()
    errors = [line for line in app.log_text().splitlines()
              if "appliance.service:" in line and "failed" in line]
    assert errors == [], errors[:3]


def _poll_into(c: Consumer, got: dict) -> bool:
    m = c.poll(0.5)
    if m is not None and m.error() is None:
        got[m.partition()] = m.value()
    return True
