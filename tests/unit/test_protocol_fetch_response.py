"""Hand-written Fetch and Produce response encoders, checked against kio's reader and writer."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from appliance.protocol import messages
from appliance.protocol.fetch_response import (
    FETCH_VERSIONS,
    PRODUCE_VERSIONS,
    FetchPartition,
    FetchTopic,
    NodeEndpoint,
    ProducePartition,
    ProduceTopic,
    encode_fetch_response,
    encode_produce_response,
)

MS = datetime.timedelta(milliseconds=1)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
ERRORS = st.sampled_from([0, 1, 3, 6, 74, -1])
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
NAMES = st.text(min_size=1, max_size=20)
SETTINGS = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def record_parts(draw: Any) -> list[Any] | None:
    choice = draw(st.sampled_from(["null", "empty", "parts"]))
    if choice == "null":
        return None
    if choice == "empty":
        return []
    blobs = draw(st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=3))
    return [memoryview(b) if i % 2 else b for i, b in enumerate(blobs)]


@st.composite
def fetch_partitions(draw: Any) -> FetchPartition:
    records = record_parts(draw)
    given_len = draw(st.booleans())  # the caller may pass records_len or let us sum it
    return FetchPartition(
        partition_index=draw(I32), error_code=draw(ERRORS), high_watermark=draw(I64),
        last_stable_offset=draw(I64), log_start_offset=draw(I64),
        aborted_transactions=draw(st.none() | st.lists(st.tuples(I64, I64), max_size=4)),
        preferred_read_replica=draw(I32), records=records,
        records_len=sum(len(bytes(r)) for r in records) if given_len and records is not None else None,
        current_leader=draw(st.none() | st.tuples(I32, I32).filter(lambda t: t != (-1, -1))),
    )


@st.composite
def fetch_topics(draw: Any) -> list[FetchTopic]:
    return draw(st.lists(st.builds(
        FetchTopic, name=NAMES, topic_id=st.binary(min_size=16, max_size=16),
        partitions=st.lists(fetch_partitions(), max_size=4)), max_size=3))


ENDPOINTS = st.lists(st.builds(NodeEndpoint, node_id=I32, host=NAMES, port=I32,
                               rack=st.none() | NAMES), max_size=2)


def kio_uuid(raw: bytes) -> uuid.UUID | None:
    """kio reads the all-zero uuid as None."""
    value = uuid.UUID(bytes=raw)
    return None if value.int == 0 else value


def joined(records: list[Any] | None) -> bytes | None:
    return None if records is None else b"".join(bytes(r) for r in records)


def fetch_as_values(version: int, throttle: int, error: int, session: int,
                    topics: list[FetchTopic], endpoints: list[NodeEndpoint]) -> dict[str, Any]:
    return {
        "throttle_time_ms": throttle, "error_code": error, "session_id": session,
        "responses": [{
            "topic": t.name, "topic_id": t.topic_id,
            "partitions": [{
                "partition_index": p.partition_index, "error_code": p.error_code,
                "high_watermark": p.high_watermark, "last_stable_offset": p.last_stable_offset,
                "log_start_offset": p.log_start_offset,
                "aborted_transactions": None if p.aborted_transactions is None else [
                    {"producer_id": a, "first_offset": b} for a, b in p.aborted_transactions],
                "preferred_read_replica": p.preferred_read_replica,
                "records": joined(p.records),
                **({"current_leader": {"leader_id": p.current_leader[0], "leader_epoch": p.current_leader[1]}}
                   if p.current_leader and version >= 12 else {}),
            } for p in t.partitions],
        } for t in topics],
        "node_endpoints": [{"node_id": e.node_id, "host": e.host, "port": e.port, "rack": e.rack}
                           for e in endpoints],
    }


def check_fetch(version: int, throttle: int, error: int, session: int,
                topics: list[FetchTopic], endpoints: list[NodeEndpoint]) -> None:
    parts, total = encode_fetch_response(version, throttle, error, session, topics, endpoints)
    body = b"".join(bytes(p) for p in parts)
    assert len(body) == total
    # Zero copy: every non-empty record buffer is one of the parts, as given.
    for t in topics:
        for p in t.partitions:
            for r in p.records or ():
                if len(bytes(r)):
                    assert any(part is r for part in parts)
    cls = messages.response_class(1, version)
    resp, size = entity_reader(cls)(body, 0)
    assert size == total
    assert resp.throttle_time // MS == throttle
    if version >= 7:
        assert resp.error_code == error and resp.session_id == session
    assert len(resp.responses) == len(topics)
    for got_t, t in zip(resp.responses, topics, strict=True):
        if version >= 13:
            assert got_t.topic_id == kio_uuid(t.topic_id)
        else:
            assert got_t.topic == t.name
        assert len(got_t.partitions) == len(t.partitions)
        for got, p in zip(got_t.partitions, t.partitions, strict=True):
            assert (got.partition_index, got.error_code, got.high_watermark, got.last_stable_offset) == (
                p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset)
            if version >= 5:
                assert got.log_start_offset == p.log_start_offset
            if p.aborted_transactions is None:
                assert got.aborted_transactions is None
            else:
                assert [(a.producer_id, a.first_offset) for a in got.aborted_transactions] == list(
                    p.aborted_transactions)
            if version >= 11:
                assert got.preferred_read_replica == p.preferred_read_replica
            assert got.records == joined(p.records)
            if version >= 12:
                leader = (got.current_leader.leader_id, got.current_leader.leader_epoch)
                assert leader == (p.current_leader or (-1, -1))
    if version >= 16:
        assert [(e.node_id, e.host, e.port, e.rack) for e in resp.node_endpoints] == [
            (e.node_id, e.host, e.port, e.rack) for e in endpoints]
    # Byte for byte what kio's writer produces for the same response.
    values = fetch_as_values(version, throttle, error, session, topics, endpoints)
    assert messages.encode_response(messages.build(cls, values)) == body


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_response_matches_kio_for_every_version(version: int) -> None:
    @SETTINGS
    @given(throttle=st.integers(0, 2**31 - 1), error=ERRORS, session=I32,
           topics=fetch_topics(), endpoints=ENDPOINTS)
    def check(throttle: int, error: int, session: int, topics: list[FetchTopic],
              endpoints: list[NodeEndpoint]) -> None:
        check_fetch(version, throttle, error, session, topics, endpoints)

    check()


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_response_multi_topic_large_records(version: int) -> None:
    big = memoryview(bytes(range(256)) * 4096)  # 1 MiB: multi-byte compact length from v12
    topics = [
        FetchTopic("orders", uuid.uuid4().bytes, [
            FetchPartition(0, 0, 1000, 990, 0, [(7, 100), (8, 200)], -1, [big[:600_000], big[600_000:]], big.nbytes),
            FetchPartition(1, 0, 5, 5, 0, [], -1, []),  # read_committed, nothing to return
            FetchPartition(2, 1, -1, -1, -1, None, -1, None),  # error partition, null records
        ]),
        FetchTopic("payments", uuid.UUID(int=12345).bytes, [
            FetchPartition(7, 0, 3, 3, 0, None, -1, [b"\x00" * 70], current_leader=(1, 4)),
        ]),
    ]
    check_fetch(version, 0, 0, 0, topics, [NodeEndpoint(1, "broker", 9092, None)])


def test_fetch_response_empty_records_are_size_zero_not_null() -> None:
    parts, _ = encode_fetch_response(11, 0, 0, 0, [FetchTopic("t", None, [FetchPartition(0)])])
    body = b"".join(parts)
    assert body.endswith(b"\xff\xff\xff\xff" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00")
    # ... aborted null (read_uncommitted), preferred replica -1, records size 0.
    parts, _ = encode_fetch_response(12, 0, 0, 0, [FetchTopic("t", None, [FetchPartition(0)])])
    assert b"".join(parts).endswith(b"\x00" + b"\xff\xff\xff\xff" + b"\x01" + b"\x00\x00\x00")


def test_fetch_response_uuid_objects_accepted_and_versions_checked() -> None:
    tid = uuid.uuid4()
    parts, total = encode_fetch_response(13, 0, 0, 0, [FetchTopic("t", tid, [FetchPartition(0)])])
    resp, _ = entity_reader(messages.response_class(1, 13))(b"".join(parts), 0)
    assert resp.responses[0].topic_id == tid
    with pytest.raises(ValueError):
        encode_fetch_response(3, 0, 0, 0, [])
    with pytest.raises(ValueError):
        encode_fetch_response(19, 0, 0, 0, [])


# --------------------------------------------------------------------------- Produce

@st.composite
def produce_topics(draw: Any) -> list[ProduceTopic]:
    partition = st.builds(
        ProducePartition, index=I32, error_code=ERRORS, base_offset=I64,
        log_append_time_ms=st.sampled_from([-1, 0, 1_700_000_000_000]), log_start_offset=I64,
        record_errors=st.lists(st.tuples(I32, st.none() | NAMES), max_size=2),
        error_message=st.none() | NAMES,
        current_leader=st.none() | st.tuples(I32, I32).filter(lambda t: t != (-1, -1)))
    return draw(st.lists(st.builds(ProduceTopic, name=NAMES, topic_id=st.binary(min_size=16, max_size=16),
                                   partitions=st.lists(partition, max_size=3)), max_size=3))


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_response_matches_kio_for_every_version(version: int) -> None:
    cls = messages.response_class(0, version)

    @SETTINGS
    @given(topics=produce_topics(), throttle=st.integers(0, 2**31 - 1), endpoints=ENDPOINTS)
    def check(topics: list[ProduceTopic], throttle: int, endpoints: list[NodeEndpoint]) -> None:
        body = encode_produce_response(version, topics, throttle, endpoints)
        resp, size = entity_reader(cls)(body, 0)
        assert size == len(body)
        assert resp.throttle_time // MS == throttle
        for got_t, t in zip(resp.responses, topics, strict=True):
            if version >= 13:
                assert got_t.topic_id == kio_uuid(t.topic_id)
            else:
                assert got_t.name == t.name
            for got, p in zip(got_t.partition_responses, t.partitions, strict=True):
                assert (got.index, got.error_code, got.base_offset) == (p.index, p.error_code, p.base_offset)
                stamp = None if got.log_append_time is None else (got.log_append_time - EPOCH) // MS
                assert stamp == (None if p.log_append_time_ms < 0 else p.log_append_time_ms)
                if version >= 5:
                    assert got.log_start_offset == p.log_start_offset
                if version >= 8:
                    assert [(e.batch_index, e.batch_index_error_message) for e in got.record_errors] == list(
                        p.record_errors)
                    assert got.error_message == p.error_message
                if version >= 10:
                    leader = (got.current_leader.leader_id, got.current_leader.leader_epoch)
                    assert leader == (p.current_leader or (-1, -1))
        if version >= 10:
            assert [(e.node_id, e.host, e.port, e.rack) for e in resp.node_endpoints] == [
                (e.node_id, e.host, e.port, e.rack) for e in endpoints]
        values = {
            "throttle_time_ms": throttle,
            "responses": [{"name": t.name, "topic_id": t.topic_id, "partition_responses": [{
                "index": p.index, "error_code": p.error_code, "base_offset": p.base_offset,
                "log_append_time_ms": p.log_append_time_ms, "log_start_offset": p.log_start_offset,
                "record_errors": [{"batch_index": i, "batch_index_error_message": m} for i, m in p.record_errors],
                "error_message": p.error_message,
                **({"current_leader": {"leader_id": p.current_leader[0], "leader_epoch": p.current_leader[1]}}
                   if p.current_leader and version >= 10 else {}),
            } for p in t.partitions]} for t in topics],
            "node_endpoints": [{"node_id": e.node_id, "host": e.host, "port": e.port, "rack": e.rack}
                               for e in endpoints],
        }
        assert messages.encode_response(messages.build(cls, values)) == body

    check()


def test_produce_response_version_bounds() -> None:
    with pytest.raises(ValueError):
        encode_produce_response(2, [])
    with pytest.raises(ValueError):
        encode_produce_response(14, [])
