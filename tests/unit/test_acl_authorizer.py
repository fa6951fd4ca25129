"""The authorizer's matching rules (Kafka's StandardAuthorizer), on snapshots built in memory."""

import pytest

from appliance.acl.authorizer import CACHE_MAX, AclSnapshot, Authorizer, kafka_host
from appliance.acl.model import (AclBinding, AclFilter, AclOperation as O,
                                 AclPermissionType as A, PatternType as P, ResourceType as R,
                                 SUPPORTED_OPERATIONS, operation_name, operations_bitfield,
                                 parse_operation, parse_resource_type, validate_filter,
                                 validate_new_acl)

ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(rtype=R.TOPIC, name="orders", principal=ALICE, op=O.READ, perm=A.ALLOW,
        pattern=P.LITERAL, host="*"):
    return AclBinding(int(rtype), name, int(pattern), principal, host, int(op), int(perm))


class Snapshots:
    """A published snapshot that a test can replace, as the supervisor does."""

    def __init__(self, *acls):
        self.current = AclSnapshot(1, acls)

    def set(self, *acls):
        self.current = AclSnapshot(self.current.version + 1, acls)

    def __call__(self):
        return self.current


class _Authorizer(Authorizer):
    """With a ``snaps`` attribute (the base class has slots)."""


def authz(*acls, super_users=(), allow_if_no_acl=False):
    snaps = Snapshots(*acls)
    a = _Authorizer(True, super_users, allow_if_no_acl, snaps)
    a.snaps = snaps
    return a


def can(a, op, name="orders", rtype=R.TOPIC, principal=ALICE, host=HOST):
    return a.authorize(principal, host, int(op), int(rtype), name)


def test_disabled_authorizer_allows_everything_and_reports_every_supported_operation():
    a = Authorizer(False, (), False, lambda: AclSnapshot(1, [acl(perm=A.DENY, op=O.ALL)]))
    assert can(a, O.WRITE) and can(a, O.ALTER, "kafka-cluster", R.CLUSTER)
    assert a.authorize_by_resource_type(ALICE, HOST, O.WRITE, R.TOPIC)
    assert a.authorized_operations(ALICE, HOST, R.TOPIC, "x") == operations_bitfield(
        SUPPORTED_OPERATIONS[R.TOPIC])


def test_no_acl_denies_unless_allow_everyone_if_no_acl_found():
    assert not can(authz(), O.READ)
    assert can(authz(allow_if_no_acl=True), O.READ)


def test_acls_for_another_principal_mean_the_default_no_longer_applies():
    # Kafka: allow.everyone.if.no.acl.found only when the resource has no ACL at all.
    a = authz(acl(principal=BOB), allow_if_no_acl=True)
    assert not can(a, O.READ)
    assert can(a, O.READ, principal=BOB)
    assert can(a, O.READ, name="other")           # no ACL on "other"


def test_super_user_may_do_everything_even_when_denied():
    a = authz(acl(op=O.ALL, perm=A.DENY), super_users=[ALICE])
    assert can(a, O.WRITE) and can(a, O.ALTER, "kafka-cluster", R.CLUSTER)
    assert not can(a, O.READ, principal=BOB)


def test_literal_acl_applies_to_its_name_only():
    a = authz(acl(name="foo"))
    assert can(a, O.READ, "foo")
    assert not can(a, O.READ, "foobar") and not can(a, O.READ, "fo")


def test_prefixed_acl_applies_to_names_that_start_with_it():
    a = authz(acl(name="foo", pattern=P.PREFIXED))
    assert can(a, O.READ, "foo") and can(a, O.READ, "foobar")
    assert not can(a, O.READ, "fo") and not can(a, O.READ, "barfoo")


def test_several_prefix_lengths_are_all_found():
    a = authz(acl(name="f", pattern=P.PREFIXED, op=O.READ),
              acl(name="foob", pattern=P.PREFIXED, op=O.WRITE),
              acl(name="fooba", pattern=P.LITERAL, op=O.DELETE))
    assert can(a, O.READ, "foobar") and can(a, O.WRITE, "foobar")
    assert not can(a, O.DELETE, "foobar")          # a literal that is only a prefix
    assert not can(a, O.WRITE, "foo")


def test_wildcard_resource_applies_to_every_resource_of_its_type_only():
    a = authz(acl(name="*"))
    assert can(a, O.READ, "anything") and can(a, O.READ, "*")
    assert not can(a, O.READ, "anything", R.GROUP)


def test_wildcard_principal_applies_to_every_principal():
    a = authz(acl(principal="User:*"))
    assert can(a, O.READ) and can(a, O.READ, principal=BOB)
    assert can(a, O.READ, principal="Group:x")   # Kafka: User:* matches any session principal
    b = authz(acl(principal="Group:*"))
    assert not can(b, O.READ)                     # only User:* is the wildcard


def test_host_must_match_unless_wildcard():
    a = authz(acl(host="10.0.0.1"))
    assert can(a, O.READ, host="10.0.0.1")
    assert not can(a, O.READ, host="10.0.0.2")


def test_ipv6_hosts_are_compared_in_javas_form():
    assert kafka_host("::1") == "0:0:0:0:0:0:0:1"
    assert kafka_host("::ffff:10.0.0.1") == "10.0.0.1"
    assert kafka_host("fe80::1%eth0") == "fe80:0:0:0:0:0:0:1%eth0"
    assert kafka_host("10.0.0.1") == "10.0.0.1"
    a = authz(acl(host="0:0:0:0:0:0:0:1"), acl(name="v4", host="10.0.0.1"))
    assert can(a, O.READ, host="::1")
    assert can(a, O.READ, "v4", host="::ffff:10.0.0.1")


@pytest.mark.parametrize("granted,implied", [
    (O.READ, O.DESCRIBE), (O.WRITE, O.DESCRIBE), (O.DELETE, O.DESCRIBE), (O.ALTER, O.DESCRIBE),
    (O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS)])
def test_allow_implies_describe(granted, implied):
    a = authz(acl(op=granted))
    assert can(a, implied)


@pytest.mark.parametrize("granted,other", [
    (O.WRITE, O.READ), (O.READ, O.WRITE), (O.CREATE, O.DESCRIBE), (O.DESCRIBE, O.READ),
    (O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS), (O.WRITE, O.TWO_PHASE_COMMIT),
    (O.IDEMPOTENT_WRITE, O.WRITE), (O.DESCRIBE_CONFIGS, O.DESCRIBE)])
def test_an_operation_implies_no_other(granted, other):
    assert not can(authz(acl(op=granted)), other)


def test_deny_implies_nothing():
    # A DENY of Read does not deny Describe (only ALLOWs imply).
    a = authz(acl(op=O.ALL), acl(op=O.READ, perm=A.DENY))
    assert not can(a, O.READ)
    assert can(a, O.DESCRIBE) and can(a, O.WRITE)


def test_all_allows_and_denies_every_operation():
    a = authz(acl(op=O.ALL))
    for op in O:
        if op not in (O.UNKNOWN, O.ANY):
            assert can(a, op), op
    d = authz(acl(op=O.ALL), acl(op=O.ALL, perm=A.DENY, principal="User:*"))
    assert not any(can(d, op) for op in (O.READ, O.WRITE, O.DESCRIBE, O.TWO_PHASE_COMMIT))


@pytest.mark.parametrize("deny", [
    acl(op=O.WRITE, perm=A.DENY),                                   # same literal
    acl(name="ord", pattern=P.PREFIXED, op=O.WRITE, perm=A.DENY),   # a prefix
    acl(name="*", op=O.WRITE, perm=A.DENY),                         # the wildcard
    acl(op=O.WRITE, perm=A.DENY, principal="User:*"),               # every principal
    acl(op=O.WRITE, perm=A.DENY, host=HOST),                        # this host
])
def test_deny_beats_allow(deny):
    a = authz(acl(op=O.WRITE), acl(name="*", op=O.ALL, pattern=P.LITERAL), deny)
    assert not can(a, O.WRITE)
    assert can(a, O.READ)


def test_deny_for_another_host_does_not_apply():
    a = authz(acl(op=O.WRITE), acl(op=O.WRITE, perm=A.DENY, host="10.9.9.9"))
    assert can(a, O.WRITE)


def test_decisions_follow_a_new_snapshot():
    a = authz(acl(op=O.WRITE))
    assert can(a, O.WRITE)
    a.snaps.set(acl(op=O.WRITE), acl(op=O.WRITE, perm=A.DENY))
    assert not can(a, O.WRITE)
    a.snaps.set()
    assert not can(a, O.WRITE)


def test_cache_is_bounded():
    a = authz(acl(name="t", pattern=P.PREFIXED))
    for i in range(CACHE_MAX + 10):
        can(a, O.READ, f"t{i}")
    assert len(a._cache) <= CACHE_MAX


def test_authorized_operations_bitfield():
    a = authz(acl(op=O.WRITE), acl(op=O.ALTER_CONFIGS))
    ops = a.authorized_operations(ALICE, HOST, R.TOPIC, "orders")
    assert ops == operations_bitfield([O.WRITE, O.DESCRIBE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS])
    cluster = authz(acl(R.CLUSTER, "kafka-cluster", op=O.DESCRIBE))
    assert cluster.authorized_operations(ALICE, HOST, R.CLUSTER, "kafka-cluster") == 1 << O.DESCRIBE


# -- authorizeByResourceType (Kafka's default implementation) ---------------------------------------

def by_type(a, op=O.WRITE, rtype=R.TOPIC, principal=ALICE, host=HOST):
    return a.authorize_by_resource_type(principal, host, int(op), int(rtype))


def test_by_resource_type_any_allowed_resource():
    assert not by_type(authz())
    assert by_type(authz(acl(op=O.WRITE, name="t1")))
    assert by_type(authz(acl(op=O.ALL, name="t1")))
    assert not by_type(authz(acl(op=O.READ, name="t1")))
    assert not by_type(authz(acl(op=O.WRITE, name="t1", principal=BOB)))
    assert by_type(authz(acl(op=O.WRITE, name="t1", principal="User:*")))
    assert not by_type(authz(acl(op=O.WRITE, name="t1", host="10.9.9.9")))


def test_by_resource_type_denies_that_cover_the_allow():
    assert not by_type(authz(acl(op=O.WRITE, name="t1"), acl(op=O.WRITE, name="t1", perm=A.DENY)))
    assert not by_type(authz(acl(op=O.WRITE, name="t1"),
                             acl(op=O.WRITE, name="t", pattern=P.PREFIXED, perm=A.DENY)))
    assert not by_type(authz(acl(op=O.WRITE, name="abc", pattern=P.PREFIXED),
                             acl(op=O.WRITE, name="ab", pattern=P.PREFIXED, perm=A.DENY)))
    # A denied literal does not cover an allowed prefix, nor a longer denied prefix a shorter one.
    assert by_type(authz(acl(op=O.WRITE, name="t", pattern=P.PREFIXED),
                         acl(op=O.WRITE, name="t", perm=A.DENY)))
    assert by_type(authz(acl(op=O.WRITE, name="ab", pattern=P.PREFIXED),
                         acl(op=O.WRITE, name="abc", pattern=P.PREFIXED, perm=A.DENY)))


def test_by_resource_type_wildcards():
    assert by_type(authz(acl(op=O.WRITE, name="*")))
    assert not by_type(authz(acl(op=O.WRITE, name="*"), acl(op=O.WRITE, name="*", perm=A.DENY)))
    assert not by_type(authz(acl(op=O.WRITE, name="t1"), acl(op=O.WRITE, name="*", perm=A.DENY)))


def test_by_resource_type_super_user_and_no_acl_default():
    assert by_type(authz(acl(op=O.WRITE, name="*", perm=A.DENY), super_users=[ALICE]))
    assert by_type(authz(allow_if_no_acl=True))


# -- filters (DescribeAcls, DeleteAcls) ---------------------------------------------------------------

SNAP = AclSnapshot(1, [acl(name="orders"), acl(name="ord", pattern=P.PREFIXED),
                       acl(name="*"), acl(R.GROUP, "orders"), acl(name="other", principal=BOB)])


def names(f):
    return sorted((a.resource_type, a.resource_name, a.pattern_type) for a in SNAP.matching(f))


def test_filter_any_and_exact():
    assert len(SNAP.matching(AclFilter())) == 5
    assert names(AclFilter(R.TOPIC, "orders", P.ANY)) == [(R.TOPIC, "orders", P.LITERAL)]
    assert names(AclFilter(R.TOPIC, "ord", P.PREFIXED)) == [(R.TOPIC, "ord", P.PREFIXED)]
    assert names(AclFilter(R.TOPIC, "orders", P.PREFIXED)) == []


def test_filter_match_finds_every_pattern_that_applies():
    assert names(AclFilter(R.TOPIC, "orders", P.MATCH)) == [
        (R.TOPIC, "*", P.LITERAL), (R.TOPIC, "ord", P.PREFIXED), (R.TOPIC, "orders", P.LITERAL)]


def test_filter_entry_fields():
    assert names(AclFilter(principal=BOB)) == [(R.TOPIC, "other", P.LITERAL)]
    assert names(AclFilter(operation=O.WRITE)) == []
    assert len(SNAP.matching(AclFilter(permission_type=A.ALLOW, host="*"))) == 5


# -- validation and names ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    acl(R.CLUSTER, "not-the-cluster"), acl(name=""), acl(pattern=P.MATCH), acl(pattern=P.ANY),
    acl(op=O.ANY), acl(perm=A.ANY), acl(rtype=R.ANY), acl(principal="alice")])
def test_invalid_new_acls_are_refused(bad):
    code, _ = validate_new_acl(bad)
    assert code.name == "invalid_request"


def test_valid_new_acls():
    assert validate_new_acl(acl()) is None
    assert validate_new_acl(acl(R.CLUSTER, "kafka-cluster", op=O.ALTER)) is None
    assert validate_new_acl(acl(R.TRANSACTIONAL_ID, "tx", op=O.TWO_PHASE_COMMIT)) is None


def test_filter_validation():
    assert validate_filter(AclFilter()) is None
    assert validate_filter(AclFilter(operation=0)) is not None


def test_names_round_trip():
    assert operation_name(O.CLUSTER_ACTION) == "ClusterAction"
    assert operation_name(O.TWO_PHASE_COMMIT) == "TwoPhaseCommit"
    assert parse_operation("ClusterAction") == O.CLUSTER_ACTION
    assert parse_operation("idempotent_write") == O.IDEMPOTENT_WRITE
    assert parse_resource_type("TransactionalId") == R.TRANSACTIONAL_ID
    with pytest.raises(ValueError):
        parse_operation("Fly")
