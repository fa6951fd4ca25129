"""The ACL APIs end to end (CreateAcls, DescribeAcls, DeleteAcls): through confluent-kafka's and
kafka-python's admin clients, Kafka's Java AdminClient (tests/java/AclAdmin.java) and the raw wire
at every version; without the authorizer (SECURITY_DISABLED); requests too big for one
operation; super users, the no-ACL default and a change seen at once by every connection.

The refusals of the other APIs by the authorizer are test_acls.py's.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError as CKError, KafkaException, Producer
from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType,
                                   ResourcePatternType, ResourceType)

from appliance_harness import log_errors
from java_programs import java_program  # noqa: F401 (fixture)
from raw_wire import INVALID_REQUEST, SECURITY_DISABLED, TOPIC_AUTHORIZATION_FAILED, RawClient
from security_setup import ANONYMOUS, Acl, Principal, any_filter, produce_one, secure


def test_acl_apis_with_confluent_admin(appliance_factory):
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    admin = Principal(ANONYMOUS, a.bootstrap).admin()
    acls = [Acl("Topic", "orders", "Read", principal="User:alice"),
            Acl("Topic", "ord", "Write", principal="User:alice", pattern="PREFIXED"),
            Acl("Group", "g", "All", principal="User:bob", permission="Deny", host="10.0.0.1"),
            Acl("Cluster", "kafka-cluster", "Alter", principal="User:admin")]
    bindings = [x.confluent() for x in acls]
    for f in admin.create_acls(bindings, request_timeout=20).values():
        assert f.result() is None
    bad = Acl("Cluster", "not-the-cluster", "Alter").confluent()
    with pytest.raises(KafkaException) as e:
        admin.create_acls([bad], request_timeout=20)[bad].result()
    assert e.value.args[0].code() == CKError.INVALID_REQUEST
    assert set(admin.describe_acls(any_filter(), request_timeout=20).result()) == set(bindings)
    match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    assert set(admin.describe_acls(match, request_timeout=20).result()) == set(bindings[:2])
    # Durable: the same after a restart.
    a.terminate()
    a.start()
    admin = Principal(ANONYMOUS, a.bootstrap).admin()
    assert set(admin.describe_acls(any_filter(), request_timeout=20).result()) == set(bindings)
    topic_filter = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None,
                                    AclOperation.ANY, AclPermissionType.ANY)
    deleted = admin.delete_acls([topic_filter], request_timeout=20)[topic_filter].result()
    assert set(deleted) == set(bindings[:2])
    assert set(admin.describe_acls(any_filter(), request_timeout=20).result()) == set(bindings[2:])
    assert not log_errors(a, 0)


def test_acl_apis_with_kafka_python(appliance_factory):
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType,
                             ACLResourcePatternType, KafkaAdminClient, ResourcePattern,
                             ResourcePatternFilter, ResourceType as KResourceType)
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    admin = KafkaAdminClient(bootstrap_servers=a.bootstrap, request_timeout_ms=20000)
    try:
        acl = ACL("User:carol", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                  ResourcePattern(KResourceType.TOPIC, "carols", ACLResourcePatternType.LITERAL))
        r = admin.create_acls([acl])
        assert r["succeeded"] == [acl] and not r["failed"]
        flt = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(KResourceType.ANY, None, ACLResourcePatternType.ANY))
        acls, error = admin.describe_acls(flt)
        assert [(x.principal, x.resource_pattern.resource_name) for x in acls] == [("User:carol", "carols")]
        deleted = admin.delete_acls([flt])
        assert [x.principal for x in deleted[0][1]] == ["User:carol"]
        assert admin.describe_acls(flt)[0] == []
    finally:
        admin.close()


def test_acl_apis_answer_security_disabled_without_the_authorizer(appliance):
    admin = Principal(ANONYMOUS, appliance.bootstrap).admin()
    # librdkafka drops DescribeAcls' error code (an empty list); the wire shows it.
    assert admin.describe_acls(any_filter(), request_timeout=20).result() == []
    with RawClient(appliance.bootstrap) as r:
        d = r.request(29, 3, {"resource_type_filter": 1, "resource_name_filter": None,
                              "pattern_type_filter": 1, "principal_filter": None,
                              "host_filter": None, "operation": 1, "permission_type": 1})
        assert (d.error_code, d.error_message) == (SECURITY_DISABLED,
                                                   "No Authorizer is configured on the broker")
    new = Acl("Topic", "t", "Read").confluent()
    with pytest.raises(KafkaException) as e:
        admin.create_acls([new], request_timeout=20)[new].result()
    assert e.value.args[0].code() == CKError.SECURITY_DISABLED


@pytest.mark.parametrize("version", [1, 2, 3])
def test_acl_apis_at_every_version(appliance_factory, version):
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    with RawClient(a.bootstrap) as r:
        create = r.request(30, version, {"creations": [
            {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 4, "principal": "User:x",
             "host": "*", "operation": 3, "permission_type": 3},
            {"resource_type": 2, "resource_name": "", "resource_pattern_type": 3, "principal": "User:x",
             "host": "*", "operation": 3, "permission_type": 3}]})
        assert [c.error_code for c in create.results] == [0, INVALID_REQUEST]
        describe = r.request(29, version, {
            "resource_type_filter": 2, "resource_name_filter": "topic", "pattern_type_filter": 2,
            "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1})
        assert describe.error_code == 0
        assert [(x.resource_name, x.pattern_type, [acl.principal for acl in x.acls])
                for x in describe.resources] == [("t", 4, ["User:x"])]
        delete = r.request(31, version, {"filters": [
            {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
             "principal_filter": "User:x", "host_filter": None, "operation": 1, "permission_type": 1}]})
        (fr,) = delete.filter_results
        assert fr.error_code == 0 and [m.resource_name for m in fr.matching_acls] == ["t"]


@pytest.mark.parametrize("api_key,body", [
    (29, {"resource_type_filter": 0, "resource_name_filter": None, "pattern_type_filter": 1,
          "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}),
    (30, {"creations": [{"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
                         "principal": "User:x", "host": "*", "operation": 0, "permission_type": 3}]}),
    (31, {"filters": [{"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 0,
                       "principal_filter": None, "host_filter": None, "operation": 1,
                       "permission_type": 1}]}),
])
def test_unknown_acl_elements_close_the_connection(appliance_factory, api_key, body):
    """Kafka refuses to parse an ACL request with an UNKNOWN element: the connection is closed."""
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    with RawClient(a.bootstrap) as r:
        r.request(api_key, 3, body, expect_response=False)
        assert r.closed_by_peer()
    with RawClient(a.bootstrap) as r:          # the frontend is fine
        assert r.request(29, 3, {"resource_type_filter": 1, "resource_name_filter": None,
                                 "pattern_type_filter": 1, "principal_filter": None,
                                 "host_filter": None, "operation": 1,
                                 "permission_type": 1}).error_code == 0


def test_acl_requests_too_big_for_one_operation_are_refused_and_nothing_breaks(appliance_factory):
    """Kafka's controller changes at most 10,000 ACLs per operation; an answer listing more
    deleted ACLs than a ring holds is refused the same way (nothing deleted); an ACL larger than
    half a ring is refused alone. The appliance goes on serving."""
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]},
                          shm={"small_ring_bytes": 65536})

    def creation(name, principal="User:x"):
        return {"resource_type": 2, "resource_name": name, "resource_pattern_type": 3,
                "principal": principal, "host": "*", "operation": 3, "permission_type": 3}
    every = {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
             "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}
    with RawClient(a.bootstrap, timeout=60) as r:
        over = r.request(30, 3, {"creations": [creation(f"t{i}") for i in range(10001)]})
        assert {c.error_code for c in over.results} == {-1}                  # UNKNOWN_SERVER_ERROR
        # Kafka's strings stop at 32,767 bytes (a longer one closes the connection, as the codec
        # refuses it); two long ones make an ACL larger than half the 64 KiB ring.
        huge = r.request(30, 3, {"creations": [creation("h" * 32000, "User:" + "p" * 2000),
                                               creation("small")]})
        assert [c.error_code for c in huge.results] == [INVALID_REQUEST, 0]
        # 600 ACLs of ~100 bytes: more than a 64 KiB ring's answer may list.
        many = r.request(30, 3, {"creations": [creation(f"topic-{i:04d}-" + "x" * 80) for i in range(600)]})
        assert {c.error_code for c in many.results} == {0}
        refused = r.request(31, 3, {"filters": [every]})
        assert refused.filter_results[0].error_code == -1
        assert "Cannot remove more than" in refused.filter_results[0].error_message
        d = r.request(29, 3, every)
        assert sum(len(x.acls) for x in d.resources) == 601                   # nothing deleted
        narrow = dict(every, resource_type_filter=2, resource_name_filter="small",
                      pattern_type_filter=3)
        ok = r.request(31, 3, {"filters": [narrow]})
        assert [m.resource_name for m in ok.filter_results[0].matching_acls] == ["small"]
    assert a.proc.poll() is None and not log_errors(a, 0)


# -- super users, the no-ACL default, changes seen at once ----------------------------------------------

def test_super_user_may_do_everything_even_when_denied(appliance_factory):
    a = appliance_factory(start=False)
    p = secure(a, [Acl("Topic", "*", "All", principal="User:*", permission="Deny")], {"t": 1},
               super_users=[ANONYMOUS])
    assert produce_one(p, "t") == 0
    admin = p.admin()
    assert len(admin.describe_acls(any_filter(), request_timeout=20).result()) == 1


def test_allow_everyone_if_no_acl_found(appliance_factory):
    a = appliance_factory(start=False)
    p = secure(a, [Acl("Topic", "bobs", "All", principal="User:bob")], {"open": 1, "bobs": 1},
               allow_everyone_if_no_acl_found=True)
    assert produce_one(p, "open") == 0                   # no ACL on it: everyone
    assert produce_one(p, "bobs") == TOPIC_AUTHORIZATION_FAILED     # ACLs, none for ANONYMOUS


def test_acl_changes_apply_to_every_connection_as_soon_as_answered(appliance_factory):
    """The CreateAcls answer leaves after every frontend can see the new ACLs: a producer on
    another connection is refused at once, with no wait."""
    a = appliance_factory(start=False)
    p = secure(a, [], {"t": 1}, allow_everyone_if_no_acl_found=True)
    prod = Producer(p.confluent(**{"message.timeout.ms": 10000}))
    got = []
    prod.produce("t", b"before", on_delivery=lambda err, msg: got.append(err))
    prod.flush(20)
    assert got == [None]
    admin = p.admin()            # no ACL on the Cluster yet: ANONYMOUS may change ACLs
    deny = Acl("Topic", "t", "Write", permission="Deny").confluent()
    assert admin.create_acls([deny], request_timeout=20)[deny].result() is None
    prod.produce("t", b"after", on_delivery=lambda err, msg: got.append(err))
    prod.flush(20)
    assert got[1] is not None and got[1].code() == CKError.TOPIC_AUTHORIZATION_FAILED


# -- the Java AdminClient ----------------------------------------------------------------------------

def run_java(java_program, bootstrap, mode) -> list[str]:
    """tests/java/AclAdmin.java (compiled against kafka-clients 3.9.1 by ``java_program``) in
    ``mode``: its output lines."""
    r = java_program.process("AclAdmin", bootstrap, mode, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_java_admin_client_acls(appliance_factory, java_program):
    a = appliance_factory(authorizer={"enable": True, "super_users": [ANONYMOUS]})
    assert run_java(java_program, a.bootstrap, "roundtrip") == [
        "created 2", "described 2 true true", "matched 1 true",
        "bad cluster InvalidRequestException", "deleted 2", "left 0"]


def test_java_admin_client_refused_without_describe_and_alter(appliance_factory, java_program):
    a = appliance_factory(authorizer={"enable": True})
    assert run_java(java_program, a.bootstrap, "refused") == [
        "describe ClusterAuthorizationException", "create ClusterAuthorizationException"]
