"""RecordBatch v2 codec: layout, validation error codes, codecs, control batches, in-place edits.

kafka-python's DefaultRecordBatch (an independent implementation of the same format) is used to
cross-check bytes in both directions.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KPBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KPBuilder

from appliance.errors import ErrorCode, KafkaError
from appliance.protocol import records as R
from appliance.protocol.records import (Record, build_batch, build_control_batch, compress,
                                        decode_records, decompress, iter_batch_headers,
                                        parse_control_record, read_header, scan_valid,
                                        set_base_offset, stamp_log_append_time, validate_batch)

CODECS = [R.COMPRESSION_NONE, R.COMPRESSION_GZIP, R.COMPRESSION_SNAPPY, R.COMPRESSION_LZ4,
          R.COMPRESSION_ZSTD]
BIG = 1 << 20


def recs(n: int = 3, ts: int = 1_700_000_000_000) -> list[Record]:
    return [Record(b"key-%d" % i, b"value-%d" % i * (i + 1), [("h%d" % i, b"x" * i)], ts + i)
            for i in range(n)]


def fix_crc(b: bytearray) -> bytearray:
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return b


# ---------------------------------------------------------------------------------------------
# header layout
# ---------------------------------------------------------------------------------------------

def test_header_layout_positions_match_kafka():
    b = build_batch(recs(2), base_offset=7, producer_id=42, producer_epoch=3, base_sequence=9,
                    transactional=True, partition_leader_epoch=5, base_timestamp=1000)
    assert struct.unpack_from(">q", b, 0)[0] == 7
    assert struct.unpack_from(">i", b, 8)[0] == len(b) - 12
    assert struct.unpack_from(">i", b, 12)[0] == 5
    assert b[16] == 2
    assert struct.unpack_from(">I", b, 17)[0] == crc32c(b[21:])
    assert struct.unpack_from(">h", b, 21)[0] == 0x10
    assert struct.unpack_from(">i", b, 23)[0] == 1
    assert struct.unpack_from(">q", b, 27)[0] == 1000
    assert struct.unpack_from(">q", b, 35)[0] == 1_700_000_000_001
    assert struct.unpack_from(">q", b, 43)[0] == 42
    assert struct.unpack_from(">h", b, 51)[0] == 3
    assert struct.unpack_from(">i", b, 53)[0] == 9
    assert struct.unpack_from(">i", b, 57)[0] == 2
    h = read_header(b)
    assert (h.base_offset, h.partition_leader_epoch, h.magic, h.producer_id, h.producer_epoch,
            h.base_sequence, h.records_count) == (7, 5, 2, 42, 3, 9, 2)
    assert h.size == len(b) and h.last_offset == 8 and h.is_transactional and not h.is_control
    assert h.compression == 0 and h.timestamp_type == 0


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec_with_headers_and_nulls(codec):
    rs = [Record(None, b"v1", [], 10), Record(b"k2", None, [("a", None), ("b", b"")], 12),
          Record(b"", b"", [("\u00e9t\u00e9", b"\x00\xff")], 11),
          Record(b"k" * 300, b"v" * 70000, [], 9)]
    b = build_batch(rs, compression=codec, base_offset=100)
    h = validate_batch(set_zero(b), BIG)
    assert h.compression == codec and h.records_count == 4 and h.max_timestamp == 12
    out = decode_records(b)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (100, 10, None, b"v1", []), (101, 12, b"k2", None, [("a", None), ("b", b"")]),
        (102, 11, b"", b"", [("\u00e9t\u00e9", b"\x00\xff")]), (103, 9, b"k" * 300, b"v" * 70000, [])]
    # kafka-python reads our bytes the same way
    kp = list(KPBatch(bytearray(b)))
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in kp] == [
        (r.offset, r.timestamp, r.key, r.value, r.headers) for r in out]


def set_zero(b: bytes) -> bytearray:
    out = bytearray(b)
    set_base_offset(out, 0)
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_decode_batches_built_by_kafka_python(codec):
    kb = KPBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                   producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(5):
        kb.append(i, timestamp=1000 + i, key=None if i == 2 else b"k%d" % i,
                  value=b"v%d" % i * 100, headers=[("h", b"x%d" % i)])
    b = bytes(kb.build())
    h = validate_batch(b, BIG)
    assert h.records_count == 5 and h.compression == codec
    out = decode_records(b)
    assert [(r.offset, r.key, r.value, r.headers) for r in out] == [
        (i, None if i == 2 else b"k%d" % i, b"v%d" % i * 100, [("h", b"x%d" % i)]) for i in range(5)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.none() | st.binary(max_size=40), st.none() | st.binary(max_size=200),
                          st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)),
                                   max_size=3),
                          st.integers(0, 2**41)), min_size=1, max_size=12),
       st.sampled_from(CODECS))
def test_round_trip_property(items, codec):
    rs = [Record(k, v, h, t) for k, v, h, t in items]
    b = build_batch(rs, compression=codec, base_timestamp=min(t for *_, t in items))
    validate_batch(b, BIG)
    out = decode_records(b)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in out] == [
        (k, v, list(h), t) for k, v, h, t in items]


@pytest.mark.parametrize("size", [0, 63, 64, 8191, 8192, 8193, 40000])
def test_varints_on_both_sides_of_the_lookup_table_read_back_by_kafka_python(size):
    # The encoder looks small varints up in a table (zig-zag values below 2**14) and computes the
    # rest: lengths and deltas on both sides of that edge must decode, with ours and kafka-python's.
    ts = [10**12, 10**12 - 8192, 10**12 + 8191, 10**12 + 2**40, 10**12 - 8193]
    rs = [Record(b"k" * size, b"v" * (size + i), (("h", b"x" * size), ("n", None)), t)
          for i, t in enumerate(ts)]
    b = build_batch(rs)
    validate_batch(b, BIG)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in decode_records(b)] == [
        (r.key, r.value, list(r.headers), r.timestamp) for r in rs]
    theirs = list(KPBatch(b))
    assert [(m.key, m.value, list(m.headers), m.timestamp) for m in theirs] == [
        (r.key, r.value, list(r.headers), r.timestamp) for r in rs]


def test_zigzag_varints_negative_timestamp_delta():
    b = build_batch([Record(b"a", b"b", (), 5000), Record(b"c", b"d", (), 1000)])
    assert [r.timestamp for r in decode_records(b)] == [5000, 1000]
    assert read_header(b).max_timestamp == 5000


# ---------------------------------------------------------------------------------------------
# codecs
# ---------------------------------------------------------------------------------------------

def test_lz4_frame_is_kafkas_and_readable_by_python_lz4():
    import lz4.frame
    data = bytes(range(256)) * 1000
    c = compress(R.COMPRESSION_LZ4, data)
    # FLG 0x60: version 1, independent blocks, no checksums; BD 0x40: 64 KiB blocks; HC byte
    # as python-lz4 (reference xxhash) computes it for the same descriptor.
    ref = lz4.frame.compress(b"x", block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                             content_checksum=False, block_checksum=False, store_size=False)
    assert c[:7] == ref[:7] == bytes.fromhex("04224d18604082")
    assert lz4.frame.decompress(c) == data
    assert decompress(R.COMPRESSION_LZ4, lz4.frame.compress(data)) == data   # linked blocks too


def test_snappy_writes_xerial_framing_and_reads_raw_and_xerial():
    from kafka.codec import snappy_decode, snappy_encode
    data = b"abcdefgh" * 20000
    c = compress(R.COMPRESSION_SNAPPY, data)
    assert c[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    assert snappy_decode(c) == data                                   # kafka-python's xerial reader
    assert decompress(R.COMPRESSION_SNAPPY, snappy_encode(data, xerial_compatible=True)) == data
    assert decompress(R.COMPRESSION_SNAPPY, snappy_encode(data, xerial_compatible=False)) == data
    # two concatenated xerial streams
    assert decompress(R.COMPRESSION_SNAPPY, c + compress(R.COMPRESSION_SNAPPY, b"tail")) == data + b"tail"


@pytest.mark.parametrize("codec", CODECS[1:])
def test_corrupt_compressed_payload_is_corrupt_record(codec):
    with pytest.raises(KafkaError) as e:
        decompress(codec, b"\x00garbage-not-compressed-data")
    assert e.value.code == ErrorCode.corrupt_message


# ---------------------------------------------------------------------------------------------
# validate_batch: one test per Kafka rule
# ---------------------------------------------------------------------------------------------

def err(buf, max_bytes=BIG, **kw) -> ErrorCode:
    with pytest.raises(KafkaError) as e:
        validate_batch(buf, max_bytes, **kw)
    return e.value.code


GOOD = build_batch(recs(3))


def mutate(**fields) -> bytearray:
    """GOOD with header fields replaced and the CRC made right again."""
    b = bytearray(GOOD)
    h = read_header(b)._replace(**fields)
    struct.pack_into(">qiibIhiqqqhii", b, 0, *h)
    return fix_crc(b)


def test_valid_batch_returns_header():
    h = validate_batch(GOOD, BIG)
    assert h == read_header(GOOD)


def test_memoryview_and_bytearray_inputs():
    assert validate_batch(memoryview(GOOD), BIG) == validate_batch(bytearray(GOOD), BIG)


@pytest.mark.parametrize("buf", [b"", b"\x00" * 11, GOOD[:16]])
def test_empty_or_short_buffer_is_invalid_record(buf):
    assert err(buf) == ErrorCode.invalid_record


def test_length_below_minimum_overhead_is_corrupt():
    b = bytearray(GOOD)
    struct.pack_into(">i", b, 8, 13)
    assert err(b) == ErrorCode.corrupt_message
    assert err(bytes(b[:12])) == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [3, 0x80])
def test_unknown_magic_is_corrupt(magic):
    b = bytearray(GOOD)
    b[16] = magic
    assert err(b) == ErrorCode.corrupt_message


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_is_invalid_record(magic):
    b = bytearray(GOOD)
    b[16] = magic
    assert err(b) == ErrorCode.invalid_record


def test_length_field_longer_than_buffer_is_invalid_record():
    assert err(GOOD[:-1]) == ErrorCode.invalid_record


def test_two_batches_is_invalid_record():
    assert err(GOOD + GOOD) == ErrorCode.invalid_record


@pytest.mark.parametrize("tail", [b"\x00", b"\x00" * 20, b"\xff" * 61])
def test_trailing_garbage_is_corrupt(tail):
    assert err(GOOD + tail) == ErrorCode.corrupt_message


def test_non_zero_base_offset_is_invalid_record():
    b = bytearray(GOOD)
    set_base_offset(b, 5)
    assert err(b) == ErrorCode.invalid_record


def test_larger_than_max_is_message_too_large():
    assert err(GOOD, len(GOOD) - 1) == ErrorCode.message_too_large
    assert validate_batch(GOOD, len(GOOD)).size == len(GOOD)


def test_shorter_than_header_is_corrupt():
    b = bytearray(GOOD[:40])
    struct.pack_into(">i", b, 8, 28)
    assert err(b) == ErrorCode.corrupt_message


def test_crc_mismatch_is_corrupt():
    b = bytearray(GOOD)
    b[-1] ^= 1
    assert err(b) == ErrorCode.corrupt_message


def test_crc_covers_attributes_but_not_leader_epoch():
    b = bytearray(GOOD)
    b[21] ^= 0x40                     # attributes are inside the CRC
    assert err(b) == ErrorCode.corrupt_message
    b = bytearray(GOOD)
    struct.pack_into(">i", b, 12, 99)  # partition leader epoch is outside
    validate_batch(b, BIG)


def test_unknown_codec_is_unsupported_compression():
    assert err(mutate(attributes=6)) == ErrorCode.unsupported_compression_type


def test_zstd_before_produce_v7_is_unsupported_compression():
    b = build_batch(recs(), compression=R.COMPRESSION_ZSTD)
    assert err(b, produce_version=6) == ErrorCode.unsupported_compression_type
    validate_batch(b, BIG, produce_version=7)


def test_negative_last_offset_delta_is_invalid_record():
    assert err(mutate(last_offset_delta=-1)) == ErrorCode.invalid_record


def test_zero_records_count_is_invalid_record():
    assert err(mutate(records_count=0, last_offset_delta=0)) == ErrorCode.invalid_record


def test_count_disagreeing_with_last_offset_delta_is_invalid_record():
    assert err(mutate(records_count=4)) == ErrorCode.invalid_record
    assert err(mutate(last_offset_delta=1)) == ErrorCode.invalid_record


def test_control_batch_from_client_is_invalid_record():
    b = build_control_batch(commit=True, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                            timestamp_ms=1)
    assert err(b) == ErrorCode.invalid_record


def test_producer_id_without_sequence_is_invalid_record():
    assert err(mutate(producer_id=5, producer_epoch=0, base_sequence=-1)) == ErrorCode.invalid_record
    validate_batch(mutate(producer_id=5, producer_epoch=0, base_sequence=0), BIG)


def test_transactional_without_producer_id_is_invalid_record():
    assert err(mutate(attributes=0x10)) == ErrorCode.invalid_record


def test_log_append_time_from_client_is_invalid_timestamp():
    assert err(mutate(attributes=0x08)) == ErrorCode.invalid_timestamp


# ---------------------------------------------------------------------------------------------
# in-place edits
# ---------------------------------------------------------------------------------------------

def test_set_base_offset_keeps_crc_valid():
    b = bytearray(GOOD)
    crc = read_header(b).crc
    set_base_offset(b, 123456789)
    h = read_header(b)
    assert h.base_offset == 123456789 and h.crc == crc
    assert scan_valid(b)[1] == len(b)
    assert [r.offset for r in decode_records(b)] == [123456789, 123456790, 123456791]


def test_set_base_offset_at_position():
    buf = bytearray(GOOD + GOOD)
    set_base_offset(buf, 77, pos=len(GOOD))
    assert read_header(buf, len(GOOD)).base_offset == 77 and read_header(buf).base_offset == 0


def test_stamp_log_append_time_sets_bit_and_max_keeps_base_and_fixes_crc():
    b = bytearray(GOOD)
    before = read_header(b)
    stamp_log_append_time(b, 9_999_999)
    h = read_header(b)
    assert h.timestamp_type == 1 and h.max_timestamp == 9_999_999
    assert h.base_timestamp == before.base_timestamp
    assert h.attributes == before.attributes | 0x08
    assert h.crc == crc32c(bytes(b[21:])) != before.crc
    assert [r.timestamp for r in decode_records(b)] == [9_999_999] * 3
    assert [r.timestamp for r in KPBatch(bytearray(b))] == [9_999_999] * 3


def test_stamp_at_position_only_touches_that_batch():
    buf = bytearray(GOOD + GOOD)
    stamp_log_append_time(buf, 5, pos=len(GOOD))
    assert bytes(buf[:len(GOOD)]) == GOOD
    assert [p for p, _ in scan_valid(buf)[0]] == [0, len(GOOD)]


# ---------------------------------------------------------------------------------------------
# control batches
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("commit,wire_type", [(True, 1), (False, 0)])
def test_control_batch_bytes_match_kafka_definition(commit, wire_type):
    b = build_control_batch(commit=commit, producer_id=4242, producer_epoch=7, coordinator_epoch=13,
                            timestamp_ms=1_700_000_000_123, base_offset=50)
    h = read_header(b)
    assert h.attributes == 0x30 and h.is_control and h.is_transactional
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (4242, 7, -1)
    assert (h.records_count, h.last_offset_delta, h.base_offset) == (1, 0, 50)
    assert h.base_timestamp == h.max_timestamp == 1_700_000_000_123
    assert h.timestamp_type == 0        # MemoryRecords.writeEndTransactionalMarker uses CreateTime
    # The single record, byte by byte (DefaultRecord + EndTransactionMarker):
    key = struct.pack(">hh", 0, wire_type)
    value = struct.pack(">hi", 0, 13)
    body = bytes([0x00, 0x00, 0x00, 0x08]) + key + bytes([0x0C]) + value + bytes([0x00])
    assert b[61:] == bytes([len(body) * 2]) + body
    assert len(b) == 61 + 1 + len(body)         # Kafka's CURRENT_END_TXN_SCHEMA_RECORD_SIZE + 61
    assert parse_control_record(b) == (wire_type, 13)
    kp = list(KPBatch(bytearray(b)))
    assert kp[0].type == wire_type and KPBatch(bytearray(b)).is_control_batch


def test_parse_control_record_refuses_data_batch():
    with pytest.raises(KafkaError):
        parse_control_record(GOOD)


# ---------------------------------------------------------------------------------------------
# walking
# ---------------------------------------------------------------------------------------------

def test_iter_batch_headers_and_scan_valid_stop_at_zeros():
    b1, b2 = build_batch(recs(1)), build_batch(recs(2))
    buf = bytearray(b1 + b2 + bytes(500))
    assert [(p, h.records_count) for p, h in iter_batch_headers(buf)] == [(0, 1), (len(b1), 2)]
    valid, end = scan_valid(buf, 0, len(buf))
    assert [p for p, _ in valid] == [0, len(b1)] and end == len(b1) + len(b2)


def test_scan_valid_stops_at_bad_crc_and_torn_batch():
    b1, b2, b3 = (build_batch(recs(i + 1)) for i in range(3))
    buf = bytearray(b1 + b2 + b3)
    buf[len(b1) + 70] ^= 0xFF
    assert scan_valid(buf)[1] == len(b1)
    whole = b1 + b2
    assert scan_valid(whole + b3[:-1])[1] == len(whole)
    assert scan_valid(b1, 0, len(b1) - 1)[1] == 0


def test_iter_batch_headers_does_not_check_crc():
    b = bytearray(GOOD)
    b[-1] ^= 1
    assert len(list(iter_batch_headers(b))) == 1 and scan_valid(b)[1] == 0


def test_decode_rejects_count_mismatch():
    b = bytearray(GOOD)
    struct.pack_into(">i", b, 57, 4)
    with pytest.raises(KafkaError) as e:
        decode_records(b)
    assert e.value.code == ErrorCode.invalid_record
    b = bytearray(GOOD)
    struct.pack_into(">i", b, 57, 2)
    with pytest.raises(KafkaError):
        decode_records(b)


def test_build_batch_needs_records():
    with pytest.raises(ValueError):
        build_batch([])
