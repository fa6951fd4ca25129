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
