"""Kafka's listeners: several listeners, each answering Metadata, FindCoordinator and
DescribeCluster with its own advertised endpoint; every listener bound before the workers fork,
with the exit statuses of a listener that cannot be bound."""

from __future__ import annotations

import os
import socket
import subprocess

import confluent_kafka as ck

from appliance.runtime import EXIT_CONFIG, EXIT_LISTEN_ADDRESS, EXIT_LISTEN_IN_USE
from appliance_harness import APPLIANCE, free_port
from raw_wire import RawClient


def _run(args, tmp_path, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    return subprocess.run([APPLIANCE, *args], cwd=tmp_path, env=env, capture_output=True,
                          timeout=timeout, text=True, errors="replace")


def _endpoints(bootstrap: str) -> dict:
    with RawClient(bootstrap) as raw:
        md = raw.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        fc = raw.request(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
        fc3 = raw.request(10, 3, {"key_type": 0, "key": "g"})
        dc = raw.request(60, 1, {"include_cluster_authorized_operations": False,
                                 "endpoint_type": 1})
    return {"metadata": [(b.host, b.port) for b in md.brokers],
            "find_coordinator": [(c.host, c.port) for c in fc.coordinators] + [(fc3.host, fc3.port)],
            "describe_cluster": [(b.host, b.port) for b in dc.brokers]}


def test_each_listener_answers_with_its_own_advertised_endpoint(appliance_factory):
    outside, inside = free_port(), free_port()
    app = appliance_factory(start=False, server={
        "listeners": f"CLIENT://127.0.0.1:{outside},INTERNAL://127.0.0.1:{inside}",
        "listener_security_protocol_map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
        "advertised_listeners": "CLIENT://broker.example.com:19092"})
    app.use_listeners({"PLAINTEXT": inside})
    app.start()
    # Through CLIENT: the advertised address; through INTERNAL: its own (not advertised) address.
    assert _endpoints(f"127.0.0.1:{outside}") == {
        "metadata": [("broker.example.com", 19092)],
        "find_coordinator": [("broker.example.com", 19092)] * 2,
        "describe_cluster": [("broker.example.com", 19092)]}
    assert _endpoints(f"127.0.0.1:{inside}") == {
        "metadata": [("127.0.0.1", inside)], "find_coordinator": [("127.0.0.1", inside)] * 2,
        "describe_cluster": [("127.0.0.1", inside)]}
    # A real client through the listener that advertises itself works end to end.
    p = ck.Producer({"bootstrap.servers": f"127.0.0.1:{inside}"})
    p.produce("through-internal", b"v")
    assert p.flush(30) == 0
    # Every frontend serves both listeners; the supervisor says which ports it bound.
    assert app.processes()["listeners"] == {"CLIENT": outside, "INTERNAL": inside}


def test_listen_and_listeners_together_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nlisteners = "PLAINTEXT://127.0.0.1:{free_port()}"\n')
    r = _run(["run", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}",
              "--data-dir", str(tmp_path / "d")], tmp_path)
    assert r.returncode == EXIT_CONFIG, r.stderr
    assert "server.listen, server.listeners: set one of them" in r.stderr


def test_a_second_listener_in_use_exits_5_naming_it(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    busy = holder.getsockname()[1]
    first = free_port()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nlisteners = "PLAINTEXT://127.0.0.1:{first},'
                   f'SASL_PLAINTEXT://127.0.0.1:{busy}"\n')
    try:
        r = _run(["run", "--config", str(cfg), "--data-dir", str(tmp_path / "d")], tmp_path)
    finally:
        holder.close()
    assert r.returncode == EXIT_LISTEN_IN_USE, r.stderr
    assert (f"server.listeners SASL_PLAINTEXT://127.0.0.1:{busy}: address 127.0.0.1:{busy} already "
            f"in use") in r.stderr
    # The first listener was released with the failed start.
    with socket.socket() as s:
        s.bind(("127.0.0.1", first))


def test_a_listener_on_a_foreign_address_exits_6(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nlisteners = "PLAINTEXT://127.0.0.1:{free_port()},'
                   f'SASL_PLAINTEXT://192.0.2.1:{free_port()}"\n')
    r = _run(["run", "--config", str(cfg), "--data-dir", str(tmp_path / "d")], tmp_path)
    assert r.returncode == EXIT_LISTEN_ADDRESS, r.stderr
    assert "server.listeners SASL_PLAINTEXT://192.0.2.1:" in r.stderr


def test_the_metrics_endpoint_serves_beside_every_listener(appliance_factory, tmp_path):
    """[metrics] listen (bound by the supervisor, served by the metrics worker) next to a
    PLAINTEXT and a SASL_SSL listener: open connections are counted per listener name."""
    from security_setup import secure_appliance
    from test_operating import scrape, val
    port = free_port()
    s = secure_appliance(appliance_factory, tmp_path, protocols=("PLAINTEXT", "SASL_SSL"),
                         server={"frontends": 1}, metrics={"listen": f"127.0.0.1:{port}"})
    assert "metrics served at http://127.0.0.1:%d/metrics" % port in s.app.log_text()
    plain = RawClient(s.bootstrap("PLAINTEXT"))
    secured = RawClient(s.bootstrap("SASL_SSL"), ssl_context=s.pki.client_context())
    try:
        name = "kafka_server_socket_server_metrics_connection_count"
        s.app.wait_for(lambda: (val(scrape(port), name, listener="SASL_SSL") or 0) >= 1
                       and (val(scrape(port), name, listener="PLAINTEXT") or 0) >= 1,
                       what="a connection counted on each listener")
    finally:
        plain.close()
        secured.close()
    s.app.wait_for(lambda: val(scrape(port), name, listener="SASL_SSL") == 0,
                   what="the closed connection uncounted")
