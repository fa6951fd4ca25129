"""Requests larger than the appliance's own channels, found by the frame fuzzer (inflated cases).

A request or an answer that does not fit one record of a ring between two of the appliance's
processes (``shm.small_ring_bytes`` / 2, ``shm.produce_ring_bytes`` / 2) is still carried
(spilled to a file in the runtime dir), and a request of thousands of partitions does not hold a
frontend's event loop past its heartbeat. Every worker stays the one that started.
"""

from __future__ import annotations

import re
import threading

from appliance.protocol.records import COMPRESSION_ZSTD, Record, build_batch
from raw_wire import RawClient

LOG_PROBLEMS = re.compile(r"Traceback|never retrieved|ERROR")


def pids(app) -> dict[str, int]:
    return {w["name"]: w["pid"] for w in app.workers()}


def create_topic(raw: RawClient, name: str, partitions: int = 1, configs=()) -> None:
    r = raw.request(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                        "assignments": [], "configs": [{"name": k, "value": v} for k, v in configs]}],
                            "timeout_ms": 30000})
    assert r.topics[0].error_code == 0, r


def join(raw: RawClient, member_id: str, metadata: bytes):
    return raw.request(11, 5, {"group_id": "big", "session_timeout_ms": 30000, "rebalance_timeout_ms": 30000,
                               "member_id": member_id, "group_instance_id": None, "protocol_type": "consumer",
                               "protocols": [{"name": "range", "metadata": metadata}]})


def test_join_group_larger_than_a_ring_record_is_served(appliance_factory):
    """Regression: a 2 MiB JoinGroup (subscription metadata) did not fit the frontend's ring to the
    coordinator: the handler failed with a traceback, and its registered future expired later as
    asyncio's "Future exception was never retrieved"."""
    app = appliance_factory(groups={"initial_rebalance_delay_ms": 0})
    before = pids(app)
    with RawClient(app.bootstrap, timeout=60) as raw:
        r = join(raw, "", b"m" * (2 << 20))
        assert r.error_code == 79                  # MEMBER_ID_REQUIRED, then the real join
        r = join(raw, r.member_id, b"m" * (2 << 20))
        assert r.error_code == 0 and r.members[0].metadata == b"m" * (2 << 20)
    assert pids(app) == before
    assert not LOG_PROBLEMS.search(app.log_text())


def test_join_group_answer_larger_than_a_ring_record_reaches_the_leader(appliance_factory):
    """Regression: two members with 300 KiB of metadata each: the leader's JoinGroup answer (both
    subscriptions) did not fit the coordinator's ring back ("respond callback failed"), and the
    leader got COORDINATOR_NOT_AVAILABLE after its timeout."""
    app = appliance_factory(groups={"initial_rebalance_delay_ms": 2000})
    metadata = [bytes([65 + i]) * (300 << 10) for i in range(2)]
    answers: list = [None, None]

    def member(i: int) -> None:
        with RawClient(app.bootstrap, timeout=60) as raw:
            r = join(raw, "", metadata[i])
            answers[i] = join(raw, r.member_id, metadata[i])

    threads = [threading.Thread(target=member, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert all(a is not None and a.error_code == 0 for a in answers), answers
    leader = next(a for a in answers if a.leader == a.member_id)
    assert sorted(m.metadata for m in leader.members) == metadata
    assert not LOG_PROBLEMS.search(app.log_text())


def test_batch_larger_than_the_produce_ring_is_message_too_large(appliance_factory):
    """Regression: a topic's max.message.bytes may allow a batch larger than the produce ring
    carries; the handler failed with a traceback instead of answering MESSAGE_TOO_LARGE."""
    app = appliance_factory(log={"message_max_bytes": 1 << 20}, shm={"produce_ring_bytes": 4 << 20})
    with RawClient(app.bootstrap, timeout=60) as raw:
        create_topic(raw, "wide", configs=[("max.message.bytes", str(16 << 20))])
        batch = build_batch([Record(key=None, value=bytes(3 << 20))])
        r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
            {"name": "wide", "partition_data": [{"index": 0, "records": batch}]}]})
        p = r.responses[0].partition_responses[0]
        assert p.error_code == 10 and "produce ring" in p.error_message     # MESSAGE_TOO_LARGE
        small = build_batch([Record(key=None, value=b"fits")])
        r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
            {"name": "wide", "partition_data": [{"index": 0, "records": small}]}]})
        assert r.responses[0].partition_responses[0].error_code == 0
    assert not LOG_PROBLEMS.search(app.log_text())


def test_produce_of_thousands_of_partitions_keeps_the_frontend_beating(appliance_factory):
    """Regression (fuzzer, inflated Produce): validating 20,000 zstd batches in one request held
    the frontend's event loop past its heartbeat timeout and the supervisor killed it. The
    validation now gives the loop back; the request is answered and no worker restarted."""
    app = appliance_factory(server={"frontends": 1}, supervisor={"heartbeat_timeout_ms": 2000})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "many")
    before = pids(app)
    batch = build_batch([Record(key=b"k%d" % i, value=b"v" * 100) for i in range(20)],
                        compression=COMPRESSION_ZSTD)
    entries = 20000
    with RawClient(app.bootstrap, timeout=120) as raw:
        r = raw.request(0, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 60000, "topic_data": [
            {"name": "many", "partition_data": [{"index": 0, "records": batch}] * entries}]})
        codes = [p.error_code for t in r.responses for p in t.partition_responses]
        assert len(codes) == entries and set(codes) == {0}
        assert raw.request(18, 0, {}).error_code == 0
    assert pids(app) == before


def test_requests_repeating_one_entry_are_answered_as_kafka_answers_them(appliance_factory):
    """Regressions (fuzzer, inflated requests): ListOffsets counted duplicates per partition
    (quadratic: 40,000 repeats took minutes); DescribeConfigs built and encoded every copy of
    the broker resource entity by entity (50,000: minutes); both held the frontend's event loop
    past its heartbeat (here 3 s) and the supervisor killed it. Fetch answered a repeated
    partition once per repeat (Kafka keeps a full fetch's partitions in a map: once); Metadata
    too (Kafka reads the topics into a set)."""
    app = appliance_factory(server={"frontends": 1}, supervisor={"heartbeat_timeout_ms": 3000})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "rep")
        batch = build_batch([Record(key=None, value=b"x")])
        raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
            {"name": "rep", "partition_data": [{"index": 0, "records": batch}]}]})
    before = pids(app)
    n = 10_000
    with RawClient(app.bootstrap, timeout=60) as raw:
        r = raw.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": "rep", "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                            "timestamp": -1}] * n}]})
        assert [(p.partition_index, p.error_code) for p in r.topics[0].partitions] == [(0, 42)]  # INVALID_REQUEST

        # This node's broker resource (the empty name is the cluster-wide dynamic defaults only).
        r = raw.request(32, 4, {"resources": [{"resource_type": 4, "resource_name": "1",
                                               "configuration_keys": None}] * 5_000,
                                "include_synonyms": True, "include_documentation": False})
        assert len(r.results) == 5_000 and len({x for x in r.results}) == 1
        assert r.results[0].error_code == 0 and len(r.results[0].configs) > 10

        r = raw.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                "topics": [{"topic": "rep", "partitions": [
                                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                     "last_fetched_epoch": -1, "log_start_offset": -1,
                                     "partition_max_bytes": 1 << 20}] * n}] * 3,
                                "forgotten_topics_data": [], "rack_id": ""})
        assert [(t.topic, len(t.partitions)) for t in r.responses] == [("rep", 1)]
        assert r.responses[0].partitions[0].records

        r = raw.request(3, 12, {"topics": [{"topic_id": b"\0" * 16, "name": "rep"}] * n,
                                "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})
        assert [t.name for t in r.topics] == ["rep"]

        r = raw.request(61, 0, {"topics": [{"name": "rep", "partition_indexes": [0] * n}] * 4})
        assert sum(len(t.partitions) for t in r.topics) == 4 * n
        assert {p.error_code for t in r.topics for p in t.partitions} == {0}
    assert pids(app) == before
    assert not LOG_PROBLEMS.search(app.log_text())
