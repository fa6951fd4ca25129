"""The Spark sink's column-wise record batches (appliance.spark.encode) against the client's
record-at-a-time encoding and partitioner: the same bytes on the wire, the same partitions."""

import random

import numpy as np
import pyarrow as pa

from appliance.client.producer import default_partition, murmur2
from appliance.protocol.records import HEADER_SIZE, Record, build_batch, build_batch_from_body, decode_records
from appliance.spark.encode import Partitioner, _views, encode_partitions, encode_rows, murmur2_column


def random_bytes(rnd, n):
    return bytes(rnd.getrandbits(8) for _ in range(n))


def test_murmur2_column_is_kafkas_murmur2_for_keys_of_every_length():
    rnd = random.Random(5)
    keys = [random_bytes(rnd, rnd.choice([0, 1, 2, 3, 4, 5, 7, 8, 13, 36, 100])) for _ in range(500)]
    keys += [b"%d" % i for i in range(300)]
    offsets, data, lengths = _views(pa.array(keys, pa.binary()))
    got = murmur2_column(offsets, data, lengths)
    assert [int(h) for h in got] == [murmur2(k) & 0xFFFFFFFF for k in keys]


def test_rows_are_partitioned_as_the_client_does_and_null_keys_stick_to_one_partition():
    keys = pa.array([b"%d" % i for i in range(200)] + [None] * 5, pa.binary())
    p = Partitioner()
    parts = p.assign("t", 7, keys, None)
    assert parts[:200].tolist() == [default_partition(b"%d" % i, 7) for i in range(200)]
    assert len(set(parts[200:].tolist())) == 1
    again = p.assign("t", 7, keys, None)
    assert again[200] == (parts[200] + 1) % 7                   # the next batch, the next one
    given = p.assign("t", 7, keys, pa.array([3] * 100 + [None] * 105, pa.int32()))
    assert (given[:100] == 3).all() and given[100:200].tolist() == parts[100:200].tolist()


def decoded(encoded):
    out = []
    for e in encoded:
        batch = build_batch_from_body(bytes(e.body), e.count, base_timestamp=e.base_timestamp,
                                      max_timestamp=e.max_timestamp)
        out.append([(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(batch)])
    return out


def test_encoded_rows_decode_to_the_rows_and_match_the_record_encoder_byte_for_byte():
    rnd = random.Random(9)
    keys = [None if i % 11 == 0 else random_bytes(rnd, rnd.randrange(0, 20)) for i in range(300)]
    values = [None if i % 13 == 0 else random_bytes(rnd, rnd.randrange(0, 300)) for i in range(300)]
    encoded = encode_rows(pa.array(keys, pa.binary()), pa.array(values, pa.binary()), 1 << 20, 1234)
    assert len(encoded) == 1 and encoded[0].count == 300
    want = build_batch([Record(k, v, (), 1234) for k, v in zip(keys, values)], base_timestamp=1234)
    assert bytes(encoded[0].body) == want[HEADER_SIZE:]
    assert decoded(encoded) == [[(i, 1234, k, v, []) for i, (k, v) in enumerate(zip(keys, values))]]


def test_rows_are_cut_into_batches_of_at_most_batch_size_with_offset_deltas_from_zero():
    values = pa.array([b"x" * 100] * 1000, pa.binary())
    keys = pa.array([str(i).encode() for i in range(1000)], pa.binary())
    encoded = encode_rows(keys, values, 16384, 7)
    assert len(encoded) > 6 and sum(e.count for e in encoded) == 1000
    assert all(len(e.body) + HEADER_SIZE <= 16384 for e in encoded)
    rows = [r for batch in decoded(encoded) for r in batch]
    assert [r[3] for r in rows] == [b"x" * 100] * 1000 and [r[2] for r in rows] == keys.to_pylist()
    assert all(batch[0][0] == 0 for batch in decoded(encoded))
    big = encode_rows(pa.array([b"k"]), pa.array([b"y" * 5000]), 1024, 7)    # larger than a batch
    assert len(big) == 1 and big[0].count == 1


def test_each_partition_gets_its_rows_in_their_order():
    keys = pa.array([b"%d" % (i % 50) for i in range(2000)], pa.binary())
    values = pa.array([b"v-%d" % i for i in range(2000)], pa.binary())
    parts = Partitioner().assign("t", 3, keys, None)
    out = encode_partitions(keys, values, parts, 4096, 1)
    seen = {0: [], 1: [], 2: []}
    for p, e in out:
        seen[p] += [v for batch in decoded([e]) for (_, _, _, v, _) in batch]
    for p in range(3):
        assert seen[p] == [b"v-%d" % i for i in range(2000) if parts[i] == p]
    assert np.bincount(parts, minlength=3).tolist() == [len(seen[p]) for p in range(3)]
