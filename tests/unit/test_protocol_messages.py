"""kio glue: appliance.protocol.messages (request decoding, response building, ApiVersions)."""

from __future__ import annotations

import datetime
import io
import struct
import uuid
from typing import Any

import kafka_specs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records

from appliance.api import api_ranges, load_handlers
from appliance.errors import ProtocolViolation
from appliance.protocol import messages, shape
from appliance.protocol.frames import parse_request_header
from appliance.protocol.primitives import uvarint

# kio registers hypothesis strategies for its phantom types, except Records (bytes on the wire).
st.register_type_strategy(Records, st.binary(max_size=64))

# The APIs and versions real clients send (librdkafka, the Java client, kafka-python, aiokafka),
# all of which we must parse.
ROUND_TRIP = {
    0: range(3, 14),    # Produce
    1: range(4, 19),    # Fetch
    3: range(0, 14),    # Metadata
    2: range(1, 12),    # ListOffsets
    18: range(0, 5),    # ApiVersions
    19: range(2, 8),    # CreateTopics
    20: range(1, 7),    # DeleteTopics
    32: range(1, 5),    # DescribeConfigs
    60: range(0, 3),    # DescribeCluster
    10: range(0, 7),    # FindCoordinator
}
CASES = [(k, v) for k, vs in ROUND_TRIP.items() for v in vs]


def write(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def request_frame(api_key: int, version: int, body: bytes, corr: int = 1) -> bytes:
    cls = messages.request_class(api_key, version)
    header_cls = KioHeaderV2 if cls.__flexible__ else KioHeaderV1
    header = header_cls(request_api_key=api_key, request_api_version=version,
                        correlation_id=corr, client_id="test")
    return write(header) + body


def decode_frame(frame: bytes) -> Any:
    header, offset = parse_request_header(frame)
    return messages.decode_request(header.api_key, header.api_version, frame, offset)


# --------------------------------------------------------------------------- round trips

@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_request_round_trip_and_truncation(api_key: int, version: int) -> None:
    cls = messages.request_class(api_key, version)
    assert cls.__api_key__ == api_key and cls.__version__ == version

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.from_type(cls))
    def check(entity: Any) -> None:
        body = write(entity)
        frame = request_frame(api_key, version, body, corr=12345)
        header, offset = parse_request_header(frame)
        assert (header.api_key, header.api_version, header.correlation_id) == (api_key, version, 12345)
        assert messages.decode_request(api_key, version, frame, offset) == entity
        # Every strict prefix of the body is a truncated body.
        cuts = range(len(body)) if len(body) <= 64 else sorted({*range(0, len(body), len(body) // 20), len(body) - 1})
        for cut in cuts:
            with pytest.raises(ProtocolViolation):
                messages.decode_request(api_key, version, frame[: offset + cut], offset)

    check()


def test_trailing_bytes_after_body_are_ignored_like_kafka() -> None:
    import kio.schema.metadata.v12.request as m

    entity = m.MetadataRequest(topics=(m.MetadataRequestTopic(topic_id=uuid.uuid4(), name="t"),),
                               allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    frame = request_frame(3, 12, write(entity) + b"garbage after the body")
    assert decode_frame(frame) == entity


def test_memoryview_and_writable_frames_are_accepted() -> None:
    import kio.schema.find_coordinator.v3.request as fc

    entity = fc.FindCoordinatorRequest(key="group-1", key_type=0)
    frame = request_frame(10, 3, write(entity))
    header, offset = parse_request_header(frame)
    for buf in (memoryview(frame), memoryview(bytearray(frame)), bytearray(frame)):
        assert messages.decode_request(10, 3, buf, offset) == entity


@pytest.mark.parametrize(("api_key", "version"), [(0, 2), (1, 19), (99, 0), (7, 0)])
def test_decode_of_unknown_api_or_version_is_violation(api_key: int, version: int) -> None:
    with pytest.raises(ProtocolViolation):
        messages.decode_request(api_key, version, b"\x00" * 20, 0)


# --------------------------------------------------------------------------- hostile bodies

def metadata_v4(topic_count: bytes) -> bytes:
    return topic_count + b"\x01"  # topics array count, allow_auto_topic_creation


def test_huge_legacy_array_count_is_refused_before_kio_allocates() -> None:
    # Regression: kio's native reader reserves `count` slots before reading an array; a count of
    # 2**31-1 asks for 16 GiB and, where that allocation fails, the Rust runtime aborts the process.
    body = metadata_v4(struct.pack(">i", 2**31 - 1))
    guard = shape.guard(messages.request_class(3, 4))
    with pytest.raises(shape.ShortArray):  # checked first: a regression must not reach kio
        guard(body, 0, [])
    with pytest.raises(ProtocolViolation, match="array of 2147483647 items"):
        messages.decode_request(3, 4, body, 0)


def test_huge_compact_array_count_is_refused_before_kio_allocates() -> None:
    # A 5-byte uvarint of 2**35-1: kio would reserve 2**35-2 slots (256 GiB) and abort.
    body = b"\xff\xff\xff\xff\x7f" + b"\x00" * 8
    guard = shape.guard(messages.request_class(3, 12))
    with pytest.raises(shape.ShortArray):
        guard(body, 0, [])
    with pytest.raises(ProtocolViolation):
        messages.decode_request(3, 12, body, 0)


def test_huge_nested_array_count_is_refused() -> None:
    # Produce v9: one topic whose partition array claims 2**32 entries.
    body = (b"\x00" + struct.pack(">hi", -1, 30000)  # null transactional id, acks, timeout
            + b"\x02" + b"\x02t"                      # one topic named "t"
            + b"\xff\xff\xff\xff\x0f" + b"\x00" * 4)  # partitions: uvarint 2**32-1
    guard = shape.guard(messages.request_class(0, 9))
    with pytest.raises(shape.ShortArray):
        guard(body, 0, [])
    with pytest.raises(ProtocolViolation):
        messages.decode_request(0, 9, body, 0)


def test_array_count_equal_to_remaining_bytes_is_parsed_normally() -> None:
    import kio.schema.delete_topics.v1.request as dt

    entity = dt.DeleteTopicsRequest(topic_names=("a", "b"), timeout=datetime.timedelta(seconds=1))
    assert messages.decode_request(20, 1, write(entity), 0) == entity


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    [
        (3, 4, struct.pack(">i", 1) + struct.pack(">h", -5) + b"\x01"),  # negative string length
        (3, 12, b"\xff\xff\xff\xff\xff\xff" + b"\x00" * 8),              # varint longer than 5 bytes
        (10, 3, b"\x00\x00\x00"),                                        # null non-nullable key
        (0, 3, b"\xff\xff\xff\xff"),                                     # truncated in fixed fields
    ],
)
def test_malformed_bodies_are_violations(api_key: int, version: int, body: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        messages.decode_request(api_key, version, body, 0)


def test_unknown_tagged_fields_are_skipped_like_kafka() -> None:
    import kio.schema.produce.v9.request as p

    entity = p.ProduceRequest(
        transactional_id="tx", acks=-1, timeout=datetime.timedelta(seconds=30),
        topic_data=(p.TopicProduceData(name="t", partition_data=(
            p.PartitionProduceData(index=3, records=b"batch-bytes"),)),))
    body = write(entity)
    assert body.endswith(b"batch-bytes\x00\x00\x00")  # partition, topic, request tag sections
    tampered = (body[:-3]
                + b"\x01" + b"\x07\x02zz"            # partition: unknown tag 7 with 2 bytes
                + b"\x00"                            # topic: none
                + b"\x02" + b"\x08\x00" + b"\x7f\x01q")  # request: unknown tags 8 (empty), 127
    assert messages.decode_request(0, 9, tampered, 0) == entity
    # Known and unknown tags mixed: Fetch v15 with ClusterId (tag 0) and an unknown tag 99.
    import kio.schema.fetch.v15.request as f

    fetch = f.FetchRequest(
        cluster_id="c1", replica_state=f.ReplicaState(), max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1, max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
        topics=(), forgotten_topics_data=(), rack_id="")
    raw = write(fetch)
    section = b"\x01\x00\x03\x03c1"
    assert raw.endswith(section)
    tampered = raw[: -len(section)] + b"\x02\x00\x03\x03c1" + b"\x63\x03abc"
    frame = request_frame(1, 15, tampered)
    assert decode_frame(frame) == fetch


def test_unknown_tag_running_past_the_frame_is_violation() -> None:
    import kio.schema.find_coordinator.v3.request as fc

    raw = write(fc.FindCoordinatorRequest(key="g", key_type=0))
    with pytest.raises(ProtocolViolation):
        messages.decode_request(10, 3, raw[:-1] + b"\x01\x05\x40zz", 0)


def test_preload_fills_the_caches() -> None:
    assert messages.preload({0: (3, 13), 1: (4, 18), 99: (0, 1), 18: (0, 7)}) == 11 + 15 + 5
    assert (1, 18) in messages._BY_KEY and (18, 4) in messages._BY_KEY


def test_shape_checks_compile_for_every_request_kio_knows() -> None:
    table = messages.flexible_versions_table()
    count = 0
    for api_key, (_name, lo, hi, _flex) in table.items():
        for version in range(lo, hi + 1):
            cls = messages.request_class(api_key, version)
            shape.guard(cls)
            shape.lenient_guard(cls)
            count += 1
    assert count > 250


# --------------------------------------------------------------------------- tables

# Kafka's JSON message definitions come from the installed kafka-python, or KAFKA_MESSAGE_SPECS
# (tests/unit/kafka_specs.py): never from a path outside the clone.


def test_flexible_versions_match_kafka_message_specs() -> None:
    specs = kafka_specs.request_specs()
    table = messages.flexible_versions_table()
    load_handlers()
    kafka_specs.require(specs, api_ranges(), {k: v[0] for k, v in table.items()})
    checked = 0
    for key, spec in specs.items():
        if key not in table:
            continue  # APIs kio does not know (Kafka's broker-internal ones)
        _name, lo, _hi, flexible = table[key]
        declared = None if spec["flexibleVersions"] == "none" else int(spec["flexibleVersions"].rstrip("+"))
        expected = None if declared is None else max(declared, lo)
        assert flexible == expected, (spec["name"], declared, table[key])
        checked += 1
    assert checked > 50


def test_known_facts_about_flexible_versions() -> None:
    assert messages.flexible_from(0) == 9
    assert messages.flexible_from(1) == 12
    assert messages.flexible_from(18) == 3
    assert messages.flexible_from(17) is None  # SaslHandshake never became flexible
    assert messages.known_versions(1) == (4, 18)


# --------------------------------------------------------------------------- building responses

def read_back(entity: Any) -> Any:
    body = messages.encode_response(entity)
    decoded, size = entity_reader(type(entity))(body, 0)
    assert size == len(body)
    return decoded


def test_build_fills_defaults_and_converts_plain_values() -> None:
    resp = messages.build_response(0, 11, responses=[{
        "name": "t",
        "partition_responses": [{"index": 0, "error_code": 6, "base_offset": 42,
                                 "log_append_time_ms": 1_700_000_000_123}],
    }], throttle_time_ms=250)
    part = resp.responses[0].partition_responses[0]
    assert part.error_code is ErrorCode.not_leader_or_follower
    assert part.log_start_offset == -1  # kio's default (Kafka's "default": "-1")
    assert part.record_errors == () and part.error_message is None
    assert part.log_append_time == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC)
    assert resp.throttle_time == datetime.timedelta(milliseconds=250)
    assert read_back(resp) == resp


def test_build_log_append_time_minus_one_is_null() -> None:
    resp = messages.build_response(0, 3, responses=[{"name": "t", "partition_responses": [
        {"index": 0, "base_offset": 1, "log_append_time_ms": -1}]}])
    body = messages.encode_response(resp)
    assert struct.pack(">q", -1) in body


def test_build_ignores_fields_of_other_versions_but_not_typos() -> None:
    part = {"index": 1, "error_code": 0, "base_offset": 7, "log_start_offset": 0,
            "record_errors": [], "error_message": None}
    v3 = messages.build_response(0, 3, responses=[{"name": "t", "topic_id": uuid.uuid4().bytes,
                                                   "partition_responses": [part]}])
    assert read_back(v3).responses[0].partition_responses[0].base_offset == 7
    with pytest.raises(TypeError, match="bse_offset"):
        messages.build_response(0, 11, responses=[{"name": "t", "partition_responses": [{"bse_offset": 1}]}])


def test_build_metadata_response_from_nested_dicts() -> None:
    topic_id = uuid.uuid4()
    values = {
        "brokers": [{"node_id": 1, "host": "localhost", "port": 9092}],
        "cluster_id": "cluster-x",
        "controller_id": 1,
        "topics": [{"error_code": 0, "name": "orders", "topic_id": topic_id.bytes,
                    "partitions": [{"partition_index": 0, "leader_id": 1, "leader_epoch": 0,
                                    "replica_nodes": [1], "isr_nodes": [1]}]}],
    }
    for version in range(0, 14):
        resp = messages.build_response(3, version, values)
        back = read_back(resp)
        assert back.brokers[0].host == "localhost"
        assert back.topics[0].partitions[0].replica_nodes == (1,)
        if version >= 10:
            assert back.topics[0].topic_id == topic_id


def test_build_accepts_entities_and_error_code_enums_unchanged() -> None:
    import kio.schema.find_coordinator.v6.response as fr

    coord = fr.Coordinator(key="g", node_id=1, host="h", port=9092, error_code=ErrorCode.none,
                           error_message=None)
    resp = messages.build(fr.FindCoordinatorResponse, coordinators=[coord])
    assert resp.coordinators == (coord,)
    assert resp.throttle_time == datetime.timedelta(0)
    with pytest.raises(ValueError):
        messages.build(fr.Coordinator, error_code=31999)


# --------------------------------------------------------------------------- ApiVersions

RANGES = {0: (3, 13), 1: (4, 18), 3: (0, 13), 18: (0, 4), 60: (0, 2)}


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_response_every_version(version: int) -> None:
    body = messages.build_api_versions_response(
        version, RANGES, throttle_time_ms=7,
        supported_features={"transaction.version": (0, 2), "group.version": (1, 1)},
        finalized_features={"transaction.version": 2, "group.version": 0},
        finalized_features_epoch=5,
    )
    resp, size = entity_reader(messages.response_class(18, version))(body, 0)
    assert size == len(body)
    assert resp.error_code == ErrorCode.none
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [
        (k, lo, hi) for k, (lo, hi) in sorted(RANGES.items())]
    if version >= 1:
        assert resp.throttle_time == datetime.timedelta(milliseconds=7)
    if version >= 3:
        supported = {f.name: (f.min_version, f.max_version) for f in resp.supported_features}
        # KAFKA-17492: features with min 0 are hidden from requests older than v4.
        assert supported == ({"transaction.version": (0, 2), "group.version": (1, 1)} if version >= 4
                             else {"group.version": (1, 1)})
        assert [(f.name, f.min_version_level, f.max_version_level) for f in resp.finalized_features] == [
            ("transaction.version", 2, 2)]
        assert resp.finalized_features_epoch == 5


def test_api_versions_version_outside_our_range_is_unsupported() -> None:
    body = messages.build_api_versions_response(4, {**RANGES, 18: (0, 3)})
    resp, _ = entity_reader(messages.response_class(18, 0))(body, 0)
    assert resp.error_code == ErrorCode.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 3)]
    assert body == struct.pack(">hi", 35, 1) + struct.pack(">hhh", 18, 0, 3)


def test_api_versions_invalid_request_error_has_no_keys() -> None:
    body = messages.build_api_versions_response(3, RANGES, error_code=42)
    resp, _ = entity_reader(messages.response_class(18, 3))(body, 0)
    assert resp.error_code == ErrorCode.invalid_request and resp.api_keys == ()


def test_api_versions_request_validity() -> None:
    import kio.schema.api_versions.v3.request as r3
    import kio.schema.api_versions.v2.request as r2

    ok = r3.ApiVersionsRequest(client_software_name="apache-kafka-java", client_software_version="3.9.0")
    bad = r3.ApiVersionsRequest(client_software_name="my client", client_software_version="1.0")
    assert messages.api_versions_request_valid(ok)
    assert not messages.api_versions_request_valid(bad)
    assert messages.api_versions_request_valid(r2.ApiVersionsRequest())


def test_uvarint_sizes() -> None:
    assert uvarint(0) == b"\x00" and uvarint(127) == b"\x7f" and uvarint(128) == b"\x80\x01"
    assert uvarint(2**35 - 1) == b"\xff\xff\xff\xff\x7f"
