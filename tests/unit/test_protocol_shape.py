"""The request codec refuses what Kafka's schema refuses, once, in the codec (appliance.protocol.shape
through messages.decode_request), and reads what Kafka reads where kio alone would not.

Bodies are written by hand with the wire primitives, so each test shows the bytes of its rule.
"""

from __future__ import annotations

import datetime
import io
import os
import random
import re
import struct
from dataclasses import fields
from typing import Any

import kafka_specs
import pytest
from kio.serial import entity_writer
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field, is_optional

from appliance.api import api_ranges, load_handlers
from appliance.errors import ProtocolViolation
from appliance.protocol import messages, shape
from appliance.protocol.primitives import uvarint

I8, I16, I32, I64 = (struct.Struct(f">{c}").pack for c in "bhiq")
NO_TAGS = b"\x00"


def s16(text: str) -> bytes:
    """Legacy string."""
    return I16(len(text.encode())) + text.encode()


def cs(text: str) -> bytes:
    """Compact string."""
    return uvarint(len(text.encode()) + 1) + text.encode()


def decode(api_key: int, version: int, body: bytes) -> Any:
    return messages.decode_request(api_key, version, body, 0)


def refused(api_key: int, version: int, body: bytes, match: str) -> None:
    with pytest.raises(ProtocolViolation, match=match):
        decode(api_key, version, body)


# --------------------------------------------------------------------------- null where not nullable

def test_null_resources_in_describe_configs_is_a_parse_error() -> None:
    # Regression: a null `resources` array reached the handler as None (TypeError traceback).
    refused(32, 1, I32(-1) + b"\x00", "non-nullable field resources was serialized as null")
    refused(32, 4, b"\x00" + b"\x00\x00" + NO_TAGS, "non-nullable field resources")


def test_null_topics_in_offset_commit_is_a_parse_error() -> None:
    # Regression: a null `topics` array reached the handler as None (TypeError traceback).
    refused(8, 2, s16("g") + I32(1) + s16("m") + I64(-1) + I32(-1),
            "non-nullable field topics was serialized as null")
    refused(8, 8, cs("g") + I32(1) + cs("m") + b"\x00" + b"\x00" + NO_TAGS, "non-nullable field topics")


def test_null_array_is_kept_where_kafka_allows_it() -> None:
    assert decode(3, 1, I32(-1)).topics is None                        # Metadata v1: all topics
    resource = I8(2) + s16("t") + I32(-1)                              # configuration_keys null
    r = decode(32, 1, I32(1) + resource + b"\x00")
    assert r.resources[0].configuration_keys is None


def test_null_non_nullable_string_is_a_parse_error() -> None:
    refused(10, 1, I16(-1) + I8(0), "non-nullable field key was serialized as null")     # FindCoordinator
    refused(10, 3, b"\x00" + I8(0) + NO_TAGS, "non-nullable field key")


def test_null_array_element_is_a_parse_error() -> None:
    # DeleteTopics v1: an array of strings; Kafka's array elements are never nullable.
    refused(20, 1, I32(2) + s16("a") + I16(-1) + I32(1000), "topic_names element was serialized as null")
    refused(10, 4, I8(0) + uvarint(2) + b"\x00" + NO_TAGS, "coordinator_keys element")


def test_null_non_nullable_bytes_is_a_parse_error() -> None:
    # SyncGroup v3: assignments[].assignment is non-nullable bytes.
    body = s16("g") + I32(1) + s16("m") + I16(-1) + I32(1) + s16("m") + I32(-1)
    refused(14, 3, body, "non-nullable field assignment was serialized as null")


def test_nullable_string_and_records_may_be_null() -> None:
    assert decode(22, 0, I16(-1) + I32(1000)).transactional_id is None   # InitProducerId
    # Produce v3: null transactional id, one partition with null records.
    body = I16(-1) + I16(1) + I32(1000) + I32(1) + s16("t") + I32(1) + I32(0) + I32(-1)
    assert decode(0, 3, body).topic_data[0].partition_data[0].records is None


# --------------------------------------------------------------------------- lengths past the end

def test_string_longer_than_the_bytes_left_is_a_parse_error() -> None:
    refused(10, 1, I16(50) + b"abc", "key: 50 bytes with only 3 left")
    refused(10, 3, uvarint(51) + b"abc", "key: 50 bytes with only 3 left")


def test_bytes_longer_than_the_bytes_left_is_a_parse_error() -> None:
    body = s16("g") + I32(1) + s16("m") + I16(-1) + I32(1) + s16("m") + I32(1000) + b"xyz"
    refused(14, 3, body, "assignment: 1000 bytes with only 3 left")


def test_records_longer_than_the_bytes_left_is_a_parse_error() -> None:
    body = I16(-1) + I16(1) + I32(1000) + I32(1) + s16("t") + I32(1) + I32(0) + I32(10**6) + b"x" * 61
    refused(0, 3, body, "records: 1000000 bytes with only 61 left")


def test_array_longer_than_the_bytes_left_is_a_parse_error() -> None:
    refused(20, 1, I32(4) + s16("a"), "topic_names: array of 4 items with only 3 bytes left")
    refused(3, 12, uvarint(1000) + b"\x00" * 20, "topics: array of 999 items")


def test_compact_string_over_the_kafka_string_limit_is_a_parse_error() -> None:
    # Kafka refuses a string of more than 0x7fff bytes even when a compact length could say more.
    refused(10, 3, uvarint(0x8001 + 1) + b"k" * 0x8001 + I8(0) + NO_TAGS,
            "string field key had invalid length 32769")
    assert decode(10, 3, uvarint(0x7FFF + 1) + b"k" * 0x7FFF + I8(0) + NO_TAGS).key == "k" * 0x7FFF


def test_tagged_field_overrunning_the_body_is_a_parse_error() -> None:
    # FindCoordinator v3: an unknown tag claiming 64 bytes with 2 left.
    refused(10, 3, cs("g") + I8(0) + b"\x01" + b"\x05\x40zz", "tagged field 5 of 64 bytes with only 2 left")


def test_tagged_field_count_beyond_the_body_is_a_parse_error() -> None:
    refused(10, 3, cs("g") + I8(0) + uvarint(2**20), "truncated or malformed")


def test_body_shorter_than_its_fixed_fields_is_a_parse_error() -> None:
    refused(22, 0, I16(-1) + b"\x00\x00", "body truncated")


def test_trailing_bytes_are_ignored_as_kafka_ignores_them() -> None:
    # AbstractRequest.parseRequest never looks at what remains after the body.
    assert decode(22, 0, I16(-1) + I32(1000) + b"trailing garbage").transactional_id is None
    assert decode(10, 3, cs("g") + I8(0) + NO_TAGS + b"\xff" * 9).key == "g"


# --------------------------------------------------------------------------- where kio is stricter than Kafka

def test_nullable_length_below_minus_one_is_null_as_in_kafka() -> None:
    # Kafka's readers take any negative length of a nullable field as null; kio only -1.
    assert decode(22, 0, I16(-7) + I32(1000)).transactional_id is None
    assert decode(3, 1, I32(-5)).topics is None


def test_boolean_byte_other_than_zero_or_one_is_true_as_in_kafka() -> None:
    # Metadata v4: allow_auto_topic_creation; Kafka reads readByte() != 0.
    assert decode(3, 4, I32(0) + b"\x02").allow_auto_topic_creation is True
    assert decode(3, 4, I32(0) + b"\x00").allow_auto_topic_creation is False


def test_string_that_is_not_utf8_is_read_with_replacement_characters_as_in_kafka() -> None:
    assert decode(10, 1, I16(3) + b"a\xffb" + I8(0)).key == "a\ufffdb"
    assert decode(10, 3, uvarint(4) + b"a\xffb" + I8(0) + NO_TAGS).key == "a\ufffdb"
    r = decode(20, 1, I32(2) + I16(2) + b"\xfe\xfe" + s16("ok") + I32(1000))
    assert r.topic_names == ("\ufffd\ufffd", "ok")


def test_retention_beyond_kios_range_is_clamped() -> None:
    # OffsetCommit v2 retention_time: any int64 to Kafka; kio's timedelta stops at 2**63 µs.
    body = s16("g") + I32(1) + s16("m") + I64(2**63 - 1) + I32(0)
    assert decode(8, 2, body).retention_time == datetime.timedelta(milliseconds=(2**63 - 1) // 1000)
    body = s16("g") + I32(1) + s16("m") + I64(-(2**63)) + I32(0)
    assert decode(8, 2, body).retention_time == -datetime.timedelta(milliseconds=(2**63 - 1) // 1000)


def test_lenient_reading_never_runs_for_a_body_kio_reads() -> None:
    guard = shape.guard(messages.request_class(3, 4))
    assert "fix" not in shape.guard_source(messages.request_class(3, 4))
    assert guard(I32(0) + b"\x01", 0, []) == 5


# --------------------------------------------------------------------------- every version we serve

def _in_versions(spec: str | None, v: int) -> bool:
    if spec is None or spec == "none":
        return False
    if spec.endswith("+"):
        return v >= int(spec[:-1])
    lo, _, hi = spec.partition("-")
    return int(lo) <= v <= int(hi or lo)


def _snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s).lower()


def _compare(spec_fields, common, cls, v, path, problems) -> int:
    """Compare the nullability of every variable-length field (strings, bytes, records, arrays,
    structs: the ones a null can be written for) with Kafka's nullableVersions."""
    kio = {f.name: f for f in fields(cls)}
    checked = 0
    for sf in spec_fields:
        if not _in_versions(sf["versions"], v):
            continue
        name = _snake(sf["name"])
        f = kio.get(name) or kio.get(re.sub(r"_ms$", "", name))
        if f is None:
            problems.append(f"{path}: {sf['name']} missing in kio")
            continue
        if sf["type"] not in ("uuid",) and not re.fullmatch(r"u?int\d+|bool|float64", sf["type"]):
            checked += 1
            if _in_versions(sf.get("nullableVersions"), v) != is_optional(f):
                problems.append(f"{path}.{f.name}: Kafka nullable "
                                f"{_in_versions(sf.get('nullableVersions'), v)}, kio {is_optional(f)}")
        fc = classify_field(f)
        if isinstance(fc, (EntityField, EntityTupleField)):
            sub = sf["type"].removeprefix("[]")
            checked += _compare(sf.get("fields") or common[sub], common, fc.type_, v, f"{path}.{f.name}",
                                problems)
    return checked


def test_nullability_of_every_served_request_field_matches_kafkas_specs() -> None:
    specs = kafka_specs.request_specs()
    load_handlers()
    kafka_specs.require(specs, api_ranges(), {k: v[0] for k, v in messages.flexible_versions_table().items()})
    problems: list[str] = []
    checked = 0
    for key, (lo, hi) in api_ranges().items():
        spec = specs[key]
        common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
        for v in range(lo, hi + 1):
            checked += _compare(spec["fields"], common, messages.request_class(key, v), v,
                                f"{spec['name']} v{v}", problems)
    assert not problems
    assert checked > 500


def _no_null_where_kafka_has_none(entity: Any) -> None:
    for f in fields(entity):
        value = getattr(entity, f.name)
        fc = classify_field(f)
        if value is None:
            assert is_optional(f) or f.metadata.get("kafka_type") in ("uuid", "datetime_i64"), \
                f"{type(entity).__name__}.{f.name} is None"
        elif isinstance(fc, EntityField):
            _no_null_where_kafka_has_none(value)
        elif isinstance(fc, EntityTupleField):
            for item in value:
                _no_null_where_kafka_has_none(item)
        elif isinstance(fc, PrimitiveTupleField):
            assert None not in value


_VALUES = {"string": "ab", "bytes": b"xy", "records": b"batch", "bool": True, "uuid": b"\x01" * 16,
           "timedelta_i32": 1000, "timedelta_i64": 1000, "datetime_i64": 1000, "float64": 0.5}


def _sample(cls: type) -> Any:
    """An entity of a request class with two items in every array and no null (for mutation)."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        fc = classify_field(f)
        if isinstance(fc, EntityField):
            values[f.name] = _sample(fc.type_)
        elif isinstance(fc, EntityTupleField):
            values[f.name] = [_sample(fc.type_)] * 2
        elif isinstance(fc, PrimitiveTupleField):
            values[f.name] = [_VALUES.get(f.metadata["kafka_type"], 1)] * 2
        else:
            values[f.name] = _VALUES.get(f.metadata["kafka_type"], 1)
    return messages.build(cls, values)


SEED = int(os.environ.get("SHAPE_FUZZ_SEED", "17"))


def test_mutated_bodies_of_every_served_version_decode_or_are_parse_errors() -> None:
    """Byte flips, truncation, inserted lengths and garbage over a valid body of every (API,
    version) we serve: decoding gives an entity without a null where Kafka's schema has none, or
    ProtocolViolation; never another exception (a handler would see it)."""
    load_handlers()
    rng = random.Random(SEED)
    tried = 0
    for key, (lo, hi) in api_ranges().items():
        for v in range(lo, hi + 1):
            cls = messages.request_class(key, v)
            buf = io.BytesIO()
            entity_writer(cls)(buf, _sample(cls))
            body = buf.getvalue()
            for _ in range(40):
                b = bytearray(body)
                kind = rng.randrange(5)
                if kind == 0 and b:
                    for _ in range(rng.randint(1, 4)):
                        b[rng.randrange(len(b))] = rng.randrange(256)
                elif kind == 1:
                    del b[rng.randrange(len(b) + 1):]
                elif kind == 2:
                    pos = rng.randrange(len(b) + 1)
                    b[pos:pos] = rng.choice([b"\xff\xff", b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff",
                                             b"\x80\x00\x00\x00", b"\xff\xff\xff\xff\x0f", b"\x00"])
                elif kind == 3:
                    b += rng.randbytes(rng.randint(1, 16))
                else:
                    pos = rng.randrange(len(b) + 1)
                    b[pos:pos] = rng.randbytes(rng.randint(1, 8))
                try:
                    entity = decode(key, v, bytes(b))
                except ProtocolViolation:
                    pass
                else:
                    _no_null_where_kafka_has_none(entity)
                tried += 1
    assert tried > 5000
