"""TransactionLogKey / TransactionLogValue encoding (appliance.txn.records)."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.txn.records import (RecordDecodeError, TransactionLogValue, UnknownKeyVersion,
                                   decode_key, decode_value, encode_key, encode_value)


def _value(**kw) -> TransactionLogValue:
    base = dict(producer_id=4711, producer_epoch=3, transaction_timeout_ms=60000,
                transaction_status=1, transaction_partitions=[("orders", [0, 2]), ("x", [7])],
                transaction_last_update_ms=1_700_000_000_123, transaction_start_ms=1_700_000_000_000)
    base.update(kw)
    return TransactionLogValue(**base)


# -- keys ---------------------------------------------------------------------------------------

def test_key_bytes_match_the_spec():
    # version int16 0, then string: int16 length + UTF-8
    assert encode_key("tx-é") == b"\x00\x00" + b"\x00\x05" + "tx-é".encode()
    assert decode_key(b"\x00\x00\x00\x02ab") == "ab"


def test_key_with_unknown_version_is_reported_not_decoded():
    with pytest.raises(UnknownKeyVersion) as exc:
        decode_key(b"\x00\x01\x00\x02ab")
    assert exc.value.version == 1


def test_truncated_key_raises():
    with pytest.raises(RecordDecodeError):
        decode_key(b"\x00\x00\x00\x05ab")


# -- values: bytes built by hand from the JSON spec ----------------------------------------------

def test_value_v0_bytes_match_the_spec():
    v = _value(transaction_partitions=[("ab", [1, 2])])
    expected = (
        struct.pack(">h", 0)                 # version
        + struct.pack(">q", 4711)            # ProducerId
        + struct.pack(">h", 3)               # ProducerEpoch
        + struct.pack(">i", 60000)           # TransactionTimeoutMs
        + struct.pack(">b", 1)               # TransactionStatus (Ongoing)
        + struct.pack(">i", 1)               # TransactionPartitions: 1 entry
        + struct.pack(">h", 2) + b"ab"       #   Topic
        + struct.pack(">i", 2) + struct.pack(">ii", 1, 2)   # PartitionIds
        + struct.pack(">q", 1_700_000_000_123)               # LastUpdateTimestampMs
        + struct.pack(">q", 1_700_000_000_000)               # StartTimestampMs
    )
    assert encode_value(v, version=0) == expected
    back = decode_value(expected)
    assert back == v


def test_value_v1_bytes_match_the_spec():
    v = _value(transaction_partitions=[("ab", [1, 2])], previous_producer_id=4711,
               next_producer_id=5000, client_transaction_version=2, next_producer_epoch=9)
    expected = (
        struct.pack(">h", 1)                 # version (never a varint)
        + struct.pack(">q", 4711)
        + struct.pack(">h", 3)
        + struct.pack(">i", 60000)
        + struct.pack(">b", 1)
        + bytes([2])                         # compact array: 1 entry + 1
        + bytes([3]) + b"ab"                 #   compact string: length + 1
        + bytes([3]) + struct.pack(">ii", 1, 2)   # compact array of int32
        + bytes([0])                         #   no tagged fields in the entry
        + struct.pack(">q", 1_700_000_000_123)
        + struct.pack(">q", 1_700_000_000_000)
        + bytes([4])                         # 4 tagged fields, ascending tag
        + bytes([0, 8]) + struct.pack(">q", 4711)    # 0 PreviousProducerId
        + bytes([1, 8]) + struct.pack(">q", 5000)    # 1 NextProducerId
        + bytes([2, 2]) + struct.pack(">h", 2)       # 2 ClientTransactionVersion
        + bytes([3, 2]) + struct.pack(">h", 9)       # 3 NextProducerEpoch (ours)
    )
    assert encode_value(v) == expected
    assert decode_value(expected) == v


def test_default_tagged_fields_are_not_written():
    raw = encode_value(_value(transaction_partitions=None))
    # null compact array is 0; the record ends with a tagged-field count of 0
    assert raw[2 + 8 + 2 + 4 + 1] == 0
    assert raw[-1] == 0 and len(raw) == 2 + 8 + 2 + 4 + 1 + 1 + 16 + 1
    back = decode_value(raw)
    assert back.previous_producer_id == -1 and back.next_producer_id == -1
    assert back.client_transaction_version == 0 and back.next_producer_epoch == -1
    assert back.transaction_partitions is None


def test_unknown_tags_are_skipped_on_read():
    raw = bytearray(encode_value(_value(client_transaction_version=2)))
    assert raw[-5:] == bytes([1, 2, 2]) + struct.pack(">h", 2)
    # rewrite the trailing tagged section: tag 2 plus an unknown tag 40 with 3 bytes,
    # and an unknown tag 300 (a two-byte varint tag) with 0 bytes
    raw[-5:] = bytes([3, 2, 2]) + struct.pack(">h", 2) + bytes([40, 3]) + b"xyz" + bytes([0xAC, 0x02, 0])
    back = decode_value(bytes(raw))
    assert back.client_transaction_version == 2
    assert back.unknown_tags == {40: b"xyz", 300: b""}
    assert back.transaction_partitions == [("orders", [0, 2]), ("x", [7])]


def test_upstream_kafka_value_decodes():
    # What Kafka's serializer writes for a TV2 client: only ClientTransactionVersion tagged.
    v = _value(transaction_status=4, transaction_partitions=[], client_transaction_version=2)
    raw = encode_value(v)
    assert raw.endswith(bytes([1, 2, 2, 0, 2]))
    assert decode_value(raw).transaction_partitions == []


def test_tombstone_is_none():
    assert decode_value(None) is None


def test_v0_cannot_carry_tagged_fields():
    with pytest.raises(ValueError):
        encode_value(_value(previous_producer_id=1), version=0)


@pytest.mark.parametrize("raw", [
    b"\x00",                                          # not even a version
    b"\x00\x02" + bytes(40),                          # unknown version
    encode_value(_value())[:-3],                      # truncated tagged section
    encode_value(_value(), version=0)[:20],           # truncated partitions
])
def test_bad_values_raise(raw):
    with pytest.raises(RecordDecodeError):
        decode_value(raw)


def test_known_tag_with_wrong_size_raises():
    raw = bytearray(encode_value(_value(previous_producer_id=7)))
    assert raw[-11:-8] == bytes([1, 0, 8])
    raw[-11:] = bytes([1, 0, 4]) + struct.pack(">i", 7)
    with pytest.raises(RecordDecodeError):
        decode_value(bytes(raw))


_parts = st.one_of(st.none(), st.lists(st.tuples(st.text(min_size=1, max_size=20),
                                                 st.lists(st.integers(0, 2**31 - 1), max_size=5)),
                                       max_size=4))


@settings(max_examples=200, deadline=None)
@given(pid=st.integers(-1, 2**63 - 1), epoch=st.integers(-1, 32767), timeout=st.integers(-1, 2**31 - 1),
       status=st.integers(0, 7), parts=_parts, ts=st.integers(-1, 2**62), prev=st.integers(-1, 2**63 - 1),
       nxt=st.integers(-1, 2**63 - 1), tv=st.integers(0, 32767), nepoch=st.integers(-1, 32767))
def test_value_round_trip(pid, epoch, timeout, status, parts, ts, prev, nxt, tv, nepoch):
    v = TransactionLogValue(pid, epoch, timeout, status, parts, ts, ts // 2, prev, nxt, tv, nepoch)
    assert decode_value(encode_value(v)) == v
    v0 = TransactionLogValue(pid, epoch, timeout, status, parts, ts, ts // 2)
    assert decode_value(encode_value(v0, version=0)) == v0


@given(st.text(max_size=100))
def test_key_round_trip(tid):
    assert decode_key(encode_key(tid)) == tid
