"""The Java client (kafka-clients 3.9.1, as Spark 4 ships it; tests/java/SecureClients.java, run
through java_programs) over SASL_SSL with SCRAM-SHA-512 and SCRAM-SHA-256: the AdminClient creates a
user with alterUserScramCredentials and reads it back, and that user produces (idempotent and
transactional) and consumes read_committed in a group, with the authorizer on and only the ACLs
it needs (the admin is the super user); a wrong password is Kafka's SaslAuthenticationException."""

from __future__ import annotations

from java_programs import java_program  # noqa: F401 (fixture)
from security_setup import ADMIN, ADMIN_PASSWORD, grant, secure_appliance


def test_java_client_over_sasl_ssl(appliance_factory, tmp_path, java_program):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL",),
                         groups={"initial_rebalance_delay_ms": 0},
                         authorizer={"enable": True, "super_users": [f"User:{ADMIN}"]})
    # What SecureClients' roundtrip needs: the topic (auto-created), its transactional id and group.
    grant(s, "javauser", [("TOPIC", "java-topic", "LITERAL", "ALL"),
                          ("TRANSACTIONAL_ID", "java-java-topic", "LITERAL", "WRITE"),
                          ("GROUP", "java-java-topic", "LITERAL", "READ")])
    common = [s.bootstrap("SASL_SSL"), s.pki.ca]
    got = java_program("SecureClients", *common, "SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD,
                       "add-user", "javauser", "java-secret", timeout=300)
    assert got == {"described": "javauser SCRAM_SHA_512 8192"}
    got = java_program("SecureClients", *common, "SCRAM-SHA-512", "javauser", "java-secret",
                       "roundtrip", "java-topic", timeout=300)
    assert got["produced"] == "100" and got["transactions"] == "done", got
    assert got["consumed"] == "plain 100 committed 10 aborted 0", got
    assert int(got["committed"].split()[-1]) >= 110, got
    # A wrong password is refused: the program fails with Kafka's authentication error.
    r = java_program.process("SecureClients", *common, "SCRAM-SHA-512", "javauser", "wrong",
                             "add-user", "x", "y", timeout=300)
    assert r.returncode != 0
    assert "SaslAuthenticationException" in r.stderr
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in r.stderr
