"""The Spark reader's column-wise decoding (appliance.spark.decode) against the record-at-a-time
decoder: the same records from plain and compressed batches, nulls, headers, LogAppendTime,
and the offsets a fetch starts or ends inside a batch."""

import random

import pytest

from appliance.errors import InvalidRecord
from appliance.protocol.records import (COMPRESSION_LZ4, COMPRESSION_ZSTD, Record, build_batch,
                                        decode_records, read_header, stamp_log_append_time)
from appliance.spark.decode import decode_batches, record_starts


def batches_of(*raws, first=None):
    out = []
    for i, raw in enumerate(raws):
        h = read_header(raw)
        out.append((memoryview(raw), h, h.base_offset if first is None or i else first))
    return out


def rows(cols):
    hs = cols.headers or [None] * len(cols)
    return [(int(o), int(t), int(tt), k, v, h) for o, t, tt, k, v, h in
            zip(cols.offset, cols.timestamp, cols.timestamp_type, cols.key.to_pylist(),
                cols.value.to_pylist(), hs)]


def expected(*raws, lat=False):
    out = []
    for raw in raws:
        for r in decode_records(raw):
            out.append((r.offset, r.timestamp, int(lat), r.key, r.value, r.headers or None))
    return out


def test_records_of_plain_and_compressed_batches_with_nulls_and_headers():
    rnd = random.Random(3)
    raws = []
    base = 0
    for codec in (0, COMPRESSION_ZSTD, COMPRESSION_LZ4):
        recs = [Record(None if i % 7 == 0 else bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 30))),
                       None if i % 9 == 0 else b"v" * rnd.randrange(0, 400),
                       (("h", b"x"), ("e", None)) if i % 5 == 0 else (), 1000 + i) for i in range(120)]
        raws.append(build_batch(recs, base_offset=base, compression=codec, base_timestamp=1000))
        base += 120
    cols = decode_batches(batches_of(*raws), end=10**9, headers=True)
    assert rows(cols) == expected(*raws)
    plain = decode_batches(batches_of(*raws), end=10**9)
    assert plain.headers is None and plain.value.to_pylist() == cols.value.to_pylist()


def test_a_fetch_starting_and_ending_inside_batches_keeps_only_its_range():
    raws = [build_batch([Record(b"%d" % i, b"%d" % i, (), 5) for i in range(10)], base_offset=b)
            for b in (100, 110)]
    cols = decode_batches(batches_of(*raws, first=104), end=115)
    assert cols.offset.tolist() == list(range(104, 115))
    assert cols.value.to_pylist() == [b"%d" % i for i in range(4, 10)] + [b"%d" % i for i in range(5)]


def test_log_append_time_batches_give_every_record_the_batch_timestamp():
    raw = bytearray(build_batch([Record(b"k", b"v", (), 7), Record(b"k", b"w", (), 9)], base_offset=3))
    stamp_log_append_time(raw, 12345)
    cols = decode_batches(batches_of(bytes(raw)), end=100)
    assert cols.timestamp.tolist() == [12345, 12345] and cols.timestamp_type.tolist() == [1, 1]


def test_a_records_section_that_does_not_add_up_is_refused():
    raw = build_batch([Record(b"k", b"v" * 20, (), 1)] * 3)
    section = raw[61:]
    assert len(record_starts(section, 3, 0)) == 3
    with pytest.raises(InvalidRecord):
        record_starts(section, 4, 0)
    with pytest.raises(InvalidRecord):
        record_starts(section + b"\x00", 3, 0)
