"""The config tree: defaults, TOML, environment and flag overrides, and rejection messages."""

import os
import tomllib

import msgspec
import pytest

from appliance.config import Config, ConfigError, load
from appliance.config_print import dumps_toml
from appliance.listeners import Listener

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_defaults_listen_and_data_dir():
    cfg = load(None, environ={})
    # Neither listen nor listeners set: one PLAINTEXT listener on 127.0.0.1:9092.
    assert cfg.server.listen == "" and cfg.server.listeners == ""
    assert cfg.listeners == [Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
    assert cfg.server.data_dir == "./data"


def test_config_toml_holds_every_default_exactly():
    """config.toml at the top level must list every key with the value the code defaults to."""
    with open(os.path.join(ROOT, "config.toml"), "rb") as f:
        on_disk = tomllib.load(f)
    assert on_disk == msgspec.to_builtins(Config())


def test_unknown_key_is_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[log]\nsegmnet_bytes = 5\n")
    with pytest.raises(ConfigError, match=r"log\.segmnet_bytes: unknown key"):
        load(p, environ={})


def test_unknown_section_is_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[lgo]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"lgo: unknown key"):
        load(p, environ={})


def test_bad_value_names_key(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[log.flush]\npolicy = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"log\.flush\.policy"):
        load(p, environ={})


def test_wrong_type_names_key(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[server]\nnode_id = "one"\n')
    with pytest.raises(ConfigError, match=r"server\.node_id: Expected `int`"):
        load(p, environ={})


def test_env_overrides_file_and_flags_override_env(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[server]\nlisten = "127.0.0.1:1000"\n[log]\nsegment_bytes = 2000000\n')
    env = {"APPLIANCE_SERVER__LISTEN": "127.0.0.1:2000", "APPLIANCE_LOG__SEGMENT_BYTES": "3000000",
           "APPLIANCE_LOG__FLUSH__POLICY": "os"}
    cfg = load(p, environ=env)
    assert cfg.server.listen == "127.0.0.1:2000"
    assert cfg.log.segment_bytes == 3000000
    assert cfg.log.flush.policy == "os"
    cfg = load(p, environ=env, overrides={"server": {"listen": "127.0.0.1:3000"}})
    assert cfg.server.listen == "127.0.0.1:3000"


def test_env_bad_name_rejected():
    with pytest.raises(ConfigError, match="APPLIANCE_LISTEN"):
        load(None, environ={"APPLIANCE_LISTEN": "x"})


def test_bad_hostport_rejected():
    with pytest.raises(ConfigError, match="server.listen"):
        load(None, environ={}, overrides={"server": {"listen": "localhost"}})


def test_ring_must_hold_two_max_batches():
    with pytest.raises(ConfigError, match="produce_ring_bytes"):
        load(None, environ={}, overrides={"shm": {"produce_ring_bytes": 1048576}})


def test_dumps_toml_round_trips():
    cfg = load(None, environ={}, overrides={"log": {"retention_ms": 5}})
    assert msgspec.convert(tomllib.loads(dumps_toml(cfg)), Config) == cfg


# -- issue 19, item 7: every gap refused with a message naming the key ------------------------

def test_non_utf8_file_is_a_config_error_not_a_traceback(tmp_path):
    p = tmp_path / "c.toml"
    p.write_bytes(b'[server]\nlisten = "127.0.0.1:9092"\n# caf\xe9\n')
    with pytest.raises(ConfigError, match=r"not valid TOML: not UTF-8 \(byte 0xe9 on line 3\)"):
        load(p, environ={})


def test_unreadable_config_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load(tmp_path, environ={})          # a directory


def test_frontends_has_an_upper_bound():
    with pytest.raises(ConfigError, match=r"server\.frontends: Expected `int` <= 256"):
        load(None, environ={}, overrides={"server": {"frontends": 100000}})
    with pytest.raises(ConfigError, match=r"server\.fetchers: Expected `int` <= 256"):
        load(None, environ={}, overrides={"server": {"fetchers": 100000}})


def test_frontends_zero_is_capped_by_the_bound(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 10_000)
    assert load(None, environ={}).frontend_count == 256


def test_min_session_timeout_above_max_is_refused():
    with pytest.raises(ConfigError, match=r"groups\.min_session_timeout_ms: must be <= "
                                          r"groups\.max_session_timeout_ms"):
        load(None, environ={}, overrides={"groups": {"min_session_timeout_ms": 7000,
                                                     "max_session_timeout_ms": 6000}})


def test_node_id_above_int32_is_refused():
    """Regression: node_id 2**31 was accepted and every Metadata answer then failed to encode."""
    with pytest.raises(ConfigError, match=r"server\.node_id: Expected `int` <= 2147483647"):
        load(None, environ={}, overrides={"server": {"node_id": 2**31}})
    assert load(None, environ={}, overrides={"server": {"node_id": 2**31 - 1}}).server.node_id == 2**31 - 1


def test_bad_server_table_is_not_replaced_by_data_dir_flag(tmp_path):
    """Regression: `server = 5` in the file vanished when --data-dir was given."""
    p = tmp_path / "c.toml"
    p.write_text("server = 5\n")
    with pytest.raises(ConfigError, match=r"^config: server: Expected `object`, got `int`$"):
        load(p, environ={}, overrides={"server": {"data_dir": str(tmp_path)}})


def test_bad_server_value_is_reported_even_when_a_flag_overrides_it(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[server]\ndata_dir = 5\n")
    with pytest.raises(ConfigError, match=r"server\.data_dir: Expected `str`, got `int`"):
        load(p, environ={}, overrides={"server": {"data_dir": str(tmp_path)}})


def test_env_value_error_names_the_variable():
    with pytest.raises(ConfigError, match=r"server\.node_id: Expected `int` <= 2147483647 "
                                          r"\(from environment APPLIANCE_SERVER__NODE_ID\)"):
        load(None, environ={"APPLIANCE_SERVER__NODE_ID": str(2**32)})


def test_env_unknown_key_and_section_name_the_variable():
    with pytest.raises(ConfigError, match=r"server\.nodeid: unknown key \(from environment "
                                          r"APPLIANCE_SERVER__NODEID\)"):
        load(None, environ={"APPLIANCE_SERVER__NODEID": "3"})
    with pytest.raises(ConfigError, match=r"lgo: unknown key \(from environment APPLIANCE_LGO__X\)"):
        load(None, environ={"APPLIANCE_LGO__X": "3"})


def test_env_consistency_error_names_the_variable():
    with pytest.raises(ConfigError, match=r"groups\.min_session_timeout_ms: .* \(from environment "
                                          r"APPLIANCE_GROUPS__MIN_SESSION_TIMEOUT_MS\)"):
        load(None, environ={"APPLIANCE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1900000"})


def test_env_scalar_over_a_table_names_the_variable():
    with pytest.raises(ConfigError, match=r"log\.flush: Expected `object`.*\(from environment "
                                          r"APPLIANCE_LOG__FLUSH\)"):
        load(None, environ={"APPLIANCE_LOG__FLUSH": "os"})


def test_flag_wins_over_env_and_is_not_blamed_on_it(tmp_path):
    env = {"APPLIANCE_SERVER__LISTEN": "127.0.0.1:1"}
    with pytest.raises(ConfigError, match=r"^config: server\.listen: expected HOST:PORT, got 'nope'$"):
        load(None, environ=env, overrides={"server": {"listen": "nope"}})


def test_file_error_does_not_name_an_unrelated_variable(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[server]\nnode_id = -1\n")
    with pytest.raises(ConfigError, match=r"^config: server\.node_id: Expected `int` >= 0$"):
        load(p, environ={"APPLIANCE_SERVER__LISTEN": "127.0.0.1:1"})


def test_runtime_dir_must_not_hold_the_data_dir(tmp_path):
    """The runtime dir is removed on exit: as data_dir (or a parent of it) it would take the data."""
    for run in (str(tmp_path), str(tmp_path / "data"), str(tmp_path) + "/"):
        with pytest.raises(ConfigError, match=r"server\.runtime_dir: must not be server\.data_dir"):
            load(None, environ={}, overrides={"server": {"runtime_dir": run,
                                                         "data_dir": str(tmp_path / "data")}})
    load(None, environ={}, overrides={"server": {"runtime_dir": str(tmp_path / "datarun"),
                                                 "data_dir": str(tmp_path / "data")}})


def test_log_cleaner_section_and_topic_configs():
    from appliance.errors import KafkaError
    from appliance.topic_config import validate_topic_configs
    cfg = load(environ={"APPLIANCE_LOG__CLEANER__MIN_CLEANABLE_RATIO": "0.1",
                        "APPLIANCE_LOG__CLEANUP_POLICY": "compact"})
    assert cfg.log.cleaner.min_cleanable_ratio == 0.1 and cfg.log.cleanup_policy == "compact"
    with pytest.raises(ConfigError, match="log.cleaner.min_cleanable_ratio"):
        load(environ={"APPLIANCE_LOG__CLEANER__MIN_CLEANABLE_RATIO": "1.5"})
    with pytest.raises(ConfigError, match="log.cleaner.min_compaction_lag_ms: must be <="):
        load(environ={"APPLIANCE_LOG__CLEANER__MIN_COMPACTION_LAG_MS": "10",
                      "APPLIANCE_LOG__CLEANER__MAX_COMPACTION_LAG_MS": "5"})
    with pytest.raises(ConfigError, match="log.cleanup_policy"):
        load(environ={"APPLIANCE_LOG__CLEANUP_POLICY": "shred"})
    assert validate_topic_configs({"cleanup.policy": "compact,delete", "delete.retention.ms": "0",
                                   "min.cleanable.dirty.ratio": "0.0"})["cleanup.policy"] == \
        "compact,delete"
    for bad in ({"cleanup.policy": "compact,shred"}, {"cleanup.policy": ""},
                {"min.cleanable.dirty.ratio": "2"}, {"max.compaction.lag.ms": "0"},
                {"min.compaction.lag.ms": "9", "max.compaction.lag.ms": "8"}):
        with pytest.raises(KafkaError) as e:
            validate_topic_configs(bad)
        assert e.value.code.name == "invalid_config", bad


def test_super_users_must_be_principals():
    cfg = load(None, environ={}, overrides={"authorizer": {"super_users": ["User:admin"]}})
    assert cfg.authorizer.super_users == ["User:admin"] and not cfg.authorizer.enable
    with pytest.raises(ConfigError, match=r"authorizer\.super_users: 'admin' is not a principal"):
        load(None, environ={}, overrides={"authorizer": {"super_users": ["admin"]}})


# -- listeners, TLS and SASL ------------------------------------------------------------------------

def _load(**sections):
    return load(None, environ={}, overrides=sections)


def test_listeners_in_kafka_syntax_with_advertised_endpoints():
    cfg = _load(server={"listeners": "PLAINTEXT://127.0.0.1:9092,sasl_ssl://:9093,SSL://[::1]:9094",
                        "advertised_listeners": "SASL_SSL://broker.example.com:19093"},
                tls={"cert_file": "c.pem", "key_file": "k.pem"})
    assert cfg.listeners == [Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),
                             Listener("SASL_SSL", "SASL_SSL", "", 9093),
                             Listener("SSL", "SSL", "::1", 9094)]
    assert cfg.advertised_endpoints() == {"PLAINTEXT": ("127.0.0.1", 9092),
                                          "SASL_SSL": ("broker.example.com", 19093),
                                          "SSL": ("::1", 9094)}
    # The ports actually bound replace port 0 (and an all-interfaces bind advertises loopback).
    cfg = _load(server={"listeners": "PLAINTEXT://0.0.0.0:0"})
    assert cfg.advertised_endpoints({"PLAINTEXT": 4321}) == {"PLAINTEXT": ("127.0.0.1", 4321)}


def test_listener_names_through_the_security_protocol_map():
    cfg = _load(server={"listeners": "CLIENT://:9092,INTERNAL://127.0.0.1:9093",
                        "listener_security_protocol_map": "CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT"})
    assert [(x.name, x.protocol) for x in cfg.listeners] == [("CLIENT", "SASL_PLAINTEXT"),
                                                           ("INTERNAL", "PLAINTEXT")]


@pytest.mark.parametrize("server, match", [
    ({"listen": "127.0.0.1:9092", "listeners": "PLAINTEXT://:9093"},
     r"^config: server\.listen, server\.listeners: set one of them"),
    ({"listeners": "PLAINTEXT://:9092,PLAINTEXT://:9093"}, r"server\.listeners: listener name PLAINTEXT appears twice"),
    ({"listeners": "PLAINTEXT://:9092,SSL://:9092"}, r"server\.listeners: two listeners on the same port"),
    ({"listeners": "HTTP://:80"}, r"server\.listeners: HTTP://:80: listener name HTTP is neither"),
    ({"listeners": "PLAINTEXT:9092"}, r"server\.listeners: expected NAME://HOST:PORT"),
    ({"listeners": "PLAINTEXT://:9092", "advertised_listeners": "SSL://h:1"},
     r"server\.advertised_listeners: SSL is not a listener"),
    ({"listeners": "PLAINTEXT://:9092", "advertised_listeners": "PLAINTEXT://0.0.0.0:9092"},
     r"server\.advertised_listeners: .*advertise a host"),
    ({"listeners": "PLAINTEXT://:9092,SASL_PLAINTEXT://:9093", "advertised_listener": "h:1"},
     r"server\.advertised_listener: one address for several listeners"),
    ({"listener_security_protocol_map": "X:TLS"}, r"server\.listener_security_protocol_map: X: unknown"),
])
def test_bad_listener_settings_are_refused_naming_the_keys(server, match):
    with pytest.raises(ConfigError, match=match):
        _load(server=server)


def test_tls_listener_needs_certificate_and_key():
    with pytest.raises(ConfigError, match=r"^config: tls\.cert_file: required by the SASL_SSL listener"):
        _load(server={"listeners": "SASL_SSL://:9093"})
    with pytest.raises(ConfigError, match=r"^config: tls\.ca_file: required when tls\.client_auth"):
        _load(tls={"client_auth": "required"})
    with pytest.raises(ConfigError, match=r"tls\.client_auth"):
        _load(tls={"client_auth": "sometimes"})
    with pytest.raises(ConfigError, match=r"tls\.min_version"):
        _load(tls={"min_version": "TLSv1.0"})


def test_sasl_mechanisms_and_mapping_rules_are_checked():
    with pytest.raises(ConfigError, match=r"sasl\.mechanisms"):
        _load(sasl={"mechanisms": ["GSSAPI"]})
    with pytest.raises(ConfigError, match=r"^config: sasl\.mechanisms: empty"):
        _load(server={"listeners": "SASL_PLAINTEXT://:9093"}, sasl={"mechanisms": []})
    with pytest.raises(ConfigError, match=r"^config: tls\.principal_mapping_rules: 'RULE:x'"):
        _load(tls={"principal_mapping_rules": ["RULE:x"]})


def test_check_config_hides_the_key_password():
    out = dumps_toml(_load(tls={"key_password": "s3cret"}, console={"ssl_password": "c0nsole"}))
    assert "s3cret" not in out and 'key_password = "[hidden]"' in out
    assert "c0nsole" not in out and 'ssl_password = "[hidden]"' in out
    assert 'mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512"]' in out


def test_listen_and_listeners_from_the_environment_name_both_variables():
    env = {"APPLIANCE_SERVER__LISTEN": "0.0.0.0:9092", "APPLIANCE_SERVER__LISTENERS": "SSL://:9093"}
    with pytest.raises(ConfigError, match=r"set one of them .*\(from environment "
                                          r"APPLIANCE_SERVER__LISTEN, APPLIANCE_SERVER__LISTENERS\)$"):
        load(None, environ=env)
    # An empty value is "not set" (how a container image's default listen is emptied).
    cfg = load(None, environ={**env, "APPLIANCE_SERVER__LISTEN": "",
                              "APPLIANCE_SERVER__LISTENERS": "PLAINTEXT://:9093"})
    assert [str(x) for x in cfg.listeners] == ["PLAINTEXT://:9093"]


def test_metrics_listen_must_differ_from_every_listener():
    with pytest.raises(ConfigError, match="metrics.listen: must differ from the listener "
                                          "SASL_SSL://127.0.0.1:9093"):
        load(None, overrides={"server": {"listeners": "PLAINTEXT://127.0.0.1:9092,"
                                                      "SASL_SSL://127.0.0.1:9093"},
                              "tls": {"cert_file": "c.pem", "key_file": "k.pem"},
                              "metrics": {"listen": "127.0.0.1:9093"}})
    with pytest.raises(ConfigError, match="metrics.listen: must differ from the listener "
                                          "PLAINTEXT://127.0.0.1:9092"):
        load(None, overrides={"metrics": {"listen": "127.0.0.1:9092"}})
    cfg = load(None, overrides={"server": {"listen": "127.0.0.1:0"},
                                "metrics": {"listen": "127.0.0.1:0"}})   # two ephemeral ports
    assert cfg.metrics.listen == "127.0.0.1:0"
