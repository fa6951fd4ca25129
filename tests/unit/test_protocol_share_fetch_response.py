"""The hand-written ShareFetch response encoder, byte for byte against kio's writer."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.protocol import messages
from appliance.protocol.fetch_response import NodeEndpoint
from appliance.protocol.share_fetch_response import (
    SHARE_FETCH_VERSIONS,
    SharePartitionData,
    ShareTopic,
    encode_share_fetch_response,
)

ERRORS = st.sampled_from([0, 1, 3, 6, 74, 122, 126])
I16 = st.integers(-(2**15), 2**15 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.none() | st.text(max_size=20)
SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def records(draw: Any) -> list:
    if draw(st.booleans()):
        return []
    blobs = draw(st.lists(st.binary(max_size=200), min_size=1, max_size=3))
    return [memoryview(b) if i % 2 else b for i, b in enumerate(blobs)]


PARTITIONS = st.builds(
    SharePartitionData, partition_index=I32, error_code=ERRORS, error_message=TEXT,
    acknowledge_error_code=ERRORS, acknowledge_error_message=TEXT,
    current_leader=st.tuples(I32, I32), records=records(),
    acquired_records=st.lists(st.tuples(I64, I64, I16), max_size=4))
TOPICS = st.lists(st.builds(ShareTopic, topic_id=st.binary(min_size=16, max_size=16),
                            partitions=st.lists(PARTITIONS, max_size=3)), max_size=3)
ENDPOINTS = st.lists(st.builds(NodeEndpoint, node_id=I32, host=st.text(min_size=1, max_size=10),
                               port=I32, rack=TEXT), max_size=2)


def kio_body(version: int, throttle: int, error: int, message: str | None, lock_ms: int,
             topics: list[ShareTopic], endpoints: list[NodeEndpoint]) -> bytes:
    ms = datetime.timedelta(milliseconds=1)
    entity = messages.build(
        messages.response_class(78, version), throttle_time=throttle * ms, error_code=error,
        error_message=message, acquisition_lock_timeout=lock_ms * ms,
        responses=tuple(dict(topic_id=uuid.UUID(bytes=t.topic_id), partitions=tuple(dict(
            partition_index=p.partition_index, error_code=p.error_code,
            error_message=p.error_message, acknowledge_error_code=p.acknowledge_error_code,
            acknowledge_error_message=p.acknowledge_error_message,
            current_leader=dict(leader_id=p.current_leader[0], leader_epoch=p.current_leader[1]),
            records=b"".join(bytes(r) for r in p.records),
            acquired_records=tuple(dict(first_offset=f, last_offset=last, delivery_count=n)
                                   for f, last, n in p.acquired_records))
            for p in t.partitions)) for t in topics),
        node_endpoints=tuple(dict(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                             for e in endpoints))
    return messages.encode_response(entity)


@pytest.mark.parametrize("version", list(SHARE_FETCH_VERSIONS))
@SETTINGS
@given(throttle=st.integers(0, 2**31 - 1), error=ERRORS, message=TEXT,
       lock_ms=st.integers(0, 2**31 - 1), topics=TOPICS, endpoints=ENDPOINTS)
def test_share_fetch_response_is_kios_bytes(version, throttle, error, message, lock_ms, topics,
                                            endpoints):
    parts, total = encode_share_fetch_response(version, throttle, error, message, lock_ms,
                                               topics, endpoints)
    body = b"".join(bytes(p) for p in parts)
    assert len(body) == total
    assert body == kio_body(version, throttle, error, message, lock_ms, topics, endpoints)
    # Zero copy: every non-empty record buffer is one of the parts, as given.
    for t in topics:
        for p in t.partitions:
            for r in p.records:
                if len(bytes(r)):
                    assert any(part is r for part in parts)


def test_share_fetch_response_refuses_an_unknown_version():
    with pytest.raises(ValueError):
        encode_share_fetch_response(3, 0, 0, None, 0, [])


@pytest.mark.parametrize("version", list(SHARE_FETCH_VERSIONS))
@SETTINGS
@given(lock_ms=st.integers(0, 2**31 - 1), topics=TOPICS)
def test_the_handlers_kio_answer_for_quotas_is_the_same_bytes(version, lock_ms, topics):
    # ShareFetch answers through kio's entity only when a quota may throttle them: both paths
    # must say the same (error messages are never set by the handler).
    from appliance.api.share_fetch import kio_answer
    for t in topics:
        for p in t.partitions:
            p.error_message = p.acknowledge_error_message = None
    parts, _ = encode_share_fetch_response(version, 0, 0, None, lock_ms, topics)
    entity = kio_answer(messages.response_class(78, version), lock_ms, topics)
    assert messages.encode_response(entity) == b"".join(bytes(p) for p in parts)
