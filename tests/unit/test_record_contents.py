"""record_contents: Kafka's per-record checks of a produced batch, bounded decompression, and the
readers' walk. Every rule once, with each fast walk (ours in C, aiokafka's parser) and without
one (the Python walk alone): they must agree."""

from __future__ import annotations

import gzip
import struct
import zlib

import lz4.frame
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import zstandard
from crc32c import crc32c

from appliance.errors import ErrorCode, KafkaError
from appliance.protocol import record_contents as RC
from appliance.protocol import records as R
from appliance.protocol.record_contents import (RecordValidationError, decompress_bounded,
                                                offsets_and_timestamps, records_ok, validate_records)

T0 = 1_700_000_000_000
BIG = 64 << 20


@pytest.fixture(params=["native", "aiokafka", "python"])
def path(request, monkeypatch):
    """Run a test with our C walk, with aiokafka's parser, and with the Python walk alone."""
    if request.param != "native":
        monkeypatch.setattr(RC, "_native_ok", None)
    if request.param == "python":
        monkeypatch.setattr(RC, "_FastBatch", None)
    return request.param


def test_the_c_walk_is_built():
    """``make test`` installs the package with its extension (setup.py); a missing compiler would
    otherwise go unnoticed and leave the hot path on the slower walk."""
    assert RC._native_ok is not None


def rec(body: bytes) -> bytes:
    return R._varint(len(body)) + body


def body(ts_delta=0, offset_delta=0, key: bytes | None = b"k", value: bytes | None = b"value",
         headers: bytes = b"\x00") -> bytes:
    out = b"\x00" + R._varint(ts_delta) + R._varint(offset_delta)
    out += R._varint(-1) if key is None else R._varint(len(key)) + key
    out += R._varint(-1) if value is None else R._varint(len(value)) + value
    return out + headers


def raw_batch(data: bytes, count: int, *, codec: int = 0, base_ts: int = T0, attrs: int = 0,
              base_offset: int = 0) -> bytes:
    """A batch around arbitrary record bytes (compressed with ``codec``), with a valid CRC."""
    payload = R.compress(codec, data) if codec else data
    b = bytearray(R.HEADER_SIZE + len(payload))
    R._HEADER.pack_into(b, 0, base_offset, len(b) - R.LOG_OVERHEAD, -1, 2, 0, codec | attrs,
                        count - 1, base_ts, base_ts, -1, -1, -1, count)
    b[R.HEADER_SIZE:] = payload
    struct.pack_into(">I", b, R.CRC_OFFSET, crc32c(bytes(b[R.ATTRIBUTES_OFFSET:])))
    return bytes(b)


def refused(buf, **kw) -> KafkaError:
    kw.setdefault("max_bytes", BIG)
    with pytest.raises(KafkaError) as e:
        validate_records(buf, **kw)
    return e.value


def good(n=5, codec=0) -> bytes:
    return R.build_batch([R.Record(b"k%d" % i, b"v" * 50, [("h", b"x")], T0 + i) for i in range(n)],
                         compression=codec)


@pytest.mark.parametrize("codec", range(5))
def test_good_batches_pass_every_codec(path, codec):
    validate_records(good(codec=codec), max_bytes=BIG, now_ms=T0)
    assert records_ok(good(codec=codec), 0, R.read_header(good(codec=codec)), max_bytes=BIG)


# -- framing: INVALID_RECORD, no per-record errors (Kafka's InvalidRecordException) ---------------

FRAMING = {
    "record length past the end": (R._varint(100) + body(), 1),
    "record length shorter than its fields": (R._varint(len(body()) - 1) + body(), 1),
    "record count with no record bytes behind it": (rec(body()), 3),
    "bytes after the last record": (rec(body()) + b"\x00\x02", 1),
    "negative header count": (rec(body(headers=R._varint(-2))), 1),
    "negative header key size": (rec(body(headers=b"\x02" + R._varint(-3) + b"\x00")), 1),
    "header count larger than the buffer": (rec(body(headers=R._varint(1000))), 1),
    "value past the end": (rec(body(value=None)[:-1] + R._varint(100000) + b"x\x00"), 1),
    "varint longer than 5 bytes": (b"\xff" * 6 + b"\x01", 1),
    "empty record data": (b"", 1),
}


@pytest.mark.parametrize("case", sorted(FRAMING))
def test_broken_framing_is_invalid_record(path, case):
    data, count = FRAMING[case]
    for codec in (0, R.COMPRESSION_ZSTD):
        e = refused(raw_batch(data, count, codec=codec))
        assert e.code == ErrorCode.invalid_record, case
        assert not isinstance(e, RecordValidationError)
        assert not records_ok(raw_batch(data, count, codec=codec), 0,
                              R.read_header(raw_batch(data, count, codec=codec)), max_bytes=BIG)


# -- per-record rules: RecordValidationError with (batch_index, message) --------------------------

def test_offset_deltas_must_be_0_to_n_minus_1(path):
    data = rec(body(offset_delta=0)) + rec(body(offset_delta=2)) + rec(body(offset_delta=1))
    e = refused(raw_batch(data, 3))
    assert e.code == ErrorCode.invalid_record
    assert [i for i, _ in e.record_errors] == [1, 2]
    assert "2 record errors" in e.message and "offset delta 2" in e.record_errors[0][1]


def test_compacted_topic_needs_keys(path):
    data = rec(body(key=b"a")) + rec(body(offset_delta=1, key=None))
    validate_records(raw_batch(data, 2), max_bytes=BIG)
    e = refused(raw_batch(data, 2), compacted=True, topic_partition="t-0")
    assert e.code == ErrorCode.invalid_record
    assert e.record_errors == [(1, "Compacted topic cannot accept message without key in topic partition t-0")]


def test_create_time_out_of_range_is_invalid_timestamp(path):
    data = rec(body(ts_delta=0)) + rec(body(ts_delta=-5000, offset_delta=1)) + rec(body(ts_delta=9000, offset_delta=2))
    b = raw_batch(data, 3)
    validate_records(b, max_bytes=BIG, now_ms=T0)                       # no limit by default
    e = refused(b, now_ms=T0, before_ms=1000, after_ms=1000)
    assert e.code == ErrorCode.invalid_timestamp
    assert e.message == "One or more records have been rejected due to invalid timestamp"
    assert [i for i, _ in e.record_errors] == [1, 2]
    assert e.record_errors[0][1].startswith(f"Timestamp {T0 - 5000} of message with offset 1 is out of range")
    validate_records(b, max_bytes=BIG, now_ms=T0, before_ms=5000, after_ms=9000)


def test_no_timestamp_and_log_append_time_batches_are_not_checked(path):
    data = rec(body()) + rec(body(offset_delta=1))
    validate_records(raw_batch(data, 2, base_ts=-1 - 0), max_bytes=BIG, now_ms=T0, before_ms=0, after_ms=0)
    validate_records(raw_batch(data, 2, attrs=0x08, base_ts=1), max_bytes=BIG, now_ms=T0,
                     before_ms=0, after_ms=0)


# -- compressed data --------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_garbage_claimed_as_compressed_is_corrupt_message(path, codec):
    b = bytearray(raw_batch(b"\x00garbage that is not compressed at all", 1))
    b[22] |= codec
    struct.pack_into(">I", b, R.CRC_OFFSET, crc32c(bytes(b[R.ATTRIBUTES_OFFSET:])))
    assert refused(bytes(b)).code == ErrorCode.corrupt_message


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_decompressed_size_is_bounded(path, codec):
    data = b"".join(rec(body(offset_delta=i, value=b"\x00" * 10000)) for i in range(100))
    b = raw_batch(data, 100, codec=codec)
    validate_records(b, max_bytes=len(data))
    e = refused(b, max_bytes=len(data) - 1)
    assert e.code == ErrorCode.invalid_record and "decompresses to more than" in e.message
    assert not records_ok(b, 0, R.read_header(b), max_bytes=len(data) - 1)


def test_zstd_bomb_stops_at_the_bound():
    bomb = zstandard.ZstdCompressor(level=3).compress(b"\x00" * (256 << 20))
    assert len(bomb) < 64 << 10
    with pytest.raises(KafkaError) as e:
        decompress_bounded(R.COMPRESSION_ZSTD, bomb, 1 << 20)
    assert e.value.code == ErrorCode.invalid_record


def test_other_writers_framings_decode():
    data = bytes(range(256)) * 400
    lim = len(data)
    # Linked blocks decode as one frame, allowed when the headers bound it: each block counts as
    # its frame's maximum block size (2 x 64 KiB here).
    linked = lz4.frame.compress(data, block_linked=True, content_checksum=True)
    assert decompress_bounded(R.COMPRESSION_LZ4, linked, 128 << 10) == data
    with pytest.raises(KafkaError):
        decompress_bounded(R.COMPRESSION_LZ4, linked, lim)
    independent = lz4.frame.compress(data, block_linked=False, block_checksum=True)
    assert decompress_bounded(R.COMPRESSION_LZ4, independent, lim) == data
    import cramjam
    assert decompress_bounded(R.COMPRESSION_SNAPPY, bytes(cramjam.snappy.compress_raw(data)), lim) == data
    two = gzip.compress(data[:1000]) + gzip.compress(data[1000:])                            # two members
    assert decompress_bounded(R.COMPRESSION_GZIP, two, lim) == data
    assert decompress_bounded(R.COMPRESSION_GZIP, two + b"trailing", lim) == data
    with pytest.raises(KafkaError) as e:
        decompress_bounded(R.COMPRESSION_GZIP, gzip.compress(data)[:-20], lim)
    assert e.value.code == ErrorCode.corrupt_message
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    assert decompress_bounded(R.COMPRESSION_GZIP, c.compress(data) + c.flush(), lim) == data


# -- readers ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", range(5))
def test_offsets_and_timestamps(codec):
    b = bytearray(good(4, codec))
    R.set_base_offset(b, 100)
    assert list(offsets_and_timestamps(b, max_bytes=BIG)) == [(100 + i, T0 + i) for i in range(4)]
    R.stamp_log_append_time(b, T0 + 99)
    assert list(offsets_and_timestamps(b, max_bytes=BIG)) == [(100 + i, T0 + 99) for i in range(4)]
    if codec:
        with pytest.raises(KafkaError):
            list(offsets_and_timestamps(b, max_bytes=10))


def test_records_ok_accepts_control_batches_at_any_offset(path):
    b = R.build_control_batch(commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                              timestamp_ms=T0, base_offset=77)
    assert records_ok(b, 0, R.read_header(b), max_bytes=BIG)
    padded = b"\x00" * 5 + b
    assert records_ok(padded, 5, R.read_header(padded, 5), max_bytes=BIG)


# -- the C walk against the Python walk -------------------------------------------------------------

def _python_accepts(data: bytes, count: int, *, compacted: bool, create_time: bool, base_ts: int,
                    now_ms: int, before_ms: int, after_ms: int) -> bool:
    h = R.read_header(raw_batch(b"", 0, base_ts=base_ts, attrs=0 if create_time else 0x08))
    h = h._replace(records_count=count)
    try:
        RC._validate_slow(h, data, now_ms=now_ms, before_ms=before_ms, after_ms=after_ms,
                          compacted=compacted, topic_partition="")
    except KafkaError:
        return False
    return True


_bytes = st.one_of(st.none(), st.binary(max_size=40))
_record = st.tuples(st.integers(-(1 << 40), 1 << 40), _bytes, _bytes,
                    st.lists(st.tuples(st.binary(max_size=8), _bytes), max_size=3))


@given(records=st.lists(_record, max_size=12),
       offset_noise=st.lists(st.integers(-2, 2), max_size=12),
       edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
       cut=st.one_of(st.none(), st.integers(0, 10_000)),
       extra=st.binary(max_size=3),
       count_noise=st.sampled_from([0, 0, 0, -1, 1]),
       compacted=st.booleans(), create_time=st.booleans(),
       base_ts=st.sampled_from([T0, -1, 0, -(1 << 63), (1 << 63) - 1]),
       limits=st.sampled_from([(RC.NO_TIMESTAMP_LIMIT,) * 2, (1000, 1000), (0, 0), (1 << 41, 1 << 41)]))
@settings(max_examples=1500, deadline=None)
def test_the_c_walk_vouches_only_for_what_the_python_walk_accepts(
        records, offset_noise, edits, cut, extra, count_noise, compacted, create_time, base_ts,
        limits):
    """The C walk may leave a verdict to the Python walk (False), but whatever it vouches for
    (True) the Python walk accepts; and every well-formed batch that keeps the rules it vouches
    for, or the hot path would not be fast. Mutations (bytes changed, cut, appended, a wrong
    count, off-by-some offset deltas) reach every framing branch."""
    noise = offset_noise + [0] * (len(records) - len(offset_noise))
    data = b"".join(
        rec(b"\x00" + R._varint(ts) + R._varint(i + noise[i])
            + (R._varint(-1) if k is None else R._varint(len(k)) + k)
            + (R._varint(-1) if v is None else R._varint(len(v)) + v)
            + R._varint(len(hs)) + b"".join(
                R._varint(len(hk)) + hk + (R._varint(-1) if hv is None else R._varint(len(hv)) + hv)
                for hk, hv in hs))
        for i, (ts, k, v, hs) in enumerate(records))
    pristine = not any(noise[:len(records)])
    buf = bytearray(data)
    for at, byte in edits:
        if buf:
            buf[at % len(buf)] = byte
            pristine = False
    if cut is not None and buf:
        del buf[cut % len(buf):]
        pristine = False
    if extra:
        buf += extra
        pristine = False
    if count_noise:
        pristine = False
    count = max(0, len(records) + count_noise)
    before, after = limits
    kw = dict(compacted=compacted, create_time=create_time, base_ts=base_ts, now_ms=T0,
              before_ms=before, after_ms=after)
    native = RC._native_ok(bytes(buf), count, compacted, create_time, base_ts, T0, before, after)
    python = _python_accepts(bytes(buf), count, **kw)
    assert not native or python
    if pristine and python:
        assert native


def test_xerial_snappy_reads_the_same_bounded_and_unbounded():
    """Both readers walk xerial streams with one walk (records.xerial_blocks): concatenated
    streams read whole, a truncated chunk header or chunk is CORRUPT_MESSAGE in both, and the
    bound counts every block."""
    data = bytes(range(256)) * 200                       # 51,200 bytes: two xerial blocks
    two = R.compress(R.COMPRESSION_SNAPPY, data) + R.compress(R.COMPRESSION_SNAPPY, b"tail")
    assert R.decompress(R.COMPRESSION_SNAPPY, two) == data + b"tail"
    assert decompress_bounded(R.COMPRESSION_SNAPPY, two, len(data) + 4) == data + b"tail"
    with pytest.raises(KafkaError):
        decompress_bounded(R.COMPRESSION_SNAPPY, two, len(data) + 3)
    one = R.compress(R.COMPRESSION_SNAPPY, data)
    for cut in (one[:18], one[:-1]):                     # in a chunk's length; in its block
        for read in (lambda b: R.decompress(R.COMPRESSION_SNAPPY, b),
                     lambda b: decompress_bounded(R.COMPRESSION_SNAPPY, b, 1 << 20)):
            with pytest.raises(KafkaError) as e:
                read(cut)
            assert e.value.code == ErrorCode.corrupt_message
