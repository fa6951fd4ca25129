"""kafka-acls.sh's rules for turning a command line into ACLs (appliance.client.acl_admin.plan)."""

import pytest

from appliance.client.acl_admin import UsageError, entry_str, plan, resource_str, resources
from appliance.acl.model import AclOperation as O, AclPermissionType as A, PatternType as P
from appliance.acl.model import ResourceType as R

TOPIC = (int(R.TOPIC), "t", int(P.LITERAL))


def test_every_principal_host_and_operation():
    got = plan([TOPIC], allow_principals=["User:a", "User:b"], allow_hosts=["h1", "h2"],
               operations=[O.READ, O.WRITE])
    assert len(got[TOPIC]) == 8
    assert ("User:a", "h2", O.WRITE, A.ALLOW) in got[TOPIC]


def test_hosts_default_to_the_wildcard_and_all_is_the_default_operation():
    got = plan([TOPIC], allow_principals=["User:a"], deny_principals=["User:m"])
    assert got[TOPIC] == {("User:a", "*", O.ALL, A.ALLOW), ("User:m", "*", O.ALL, A.DENY)}


def test_producer_and_consumer_shorthands():
    res = resources(topics=["t"], groups=["g"], transactional_ids=["x"])
    got = plan(res, allow_principals=["User:a"], producer=True, consumer=True, idempotent=True)
    ops = {r: {e[2] for e in es} for r, es in got.items()}
    assert ops[TOPIC] == {O.WRITE, O.DESCRIBE, O.CREATE, O.READ}
    assert ops[(R.GROUP, "g", P.LITERAL)] == {O.READ}
    assert ops[(R.TRANSACTIONAL_ID, "x", P.LITERAL)] == {O.WRITE, O.DESCRIBE}
    assert ops[(R.CLUSTER, "kafka-cluster", P.LITERAL)] == {O.IDEMPOTENT_WRITE}


def test_cluster_only_for_literal_patterns():
    assert resources(cluster=True) == [(R.CLUSTER, "kafka-cluster", P.LITERAL)]
    assert resources(cluster=True, pattern=P.PREFIXED) == []


@pytest.mark.parametrize("kw,why", [
    (dict(res=[], allow_principals=["User:a"]), "at least one resource"),
    (dict(res=[TOPIC], allow_principals=["a"]), "principalType:principalName"),
    (dict(res=[TOPIC], allow_principals=["User:a"], operations=[O.CLUSTER_ACTION]),
     "only supports operations"),
    (dict(res=[(R.GROUP, "g", P.LITERAL)], allow_principals=["User:a"], producer=True),
     "--producer you must specify a --topic"),
])
def test_refusals(kw, why):
    with pytest.raises(UsageError, match=why):
        plan(kw.pop("res"), **kw)


def test_two_phase_commit_is_a_transactional_id_operation():
    got = plan([(R.TRANSACTIONAL_ID, "x", P.PREFIXED)], allow_principals=["User:a"],
               operations=[O.TWO_PHASE_COMMIT])
    assert {e[2] for e in got[(R.TRANSACTIONAL_ID, "x", P.PREFIXED)]} == {O.TWO_PHASE_COMMIT}


def test_kafkas_printed_forms():
    assert resource_str(R.TOPIC, "t", P.PREFIXED) == \
        "ResourcePattern(resourceType=TOPIC, name=t, patternType=PREFIXED)"
    assert entry_str("User:a", "*", O.CLUSTER_ACTION, A.DENY) == \
        "(principal=User:a, host=*, operation=CLUSTER_ACTION, permissionType=DENY)"
