"""What the supervisor tells systemd and operators (appliance.supervisor.systemd and .operating,
appliance.reload, the JSON log format), without forking: the notify socket is a real datagram
socket bound here, the clock is the test's."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from appliance import reload
from appliance.config import (Config, ConfigError, FlushConfig, LogConfig, ServerConfig,
                              ShmConfig, TopicsConfig)
from appliance.runtime import JsonFormatter
from appliance.supervisor.systemd import Watchdog, sd_notify


@pytest.fixture
def notify(tmp_path, monkeypatch):
    """A fake $NOTIFY_SOCKET; returns a function that reads every datagram sent so far."""
    path = str(tmp_path / "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", path)

    def received() -> list[str]:
        out = []
        while True:
            try:
                out.append(s.recv(4096).decode())
            except BlockingIOError:
                return out
    yield received
    s.close()


def test_sd_notify_sends_one_datagram_of_lines(notify):
    sd_notify("RELOADING=1", "MONOTONIC_USEC=5")
    assert notify() == ["RELOADING=1\nMONOTONIC_USEC=5"]


def test_the_watchdog_is_off_without_watchdog_usec_or_for_another_pid():
    assert not Watchdog({}).enabled
    assert not Watchdog({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}, pid=2).enabled
    wd = Watchdog({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, pid=7)
    assert wd.enabled and wd.interval_s == 2.0 and wd.fresh_s == 1.0


def test_pings_every_quarter_period_only_while_no_worker_is_stale(notify):
    wd = Watchdog({"WATCHDOG_USEC": "4000000"})
    assert wd.turn(0.0, []) == "WATCHDOG=1"
    assert wd.turn(0.5, []) is None                      # not due before a quarter period
    stale = [("fetcher 0", 2.5)]
    assert wd.turn(1.0, stale).startswith("STATUS=watchdog withheld: no heartbeat from fetcher 0")
    assert wd.turn(2.0, stale) is None                   # said once, not again
    assert wd.turn(3.0, []) == "WATCHDOG=1"
    assert notify() == ["WATCHDOG=1", "STATUS=watchdog withheld: no heartbeat from fetcher 0 "
                        "(2.5 s)", "WATCHDOG=1"]


def test_a_reload_applies_live_keys_and_keeps_the_others_naming_them(caplog):
    old = Config()
    new = Config(server=ServerConfig(listen="127.0.0.1:9999", connections_max_idle_ms=5000),
                 log=LogConfig(retention_ms=1000, flush=FlushConfig(policy="batch")),
                 shm=ShmConfig(small_ring_bytes=1 << 21), topics=TopicsConfig(auto_create=False))
    with caplog.at_level(logging.INFO, "appliance.supervisor"):
        p = reload.reload_config(old, lambda: new)
    assert p.config.log.retention_ms == 1000 and p.config.log.flush.policy == "batch"
    assert p.config.server.connections_max_idle_ms == 5000 and p.config.topics.auto_create is False
    assert p.config.server.listen == old.server.listen
    assert p.config.shm.small_ring_bytes == old.shm.small_ring_bytes
    assert {k for k, _, _ in p.refused} == {"server.listen", "shm.small_ring_bytes"}
    text = caplog.text
    assert "reload: server.listen cannot change while the appliance runs" in text
    assert "reload: log.retention_ms: 604800000 -> 1000" in text


def test_a_reload_applies_tls_and_sasl_keeps_listeners_and_hides_the_key_password(caplog):
    from appliance.config import SaslConfig, TlsConfig
    old = Config(server=ServerConfig(listeners="SASL_SSL://127.0.0.1:9093"),
                 tls=TlsConfig(cert_file="/a.pem", key_file="/a.key", key_password="old-secret"))
    new = Config(server=ServerConfig(listeners="SASL_SSL://127.0.0.1:9094",
                                     connection_failed_authentication_delay_ms=5),
                 tls=TlsConfig(cert_file="/b.pem", key_file="/b.key", key_password="new-secret"),
                 sasl=SaslConfig(mechanisms=["SCRAM-SHA-512"]))
    with caplog.at_level(logging.INFO, "appliance.supervisor"):
        p = reload.reload_config(old, lambda: new)
    assert p.config.tls == new.tls and p.config.sasl.mechanisms == ["SCRAM-SHA-512"]
    assert p.config.server.connection_failed_authentication_delay_ms == 5
    assert p.config.server.listeners == old.server.listeners
    assert {k for k, _, _ in p.refused} == {"server.listeners"}
    assert "reload: tls.key_password: '[hidden]' -> '[hidden]'" in caplog.text
    assert "secret" not in caplog.text


def test_a_reload_whose_result_is_inconsistent_changes_nothing(caplog):
    from appliance.config import TlsConfig
    old = Config(server=ServerConfig(listeners="SSL://127.0.0.1:9093"),
                 tls=TlsConfig(cert_file="/a.pem", key_file="/a.key"))
    new = Config(server=ServerConfig(listeners="SSL://127.0.0.1:9093"), tls=TlsConfig())
    with caplog.at_level(logging.INFO, "appliance.supervisor"):
        assert reload.reload_config(old, lambda: new) is None
    assert "reload refused" in caplog.text and "tls.cert_file: required by the SSL listener" in caplog.text


def test_every_key_is_either_live_or_has_a_reason_to_need_a_restart():
    keys = [k for k, _, _ in reload.diff(Config(), Config())]
    assert keys == []

    def walk(prefix, tree):
        for k, v in tree.items():
            yield from walk(f"{prefix}{k}.", v) if isinstance(v, dict) else [f"{prefix}{k}"]
    from appliance.config_print import to_toml_dict
    for k in walk("", to_toml_dict(Config())):
        assert reload.is_live(k) or reload._reason(k) != "it is read once, at start", k


def test_a_reload_whose_result_is_inconsistent_or_whose_file_is_bad_changes_nothing(caplog):
    # message_max_bytes must fit the produce ring, which a reload cannot grow.
    big = Config(log=LogConfig(message_max_bytes=8_000_000))
    with pytest.raises(ConfigError, match="produce_ring_bytes"):
        reload.plan(Config(), big)

    def broken():
        raise ConfigError("config: log.retention_ms: Expected `int`, got `str`")
    assert reload.reload_config(Config(), broken) is None
    assert "reload refused, the running configuration stays: config: log.retention_ms" in caplog.text


def test_the_json_log_format_is_one_object_a_line_with_role_and_process():
    f = JsonFormatter("writer", "writer orders-3")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        rec = logging.LogRecord("appliance.writer", logging.ERROR, __file__, 1, "x %d", (1,),
                                sys.exc_info())
    out = f.format(rec)
    assert "\n" not in out                    # the traceback too stays on the line
    d = json.loads(out)
    assert d["level"] == "ERROR" and d["role"] == "writer" and d["process"] == "writer orders-3"
    assert d["logger"] == "appliance.writer" and d["message"] == "x 1" and d["pid"] == rec.process
    assert d["time"].endswith("Z") and "ValueError: boom" in d["exception"]
