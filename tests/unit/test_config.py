"""The config tree: defaults, TOML, environment and flag overrides, and rejection messages."""

import os
import tomllib

import msgspec
import pytest

from appliance.config import Config, ConfigError, dumps_toml, load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_defaults_listen_and_data_dir():
    cfg = load(None, environ={})
    assert cfg.server.listen == "127.0.0.1:9092"
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
