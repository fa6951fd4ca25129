"""Topic configs and dynamic broker configs: Kafka's sources and synonyms, and the checks of
AlterConfigs / IncrementalAlterConfigs (unknown names, bad values, list operations, what a broker
resource may change live)."""

import pytest

from appliance.catalog.model import Catalog, TopicInfo, new_topic_id
from appliance.config import Config, LogConfig
from appliance.errors import ErrorCode, KafkaError
from appliance.topic_config import (DEFAULT_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
                                    DYNAMIC_TOPIC_CONFIG, OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT,
                                    STATIC_BROKER_CONFIG, alter_broker_configs, alter_topic_configs,
                                    describe_topic_configs)


def catalog(configs=None, default=None, node=None):
    t = TopicInfo("t", new_topic_id(), 1, configs or {})
    return Catalog(1, {"t": t}, broker_default=default, broker_node=node)


def test_sources_follow_kafkas_precedence_with_synonyms():
    cfg = Config(log=LogConfig(segment_bytes=2_000_000))
    c = catalog({"retention.ms": "1"}, default={"log.retention.ms": "3", "log.roll.ms": "7"},
                node={"log.retention.ms": "2"})
    d = describe_topic_configs(cfg, c, c.topics["t"].configs)
    assert d["retention.ms"][:2] == ("1", DYNAMIC_TOPIC_CONFIG)
    assert d["retention.ms"][2] == [("retention.ms", "1", DYNAMIC_TOPIC_CONFIG),
                                    ("log.retention.ms", "2", DYNAMIC_BROKER_CONFIG),
                                    ("log.retention.ms", "3", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                    ("log.retention.ms", "604800000", DEFAULT_CONFIG)]
    assert d["segment.ms"][:2] == ("7", DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert d["segment.bytes"][:2] == ("2000000", STATIC_BROKER_CONFIG)      # set in the file
    assert d["retention.bytes"][:2] == ("-1", DEFAULT_CONFIG)
    assert d["cleanup.policy"][:2] == ("delete", DEFAULT_CONFIG)


def test_incremental_ops_and_kafkas_errors():
    cfg = Config()
    c = catalog({"retention.ms": "1", "segment.bytes": "4096"})
    new = alter_topic_configs(cfg, c, "t", [(OP_SET, "retention.ms", "5"), (OP_DELETE, "segment.bytes", None),
                                           (OP_DELETE, "not.a.config", None)], True)
    assert new == {"retention.ms": "5"}
    # legacy AlterConfigs replaces the whole set
    assert alter_topic_configs(cfg, c, "t", [(OP_SET, "retention.bytes", "100")], False) == {"retention.bytes": "100"}
    cases = [
        ([(OP_SET, "no.such.config", "1")], ErrorCode.invalid_config, "Unknown topic config name: no.such.config"),
        ([(OP_SET, "retention.ms", "soon")], ErrorCode.invalid_config, "Invalid value soon for configuration retention.ms"),
        ([(OP_SET, "retention.ms", "1"), (OP_DELETE, "retention.ms", None)], ErrorCode.invalid_request,
         "Error due to duplicate config keys"),
        ([(OP_SET, "retention.ms", None)], ErrorCode.invalid_request, "Null value not supported for : retention.ms"),
        ([(OP_APPEND, "retention.ms", "1")], ErrorCode.invalid_config,
         "Config value append is not allowed for config key: retention.ms"),
        ([(OP_APPEND, "cleanup.policy", "shred")], ErrorCode.invalid_config,
         "Invalid value delete,shred for configuration cleanup.policy"),
        # Kafka's LogConfig.validateValues, also against what the topic inherits
        ([(OP_SET, "min.compaction.lag.ms", "10"), (OP_SET, "max.compaction.lag.ms", "5")],
         ErrorCode.invalid_config, "conflict topic config setting min.compaction.lag.ms (10) > "
         "max.compaction.lag.ms (5)"),
        ([(9, "retention.ms", "1")], ErrorCode.invalid_request, "Unknown operations type 9"),
    ]
    for ops, code, text in cases:
        with pytest.raises(KafkaError) as ei:
            alter_topic_configs(cfg, c, "t", ops, True)
        assert ei.value.code == code and text in ei.value.message, (ops, ei.value)
    # list operations on a list config
    assert alter_topic_configs(cfg, c, "t", [(OP_SUBTRACT, "cleanup.policy", "compact")], True)["cleanup.policy"] == "delete"
    assert alter_topic_configs(cfg, c, "t", [(OP_APPEND, "cleanup.policy", "compact")],
                               True)["cleanup.policy"] == "delete,compact"
    lagged = catalog({"max.compaction.lag.ms": "5"})
    with pytest.raises(KafkaError) as ei:
        alter_topic_configs(cfg, lagged, "t", [(OP_SET, "min.compaction.lag.ms", "10")], True)
    assert ei.value.code == ErrorCode.invalid_config


def test_broker_resources_take_only_the_configs_that_apply_live():
    assert alter_broker_configs({}, [(OP_SET, "log.retention.ms", "1000")], True) == {"log.retention.ms": "1000"}
    assert alter_broker_configs({"log.retention.ms": "1"}, [(OP_DELETE, "log.retention.ms", None)], True) == {}
    for ops in ([(OP_SET, "log.dirs", "/elsewhere")], [(OP_SET, "log.retention.ms", "1"), (OP_SET, "listeners", "PLAINTEXT://:1")]):
        with pytest.raises(KafkaError) as ei:
            alter_broker_configs({}, ops, True)
        assert ei.value.code == ErrorCode.invalid_request
        assert "Cannot update these configs dynamically: Set(" in ei.value.message
    with pytest.raises(KafkaError) as ei:
        alter_broker_configs({}, [(OP_SET, "log.retention.ms", "x")], True)
    assert ei.value.code == ErrorCode.invalid_request


def test_compaction_defaults_are_dynamic_broker_configs_that_topics_inherit():
    from appliance.topic_config import LogSettings
    assert alter_broker_configs({}, [(OP_SET, "log.cleanup.policy", "compact"),
                                     (OP_SET, "log.cleaner.delete.retention.ms", "1000")], True) == \
        {"log.cleanup.policy": "compact", "log.cleaner.delete.retention.ms": "1000"}
    with pytest.raises(KafkaError) as ei:
        alter_broker_configs({}, [(OP_SET, "log.cleanup.policy", "shred")], True)
    assert ei.value.code == ErrorCode.invalid_request
    c = catalog(default={"log.cleanup.policy": "compact", "log.cleaner.min.cleanable.ratio": "0.1"})
    d = describe_topic_configs(Config(), c, {})
    assert d["cleanup.policy"][2] == [("log.cleanup.policy", "compact", DYNAMIC_DEFAULT_BROKER_CONFIG),
                                      ("log.cleanup.policy", "delete", DEFAULT_CONFIG)]
    # What the topic's writer and its cleaner apply (Catalog.overrides over [log]).
    s = LogSettings.from_config(LogConfig(), c.overrides(c.topics["t"]))
    assert s.compact and not s.delete and s.min_cleanable_ratio == 0.1


def test_one_table_carries_every_setting_and_the_catalog_caches_each_topics():
    """TOPIC_CONFIGS is the one table: every LogSettings field (the broker-wide inflation factor
    aside) is one topic config's, its default comes from [log], and Catalog.settings derives and
    caches a topic's settings per snapshot and configuration (produce asks it per batch, the
    fetchers per partition; regression: both re-derived bounds from raw dicts, and cleanup.policy
    was parsed in two places)."""
    from appliance.topic_config import TOPIC_CONFIGS, LogSettings
    carried = [d.setting for d in TOPIC_CONFIGS.values() if d.setting]
    assert sorted(carried) == sorted(set(LogSettings.__struct_fields__) - {"decompressed_batch_max_factor"})
    assert LogSettings.from_config(LogConfig()) == LogSettings()      # [log]'s defaults are Kafka's
    c = catalog({"max.message.bytes": "2048", "cleanup.policy": "compact,delete"},
                default={"log.retention.ms": "5000"})
    log_cfg = LogConfig()
    s = c.settings(c.topics["t"], log_cfg)
    assert (s.retention_ms, s.max_message_bytes, s.compact, s.delete) == (5000, 2048, True, True)
    assert s.max_decompressed_bytes == 2048 * log_cfg.decompressed_batch_max_factor
    assert c.settings(c.topics["t"], log_cfg) is s                     # cached
    reloaded = LogConfig(segment_bytes=4096)
    assert c.settings(c.topics["t"], reloaded).segment_bytes == 4096   # a reload's [log]


# Kafka 4.3's TopicConfig names (message.format.version, message.timestamp.difference.max.ms and
# message.downconversion.enable went in 4.0) and the two replication throttles LogConfig defines.
KAFKA_TOPIC_CONFIGS = {
    "segment.bytes", "segment.ms", "segment.jitter.ms", "segment.index.bytes", "flush.messages",
    "flush.ms", "retention.bytes", "retention.ms", "remote.storage.enable", "local.retention.ms",
    "local.retention.bytes", "remote.log.copy.disable", "remote.log.delete.on.disable",
    "max.message.bytes", "index.interval.bytes", "file.delete.delay.ms", "delete.retention.ms",
    "min.compaction.lag.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio", "cleanup.policy",
    "unclean.leader.election.enable", "min.insync.replicas", "compression.type",
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "preallocate",
    "message.timestamp.type", "message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
}


def test_the_table_holds_kafkas_whole_topic_config_set():
    from appliance.topic_config import TOPIC_CONFIGS
    assert set(TOPIC_CONFIGS) == KAFKA_TOPIC_CONFIGS


@pytest.mark.parametrize("name,good,bad", [
    ("compression.type", ["uncompressed", "gzip", "snappy", "lz4", "zstd", "producer"], ["none", "LZ4"]),
    ("compression.gzip.level", ["-1", "1", "9"], ["0", "10", "-2"]),
    ("compression.lz4.level", ["1", "17"], ["0", "18"]),
    ("compression.zstd.level", ["-131072", "22"], ["-131073", "23"]),
    ("preallocate", ["true", "FALSE"], ["1", "yes"]),
    ("leader.replication.throttled.replicas", ["", "*", "0:1", "0:1, 1:1"], ["0", "*,0:1", "a:1"]),
    ("min.insync.replicas", ["1", "3"], ["0"]),
    ("flush.messages", ["1", str(2**63 - 1)], ["0", str(2**63)]),
    ("remote.storage.enable", ["false"], ["true"]),
    ("local.retention.bytes", ["-2"], ["-1", "100"]),
])
def test_values_checked_as_kafkas_logconfig_checks_them(name, good, bad):
    from appliance.topic_config import validate_topic_configs
    for v in good:
        assert validate_topic_configs({name: v}) == {name: v}
    for v in bad:
        with pytest.raises(KafkaError) as ei:
            validate_topic_configs({name: v})
        assert ei.value.code == ErrorCode.invalid_config and name in ei.value.message
        if name.startswith(("remote.", "local.")):
            assert "does not offer tiered storage" in ei.value.message


def test_topic_settings_carry_what_is_honoured():
    from appliance.topic_config import LogSettings
    s = LogSettings.from_config(LogConfig(), {"compression.type": "zstd", "flush.messages": "1",
                                              "file.delete.delay.ms": "0", "min.insync.replicas": "2",
                                              "message.timestamp.after.max.ms": "10"})
    assert (s.compression_type, s.flush_messages, s.file_delete_delay_ms, s.min_insync_replicas,
            s.message_timestamp_after_max_ms) == ("zstd", 1, 0, 2, 10)
    # [log.flush] is the default of flush.messages / flush.ms
    from appliance.config import FlushConfig, FlushPolicy
    batch = LogSettings.from_config(LogConfig(flush=FlushConfig(policy=FlushPolicy.BATCH)))
    interval = LogSettings.from_config(LogConfig(flush=FlushConfig(policy=FlushPolicy.INTERVAL, interval_ms=200)))
    assert batch.flush_messages == 1 and interval.flush_ms == 200


def test_kafkas_dynamic_broker_names_without_a_counterpart_are_stored():
    new = alter_broker_configs({}, [(OP_SET, "sasl.kerberos.min.time.before.relogin", "60000"),
                                    (OP_SET, "num.io.threads", "8")], True)
    assert new == {"sasl.kerberos.min.time.before.relogin": "60000", "num.io.threads": "8"}
    for ops in ([(OP_SET, "num.io.threads", "eight")], [(OP_SET, "sasl.enabled.mechanisms", "PLAIN")]):
        with pytest.raises(KafkaError) as ei:
            alter_broker_configs({}, ops, True)
        assert ei.value.code == ErrorCode.invalid_request


def test_list_ops_on_a_broker_config_start_from_its_default():
    # librdkafka's 0081: log.cleanup.policy APPEND compact, then SUBTRACT compact
    new = alter_broker_configs({}, [(OP_APPEND, "log.cleanup.policy", "compact"),
                                    (OP_SET, "background.threads", "9")], True)
    assert new == {"log.cleanup.policy": "delete,compact", "background.threads": "9"}
    assert alter_broker_configs(new, [(OP_SUBTRACT, "log.cleanup.policy", "compact"),
                                      (OP_DELETE, "background.threads", None)], True) == \
        {"log.cleanup.policy": "delete"}
    with pytest.raises(KafkaError) as ei:
        alter_broker_configs({}, [(OP_APPEND, "log.retention.ms", "1")], True)
    assert ei.value.code == ErrorCode.invalid_config
