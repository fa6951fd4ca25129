"""Bit rot and torn files (issue 34): a byte changed on disk in a sealed segment is never served
as a valid record; damaged indexes, transaction indexes and producer snapshots are rebuilt from
the log; the background scrub finds what nobody reads. Real confluent-kafka clients, raw Fetch
frames for the error codes."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from appliance.data_layout import partition_dir
from appliance.log.files import log_path
from appliance.metrics import key
from appliance.protocol.records import iter_batch_headers
from shm.metrics import MetricsTable
from raw_wire import RawClient

KAFKA_STORAGE_ERROR = 56
SEGMENT = 65536


def value(i: int) -> bytes:
    return b"value-%05d-" % i + b"x" * 80


def create(app, topic: str, partitions: int = 2, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    cfg = {"segment.bytes": str(SEGMENT), **configs}
    for f in admin.create_topics([NewTopic(topic, partitions, config=cfg)]).values():
        f.result(30)


def produce(app, topic: str, partition: int, n: int, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "linger.ms": 5,
                  "batch.num.messages": 20, "compression.type": "none"})
    for i in range(start, start + n):
        p.produce(topic, value=value(i), key=b"%d" % i, partition=partition)
    assert p.flush(60) == 0


def flip_value_byte(data_dir: str, topic: str, partition: int, record: int) -> tuple[str, int, int]:
    """Change one byte of record ``record``'s value in the first segment (sealed): returns the
    file, the position of the batch holding it and that batch's base offset."""
    path = log_path(partition_dir(data_dir, topic, partition), 0)
    with open(path, "r+b") as f:
        content = f.read()
        at = content.index(value(record))
        f.seek(at + 3)
        f.write(bytes([content[at + 3] ^ 0x20]))        # "value" -> "vaLue": a bit of a letter
    for pos, h in iter_batch_headers(content):
        if pos <= at < pos + h.size:
            return path, pos, h.base_offset
    raise AssertionError("no batch holds the record")


def fetch(raw: RawClient, topic: str, parts: list[tuple[int, int]]):
    r = raw.request(1, 11, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                            "topics": [{"topic": topic, "partitions": [
                                {"partition": p, "current_leader_epoch": -1, "fetch_offset": o,
                                 "log_start_offset": -1, "partition_max_bytes": 1 << 20}
                                for p, o in parts]}],
                            "forgotten_topics_data": [], "rack_id": ""})
    return {p.partition_index: p for p in r.responses[0].partitions}


def fetcher_count(app, topic: str, partition: int, name: str) -> int:
    total = 0
    for path in glob.glob(os.path.join(app.run_dir, "metrics.*")):
        try:
            with MetricsTable.open(path, readonly=True) as t:
                total += t.get(key(name, [("topic", topic), ("partition", partition)]), 0) or 0
        except (ValueError, OSError):
            continue
    return total


def consume(app, topic: str, partition: int, until, timeout_s: float = 60.0) -> list[bytes]:
    """Read ``topic``-``partition`` from offset 0 with confluent-kafka's defaults (check.crcs off,
    as in the report) until ``until(values)``."""
    import time
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": f"g-{topic}-{partition}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, partition, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(got):
            assert time.monotonic() < deadline, f"{len(got)} records after {timeout_s} s"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    return got


def test_a_byte_changed_in_a_sealed_segment_is_never_served_as_a_valid_record(appliance_factory,
                                                                                tmp_path):
    """The report on main c2ecf15: 2,000 records in 64 KiB segments, the appliance stopped, one
    byte of a record's value changed in the first (sealed) segment, started again: a
    confluent-kafka consumer with its defaults got the altered record as a valid one."""
    data = str(tmp_path / "rot")
    app = appliance_factory(data_dir=data)
    create(app, "rot")
    produce(app, "rot", 0, 2000)
    produce(app, "rot", 1, 50)
    assert app.terminate() == 0
    path, pos, bad_base = flip_value_byte(data, "rot", 0, 123)
    assert len(glob.glob(os.path.join(os.path.dirname(path), "*.log"))) > 2   # the first is sealed
    app.restart()

    intact = [value(i) for i in range(2000)]
    # The consumer gets every record before the damaged batch, then never one of it or after it:
    # it polls until its fetch at the damaged batch was refused twice (it retries, stuck there).
    refused = lambda: fetcher_count(app, "rot", 0, "appliance_log_fetch_corrupt_batches")  # noqa: E731
    got = consume(app, "rot", 0, lambda g: len(g) > bad_base or (len(g) == bad_base and refused() >= 2))
    assert all(v in intact for v in got), "a corrupt record was delivered"
    assert got == intact[:bad_base]

    with RawClient(app.bootstrap) as raw:
        parts = fetch(raw, "rot", [(0, bad_base), (1, 0)])
        assert parts[0].error_code == KAFKA_STORAGE_ERROR
        assert not parts[0].records
        assert parts[1].error_code == 0 and parts[1].records          # the other partition serves
        # A read that starts before the damaged batch is served up to it.
        before = fetch(raw, "rot", [(0, max(0, bad_base - 1))])[0]
        assert before.error_code == 0 and before.records
        served = [h.base_offset for _, h in iter_batch_headers(before.records)]
        assert served and max(served) < bad_base
    assert f"position {pos} of {path}" in app.log_text()


def test_the_scrub_finds_a_byte_changed_under_a_running_appliance_that_nobody_reads(
        appliance_factory, tmp_path):
    data = str(tmp_path / "scrub")
    app = appliance_factory(data_dir=data, log={"scrub": {"bytes_per_second": 64 << 20,
                                                          "pass_interval_ms": 200}})
    create(app, "cold", partitions=1)
    produce(app, "cold", 0, 1500)
    cleaners = [w["pid"] for w in app.workers("cleaner")]
    app.wait_for(lambda: scrub_passes(app) >= 1, what="a first scrub pass")
    assert scrub_found(app, "cold") == 0
    path, pos, base = flip_value_byte(data, "cold", 0, 77)     # the page cache has it at once
    app.wait_for(lambda: scrub_found(app, "cold") == 1, what="the scrub to find the damage")
    line = [ln for ln in app.log_text().splitlines() if "scrub:" in ln]
    assert len(line) == 1 and f"position {pos} of {path}" in line[0] and f"offset {base}" in line[0]
    passes = scrub_passes(app)
    app.wait_for(lambda: scrub_passes(app) >= passes + 2, what="two more passes")
    assert scrub_found(app, "cold") == 1                        # counted once, not every pass
    assert [w["pid"] for w in app.workers("cleaner")] == cleaners
    with RawClient(app.bootstrap) as raw:
        assert fetch(raw, "cold", [(0, base)])[0].error_code == KAFKA_STORAGE_ERROR


def scrub_found(app, topic: str) -> int:
    return fetcher_count(app, topic, 0, "appliance_log_scrub_corrupt_batches")


def scrub_passes(app) -> int:
    total = 0
    for path in glob.glob(os.path.join(app.run_dir, "metrics.cl*")):
        with MetricsTable.open(path, readonly=True) as t:
            total += t.get(key("appliance_log_scrub_passes", [("cleaner", 0)]), 0) or 0
    return total


def newest(pattern: str) -> str:
    files = sorted(glob.glob(pattern))
    assert files, pattern
    return files[-1]


def damage_file(path: str, how: str) -> None:
    with open(path, "r+b") as f:
        content = f.read()
        if how == "truncate":
            f.truncate(len(content) // 2 + 1)
        else:                                    # a bit of a byte in the middle
            f.seek(len(content) // 2)
            f.write(bytes([content[len(content) // 2] ^ 0x04]))


@pytest.mark.parametrize("suffix,how", [(".index", "flip"), (".index", "truncate"),
                                        (".timeindex", "flip"), (".timeindex", "truncate"),
                                        (".txnindex", "flip"), (".txnindex", "truncate"),
                                        (".snapshot", "flip"), (".snapshot", "truncate")])
def test_a_damaged_index_txnindex_or_producer_snapshot_is_rebuilt_from_the_log(
        appliance_factory, tmp_path, suffix, how):
    """Across a restart: every committed record read back read_committed, none of an aborted
    transaction, and the transactional producer goes on."""
    data = str(tmp_path / "idx")
    app = appliance_factory(data_dir=data)
    create(app, "tx", partitions=1)
    p = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "t-rot", "linger.ms": 5,
                  "batch.num.messages": 20})
    p.init_transactions(30)
    committed = []
    for t in range(24):
        p.begin_transaction()
        vals = [value(t * 50 + i) for i in range(50)]
        for v in vals:
            p.produce("tx", value=v, partition=0)
        if t % 5 == 1:
            assert p.flush(30) == 0           # on the broker before the abort, not purged
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed += vals
    assert app.terminate() == 0
    d = partition_dir(data, "tx", 0)
    assert len(glob.glob(os.path.join(d, "*.log"))) >= 2          # the first one is sealed
    first_sealed = sorted(glob.glob(os.path.join(d, "*.log")))[0][:-len(".log")]
    target = newest(os.path.join(d, "*.snapshot")) if suffix == ".snapshot" else first_sealed + suffix
    assert os.path.exists(target), target
    damage_file(target, how)
    app.restart()

    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "g-idx",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.assign([TopicPartition("tx", 0, 0)])
    got: list[bytes] = []
    try:
        import time
        deadline = time.monotonic() + 60
        while len(got) < len(committed):
            assert time.monotonic() < deadline, f"{len(got)} of {len(committed)}"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        # ListOffsets by timestamp still answers from the (rebuilt) time index.
        found = c.offsets_for_times([TopicPartition("tx", 0, 0)], 10)[0]
        assert found.error is None and found.offset == 0
    finally:
        c.close()
    assert got == committed
    p = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "t-rot"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("tx", value=b"after", partition=0)
    p.commit_transaction(30)
    assert "Traceback" not in app.log_text()


def test_dump_log_verify_reports_each_damaged_file_with_position_and_offset(appliance_factory,
                                                                             tmp_path):
    data = str(tmp_path / "verify")
    app = appliance_factory(data_dir=data)
    create(app, "v", partitions=1)
    produce(app, "v", 0, 1500)
    d = partition_dir(data, "v", 0)
    clean = subprocess.run([os.path.join(os.path.dirname(sys.executable), "appliance"), "dump-log",
                            "--verify", data], capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr        # beside a running appliance
    assert "no damage found" in clean.stdout
    assert app.terminate() == 0
    path, pos, base = flip_value_byte(data, "v", 0, 42)
    index = log_path(d, 0)[:-len(".log")] + ".index"
    with open(index, "r+b") as f:
        f.truncate(os.path.getsize(index) - 3)
    with open(os.path.join(data, "catalog.json"), "r+b") as f:
        c = f.read()
        at = c.index(b'"v"') + 1
        f.seek(at)
        f.write(b"w")
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "appliance"), "dump-log",
                        "--verify", data], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert f"{path}: position {pos}: offset {base}: the batch fails its CRC" in lines
    assert any(ln.startswith(index + ": ") for ln in lines)
    assert any(ln.startswith(os.path.join(data, "catalog.json") + ": ") for ln in lines)
    assert lines[-1].endswith(": 3 problems"), lines
