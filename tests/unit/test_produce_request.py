"""The hand parser of Produce v3-v13 against ``messages.decode_request`` (Kafka's shape rules,
kio's reader, the lenient re-read).

On every version: valid requests (built and encoded by kio) parse to the same field values, the
record batches as views of the frame (no copy); truncated, corrupted and random bodies are
refused exactly when ``decode_request`` refuses them, and accepted ones agree field by field.
"""

from __future__ import annotations

import datetime
import importlib
import io
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kio.serial import entity_writer

from appliance.errors import ProtocolViolation
from appliance.protocol import messages
from appliance.protocol.produce_request import MAX_VERSION, MIN_VERSION, parse_produce_request

VERSIONS = list(range(MIN_VERSION, MAX_VERSION + 1))


def encode(version: int, txn: str | None, acks: int, timeout_ms: int,
           topics: list[tuple[str, list[tuple[int, bytes | None]]]]) -> bytes:
    cls = messages.request_class(0, version)
    mod = importlib.import_module(cls.__module__)
    def topic(name, parts):
        data = tuple(mod.PartitionProduceData(index=i, records=r) for i, r in parts)
        if version >= 13:       # KIP-516: named by id (one id per name, for the test)
            return mod.TopicProduceData(topic_id=topic_id(name), partition_data=data)
        return mod.TopicProduceData(name=name, partition_data=data)
    req = cls(transactional_id=txn, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms),
              topic_data=tuple(topic(name, parts) for name, parts in topics))
    buf = io.BytesIO()
    entity_writer(cls)(buf, req)
    return buf.getvalue()


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


def kio_fields(version: int, frame: bytes, pos: int = 0):
    r = messages.decode_request(0, version, frame, pos)
    return (r.transactional_id, r.acks, r.timeout,
            [(t.topic_id.bytes if version >= 13 else t.name, [(p.index, None if p.records is None else bytes(p.records))
                       for p in t.partition_data]) for t in r.topic_data])


def our_fields(version: int, frame: bytes, pos: int = 0):
    r = parse_produce_request(memoryview(frame).toreadonly(), pos, version)
    assert all((t.topic_id is not None) == (version >= 13) for t in r.topic_data)
    assert version < 13 or all(t.name == "" for t in r.topic_data)
    return (r.transactional_id, r.acks, r.timeout,
            [(t.topic_id if version >= 13 else t.name, [(p.index, None if p.records is None else bytes(p.records))
                       for p in t.partition_data]) for t in r.topic_data])


def outcome(fn, version: int, frame: bytes):
    try:
        return ("ok", fn(version, frame))
    except ProtocolViolation:
        return ("refused", None)


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
requests = st.tuples(
    st.sampled_from(VERSIONS),
    st.none() | names,
    st.sampled_from([0, 1, -1, 2, -32768]),
    st.integers(-2**31, 2**31 - 1),
    st.lists(st.tuples(names, st.lists(st.tuples(st.integers(-2**31, 2**31 - 1),
                                                 st.none() | st.binary(max_size=40)),
                                       max_size=3)), max_size=3))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_valid_request_parses_as_kio_reads_it(version):
    frame = encode(version, "txn-1", -1, 30000,
                   [("orders", [(0, b"batch-0"), (3, None)]), ("é-topic", [(1, b"x" * 300)])])
    assert our_fields(version, frame) == kio_fields(version, frame)


@pytest.mark.parametrize("version", VERSIONS)
def test_record_batches_are_views_of_the_frame_not_copies(version):
    frame = bytearray(b"\xff" * 7) + encode(version, None, 1, 5, [("t", [(0, b"abcdef")])])
    view = memoryview(frame).toreadonly()
    r = parse_produce_request(view, 7, version)
    records = r.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and bytes(records) == b"abcdef"
    frame[frame.index(b"abcdef")] = ord("A")          # the same memory, seen through the view
    assert bytes(records) == b"Abcdef"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_any_valid_request_parses_as_kio_reads_it(req):
    version, txn, acks, timeout, topics = req
    frame = encode(version, txn, acks, timeout, topics)
    assert our_fields(version, frame) == kio_fields(version, frame)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.data())
def test_truncated_and_corrupted_requests_are_refused_exactly_when_kio_refuses(req, data):
    version, txn, acks, timeout, topics = req
    frame = bytearray(encode(version, txn, acks, timeout, topics))
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "append"]))
    if how == "truncate" and frame:
        del frame[data.draw(st.integers(0, len(frame) - 1)):]
    elif how == "flip" and frame:
        for _ in range(data.draw(st.integers(1, 3))):
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    elif how == "insert":
        at = data.draw(st.integers(0, len(frame)))
        frame[at:at] = data.draw(st.binary(min_size=1, max_size=6))
    else:
        frame += data.draw(st.binary(min_size=1, max_size=6))
    frame = bytes(frame)
    assert outcome(our_fields, version, frame) == outcome(kio_fields, version, frame)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VERSIONS), st.binary(max_size=64))
def test_random_bodies_are_refused_exactly_when_kio_refuses(version, frame):
    assert outcome(our_fields, version, frame) == outcome(kio_fields, version, frame)


def malformed(version: int, case: str) -> bytes:
    flexible = version >= 9
    frame = bytearray(encode(version, None, 1, 5, [("ab", [(0, b"r")])]))
    # offsets in the encoding of (null txn, acks, timeout, 1 topic "ab", 1 partition)
    txn_len = 1 if flexible else 2
    topics_at = txn_len + 6
    name_at = topics_at + (1 if flexible else 4)
    name_len = 16 if version >= 13 else (1 if flexible else 2) + 2      # the id, or "ab"
    records_at = name_at + name_len + (1 if flexible else 4) + 4
    if case == "null topic name":
        frame[name_at:name_at + (1 if flexible else 2)] = b"\x00" if flexible else b"\xff\xff"
    elif case == "negative string length":
        frame[0:txn_len] = b"\xff\xfe" if not flexible else b"\x80\x80\x80\x80\x80\x01"
    elif case == "negative bytes length":
        frame[records_at:records_at + (1 if flexible else 4)] = (
            b"\x80\x80\x80\x80\x80\x01" if flexible else b"\xff\xff\xff\xfe")
    elif case == "bad utf-8":
        frame[name_at + (1 if flexible else 2)] = 0xFF
    elif case == "array larger than the frame":
        frame[topics_at:topics_at + (1 if flexible else 4)] = b"\x7f" if flexible else b"\x00\x00\x01\x00"
    elif case == "null array":
        frame[topics_at:topics_at + (1 if flexible else 4)] = b"\x00" if flexible else b"\xff\xff\xff\xff"
    elif case == "long varint":
        frame[topics_at:topics_at + (1 if flexible else 4)] = (
            b"\x82\x80\x80\x80\x80\x00" if flexible else b"\x80\x00\x00\x00")
    elif case == "tagged field past the end":
        frame[-1:] = b"\x01\x00\x7f"        # the request's tag section: one tag of 127 bytes
    else:
        raise AssertionError(case)
    return bytes(frame)


@pytest.mark.parametrize("version,case", [
    (v, c) for v in VERSIONS
    for c in ("null topic name", "array larger than the frame", "null array", "long varint",
              "tagged field past the end")
    if v >= 9 or c != "tagged field past the end"          # v3-v8 have no tagged fields
    if v < 13 or c != "null topic name"])                   # v13 names topics by id
def test_malformed_fields_are_refused_like_kafka(version, case):
    frame = malformed(version, case)
    assert outcome(kio_fields, version, frame) == ("refused", None)
    assert outcome(our_fields, version, frame) == ("refused", None)


@pytest.mark.parametrize("version,case", [
    (v, c) for v in VERSIONS for c in ("negative string length", "negative bytes length", "bad utf-8")
    if v < 13 or c != "bad utf-8"])                         # v13 names topics by id
def test_what_kafka_reads_leniently_is_read_the_same(version, case):
    """A nullable length below -1 is null, a string that is not UTF-8 gets replacement
    characters (Java's reader); a varint over 5 bytes is refused (flexible versions)."""
    frame = malformed(version, case)
    expected = outcome(kio_fields, version, frame)
    assert outcome(our_fields, version, frame) == expected
    if version >= 9 and case != "bad utf-8":
        assert expected == ("refused", None)
    else:
        assert expected[0] == "ok"
