"""SASL with real clients: confluent-kafka (librdkafka) with every mechanism over SASL_PLAINTEXT
and SASL_SSL; SCRAM users managed online through AlterUserScramCredentials and
DescribeUserScramCredentials (confluent-kafka's AdminClient and ``appliance users
--bootstrap-server``) and offline (``appliance users`` refuses a data dir in use); credentials
survive a restart."""

from __future__ import annotations

import os
import subprocess
import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)

from appliance_harness import APPLIANCE
from security_setup import ADMIN, ADMIN_PASSWORD, confluent_config, secure_appliance, users_add


def _roundtrip(s, proto: str, mechanism: str, topic: str, user: str = ADMIN,
               password: str = ADMIN_PASSWORD, n: int = 20) -> list[bytes]:
    conf = confluent_config(s, proto, user, password, mechanism)
    p = ck.Producer(conf)
    for i in range(n):
        p.produce(topic, f"{topic}-{i}".encode())
    assert p.flush(30) == 0
    c = ck.Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


def _login_error(s, proto: str, user: str, password: str, mechanism: str = "SCRAM-SHA-512"):
    """The error librdkafka reports for a login (None when it is accepted).

    Metadata is asked for in short tries, the error callback served (by poll()) between them,
    until the metadata comes or librdkafka reports the authentication failure: a refused login
    ends at its error, not at the end of one long metadata timeout."""
    errors = []
    admin = AdminClient(confluent_config(s, proto, user, password, mechanism,
                                         error_cb=errors.append))
    deadline = time.monotonic() + 15
    while True:
        try:
            admin.list_topics(timeout=0.5)
            return None
        except ck.KafkaException as e:
            last = e
        admin.poll(0.1)
        auth = [x for x in errors if x.code() == ck.KafkaError._AUTHENTICATION]
        if auth:
            return auth[0]
        if time.monotonic() > deadline:
            return last.args[0]


def test_every_mechanism_over_sasl_plaintext_and_sasl_ssl(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_PLAINTEXT", "SASL_SSL"),
                         groups={"initial_rebalance_delay_ms": 0})
    for proto in ("SASL_PLAINTEXT", "SASL_SSL"):
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"):
            topic = f"{proto}-{mech}".lower()
            assert _roundtrip(s, proto, mech, topic) == [f"{topic}-{i}".encode() for i in range(20)]
    err = _login_error(s, "SASL_SSL", ADMIN, "wrong")
    assert err is not None and err.code() == ck.KafkaError._AUTHENTICATION
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in err.str()


def test_scram_credentials_online_with_the_admin_client(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL",),
                         groups={"initial_rebalance_delay_ms": 0})
    admin = AdminClient(confluent_config(s, "SASL_SSL"))
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                     b"alice-secret"),
        UserScramCredentialUpsertion("bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                     b"bob-secret", b"some-salt")])
    for f in futures.values():
        f.result(30)
    # A login right after the answer uses the new credential.
    assert _roundtrip(s, "SASL_SSL", "SCRAM-SHA-512", "alices", "alice", "alice-secret") != []
    assert _login_error(s, "SASL_SSL", "bob", "bob-secret", "SCRAM-SHA-256") is None
    assert _login_error(s, "SASL_SSL", "bob", "bob-secret", "PLAIN") is None
    described = admin.describe_user_scram_credentials().result(30)
    assert {u: [(i.mechanism, i.iterations) for i in d.scram_credential_infos]
            for u, d in described.items()} == {
        ADMIN: [(ScramMechanism.SCRAM_SHA_256, 4096), (ScramMechanism.SCRAM_SHA_512, 4096)],
        "alice": [(ScramMechanism.SCRAM_SHA_512, 8192)],
        "bob": [(ScramMechanism.SCRAM_SHA_256, 4096)]}
    # Kafka's refusals, per user.
    bad = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1024),
                                     b"x"),
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)])
    with pytest.raises(ck.KafkaException, match="Too few iterations"):
        bad["carol"].result(30)
    with pytest.raises(ck.KafkaException, match="does not exist"):
        bad["nobody"].result(30)
    with pytest.raises(ck.KafkaException, match="does not exist: ghost"):
        admin.describe_user_scram_credentials(["ghost"])["ghost"].result(30)
    # Deleted: the next login is refused.
    admin.alter_user_scram_credentials([
        UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)])["bob"].result(30)
    err = _login_error(s, "SASL_SSL", "bob", "bob-secret", "SCRAM-SHA-256")
    assert err is not None and err.code() == ck.KafkaError._AUTHENTICATION
    # Durable: after a restart alice still logs in, bob is still gone.
    s.app.terminate()
    s.app.start()
    assert _login_error(s, "SASL_SSL", "alice", "alice-secret") is None
    assert _login_error(s, "SASL_SSL", "bob", "bob-secret", "SCRAM-SHA-256") is not None


def _users(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    return subprocess.run([APPLIANCE, "users", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, env=env)


def test_users_cli_online_and_offline(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL",))
    props = tmp_path / "admin.properties"
    props.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{ADMIN_PASSWORD}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={s.pki.ca}\n")
    online = ["--bootstrap-server", s.bootstrap("SASL_SSL"), "--command-config", str(props)]
    r = _users("add", "dave", "--mechanism", "SCRAM-SHA-512", "--password-stdin", *online,
               stdin="dave-secret\n")
    assert r.returncode == 0, r.stderr
    assert _login_error(s, "SASL_SSL", "dave", "dave-secret") is None
    r = _users("list", *online)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["USER\tMECHANISM\tITERATIONS",
                                     f"{ADMIN}\tSCRAM-SHA-256\t4096", f"{ADMIN}\tSCRAM-SHA-512\t4096",
                                     "dave\tSCRAM-SHA-512\t4096"]
    # kafka-transactions.sh's twin takes the same --command-config.
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    r = subprocess.run([APPLIANCE, "transactions", *online, "list"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.startswith("TransactionalId\t"), r.stderr
    r = _users("delete", "dave", *online)
    assert r.returncode == 0 and "deleted SCRAM-SHA-512" in r.stdout, r.stderr
    assert _login_error(s, "SASL_SSL", "dave", "dave-secret") is not None
    # The running appliance owns its data dir's credentials: offline use is refused.
    r = users_add(s.app.data_dir, "eve", "eve-secret")
    assert r.returncode == 1 and "an appliance is running on" in r.stderr
    # A wrong admin password online is Kafka's authentication failure, exit 1.
    props.write_text(props.read_text().replace(ADMIN_PASSWORD, "wrong"))
    r = _users("list", *online)
    assert r.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in r.stderr
    # Offline again once it is stopped.
    s.app.terminate()
    r = users_add(s.app.data_dir, "eve", "eve-secret", "SCRAM-SHA-256", "--iterations", "10000")
    assert r.returncode == 0, r.stderr
    r = _users("list", "--data-dir", s.app.data_dir)
    assert "eve\tSCRAM-SHA-256\t10000" in r.stdout.splitlines()
    s.app.start()
    assert _login_error(s, "SASL_SSL", "eve", "eve-secret", "SCRAM-SHA-256") is None
