"""Compacted topics against the real appliance, through confluent-kafka (librdkafka) and
kafka-python: topic configs, keyless produce refused, and (below) the log cleaner.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

TIMEOUT_S = 60.0


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, 1, config=dict(configs))])
    fs[name].result(TIMEOUT_S)


def test_compacted_topic_configs_are_accepted_and_described(appliance):
    t = uid("cfg")
    create_topic(appliance.bootstrap, t, **{"cleanup.policy": "compact,delete",
                                            "min.cleanable.dirty.ratio": "0.1",
                                            "delete.retention.ms": "1000"})
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    res = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t)])
    entries = list(res.values())[0].result(TIMEOUT_S)
    assert entries["cleanup.policy"].value == "compact,delete"
    assert entries["min.cleanable.dirty.ratio"].value == "0.1"
    assert entries["delete.retention.ms"].value == "1000"
    assert entries["min.compaction.lag.ms"].value == "0" and entries["min.compaction.lag.ms"].is_default
    assert entries["max.compaction.lag.ms"].value == str(2**63 - 1)
    # A policy Kafka does not know is refused with INVALID_CONFIG.
    fs = admin.create_topics([NewTopic(uid("bad"), 1, 1, config={"cleanup.policy": "shred"})])
    with pytest.raises(KafkaException) as e:
        list(fs.values())[0].result(TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_delete_records_on_a_compact_only_topic_is_a_policy_violation(appliance):
    """Kafka's Partition.deleteRecordsOnLeader: DeleteRecords needs a policy that deletes;
    "compact" alone answers POLICY_VIOLATION and keeps every record, "compact,delete" deletes."""
    TP = TopicPartition
    only, both = uid("compact-only"), uid("compact-delete")
    create_topic(appliance.bootstrap, only, **{"cleanup.policy": "compact"})
    create_topic(appliance.bootstrap, both, **{"cleanup.policy": "compact,delete"})
    p = Producer({"bootstrap.servers": appliance.bootstrap})
    for t in (only, both):
        for i in range(10):
            p.produce(t, key=b"k%d" % i, value=b"v", partition=0)
    assert p.flush(TIMEOUT_S) == 0
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    refused = admin.delete_records([TP(only, 0, 5)], request_timeout=TIMEOUT_S)
    with pytest.raises(KafkaException) as e:
        list(refused.values())[0].result(TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION
    done = list(admin.delete_records([TP(both, 0, 5)], request_timeout=TIMEOUT_S).values())[0]
    assert done.result(TIMEOUT_S).low_watermark == 5
    c = Consumer({"bootstrap.servers": appliance.bootstrap, "group.id": uid("g")})
    try:
        assert c.get_watermark_offsets(TP(only, 0), TIMEOUT_S) == (0, 10)
        assert c.get_watermark_offsets(TP(both, 0), TIMEOUT_S) == (5, 10)
    finally:
        c.close()


def test_keyless_produce_to_a_compacted_topic_is_invalid_record_librdkafka(appliance):
    """librdkafka's test 0011 (record failures): a batch with keyless records on a compacted
    topic fails as a whole; the record errors (Produce v8+) name the keyless records, which get
    INVALID_RECORD, and librdkafka fails the others of the batch with INVALID_DIFFERENT_RECORD."""
    t = uid("nokey")
    create_topic(appliance.bootstrap, t, **{"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": appliance.bootstrap, "linger.ms": 50,
                  "enable.idempotence": False, "retries": 0})
    reports = {}
    for i in range(10):
        p.produce(t, value=b"v%d" % i, key=(b"k%d" % i if i % 2 else None), partition=0,
                  on_delivery=lambda err, msg: reports.__setitem__(msg.value(), err))
    assert p.flush(TIMEOUT_S) == 0
    assert len(reports) == 10
    for i in range(10):
        err = reports[b"v%d" % i]
        assert err is not None and err.code() == (
            KafkaError._INVALID_DIFFERENT_RECORD if i % 2 else KafkaError.INVALID_RECORD), (i, err)
    # Keyed records alone go through.
    ok = []
    p.produce(t, key=b"k", value=b"v", partition=0, on_delivery=lambda err, msg: ok.append(err))
    assert p.flush(TIMEOUT_S) == 0 and ok == [None]


def test_keyless_produce_to_a_compacted_topic_is_invalid_record_kafka_python(appliance):
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError
    t = uid("nokey-kp")
    create_topic(appliance.bootstrap, t, **{"cleanup.policy": "compact,delete"})
    p = KafkaProducer(bootstrap_servers=appliance.bootstrap, retries=0)
    try:
        with pytest.raises(InvalidRecordError) as e:
            p.send(t, value=b"v", partition=0).get(TIMEOUT_S)
        assert "Compacted topic cannot accept message without key" in str(e.value) or \
            e.value.errno == 87
        assert p.send(t, key=b"k", value=b"v", partition=0).get(TIMEOUT_S).offset == 0
    finally:
        p.close()


# -- the log cleaner --------------------------------------------------------------------------------

import os  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from appliance.durable import read_checkpoint  # noqa: E402
from appliance.log.files import CLEANED_SUFFIX, CLEANER_CHECKPOINT_FILE  # noqa: E402

CLEANER_CONFIG = {"log": {"cleaner": {"backoff_ms": 100}}}
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0",
             "delete.retention.ms": "3600000"}


@dataclass(frozen=True)
class Sent:
    offset: int
    key: bytes
    value: bytes | None
    aborted: bool = False


def pdir(a, topic: str, partition: int = 0) -> str:
    return os.path.join(a.data_dir, f"{topic}-{partition}")


def cleaned(a, topic: str, partition: int = 0):
    """The partition's state page once the cleaner has caught up: no open transaction, the
    cleaner checkpoint at the active segment, no copy in flight (else None)."""
    st = a.partition_state(topic, partition)
    d = pdir(a, topic, partition)
    cp = read_checkpoint(os.path.join(d, CLEANER_CHECKPOINT_FILE))
    if st.last_stable_offset != st.high_watermark or cp != st.active_base_offset:
        return None
    if any(n.endswith(CLEANED_SUFFIX) for n in os.listdir(d)):
        return None
    return st


def expected(sent: list[Sent], active_base: int, committed: bool) -> list[tuple]:
    """What Kafka's cleaner leaves for a consumer: below the active segment, the latest record
    of each key that no aborted transaction wrote; in the active segment, everything (aborted
    records only for read_uncommitted)."""
    latest = {}
    for s in sorted(sent, key=lambda s: s.offset):
        if s.offset < active_base and not s.aborted:
            latest[s.key] = s
    tail = [s for s in sent if s.offset >= active_base and not (committed and s.aborted)]
    return [(s.offset, s.key, s.value) for s in sorted([*latest.values(), *tail], key=lambda s: s.offset)]


def consume_confluent(bootstrap: str, topic: str, level: str) -> list[tuple]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uid("g"), "enable.auto.commit": False,
                  "isolation.level": level, "fetch.wait.max.ms": 50})
    try:
        tp = TopicPartition(topic, 0, 0)
        c.assign([tp])
        _, end = c.get_watermark_offsets(tp, timeout=TIMEOUT_S)
        out = []
        deadline = time.monotonic() + TIMEOUT_S
        while (c.position([tp])[0].offset if out else 0) < end:
            assert time.monotonic() < deadline, (out[-3:], end)
            for m in c.consume(500, 0.2):
                assert not m.error(), m.error()
                out.append((m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def consume_kafka_python(bootstrap: str, topic: str, level: str) -> list[tuple]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=level, enable_auto_commit=False,
                      fetch_max_wait_ms=50)
    try:
        tp = KTP(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        out = []
        deadline = time.monotonic() + TIMEOUT_S
        while c.position(tp) < end:
            assert time.monotonic() < deadline, (out[-3:], end, c.position(tp))
            for recs in c.poll(200).values():
                out += [(r.offset, r.key, r.value) for r in recs]
        return out
    finally:
        c.close()


def produce_mixed(bootstrap: str, topic: str, rounds: int) -> list[Sent]:
    """Keys overwritten over many segments: plain records, tombstones, and a transactional
    producer's records, committed or aborted, interleaved."""
    sent: list[Sent] = []
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True})
    txp = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "transactional.id": uid("tx")})
    txp.init_transactions(TIMEOUT_S)

    def report(aborted):
        def cb(err, msg):
            assert err is None, err
            sent.append(Sent(msg.offset(), msg.key(), msg.value(), aborted))
        return cb
    for r in range(rounds):
        for k in range(8):
            tomb = (r + k) % 7 == 3
            plain.produce(topic, key=b"k%d" % k, value=None if tomb else b"p%d-%d" % (r, k),
                          partition=0, on_delivery=report(False))
        assert plain.flush(TIMEOUT_S) == 0
        abort = r % 3 == 1
        txp.begin_transaction()
        for k in range(3, 7):
            txp.produce(topic, key=b"k%d" % k, value=b"t%d-%d" % (r, k), partition=0,
                        on_delivery=report(abort))
        assert txp.flush(TIMEOUT_S) == 0
        if abort:
            txp.abort_transaction(TIMEOUT_S)
        else:
            txp.commit_transaction(TIMEOUT_S)
    return sent


def test_cleaned_log_reads_as_kafkas_with_both_clients(appliance_factory):
    a = appliance_factory(**CLEANER_CONFIG)
    t = uid("cmp")
    create_topic(a.bootstrap, t, **COMPACTED)
    sent = produce_mixed(a.bootstrap, t, 24)
    st = a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="the cleaner to catch up")
    assert len(os.listdir(pdir(a, t))) > 4 and st.active_base_offset > 100
    for level, committed in (("read_committed", True), ("read_uncommitted", False)):
        want = expected(sent, st.active_base_offset, committed)
        assert len(want) < len(sent) / 2
        assert consume_confluent(a.bootstrap, t, level) == want, level
        assert consume_kafka_python(a.bootstrap, t, level) == want, level
    # The cleaner's work is in its metrics.
    from appliance.metrics.collector import render
    text = render(a.run_dir).decode()
    assert 'appliance_log_cleaner_rounds_total{cleaner="0"}' in text
    rounds = [l for l in text.splitlines() if l.startswith("appliance_log_cleaner_rounds_total")]
    assert float(rounds[0].split()[-1]) >= 1
    # kafka-python's consumer positioned inside a removed range moves on to the next record.
    removed = [s.offset for s in sent if s.offset < st.active_base_offset and
               (s.offset, s.key, s.value) not in expected(sent, st.active_base_offset, False)]
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    c = KafkaConsumer(bootstrap_servers=a.bootstrap, enable_auto_commit=False)
    try:
        c.assign([KTP(t, 0)])
        c.seek(KTP(t, 0), removed[len(removed) // 2])
        recs = []
        deadline = time.monotonic() + TIMEOUT_S
        while not recs:
            assert time.monotonic() < deadline
            recs = [r for rs in c.poll(200).values() for r in rs]
        nxt = [o for o, _, _ in expected(sent, st.active_base_offset, False)
               if o > removed[len(removed) // 2]][0]
        assert recs[0].offset == nxt
    finally:
        c.close()


def stored_headers(bootstrap: str, topic: str):
    """Every batch header the partition holds (Fetch v12 read_uncommitted, raw)."""
    from raw_wire import stored_batches
    return stored_batches(bootstrap, topic, 0)


def test_tombstones_and_markers_go_after_delete_retention_once_producers_expired(appliance_factory):
    a = appliance_factory(log={"retention_check_interval_ms": 200, "cleaner": {"backoff_ms": 100}},
                          transactions={"producer_id_expiration_ms": 1500})
    t = uid("horizon")
    create_topic(a.bootstrap, t, **{**COMPACTED, "delete.retention.ms": "1000"})
    sent = produce_mixed(a.bootstrap, t, 9)
    tombstoned = {s.key for s in sent if s.value is None}
    assert tombstoned
    filler = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 0})
    # The transactions' records are all overwritten: no data of any transaction is left, so
    # that every marker may go (a marker stays while data of its transaction does).
    for k in range(3, 7):
        filler.produce(t, key=b"k%d" % k, value=b"last", partition=0)
    filler.flush(TIMEOUT_S)
    n = [0]

    def settled():
        # New records keep segments rolling, so that rounds keep coming (Kafka cleans only
        # when something is dirty) until the horizons have passed.
        n[0] += 1
        filler.produce(t, key=b"filler", value=b"f%d" % n[0], partition=0)
        filler.flush(TIMEOUT_S)
        st = cleaned(a, t)
        if st is None:
            return None
        below = [h for h in stored_headers(a.bootstrap, t) if h.last_offset < st.active_base_offset]
        if any(h.is_control or h.is_transactional for h in below):
            return None
        got = consume_confluent(a.bootstrap, t, "read_uncommitted")
        if any(v is None and o < st.active_base_offset for o, _, v in got):
            return None
        return got
    got = a.wait_for(settled, timeout=TIMEOUT_S, what="markers and tombstones to go")
    table = {}
    for _, k, v in got:
        table[k] = v
    assert {k: v for k, v in table.items() if v is not None and k != b"filler"} == {
        **{b"k%d" % k: b"last" for k in range(3, 7)},
        **{k: v for k, v in {s.key: s.value for s in sorted(sent, key=lambda s: s.offset)
                             if not s.aborted and s.key not in (b"k3", b"k4", b"k5", b"k6")}.items()
           if v is not None}}
    assert consume_kafka_python(a.bootstrap, t, "read_uncommitted") == got


@pytest.mark.parametrize("step", ["checked", "committed", "renamed", "retired", "done"])
def test_writer_killed_during_a_swap_recovers_the_old_or_the_new_log(appliance_factory, tmp_path,
                                                                     step):
    once = tmp_path / "crashed"
    a = appliance_factory(env={"TESTHOOK_CRASH": f"writer:{step}:{once}"}, **CLEANER_CONFIG)
    t = uid("kill")
    create_topic(a.bootstrap, t, **COMPACTED)
    sent = produce_mixed(a.bootstrap, t, 12)

    def cleaned_by_the_restarted_writer():
        # At the last step the swap is complete before the writer dies: the log looks cleaned
        # while the dying writer's page still shows its first generation (regression: the test
        # read the page in that window).
        st = cleaned(a, t)
        return st if st is not None and st.generation > 1 else None
    st = a.wait_for(cleaned_by_the_restarted_writer, timeout=TIMEOUT_S,
                    what="cleaning after the crash, by the restarted writer")
    assert once.exists()                          # the writer did die at that step
    for level, committed in (("read_committed", True), ("read_uncommitted", False)):
        assert consume_confluent(a.bootstrap, t, level) == \
            expected(sent, st.active_base_offset, committed), level
    names = os.listdir(pdir(a, t))
    assert "cleaner-swap" not in names and not [n for n in names if n.endswith(CLEANED_SUFFIX)]


def test_cleaner_killed_after_writing_a_copy_is_restarted_and_cleans(appliance_factory, tmp_path):
    once = tmp_path / "crashed"
    a = appliance_factory(env={"TESTHOOK_CRASH": f"cleaner:written:{once}"}, **CLEANER_CONFIG)
    t = uid("killcl")
    create_topic(a.bootstrap, t, **COMPACTED)
    sent = produce_mixed(a.bootstrap, t, 12)
    st = a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="cleaning after the crash")
    assert once.exists()
    assert [w for w in a.workers("cleaner")][0]["generation"] > 1
    assert consume_confluent(a.bootstrap, t, "read_committed") == \
        expected(sent, st.active_base_offset, True)


def test_cleaner_killed_by_sigkill_while_cleaning(appliance_factory):
    import signal
    a = appliance_factory(**CLEANER_CONFIG)
    t = uid("sigkill")
    create_topic(a.bootstrap, t, **COMPACTED)
    sent = produce_mixed(a.bootstrap, t, 6)
    (w,) = a.workers("cleaner")
    os.kill(w["pid"], signal.SIGKILL)
    sent += produce_mixed(a.bootstrap, t, 6)
    st = a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="cleaning after the kill")
    assert [x for x in a.workers("cleaner")][0]["generation"] > w["generation"]
    assert consume_confluent(a.bootstrap, t, "read_committed") == \
        expected(sent, st.active_base_offset, True)


def _init_pid(raw) -> tuple[int, int]:
    r = raw.request(22, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                            "producer_id": -1, "producer_epoch": -1})
    assert r.error_code == 0, r
    return r.producer_id, r.producer_epoch


def _produce(raw, topic: str, batch: bytes):
    r = raw.request(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                           "topic_data": [{"name": topic, "partition_data": [
                               {"index": 0, "records": batch}]}]})
    p = r.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def test_idempotent_retry_after_its_batch_was_compacted_away_is_a_duplicate(appliance_factory):
    from appliance.protocol.records import Record, build_batch
    from raw_wire import RawClient
    a = appliance_factory(**CLEANER_CONFIG)
    t = uid("dup")
    create_topic(a.bootstrap, t, **COMPACTED)
    with RawClient(a.bootstrap) as raw:
        pid, epoch = _init_pid(raw)
        batch = build_batch([Record(b"dup", b"first")], producer_id=pid, producer_epoch=epoch,
                            base_sequence=0)
        code, first = _produce(raw, t, batch)
        assert code == 0
    # Another producer overwrites the key and fills segments: the batch's only record goes.
    other = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 0})
    for i in range(60):
        other.produce(t, key=b"dup" if i < 3 else b"x%d" % (i % 5), value=b"o%d" % i, partition=0)
        other.flush(TIMEOUT_S)
    a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="cleaning")
    kept = [h for h in stored_headers(a.bootstrap, t) if h.producer_id == pid]
    assert [(h.base_offset, h.records_count, h.base_sequence) for h in kept] == [(first, 0, 0)]
    with RawClient(a.bootstrap) as raw:
        assert _produce(raw, t, batch) == (0, first)          # recognised: the original offset
    # The same after a crash that lost the producer snapshots: the state comes back from the
    # empty batch the cleaner kept.
    a.kill9_all()
    for n in os.listdir(pdir(a, t)):
        if n.endswith(".snapshot"):
            os.unlink(os.path.join(pdir(a, t), n))
    a.restart()
    with RawClient(a.bootstrap) as raw:
        assert _produce(raw, t, batch) == (0, first)
        nxt = build_batch([Record(b"dup", b"second")], producer_id=pid, producer_epoch=epoch,
                          base_sequence=1)
        code, off = _produce(raw, t, nxt)
        assert code == 0 and off > first
    assert [(o, v) for o, k, v in consume_confluent(a.bootstrap, t, "read_uncommitted")
            if k == b"dup"][-1] == (off, b"second")


def test_consumers_keep_reading_correct_records_across_swaps(appliance_factory):
    """Fetchers and frontends hold maps of segment files that swaps replace: every pass of a
    consumer reading the partition from the start while the cleaner swaps returns records in
    increasing offsets, each one the record produced at that offset."""
    import threading
    a = appliance_factory(**CLEANER_CONFIG)
    t = uid("live")
    create_topic(a.bootstrap, t, **COMPACTED)
    produced: dict[int, tuple] = {}
    stop = threading.Event()
    errors: list = []

    def produce():
        p = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 2})
        i = 0

        def cb(err, msg):
            if err is not None:
                errors.append(err)
            else:
                produced[msg.offset()] = (msg.key(), msg.value())
        while not stop.is_set():
            for _ in range(20):
                p.produce(t, key=b"k%d" % (i % 13), value=b"v%d" % i, partition=0, on_delivery=cb)
                i += 1
            p.flush(TIMEOUT_S)
    th = threading.Thread(target=produce)
    th.start()
    passes = 0
    rounds_at_start = None
    try:
        c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": uid("g"), "enable.auto.commit": False,
                      "fetch.wait.max.ms": 10, "max.partition.fetch.bytes": 2048})
        deadline = time.monotonic() + TIMEOUT_S
        while passes < 6 or cleaner_rounds(a) - rounds_at_start < 3:
            assert time.monotonic() < deadline, (passes, cleaner_rounds(a))
            if rounds_at_start is None:
                rounds_at_start = cleaner_rounds(a)
            tp = TopicPartition(t, 0, 0)
            c.assign([tp])
            end = max(produced, default=-1) + 1       # offsets whose delivery report is in
            last = -1
            while last < end - 1:
                msgs = c.consume(200, 0.5)
                for m in msgs:
                    assert not m.error(), m.error()
                    assert m.offset() > last
                    last = m.offset()
                    if m.offset() < end:
                        assert produced[m.offset()] == (m.key(), m.value()), m.offset()
                if not msgs and c.position([tp])[0].offset >= end:
                    break
            passes += 1
        c.close()
    finally:
        stop.set()
        th.join()
    assert not errors


def cleaner_rounds(a) -> int:
    from appliance.metrics.collector import render
    for line in render(a.run_dir).decode().splitlines():
        if line.startswith("appliance_log_cleaner_rounds_total"):
            return int(float(line.split()[-1]))
    return 0


def test_reload_turns_the_cleaner_on(appliance_factory):
    a = appliance_factory(log={"cleaner": {"enable": False, "backoff_ms": 100}})
    t = uid("reload")
    create_topic(a.bootstrap, t, **COMPACTED)
    sent = produce_mixed(a.bootstrap, t, 6)
    assert read_checkpoint(os.path.join(pdir(a, t), CLEANER_CHECKPOINT_FILE)) is None
    a.reload(log={"cleaner": {"enable": True, "backoff_ms": 100}})
    st = a.wait_for(lambda: cleaned(a, t), timeout=TIMEOUT_S, what="cleaning after the reload")
    assert consume_confluent(a.bootstrap, t, "read_committed") == \
        expected(sent, st.active_base_offset, True)
    assert "reload: log.cleaner.enable: False -> True" in a.log_text()
