"""Every topic config of Kafka 4.3's TopicConfig, set through IncrementalAlterConfigs and read back
through DescribeConfigs by a real client (confluent-kafka's AdminClient): the value, its source
(DYNAMIC_TOPIC_CONFIG) and its synonyms, and a bad value refused with INVALID_CONFIG as Kafka's
LogConfig refuses it; tiered-storage names refused unless they ask for no tiered storage. Then
what the appliance honours per topic: broker-side recompression (a consumer reads the topic's
codec and the records), min.insync.replicas above 1, the timestamp bounds, the dynamic broker
names Kafka changes live. One appliance for the module."""

import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewTopic, ResourceType)

from appliance_harness import shared_appliance, watching  # noqa: F401 (fixture)
from raw_wire import stored_batches

TIMEOUT = 30

# name -> (a valid value other than the default, a value Kafka refuses). The tiered-storage names'
# "valid" value is the one that asks for no tiered storage; any other is refused.
CASES = {
    "segment.bytes": ("2000000", "13"),
    "segment.ms": ("3600000", "0"),
    "segment.jitter.ms": ("1000", "-1"),
    "segment.index.bytes": ("8192", "4095"),
    "flush.messages": ("1", "0"),
    "flush.ms": ("500", "-1"),
    "retention.bytes": ("123456789", "many"),
    "retention.ms": ("3600000", "-2"),
    "max.message.bytes": ("2000000", "-1"),
    "index.interval.bytes": ("8192", "-1"),
    "file.delete.delay.ms": ("0", "-1"),
    "delete.retention.ms": ("1000", "-1"),
    "min.compaction.lag.ms": ("5", "-1"),
    "max.compaction.lag.ms": ("86400000", "0"),
    "min.cleanable.dirty.ratio": ("0.25", "1.5"),
    "cleanup.policy": ("compact,delete", "shred"),
    "unclean.leader.election.enable": ("true", "maybe"),
    "min.insync.replicas": ("2", "0"),
    "compression.type": ("lz4", "brotli"),
    "compression.gzip.level": ("9", "0"),
    "compression.lz4.level": ("17", "18"),
    "compression.zstd.level": ("-5", "23"),
    "preallocate": ("true", "yes"),
    "message.timestamp.type": ("LogAppendTime", "WallClockTime"),
    "message.timestamp.before.max.ms": ("86400000", "-1"),
    "message.timestamp.after.max.ms": ("3600000", "-1"),
    "leader.replication.throttled.replicas": ("0:1,1:1", "0-1"),
    "follower.replication.throttled.replicas": ("*", "a:b"),
    "remote.storage.enable": ("false", "true"),
    "local.retention.ms": ("-2", "1000"),
    "local.retention.bytes": ("-2", "1000"),
    "remote.log.copy.disable": ("false", "true"),
    "remote.log.delete.on.disable": ("false", "true"),
}
TIERED = {"remote.storage.enable", "local.retention.ms", "local.retention.bytes",
          "remote.log.copy.disable", "remote.log.delete.on.disable"}
# Their broker synonym (the first one Kafka lists; None: no broker config).
SYNONYMS = {
    "segment.bytes": "log.segment.bytes", "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms", "segment.index.bytes": "log.index.size.max.bytes",
    "flush.messages": "log.flush.interval.messages", "flush.ms": "log.flush.interval.ms",
    "retention.bytes": "log.retention.bytes", "retention.ms": "log.retention.ms",
    "max.message.bytes": "message.max.bytes", "index.interval.bytes": "log.index.interval.bytes",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "cleanup.policy": "log.cleanup.policy",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "min.insync.replicas": "min.insync.replicas", "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level", "preallocate": "log.preallocate",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "leader.replication.throttled.replicas": None, "follower.replication.throttled.replicas": None,
    "remote.storage.enable": None, "local.retention.ms": "log.local.retention.ms",
    "local.retention.bytes": "log.local.retention.bytes", "remote.log.copy.disable": None,
    "remote.log.delete.on.disable": None,
}


@pytest.fixture(scope="module")
def admin(shared_appliance):
    a = AdminClient({"bootstrap.servers": shared_appliance.bootstrap})
    fs = a.create_topics([NewTopic("every-config", 2, 1)], request_timeout=TIMEOUT)
    fs["every-config"].result(TIMEOUT)
    return a


@pytest.fixture(autouse=True)
def _watch(request, shared_appliance):
    with watching(request, shared_appliance):
        yield


def _alter(admin, resource_type, name, ops):
    res = ConfigResource(resource_type, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])
    return admin.incremental_alter_configs([res], request_timeout=TIMEOUT)[res].result(TIMEOUT)


def _describe(admin, resource_type, name):
    res = ConfigResource(resource_type, name)
    return admin.describe_configs([res], request_timeout=TIMEOUT)[res].result(TIMEOUT)


def _kafka_error(fn):
    with pytest.raises(KafkaException) as ei:
        fn()
    return ei.value.args[0]


def test_every_kafka_topic_config_is_described(admin):
    got = _describe(admin, ResourceType.TOPIC, "every-config")
    assert set(CASES) <= set(got)
    for name, entry in got.items():
        assert entry.source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value, name


@pytest.mark.parametrize("name", sorted(CASES))
def test_topic_config_set_incrementally_and_described(admin, name):
    good, bad = CASES[name]
    topic = "every-config"
    try:
        _alter(admin, ResourceType.TOPIC, topic, [(name, good, AlterConfigOpType.SET)])
        entry = _describe(admin, ResourceType.TOPIC, topic)[name]
        assert entry.value == good
        assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        # confluent-kafka keys the synonyms by name: a broker config of the topic config's own
        # name (compression.type, min.insync.replicas ...) stands in its place
        syn = entry.synonyms
        broker = SYNONYMS[name]
        if broker != name:
            assert (syn[name].value, syn[name].source) == (good, ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        if broker is not None:
            assert broker in syn, list(syn)
        err = _kafka_error(lambda: _alter(admin, ResourceType.TOPIC, topic,
                                          [(name, bad, AlterConfigOpType.SET)]))
        assert err.name() == "INVALID_CONFIG", err
        assert name in err.str()
        if name in TIERED:
            assert "does not offer tiered storage" in err.str()
        # the refused value changed nothing
        assert _describe(admin, ResourceType.TOPIC, topic)[name].value == good
    finally:
        _alter(admin, ResourceType.TOPIC, topic, [(name, None, AlterConfigOpType.DELETE)])
    entry = _describe(admin, ResourceType.TOPIC, topic)[name]
    assert entry.source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_kafka_dynamic_broker_names_are_stored_the_rest_refused(admin, shared_appliance):
    broker = "1"        # the harness's node id
    try:
        _alter(admin, ResourceType.BROKER, broker,
               [("sasl.kerberos.min.time.before.relogin", "60000", AlterConfigOpType.SET),
                ("log.flush.interval.messages", "1000", AlterConfigOpType.SET)])
        got = _describe(admin, ResourceType.BROKER, broker)
        e = got["sasl.kerberos.min.time.before.relogin"]
        assert (e.value, e.source) == ("60000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        # a broker default reaches the topics that do not set it
        e = _describe(admin, ResourceType.TOPIC, "every-config")["flush.messages"]
        assert (e.value, e.source) == ("1000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        err = _kafka_error(lambda: _alter(admin, ResourceType.BROKER, broker,
                                          [("log.dirs", "/elsewhere", AlterConfigOpType.SET)]))
        assert err.name() == "INVALID_REQUEST"
        assert "Cannot update these configs dynamically" in err.str()
        err = _kafka_error(lambda: _alter(admin, ResourceType.BROKER, broker, [
            ("sasl.kerberos.min.time.before.relogin", "soon", AlterConfigOpType.SET)]))
        assert err.name() == "INVALID_REQUEST"
    finally:
        _alter(admin, ResourceType.BROKER, broker,
               [("sasl.kerberos.min.time.before.relogin", None, AlterConfigOpType.DELETE),
                ("log.flush.interval.messages", None, AlterConfigOpType.DELETE)])


def _create(admin, configs, partitions=1):
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)],
                        request_timeout=TIMEOUT)[name].result(TIMEOUT)
    return name


def _consume(bootstrap, topic, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        while len(out) < n:
            m = c.poll(TIMEOUT)
            assert m is not None, f"only {len(out)} of {n} records"
            assert m.error() is None, m.error()
            out.append(m)
        return out
    finally:
        c.close()


CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _stored_codecs(bootstrap, topic):
    """The codec of every batch of partition 0, as the broker holds it (raw Fetch v12)."""
    return {h.compression for h in stored_batches(bootstrap, topic, 0)}


@pytest.mark.parametrize("topic_codec,producer_codec", [
    ("lz4", "none"), ("zstd", "gzip"), ("gzip", "lz4"), ("snappy", "zstd"), ("uncompressed", "snappy"),
    ("producer", "lz4")])
def test_broker_side_recompression_a_consumer_reads(admin, shared_appliance, topic_codec, producer_codec):
    b = shared_appliance.bootstrap
    topic = _create(admin, {"compression.type": topic_codec})
    p = Producer({"bootstrap.servers": b, "compression.type": producer_codec, "linger.ms": 50,
                  "enable.idempotence": True})
    sent = [(f"k{i}".encode(), (f"value {i} " * 20).encode()) for i in range(200)]
    for k, v in sent:
        p.produce(topic, v, k, partition=0)
    assert p.flush(TIMEOUT) == 0
    got = _consume(b, topic, len(sent))
    assert [(m.key(), m.value()) for m in got] == sent
    assert [m.offset() for m in got] == list(range(len(sent)))
    want = CODECS[topic_codec] if topic_codec in CODECS else CODECS["lz4"]     # producer: as sent
    assert _stored_codecs(b, topic) == {want}


def test_min_insync_replicas_above_one_refuses_acks_all(admin, shared_appliance):
    topic = _create(admin, {"min.insync.replicas": "2"})
    errors = []
    p = Producer({"bootstrap.servers": shared_appliance.bootstrap, "acks": "all",
                  "message.timeout.ms": 3000, "retries": 0})
    p.produce(topic, b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(TIMEOUT)
    assert errors and errors[0] is not None and errors[0].name() == "NOT_ENOUGH_REPLICAS", errors
    p1 = Producer({"bootstrap.servers": shared_appliance.bootstrap, "acks": "1"})
    p1.produce(topic, b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
    assert p1.flush(TIMEOUT) == 0 and errors[-1] is None


def test_topic_timestamp_bounds_refuse_old_records(admin, shared_appliance):
    topic = _create(admin, {"message.timestamp.before.max.ms": "3600000"})
    errors = []
    p = Producer({"bootstrap.servers": shared_appliance.bootstrap, "message.timeout.ms": 5000})
    p.produce(topic, b"old", partition=0, timestamp=1_000_000,
              on_delivery=lambda err, msg: errors.append(err))
    p.flush(TIMEOUT)         # its own batch: a refused record refuses its whole batch
    p.produce(topic, b"new", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(TIMEOUT)
    assert errors[0] is not None and errors[0].name() == "INVALID_TIMESTAMP", errors
    assert errors[1] is None


def test_flush_messages_one_syncs_that_topic_only_and_a_killed_writer_loses_nothing(appliance_factory):
    """[log.flush] is "os" (no fsync); the topic "synced" asks for one per batch
    (flush.messages=1): its acks=all answers wait for an fdatasync, the other topic's never
    cause one. Then kill -9 of its writer right after an acknowledged produce loses nothing."""
    import os
    import signal

    from appliance_harness import free_port
    from test_operating import scrape, total

    port = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"})
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    for f in admin.create_topics([NewTopic("plain", 1, 1), NewTopic("synced", 1, 1, config={
            "flush.messages": "1"})], request_timeout=TIMEOUT).values():
        f.result(TIMEOUT)
    flushes = "kafka_log_logflushstats_logflushrateandtimems_count"
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(5):
        p.produce("plain", b"p%d" % i, partition=0)
        assert p.flush(TIMEOUT) == 0
    assert total(scrape(port), flushes) == 0
    for i in range(5):
        p.produce("synced", b"s%d" % i, partition=0)
        assert p.flush(TIMEOUT) == 0
    assert total(scrape(port), flushes) >= 5         # one fdatasync before each answer
    w = app.writer("synced", 0)
    os.kill(w["pid"], signal.SIGKILL)
    app.wait_for(lambda: app.writer("synced", 0)["pid"] != w["pid"] and
                 app.partition_state("synced", 0).high_watermark == 5, what="the writer restarted")
    got = _consume(app.bootstrap, "synced", 5)
    assert [m.value() for m in got] == [b"s%d" % i for i in range(5)]


def test_group_configs_set_and_described_before_the_group_exists(admin):
    """KIP-848 GROUP config resources, as a 4.x broker answers them (librdkafka's 0081)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    _alter(admin, ResourceType.GROUP, group,
           [("consumer.session.timeout.ms", "50000", AlterConfigOpType.SET)])
    got = _describe(admin, ResourceType.GROUP, group)
    e = got["consumer.session.timeout.ms"]
    assert (e.value, e.source) == ("50000", ConfigSource.GROUP_CONFIG.value)
    assert got["consumer.heartbeat.interval.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    err = _kafka_error(lambda: _alter(admin, ResourceType.GROUP, group, [
        ("consumer.session.timeout.ms", "1000", AlterConfigOpType.SET)]))
    assert err.name() == "INVALID_CONFIG"
    _alter(admin, ResourceType.GROUP, group, [("consumer.session.timeout.ms", None, AlterConfigOpType.DELETE)])
    assert _describe(admin, ResourceType.GROUP, group)["consumer.session.timeout.ms"].value == "45000"


def _raw_fetch(bootstrap, topic, version):
    from raw_wire import RawClient
    part = {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
            "partition_max_bytes": 1 << 20}
    with RawClient(bootstrap) as raw:
        r = raw.request(1, version, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [part]}], "forgotten_topics_data": []})
    return r.responses[0].partitions[0]


def test_fetch_below_v10_of_a_zstd_topic_answers_unsupported_compression_type(admin, shared_appliance):
    """KIP-110: a Fetch older than v10 cannot carry zstd batches; Kafka answers a partition of a
    topic whose compression.type is zstd with UNSUPPORTED_COMPRESSION_TYPE (76) and no records,
    and serves v10 and later. A "producer" topic is served at v9 whatever its batches hold (Kafka
    looks at the topic's config, not at the batches)."""
    b = shared_appliance.bootstrap
    zstd_topic = _create(admin, {"compression.type": "zstd"})
    plain_topic = _create(admin, {})
    p = Producer({"bootstrap.servers": b, "compression.type": "zstd"})
    for t in (zstd_topic, plain_topic):
        p.produce(t, b"v" * 100, partition=0)
    assert p.flush(TIMEOUT) == 0
    old = _raw_fetch(b, zstd_topic, 9)
    assert old.error_code == 76 and not old.records, old
    new = _raw_fetch(b, zstd_topic, 10)
    assert new.error_code == 0 and new.records and new.high_watermark == 1, new
    served = _raw_fetch(b, plain_topic, 9)
    assert served.error_code == 0 and served.records, served
