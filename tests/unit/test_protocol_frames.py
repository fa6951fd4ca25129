"""Framing and headers: appliance.protocol.frames."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as KioHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioHeaderV2
from kio.serial import entity_reader, entity_writer

from appliance.errors import ProtocolViolation
from appliance.protocol import messages
from appliance.protocol.frames import (
    REQUEST_HEADER_MIN_BYTES,
    FrameBuffer,
    FrameDecoder,
    FrameTooLarge,
    RequestHeader,
    encode_response_frame,
    parse_request_header,
    request_header_version,
    response_header_version,
)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in points:
        out.append(data[prev:p])
        prev = p
    out.append(data[prev:])
    return out


# --------------------------------------------------------------------------- FrameDecoder

@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=REQUEST_HEADER_MIN_BYTES, max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_frames_survive_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(framed(p) for p in payloads)
    dec = FrameDecoder(max_frame_bytes=1000)
    got = []
    for chunk in split_at(stream, cuts):
        got.extend(bytes(f) for f in dec.feed(chunk))
    assert got == payloads
    assert dec.buffered == 0


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(min_size=REQUEST_HEADER_MIN_BYTES, max_size=50), chunk=st.integers(1, 7))
def test_frames_fed_in_tiny_chunks(payload: bytes, chunk: int) -> None:
    stream = framed(payload) * 3
    dec = FrameDecoder(max_frame_bytes=100)
    got = []
    for i in range(0, len(stream), chunk):
        got.extend(bytes(f) for f in dec.feed(stream[i:i + chunk]))
    assert got == [payload] * 3


def test_large_frame_in_64k_reads_is_reassembled_exactly() -> None:
    payload = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB
    stream = framed(payload) + framed(b"x" * 20)
    dec = FrameDecoder(max_frame_bytes=2 << 20)
    got = []
    for i in range(0, len(stream), 65536):
        frames = dec.feed(stream[i:i + 65536])
        got.extend(bytes(f) for f in frames)
        if not got:
            # Pieces are kept as views of the chunks received, not re-copied on every read.
            assert all(isinstance(c, memoryview) for c in dec._chunks)
            assert dec.buffered == min(i + 65536, len(stream))
    assert got == [payload, b"x" * 20]


def test_frame_inside_one_chunk_is_a_view_not_a_copy() -> None:
    data = framed(b"a" * 12) + framed(b"b" * 12)
    frames = FrameDecoder(100).feed(data)
    assert [bytes(f) for f in frames] == [b"a" * 12, b"b" * 12]
    assert all(isinstance(f, memoryview) and f.readonly for f in frames)


def test_writable_input_is_copied_so_frames_do_not_change() -> None:
    data = bytearray(framed(b"c" * 12))
    (frame,) = FrameDecoder(100).feed(data)
    data[4:] = b"z" * 12
    assert bytes(frame) == b"c" * 12


def test_frames_before_a_bad_size_in_the_same_chunk_are_returned_then_the_error() -> None:
    """Regression: a good request followed by garbage in one read lost the good request."""
    dec = FrameDecoder(100)
    frames = dec.feed(framed(b"a" * 12) + struct.pack(">i", 5000) + b"junk")
    assert [bytes(f) for f in frames] == [b"a" * 12]
    assert isinstance(dec.error, FrameTooLarge)
    with pytest.raises(FrameTooLarge):
        dec.feed(framed(b"b" * 12))


@pytest.mark.parametrize("size", [101, 2**31 - 1, -1, -(2**31)])
def test_oversize_or_negative_size_raises_frame_too_large(size: int) -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">i", size))
    assert issubclass(FrameTooLarge, ProtocolViolation)


def test_oversize_detected_from_prefix_split_across_reads() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    assert dec.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLarge):
        dec.feed(b"\x01\x00")


def test_size_exactly_at_limit_is_accepted() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    assert [bytes(f) for f in dec.feed(framed(b"q" * 100))] == [b"q" * 100]


@pytest.mark.parametrize("size", [0, 1, 9])
def test_zero_or_too_short_size_is_protocol_violation(size: int) -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(ProtocolViolation) as info:
        dec.feed(struct.pack(">i", size) + b"\x00" * size)
    assert not isinstance(info.value, FrameTooLarge)


def test_min_frame_bytes_is_configurable_for_response_streams() -> None:
    dec = FrameDecoder(max_frame_bytes=100, min_frame_bytes=4)
    assert [bytes(f) for f in dec.feed(framed(b"\x00\x00\x00\x07"))] == [b"\x00\x00\x00\x07"]


# --------------------------------------------------------------------------- request headers

def kio_header(api_key: int, version: int, corr: int, client_id: str | None, hv: int) -> bytes:
    cls = KioHeaderV2 if hv == 2 else KioHeaderV1
    buf = io.BytesIO()
    entity_writer(cls)(buf, cls(request_api_key=api_key, request_api_version=version,
                                correlation_id=corr, client_id=client_id))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("api_key", "version", "hv"),
    [(0, 8, 1), (0, 9, 2), (1, 11, 1), (1, 12, 2), (3, 8, 1), (3, 9, 2), (18, 2, 1), (18, 3, 2),
     (60, 0, 2), (10, 2, 1), (10, 3, 2)],
)
@pytest.mark.parametrize("client_id", ["rdkafka", "", None, "ünïcødé-client"])
def test_header_versions_and_fields(api_key: int, version: int, hv: int, client_id: str | None) -> None:
    raw = kio_header(api_key, version, 123456, client_id, hv) + b"BODY"
    for frame in (raw, memoryview(raw)):
        header, offset = parse_request_header(frame)
        assert header == RequestHeader(api_key, version, 123456, client_id or "", hv)
        assert raw[offset:] == b"BODY"
    assert request_header_version(api_key, version) == hv


def test_header_v2_keeps_client_id_as_int16_string_not_compact() -> None:
    raw = kio_header(0, 9, 1, "abc", 2)
    assert raw[8:10] == b"\x00\x03"  # int16 length, not a uvarint
    header, offset = parse_request_header(raw + b"\x99")
    assert header.client_id == "abc"
    assert offset == len(raw)


def test_header_v2_tagged_fields_are_skipped() -> None:
    raw = (struct.pack(">hhih", 0, 9, 77, 2) + b"id"
           + b"\x02" + b"\x00\x03xyz" + b"\x05\x00")  # two unknown tags: (0, 3 bytes), (5, empty)
    header, offset = parse_request_header(raw + b"body")
    assert header.correlation_id == 77 and header.client_id == "id"
    assert offset == len(raw)


def test_header_v2_tagged_field_running_past_frame_is_violation() -> None:
    raw = struct.pack(">hhih", 0, 9, 77, -1) + b"\x01\x00\x7f"
    with pytest.raises(ProtocolViolation):
        parse_request_header(raw)


def test_header_v2_truncated_tag_section_is_violation() -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(struct.pack(">hhih", 0, 9, 77, -1))


def test_client_id_longer_than_frame_is_violation() -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(struct.pack(">hhih", 0, 8, 1, 50) + b"short")


def test_negative_client_id_length_other_than_null_is_violation() -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(struct.pack(">hhih", 0, 8, 1, -2))


def test_invalid_utf8_client_id_is_replaced_like_java() -> None:
    header, _ = parse_request_header(struct.pack(">hhih", 0, 8, 1, 2) + b"\xff\xfe")
    assert header.client_id == "\ufffd\ufffd"


@pytest.mark.parametrize("raw", [b"", b"\x00\x00\x00", struct.pack(">hhi", 0, 8, 1)])
def test_frame_too_short_for_header(raw: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(raw)


@pytest.mark.parametrize("api_key", [4, 7, 93, 1000, -1, 32767])
def test_unknown_api_key_is_violation(api_key: int) -> None:
    with pytest.raises(ProtocolViolation):
        parse_request_header(struct.pack(">hhih", api_key, 0, 1, -1))


@pytest.mark.parametrize(("api_key", "version"), [(0, 2), (0, 14), (1, 3), (1, 99), (3, -1)])
def test_unknown_version_of_known_api_is_violation(api_key: int, version: int) -> None:
    # Kafka: SocketServer.parseRequestHeader -> "... which is not enabled" -> connection closed.
    with pytest.raises(ProtocolViolation):
        parse_request_header(struct.pack(">hhih", api_key, version, 1, -1))


@pytest.mark.parametrize(("version", "hv"), [(5, 2), (99, 2), (32767, 2), (-1, 1)])
def test_api_versions_of_unknown_version_parses_header_only(version: int, hv: int) -> None:
    raw = kio_header(18, version, 42, "future-client", hv) + b"\x07unknown body layout"
    header, offset = parse_request_header(raw)
    assert header == RequestHeader(18, version, 42, "future-client", hv)
    assert raw[offset:] == b"\x07unknown body layout"
    assert not messages.is_known_version(18, version)
    # The answer is the v0 layout, with UNSUPPORTED_VERSION and the ApiVersions range,
    # under a v0 response header.
    body = messages.build_api_versions_response(version, {0: (3, 13), 18: (0, 4)})
    resp, n = entity_reader(messages.response_class(18, 0))(body, 0)
    assert n == len(body)
    assert resp.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 4)]
    assert response_header_version(18, version) == 0


def test_custom_header_version_function_is_used() -> None:
    seen = []

    def hv_of(api_key: int, version: int) -> int:
        seen.append((api_key, version))
        return 2

    raw = struct.pack(">hhih", 0, 3, 9, -1) + b"\x00"
    header, offset = parse_request_header(raw, hv_of)
    assert seen == [(0, 3)] and header.header_version == 2 and offset == len(raw)


def test_header_version_function_may_refuse() -> None:
    def refuse(api_key: int, version: int) -> int:
        raise ProtocolViolation("not enabled")

    with pytest.raises(ProtocolViolation, match="not enabled"):
        parse_request_header(struct.pack(">hhih", 0, 9, 9, -1) + b"\x00", refuse)


# --------------------------------------------------------------------------- responses

@pytest.mark.parametrize(
    ("api_key", "version", "hv"),
    [(0, 8, 0), (0, 9, 1), (1, 11, 0), (1, 12, 1), (18, 0, 0), (18, 3, 0), (18, 4, 0), (60, 0, 1)],
)
def test_response_header_version(api_key: int, version: int, hv: int) -> None:
    assert response_header_version(api_key, version) == hv


def test_encode_response_frame_v0() -> None:
    parts = encode_response_frame(7, 0, b"body")
    data = b"".join(parts)
    assert data == struct.pack(">ii", 8, 7) + b"body"


def test_encode_response_frame_v1_has_empty_tag_byte() -> None:
    data = b"".join(encode_response_frame(-5, 1, b"xyz"))
    assert data == struct.pack(">iib", 8, -5, 0) + b"xyz"


def test_encode_response_frame_passes_buffers_through() -> None:
    big = memoryview(bytes(range(256)) * 10)
    cast = memoryview(b"\x00" * 16).cast("I")  # len() is 4, nbytes is 16
    parts = encode_response_frame(1, 1, [b"ab", big, cast])
    assert parts[1] == b"ab" and parts[2] is big and parts[3] is cast
    size = struct.unpack(">i", parts[0][:4])[0]
    assert size == 5 + 2 + 2560 + 16
    dec = FrameDecoder(1 << 20, min_frame_bytes=4)
    (frame,) = dec.feed(b"".join(bytes(p) for p in parts))
    assert bytes(frame)[:5] == struct.pack(">ib", 1, 0)


def test_encode_response_frame_with_known_length() -> None:
    parts = encode_response_frame(3, 0, [b"abc", b"de"], body_len=5)
    assert b"".join(parts) == struct.pack(">ii", 9, 3) + b"abcde"


def test_decoder_frames_feed_header_parsing_and_body_decoding() -> None:
    import kio.schema.metadata.v12.request as md

    entity = md.MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                include_topic_authorized_operations=True)
    buf = io.BytesIO()
    entity_writer(md.MetadataRequest)(buf, entity)
    frame = kio_header(3, 12, 99, "c", 2) + buf.getvalue()
    stream = framed(frame) * 2
    dec = FrameDecoder(1 << 20)
    frames = dec.feed(stream[:7]) + dec.feed(stream[7:])
    assert len(frames) == 2
    for f in frames:  # one joined bytes, one memoryview into the second chunk
        header, offset = parse_request_header(f)
        assert (header.api_key, header.api_version, header.correlation_id) == (3, 12, 99)
        assert messages.decode_request(3, 12, f, offset) == entity


# --------------------------------------------------------------------------- FrameBuffer

def read_through(fb: FrameBuffer, data: bytes, reads: list[int]) -> list[bytes]:
    """What a BufferedProtocol does: get_buffer, the socket fills part of it, commit. The
    frames of each commit are copied at once (they are valid until the next get_buffer)."""
    out: list[bytes] = []
    pos = 0
    reads = list(reads)
    while pos < len(data):
        buf = fb.get_buffer()
        assert len(buf) >= FrameBuffer.MIN_READ
        n = min(len(buf), len(data) - pos, reads.pop(0) if reads else len(data))
        n = max(n, 1)
        buf[:n] = data[pos:pos + n]
        pos += n
        out += [bytes(f) for f in fb.commit(n)]
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=REQUEST_HEADER_MIN_BYTES, max_size=70_000), max_size=6),
    reads=st.lists(st.integers(min_value=1, max_value=100_000), max_size=30),
    initial=st.sampled_from([16, 4096, 65536]),
)
def test_frame_buffer_returns_every_frame_whatever_the_reads(payloads, reads, initial) -> None:
    fb = FrameBuffer(max_frame_bytes=1 << 20, initial=initial)
    data = b"".join(framed(p) for p in payloads)
    assert read_through(fb, data, reads) == payloads
    assert fb.buffered == 0


def test_frame_buffer_frames_are_read_only_views_of_the_buffer_and_a_big_frame_gets_room() -> None:
    fb = FrameBuffer(max_frame_bytes=1 << 22, initial=65536)
    big = bytes(range(256)) * 8192                       # 2 MiB
    data = framed(b"s" * 20) + framed(big)
    buf = fb.get_buffer()
    buf[:100] = data[:100]
    (small,) = fb.commit(100)
    assert small.readonly and bytes(small) == b"s" * 20
    buf = fb.get_buffer()                                  # room for the whole big frame
    assert len(buf) >= len(big) + 4 - (100 - 24)
    buf[:len(data) - 100] = data[100:]
    (frame,) = fb.commit(len(data) - 100)
    assert frame.nbytes == len(big) and bytes(frame) == big
    fb.get_buffer()
    assert fb.capacity == 65536                            # the big buffer is given back


def test_frame_buffer_returns_the_frames_before_a_bad_size_then_the_error() -> None:
    fb = FrameBuffer(100)
    data = framed(b"a" * 12) + struct.pack(">i", 5000) + b"junk"
    buf = fb.get_buffer()
    buf[:len(data)] = data
    assert [bytes(f) for f in fb.commit(len(data))] == [b"a" * 12]
    assert isinstance(fb.error, FrameTooLarge)
    with pytest.raises(FrameTooLarge):
        fb.commit(0)


@pytest.mark.parametrize("size", [101, -1, 0, 9])
def test_frame_buffer_refuses_bad_sizes_like_the_decoder(size: int) -> None:
    fb = FrameBuffer(max_frame_bytes=100)
    buf = fb.get_buffer()
    buf[:4] = struct.pack(">i", size)
    with pytest.raises(ProtocolViolation):
        fb.commit(4)
