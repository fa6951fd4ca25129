"""The Kafka tools of the CLI against a secured listener: every tool takes ``--command-config``
(Kafka client properties, as Kafka's tools take them) from the shared connection options, on the
command or on the tool's group; without ``--bootstrap-server`` the tools connect to the first
listener of the configuration's ``server.listeners``."""

from __future__ import annotations

import json
import os
import subprocess

from appliance_harness import APPLIANCE
from security_setup import ADMIN, ADMIN_PASSWORD, secure_appliance


def cli(*args, stdin=None, timeout=120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    return subprocess.run([APPLIANCE, *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin, env=env)


def admin_properties(s, path, password=ADMIN_PASSWORD) -> str:
    path.write_text(
        "# the admin over SASL_SSL, as for kafka-topics.sh --command-config\n"
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{password}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={s.pki.ca}\n"
        "client.id=ignored-by-the-tools\n")
    return str(path)


def test_every_tool_reaches_a_sasl_ssl_listener_with_command_config(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL", "PLAINTEXT"),
                         groups={"initial_rebalance_delay_ms": 0})
    props = admin_properties(s, tmp_path / "admin.properties")
    on = ["--bootstrap-server", s.bootstrap("SASL_SSL"), "--command-config", props]

    def ok(*args, stdin=None):
        r = cli(*args, stdin=stdin)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    # Options on the command, as Kafka's tools take them.
    assert ok("topics", "create", "--topic", "sec", "--partitions", "2", *on).stdout.strip() \
        == "Created topic sec."
    r = ok("produce", "--topic", "sec", "--partition", "0", "--property", "parse.key=true", *on,
           stdin="k1\tv1\nk2\tv2\n")
    assert "2 records produced to sec." in r.stderr
    r = ok("consume", "--topic", "sec", "--from-beginning", "--max-messages", "2",
           "--timeout-ms", "30000", "--property", "print.key=true", *on)
    assert r.stdout.splitlines() == ["k1\tv1", "k2\tv2"]
    offsets = json.loads(ok("get-offsets", "--topic", "sec", "--json", *on).stdout)
    assert sorted((o["partition"], o["offset"]) for o in offsets) == [(0, 2), (1, 0)]
    r = ok("configs", "describe", "--topic", "sec", "--all", *on)
    assert "retention.ms" in r.stdout
    assert ok("groups", "list", *on).returncode == 0
    # Options on the tool's group (as appliance transactions takes them).
    assert "sec" in ok("topics", *on, "list").stdout.split()
    assert ok("transactions", *on, "list").stdout.startswith("TransactionalId\t")
    # The Spark sink's recovery: its job log (created here), ListTransactions, over SASL_SSL.
    assert ok("spark", *on, "recover").stdout.splitlines() == ["nothing to recover"]
    assert ok("spark", "recover", "--prefix", "etl", *on).stdout.splitlines() == ["nothing to recover"]
    # Without --bootstrap-server: the first listener of server.listeners (here SASL_SSL).
    assert "sec" in ok("topics", "--config", s.app.config_path, "--command-config", props,
                       "list").stdout.split()
    assert ok("transactions", "--config", s.app.config_path, "--command-config", props,
              "list").returncode == 0


def test_a_secured_listener_refuses_tools_without_the_right_settings(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL",))
    # No --command-config: a plaintext client on a TLS port is disconnected; the tool says whom
    # it could not reach and exits 1.
    r = cli("topics", "list", "--bootstrap-server", s.bootstrap("SASL_SSL"), timeout=180)
    assert r.returncode == 1 and s.bootstrap("SASL_SSL") in r.stderr, r.stderr
    # A wrong password: Kafka's authentication failure, exit 1.
    bad = admin_properties(s, tmp_path / "bad.properties", password="wrong")
    r = cli("topics", "list", "--bootstrap-server", s.bootstrap("SASL_SSL"), "--command-config", bad)
    assert r.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in r.stderr, r.stderr
    # Settings that cannot be used are a usage error (exit 2) naming the option.
    broken = tmp_path / "broken.properties"
    broken.write_text("security.protocol=SASL_SSL\n")
    r = cli("get-offsets", "--bootstrap-server", s.bootstrap("SASL_SSL"), "--command-config",
            str(broken))
    assert r.returncode == 2 and "--command-config" in r.stderr and "sasl_mechanism" in r.stderr
    r = cli("groups", "list", "--bootstrap-server", s.bootstrap("SASL_SSL"), "--command-config",
            str(tmp_path / "missing.properties"))
    assert r.returncode == 2 and "missing.properties" in r.stderr
