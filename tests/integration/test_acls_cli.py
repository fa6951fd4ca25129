"""`appliance acls add|list|remove` (kafka-acls.sh) against the real appliance, run as an operator
runs it: a subprocess, over the Kafka protocol."""

from __future__ import annotations

import os
import subprocess
import sys

from confluent_kafka import Producer

from security_setup import ANONYMOUS, Principal

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")


def acls(app, *args, ok=True, stdin=None):
    r = subprocess.run([APPLIANCE, "acls", "--bootstrap-server", app.bootstrap, *args],
                       capture_output=True, text=True, timeout=120, input=stdin,
                       env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_add_list_remove(appliance_factory):
    app = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    out = acls(app, "add", "--allow-principal", "User:alice", "--allow-principal", "User:bob",
               "--operation", "Read", "--operation", "Describe", "--topic", "orders").stdout
    assert "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`" in out
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in out
    acls(app, "add", "--deny-principal", "User:mallory", "--deny-host", "10.0.0.9",
         "--group", "g", "--resource-pattern-type", "PREFIXED")
    acls(app, "add", "--allow-principal", "User:admin", "--operation", "Alter", "--cluster")
    acls(app, "add", "--allow-principal", "User:spark", "--operation", "TwoPhaseCommit",
         "--operation", "Write", "--transactional-id", "spark-")
    acls(app, "add", "--allow-principal", "User:carol", "--producer", "--topic", "logs",
         "--transactional-id", "tx", "--idempotent")
    every = acls(app, "list").stdout
    for line in ("Current ACLs for resource `ResourcePattern(resourceType=GROUP, name=g, patternType=PREFIXED)`",
                 "(principal=User:mallory, host=10.0.0.9, operation=ALL, permissionType=DENY)",
                 "(principal=User:admin, host=*, operation=ALTER, permissionType=ALLOW)",
                 "(principal=User:spark, host=*, operation=TWO_PHASE_COMMIT, permissionType=ALLOW)",
                 "(principal=User:carol, host=*, operation=CREATE, permissionType=ALLOW)",
                 "(principal=User:carol, host=*, operation=IDEMPOTENT_WRITE, permissionType=ALLOW)"):
        assert line in every, line
    # The same ACLs, seen by another client: confluent-kafka's AdminClient.
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)
    admin = Principal(ANONYMOUS, app.bootstrap).admin()      # kept: its futures need it alive
    listed = admin.describe_acls(AclBindingFilter(
        ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None, AclOperation.ANY,
        AclPermissionType.ANY), request_timeout=20).result()
    assert sorted((b.principal, b.operation) for b in listed) == [
        ("User:alice", AclOperation.READ), ("User:alice", AclOperation.DESCRIBE),
        ("User:bob", AclOperation.READ), ("User:bob", AclOperation.DESCRIBE)]
    # --principal narrows the listing; a topic narrows it to that resource.
    only = acls(app, "list", "--topic", "orders", "--principal", "User:bob").stdout
    assert "ACLs for principal `User:bob`" in only and "User:alice" not in only
    # Remove one principal's ACLs, then everything on a resource (asks unless --force).
    acls(app, "remove", "--allow-principal", "User:bob", "--operation", "Read", "--operation",
         "Describe", "--topic", "orders", "--force")
    left = acls(app, "list", "--topic", "orders").stdout
    assert "User:alice" in left and "User:bob" not in left
    declined = acls(app, "remove", "--topic", "orders", stdin="n\n")
    assert "Are you sure you want to delete all ACLs" in declined.stdout
    assert "User:alice" in acls(app, "list", "--topic", "orders").stdout
    acls(app, "remove", "--topic", "orders", stdin="y\n")
    assert "orders" not in acls(app, "list").stdout


def test_bad_command_lines_are_refused_before_asking_the_broker(appliance_factory):
    app = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    for args, why in (
            (["add", "--topic", "t"], "--allow-principal, --deny-principal"),
            (["add", "--allow-principal", "User:a"], "at least one resource"),
            (["add", "--allow-principal", "alice", "--topic", "t"], "principalType:principalName"),
            (["add", "--allow-principal", "User:a", "--operation", "IdempotentWrite", "--topic", "t"],
             "ResourceType TOPIC only supports operations"),
            (["add", "--allow-principal", "User:a", "--resource-pattern-type", "MATCH", "--topic", "t"],
             "not valid when adding acls"),
            (["add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"], "unknown")):
        r = acls(app, *args, ok=False)
        assert r.returncode == 2 and why in r.stderr, (args, r.stderr)


def test_changes_refused_without_alter_on_the_cluster(appliance_factory):
    """kafka-acls.sh run by a principal without Alter on the Cluster: Kafka's error, exit 1."""
    app = appliance_factory(authorizer={"enable": True})
    r = acls(app, "add", "--allow-principal", ANONYMOUS, "--topic", "t", ok=False)
    assert r.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in r.stderr
    r = acls(app, "list", ok=False)
    assert r.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in r.stderr
    # The refusal changed nothing: a producer is still refused.
    got = []
    p = Producer({"bootstrap.servers": app.bootstrap, "message.timeout.ms": 10000})
    p.produce("t", b"v", on_delivery=lambda err, msg: got.append(err))
    p.flush(20)
    assert got[0] is not None and got[0].code() == 29      # TOPIC_AUTHORIZATION_FAILED


def test_security_disabled_without_the_authorizer(appliance):
    r = acls(appliance, "list", ok=False)
    assert r.returncode == 1 and "SECURITY_DISABLED" in r.stderr
