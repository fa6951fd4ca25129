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
