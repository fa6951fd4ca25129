"""The typed ``[log.flush] policy`` (appliance.config.FlushPolicy): its config values, the
questions the writers and the coordinator logs ask it, what DescribeConfigs reports, and the
message for a bad value."""

import pytest

from appliance.config import ConfigError, FlushConfig, FlushPolicy, load
from appliance.config_print import dumps_toml


@pytest.mark.parametrize("value,member", [("os", FlushPolicy.OS), ("batch", FlushPolicy.BATCH),
                                          ("interval", FlushPolicy.INTERVAL)])
def test_toml_and_env_values_decode_to_the_policy(tmp_path, value, member):
    p = tmp_path / "c.toml"
    p.write_text(f'[log.flush]\npolicy = "{value}"\n')
    assert load(p, environ={}).log.flush.policy is member
    env = {"APPLIANCE_LOG__FLUSH__POLICY": value}
    assert load(None, environ=env).log.flush.policy is member
    assert f'policy = "{value}"' in dumps_toml(load(p, environ={}))   # printed as written
    assert member == value and str(member) == value


def test_default_is_os():
    assert load(None, environ={}).log.flush.policy is FlushPolicy.OS


@pytest.mark.parametrize("policy,waits,group_commit,periodic", [
    (FlushPolicy.OS, False, False, False),
    (FlushPolicy.BATCH, True, True, False),
    (FlushPolicy.INTERVAL, True, False, True),
])
def test_questions(policy, waits, group_commit, periodic):
    assert (policy.ack_waits_for_sync, policy.group_commit, policy.periodic) == (
        waits, group_commit, periodic)


@pytest.mark.parametrize("policy,reported", [(FlushPolicy.OS, 2**63 - 1), (FlushPolicy.BATCH, 0),
                                             (FlushPolicy.INTERVAL, 2500)])
def test_kafka_flush_interval_ms(policy, reported):
    assert FlushConfig(policy=policy, interval_ms=2500).kafka_flush_interval_ms == reported


def test_bad_value_is_refused_naming_the_key_and_the_value(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[log.flush]\npolicy = "sometimes"\n')
    with pytest.raises(ConfigError) as ei:
        load(p, environ={})
    assert str(ei.value) == ("config: log.flush.policy: Invalid enum value 'sometimes' "
                             "(valid values: 'batch', 'interval', 'os')")


def test_a_string_is_not_a_policy_until_converted():
    assert FlushPolicy("batch") is FlushPolicy.BATCH
    with pytest.raises(ValueError):
        FlushPolicy("sometimes")
