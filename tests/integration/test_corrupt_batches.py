"""Batches whose CRC holds but whose records a consumer cannot read are never stored (Kafka's
LogValidator), a compressed batch is never inflated beyond the bound, and a data dir poisoned
while the appliance was down is recovered by truncation. Raw Produce frames, then a real
confluent-kafka consumer reads every good record around the refused ones."""

from __future__ import annotations

import struct

import crc32c
import psutil
import pytest
import zstandard
from confluent_kafka import Consumer, TopicPartition

from appliance.data_layout import partition_dir
from appliance.log.files import log_path
from appliance.protocol.records import (COMPRESSION_GZIP, COMPRESSION_ZSTD, HEADER_SIZE, Record,
                                        build_batch, scan_valid)
from appliance_harness import Appliance
from raw_wire import RawClient

T0 = 1_700_000_000_000


def create(raw, topic: str) -> None:
    r = raw.request(19, 7, {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                                        "assignments": [], "configs": []}], "timeout_ms": 10000})
    assert r.topics[0].error_code == 0


def produce(raw, topic: str, batch: bytes, version: int = 9):
    r = raw.request(0, version, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                                 "topic_data": [{"name": topic, "partition_data": [
                                     {"index": 0, "records": batch}]}]})
    return r.responses[0].partition_responses[0]


def fix_crc(b: bytearray) -> bytes:
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    return bytes(b)


def good(i: int, n: int = 3) -> bytes:
    return build_batch([Record(b"k%d-%d" % (i, j), b"good-%d-%d" % (i, j)) for j in range(n)])


def raw_batch(records: bytes, count: int, codec: int = 0) -> bytes:
    """A batch header claiming ``count`` records and ``codec`` around arbitrary bytes."""
    b = bytearray(build_batch([Record(None, b"x")]))[:HEADER_SIZE] + records
    struct.pack_into(">i", b, 8, len(b) - 12)
    struct.pack_into(">h", b, 21, codec)
    struct.pack_into(">i", b, 23, count - 1)
    struct.pack_into(">i", b, 57, count)
    return fix_crc(b)


def consume_all(bootstrap: str, topic: str, expect: int, timeout_s: float = 30.0) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    errors = []
    try:
        import time
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                errors.append(m.error())
                continue
            out.append(m.value())
    finally:
        c.close()
    assert not errors, errors
    return out


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt-batches")
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"))
    a.start()
    yield a
    a.terminate()


def _record(value: bytes, offset_delta: int = 0) -> bytes:
    from appliance.protocol.records import _varint
    body = b"\x00" + _varint(0) + _varint(offset_delta) + _varint(-1) + _varint(len(value)) + value + b"\x00"
    return _varint(len(body)) + body


CORRUPT = {
    # garbage claimed as gzip / zstd: the codec cannot decode it
    "garbage as gzip": (lambda: raw_batch(b"\x00not gzip at all, just bytes", 1, COMPRESSION_GZIP), 2),
    "garbage as zstd": (lambda: raw_batch(b"\x00not zstd at all, just bytes", 1, COMPRESSION_ZSTD), 2),
    # a broken record length
    "record length past the end": (lambda: raw_batch(b"\x7e" + _record(b"v")[1:], 1), 87),
    # a record count with no record bytes behind it
    "count without records": (lambda: raw_batch(_record(b"v"), 5), 87),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_crc_valid_but_unreadable_batch_is_refused_and_good_records_around_it_are_read(app, case):
    make, code = CORRUPT[case]
    topic = "c-" + case.replace(" ", "-")
    with RawClient(app.bootstrap) as raw:
        create(raw, topic)
        assert produce(raw, topic, good(0)).error_code == 0
        r = produce(raw, topic, make())
        assert r.error_code == code, r
        assert produce(raw, topic, good(1)).error_code == 0
    got = consume_all(app.bootstrap, topic, 6)
    assert got == [b"good-%d-%d" % (i, j) for i in range(2) for j in range(3)]


def test_offset_deltas_out_of_order_get_per_record_errors(app):
    topic = "c-offsets"
    with RawClient(app.bootstrap) as raw:
        create(raw, topic)
        bad = raw_batch(_record(b"a", 0) + _record(b"b", 5) + _record(b"c", 2), 3)
        r = produce(raw, topic, bad, version=9)
        assert r.error_code == 87
        assert [e.batch_index for e in r.record_errors] == [1]
        assert "offset delta 5" in r.record_errors[0].batch_index_error_message
        assert produce(raw, topic, good(0)).error_code == 0
    assert len(consume_all(app.bootstrap, topic, 3)) == 3


def test_zstd_bomb_is_refused_with_the_frontend_memory_bounded(app):
    # A record of 512 MiB of zeros in a ~16 KB batch.
    from appliance.protocol.records import _varint
    n = 512 << 20
    body = b"\x00\x00\x00\x01" + _varint(n)
    rec_head = _varint(len(body) + n + 1) + body
    cctx = zstandard.ZstdCompressor(level=3)
    chunker = cctx.chunker(size=n + len(rec_head) + 1)
    comp = b"".join(chunker.compress(rec_head))
    zeros = b"\x00" * (1 << 20)
    for _ in range(n >> 20):
        comp += b"".join(chunker.compress(zeros))
    comp += b"".join(chunker.compress(b"\x00")) + b"".join(chunker.finish())
    bomb = raw_batch(comp, 1, COMPRESSION_ZSTD)
    assert len(bomb) < 64 << 10
    frontends = [psutil.Process(w["pid"]) for w in app.workers("frontend")]
    before = {p.pid: p.memory_info().rss for p in frontends}
    with RawClient(app.bootstrap) as raw:
        create(raw, "c-bomb")
        r = produce(raw, "c-bomb", bomb)
        assert r.error_code == 87 and "decompresses to more than" in r.error_message
        assert produce(raw, "c-bomb", good(0)).error_code == 0
    for p in frontends:
        grown = p.memory_info().rss - before[p.pid]
        assert grown < 200 << 20, (p.pid, grown)     # without the bound: 512 MiB and more
    assert len(consume_all(app.bootstrap, "c-bomb", 3)) == 3


def test_poisoned_data_dir_is_recovered_by_truncation(appliance_factory, tmp_path):
    data = str(tmp_path / "poisoned")
    a = appliance_factory(data_dir=data)
    with RawClient(a.bootstrap) as raw:
        create(raw, "p")
        for i in range(3):
            assert produce(raw, "p", good(i)).error_code == 0
    a.kill9_all()                          # no clean shutdown: recovery scans the active segment
    path = log_path(partition_dir(data, "p", 0), 0)
    with open(path, "r+b") as f:
        content = bytearray(f.read())
        _, end = scan_valid(content)
        poison = bytearray(raw_batch(b"\x00not zstd at all", 1, COMPRESSION_ZSTD))
        struct.pack_into(">q", poison, 0, 9)           # the next offset: the CRC does not cover it
        f.seek(end)
        f.write(poison)
    a.restart()
    got = consume_all(a.bootstrap, "p", 9)
    assert got == [b"good-%d-%d" % (i, j) for i in range(3) for j in range(3)]
    with RawClient(a.bootstrap) as raw:
        r = produce(raw, "p", good(3))
        assert r.error_code == 0 and r.base_offset == 9
    assert len(consume_all(a.bootstrap, "p", 12)) == 12
