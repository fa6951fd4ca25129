"""KIP-848 group configs (appliance/group_config.py): Kafka 4.x's GroupConfig names, checked
within the broker's bounds, described with their source and broker synonym."""

import pytest

from appliance.errors import ErrorCode, KafkaError
from appliance.group_config import DEFAULT_CONFIG, GROUP_CONFIG, alter_group_configs, describe_group_configs
from appliance.topic_config import OP_DELETE, OP_SET, apply_config_ops


def alter(current, ops):
    return alter_group_configs(current, ops, True, apply_config_ops)


def test_set_delete_and_describe():
    new = alter({}, [(OP_SET, "consumer.session.timeout.ms", "50000"),
                     (OP_SET, "share.auto.offset.reset", "by_duration:PT1H")])
    assert new == {"consumer.session.timeout.ms": "50000", "share.auto.offset.reset": "by_duration:PT1H"}
    d = describe_group_configs(new)
    assert d["consumer.session.timeout.ms"][:3] == ("50000", GROUP_CONFIG, "INT")
    assert d["consumer.session.timeout.ms"][3][1] == ("group.consumer.session.timeout.ms", "45000", DEFAULT_CONFIG)
    assert d["consumer.heartbeat.interval.ms"][:2] == ("5000", DEFAULT_CONFIG)
    assert alter(new, [(OP_DELETE, "consumer.session.timeout.ms", None)]) == {
        "share.auto.offset.reset": "by_duration:PT1H"}


@pytest.mark.parametrize("name,value", [("consumer.session.timeout.ms", "44999"),
                                        ("consumer.heartbeat.interval.ms", "16000"),
                                        ("share.isolation.level", "dirty"),
                                        ("share.auto.offset.reset", "soon"),
                                        ("no.such.group.config", "1")])
def test_kafkas_refusals(name, value):
    with pytest.raises(KafkaError) as ei:
        alter({}, [(OP_SET, name, value)])
    assert ei.value.code == ErrorCode.invalid_config and name in ei.value.message


def test_share_record_lock_duration_is_held_to_the_groups_section_bounds():
    # group.share.min/max.record.lock.duration.ms: Kafka's 15 s..60 s by default; a broker (as
    # librdkafka's test clusters with 1 s) may lower the minimum, and the group config follows.
    import msgspec
    import pytest

    from appliance.config import GroupsConfig
    from appliance.errors import KafkaError
    from appliance.topic_config import apply_config_ops as ops_fn
    op = [(OP_SET, "share.record.lock.duration.ms", "3000")]
    with pytest.raises(KafkaError, match=r"must be in \[15000, 60000\]"):
        alter_group_configs({}, op, True, ops_fn, GroupsConfig())
    low = msgspec.convert({"share_min_record_lock_duration_ms": 1000}, GroupsConfig)
    assert alter_group_configs({}, op, True, ops_fn, low) == {"share.record.lock.duration.ms": "3000"}
