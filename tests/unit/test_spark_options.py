"""The Spark data source's option parsing and micro-batch sizing (no JVM: pyspark is imported,
Spark is not started)."""

import pytest

from appliance.client.config import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS
from appliance.client.security import Security
from appliance.spark.options import (EARLIEST, LATEST, OptionError, TopicSelector, client_config,
                                     from_json_offsets, offsets_spec, to_json_offsets)
from appliance.spark.reader import _rate_limit, source_schema
from appliance.spark.writer import _query_key, PreparedTask, check_schema
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)


def test_kafka_options_become_client_config_with_types_and_unknown_keys_ignored():
    cfg = client_config({"kafka.bootstrap.servers": "h:1", "kafka.linger.ms": "20",
                         "kafka.compression.type": "zstd", "kafka.max.poll.records": "5",
                         "subscribe": "t"}, "producer")
    assert cfg == {"bootstrap_servers": "h:1", "linger_ms": 20, "compression_type": "zstd"}
    assert client_config({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "kafka.isolation.level": "read_uncommitted"},
                         "consumer") == {"bootstrap_servers": "h:1", "isolation_level": "read_uncommitted"}


def test_bootstrap_is_required_and_the_sink_owns_the_transactional_id():
    with pytest.raises(OptionError, match="kafka.bootstrap.servers"):
        client_config({"subscribe": "t"}, "consumer")
    with pytest.raises(OptionError, match="transactionalIdPrefix"):
        client_config({"kafka.bootstrap.servers": "h:1", "kafka.transactional.id": "x"}, "producer")


def test_exactly_one_way_to_choose_topics():
    assert TopicSelector({"subscribe": "a, b"}).topics == ["a", "b"]
    assert TopicSelector({"assign": '{"a": [1, 0]}'}).assigned == [("a", 0), ("a", 1)]
    assert TopicSelector({"subscribePattern": "ev.*"}).pattern.pattern == "ev.*"
    with pytest.raises(OptionError, match="exactly one"):
        TopicSelector({})
    with pytest.raises(OptionError, match="exactly one"):
        TopicSelector({"subscribe": "a", "assign": '{"a": [0]}'})
    with pytest.raises(OptionError, match="assign"):
        TopicSelector({"assign": "[0, 1]"})


def test_offsets_specs_as_spark_writes_them():
    assert offsets_spec({}, "startingOffsets", "earliest") == EARLIEST
    assert offsets_spec({"startingoffsets": "LATEST"}, "startingOffsets", "earliest") == LATEST
    spec = offsets_spec({"startingOffsets": '{"t": {"0": 23, "1": -2}}'}, "startingOffsets", "latest")
    assert spec == {("t", 0): 23, ("t", 1): -2}
    with pytest.raises(OptionError, match="startingOffsets"):
        offsets_spec({"startingOffsets": "yesterday"}, "startingOffsets", "latest")
    doc = to_json_offsets({("t", 1): 5, ("t", 0): 7, ("u", 0): 1})
    assert doc == {"t": {"0": 7, "1": 5}, "u": {"0": 1}}
    assert from_json_offsets(doc) == {("t", 1): 5, ("t", 0): 7, ("u", 0): 1}


def test_max_offsets_per_trigger_is_shared_in_proportion_to_backlog():
    begin = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    end = {("t", 0): 900, ("t", 1): 200, ("t", 2): 50}
    assert _rate_limit(begin, end, 2000) == end                  # all of it fits
    got = _rate_limit(begin, end, 100)
    assert got == {("t", 0): 90, ("t", 1): 110, ("t", 2): 50}
    # A share below one offset still moves its partition.
    got = _rate_limit({("a", 0): 0, ("b", 0): 0}, {("a", 0): 10_000, ("b", 0): 1}, 10)
    assert got == {("a", 0): 9, ("b", 0): 1}


def test_reader_schema_is_spark_kafka_sources():
    assert source_schema(False) == StructType([
        StructField("key", BinaryType()), StructField("value", BinaryType()),
        StructField("topic", StringType()), StructField("partition", IntegerType()),
        StructField("offset", LongType()), StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType())])
    assert source_schema(True).fieldNames()[-1] == "headers"


def test_writer_schema_checks_are_spark_kafka_sinks():
    value = StructField("value", StringType())
    check_schema(StructType([value]), "t")
    check_schema(StructType([value, StructField("topic", StringType())]), None)
    with pytest.raises(OptionError, match="'value' not found"):
        check_schema(StructType([StructField("key", StringType())]), "t")
    with pytest.raises(OptionError, match="topic option required"):
        check_schema(StructType([value]), None)
    with pytest.raises(OptionError, match="value attribute type"):
        check_schema(StructType([StructField("value", LongType())]), "t")
    with pytest.raises(OptionError, match="partition attribute type"):
        check_schema(StructType([value, StructField("partition", LongType())]), "t")
    with pytest.raises(OptionError, match="headers attribute type"):
        check_schema(StructType([value, StructField("headers", ArrayType(StringType()))]), "t")


def test_query_key_is_read_back_from_transactional_ids():
    msgs = [None, PreparedTask("spark-0f-3a-9", 1, ":", 0)]
    assert _query_key("spark", msgs) == "0f-3a"
    assert _query_key("spark", [None]) is None


def test_security_options_pass_through_as_spark_kafka_connector_takes_them():
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="alice" password="s3c\\"ret";')
    opts = {"kafka.bootstrap.servers": "h:9093", "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": jaas,
            "kafka.ssl.truststore.location": "/etc/ca.pem", "kafka.ssl.truststore.type": "PEM"}
    cfg = client_config(opts, "consumer")
    assert cfg["security_protocol"] == "SASL_SSL" and cfg["ssl_cafile"] == "/etc/ca.pem"
    sec = Security.from_config({**CONSUMER_DEFAULTS, **cfg})
    assert (sec.protocol, sec.sasl_mechanism, sec.sasl_username, sec.sasl_password) == \
        ("SASL_SSL", "SCRAM-SHA-512", "alice", 's3c"ret')
    plain = client_config({**opts, "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config":
                           'org.apache.kafka.common.security.plain.PlainLoginModule required '
                           "username='bob' password=pw;"}, "producer")
    sec = Security.from_config({**PRODUCER_DEFAULTS, **plain})
    assert (sec.sasl_mechanism, sec.sasl_username, sec.sasl_password) == ("PLAIN", "bob", "pw")


def test_bad_security_options_fail_on_the_driver():
    base = {"kafka.bootstrap.servers": "h:9093", "kafka.security.protocol": "SASL_SSL"}
    with pytest.raises(OptionError, match="sasl_mechanism is required"):
        client_config(base, "consumer")
    with pytest.raises(OptionError, match="only PEM"):
        client_config({"kafka.bootstrap.servers": "h:1", "kafka.ssl.truststore.type": "JKS"},
                      "consumer")
    with pytest.raises(OptionError, match="Krb5LoginModule is not supported"):
        client_config({**base, "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.jaas.config":
                       "com.sun.security.auth.module.Krb5LoginModule required;"}, "consumer")
