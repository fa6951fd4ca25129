"""appliance.client: batching per partition, sequence accounting, partitioner, configuration."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from appliance.client.accumulator import (BATCH_OVERHEAD, Delivery, RecordAccumulator,
                                          SequenceTracker, next_sequence, record_size)
from appliance.client.config import consumer_config, producer_config
from appliance.client.errors import ErrorCode, IllegalStateError, KafkaError
from appliance.client.producer import default_partition, murmur2
from appliance.protocol.records import Record, decode_records, read_header


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rec(i: int, size: int = 10) -> Record:
    return Record(b"k%d" % i, b"x" * size, (), 1_700_000_000_000 + i)


def delivery(tp=("t", 0)) -> Delivery:
    return Delivery(tp[0], tp[1], 0)


# -- batching --------------------------------------------------------------------------------

def test_partition_is_ready_when_full_or_lingered_or_forced():
    clock = Clock()
    acc = RecordAccumulator(batch_size=1000, linger_ms=50, clock=clock)
    assert acc.append(("t", 0), rec(0), delivery()) is False
    assert acc.ready() == []
    assert acc.ready(force=True) == [("t", 0)]
    clock.now += 0.049
    assert acc.ready() == []
    clock.now += 0.002
    assert acc.ready() == [("t", 0)]
    # A full partition is ready at once, whatever its age.
    full = False
    for i in range(100):
        full = acc.append(("t", 1), rec(i, 100), delivery(("t", 1)))
        if full:
            break
    assert full and ("t", 1) in acc.ready()


def test_due_follows_the_oldest_buffered_record_across_drains():
    clock = Clock()
    acc = RecordAccumulator(batch_size=100000, linger_ms=50, clock=clock)
    assert not acc.due()                                  # nothing buffered
    acc.append(("t", 0), rec(0), delivery())
    clock.now += 0.030
    acc.append(("t", 1), rec(1), delivery(("t", 1)))     # 30 ms younger
    clock.now += 0.021
    assert acc.due() and acc.ready() == [("t", 0)]
    acc.drain([("t", 0)])
    assert not acc.due()                                  # ("t", 1) has waited 21 ms only
    clock.now += 0.030
    assert acc.due() and acc.ready() == [("t", 1)]
    acc.drain(acc.ready())
    assert not acc.due()
    clock.now += 10
    assert not acc.due()
    acc.append(("t", 0), rec(2), delivery())
    acc.abort(KafkaError(ErrorCode.unknown_server_error, "x"))
    assert not acc.due()


def test_drain_splits_into_batches_of_at_most_batch_size_and_keeps_order():
    acc = RecordAccumulator(batch_size=500, linger_ms=0)
    ds = []
    for i in range(40):
        d = delivery()
        ds.append(d)
        acc.append(("t", 0), rec(i, 30), d)
    acc.append(("t", 1), rec(99, 2000), delivery(("t", 1)))     # larger than a batch: alone
    queues = acc.drain(acc.ready(force=True))
    assert acc.pending == 0
    batches = list(queues[("t", 0)])
    assert len(batches) > 1
    assert [d for b in batches for d in b.deliveries] == ds
    for b in batches:
        assert BATCH_OVERHEAD + sum(record_size(r) for r in b.records) <= 500
    assert [r.key for b in batches for r in b.records] == [b"k%d" % i for i in range(40)]
    assert len(queues[("t", 1)]) == 1 and queues[("t", 1)][0].count == 1


def test_sealed_batch_keeps_its_bytes_and_sequence_until_unsealed():
    acc = RecordAccumulator(batch_size=10000, linger_ms=0)
    for i in range(3):
        acc.append(("t", 0), rec(i), delivery())
    (batch,) = acc.drain([("t", 0)])[("t", 0)]
    data = batch.seal(producer_id=42, producer_epoch=3, base_sequence=17, transactional=True,
                      compression=4)
    h = read_header(data)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count) == (42, 3, 17, 3)
    assert h.is_transactional and h.compression == 4
    assert [r.value for r in decode_records(data)] == [b"x" * 10] * 3
    assert batch.sealed and batch.data is data
    batch.unseal()
    assert not batch.sealed and batch.base_sequence == -1


def test_deliveries_report_offsets_and_errors_once():
    seen = []
    acc = RecordAccumulator(batch_size=10000, linger_ms=0)
    ds = [Delivery("t", 0, 0, lambda err, d: seen.append((err, d.offset))) for _ in range(3)]
    with pytest.raises(IllegalStateError):
        ds[0].get()
    for i, d in enumerate(ds):
        acc.append(("t", 0), rec(i), d)
    (batch,) = acc.drain([("t", 0)])[("t", 0)]
    batch.succeed(100)
    batch.fail(KafkaError(2, "too late"))                 # a finished delivery does not change
    assert [d.get().offset for d in ds] == [100, 101, 102]
    assert seen == [(None, 100), (None, 101), (None, 102)]
    acc.append(("t", 0), rec(9), d := delivery())
    assert acc.abort(KafkaError(48, "aborted")) == 1
    with pytest.raises(KafkaError):
        d.get()
    assert acc.pending == 0


# -- sequences ---------------------------------------------------------------------------------

def test_sequences_per_partition_allocate_release_reset():
    s = SequenceTracker()
    assert s.allocate(("t", 0), 5) == 0
    assert s.allocate(("t", 0), 3) == 5
    assert s.allocate(("t", 1), 2) == 0
    assert s.peek(("t", 0)) == 8
    s.release(("t", 0), 5, 3)                  # the last batch was refused: its range comes back
    assert s.peek(("t", 0)) == 5
    s.release(("t", 0), 1, 2)                  # not the last allocation: nothing changes
    assert s.peek(("t", 0)) == 5
    assert s.allocate(("t", 0), 1) == 5
    s.reset()
    assert s.peek(("t", 0)) == 0 and s.peek(("t", 1)) == 0


def test_sequences_wrap_at_int32_like_kafka():
    assert next_sequence(2**31 - 1, 1) == 0
    assert next_sequence(2**31 - 3, 5) == 2
    s = SequenceTracker()
    s._next[("t", 0)] = 2**31 - 2
    assert s.allocate(("t", 0), 4) == 2**31 - 2
    assert s.peek(("t", 0)) == 2


# -- partitioner -------------------------------------------------------------------------------

def test_murmur2_matches_kafkas_reference_values():
    # Values of Kafka's Utils.murmur2 (UtilsTest) for these inputs.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_keyed_partition_agrees_with_kafka_python(key, partitions):
    expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions
    assert default_partition(key, partitions) == expected


# -- configuration -----------------------------------------------------------------------------

def test_producer_config_defaults_aliases_and_checks():
    cfg = producer_config({"bootstrap.servers": "h:1", "transactional.id": "t"}, {})
    assert cfg["acks"] == -1 and cfg["enable_idempotence"] and cfg["transaction_timeout_ms"] == 60000
    cfg = producer_config(None, {"bootstrap_servers": "h:1", "acks": 1})
    assert cfg["enable_idempotence"] is False              # acks=1 turns idempotence off
    cfg = producer_config({"bootstrap.servers": "h:1", "transactional.id": "t",
                           "transaction.two.phase.commit.enable": True}, {})
    assert cfg["enable_two_phase_commit"] is True
    with pytest.raises(ValueError, match="never time out"):
        producer_config(None, {"bootstrap_servers": "h:1", "transactional_id": "t",
                               "enable_two_phase_commit": True, "transaction_timeout_ms": 1000})
    with pytest.raises(ValueError, match="needs a transactional_id"):
        producer_config(None, {"bootstrap_servers": "h:1", "enable_two_phase_commit": True})
    with pytest.raises(ValueError, match="acks"):
        producer_config(None, {"bootstrap_servers": "h:1", "transactional_id": "t", "acks": 1})
    with pytest.raises(ValueError, match="unknown producer config key"):
        producer_config(None, {"bootstrap_servers": "h:1", "lingerms": 1})
    with pytest.raises(ValueError, match="compression_type"):
        producer_config(None, {"bootstrap_servers": "h:1", "compression_type": "brotli"})
    with pytest.raises(ValueError, match="transaction_version"):
        producer_config(None, {"bootstrap_servers": "h:1", "transaction_version": 3})
    with pytest.raises(ValueError, match="bootstrap_servers"):
        producer_config(None, {})


def test_consumer_config_checks():
    cfg = consumer_config({"bootstrap.servers": "h:1", "isolation.level": "read_uncommitted"}, {})
    assert cfg["isolation_level"] == "read_uncommitted"
    assert consumer_config(None, {"bootstrap_servers": "h:1"})["isolation_level"] == "read_committed"
    with pytest.raises(ValueError, match="isolation_level"):
        consumer_config(None, {"bootstrap_servers": "h:1", "isolation_level": "serializable"})
    with pytest.raises(ValueError, match="auto_offset_reset"):
        consumer_config(None, {"bootstrap_servers": "h:1", "auto_offset_reset": "middle"})


def test_records_section_is_the_record_encoders_bytes():
    from appliance.client.accumulator import records_section
    from appliance.protocol.records import HEADER_SIZE, Record, build_batch
    recs = [Record(None if i % 4 == 0 else b"k%d" % i, None if i % 5 == 0 else b"v" * i,
                   (("h", b"x"), ("n", None)) if i % 3 == 0 else (), 1000 + 7 * i) for i in range(40)]
    body, base_ts, max_ts = records_section(recs)
    assert bytes(body) == build_batch(recs)[HEADER_SIZE:]
    assert (base_ts, max_ts) == (1000, 1000 + 7 * 39)
