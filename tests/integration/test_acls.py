"""The authorizer end to end: real clients refused with Kafka's error codes (the ACL APIs
themselves: test_acls_apis.py).

Most tests share one appliance (``locked``) whose principal has these ACLs (and is no super user;
allow_everyone_if_no_acl_found is off):

    Topic  PREFIXED ok-     All             Topic  LITERAL  ro-t    Read
    Topic  LITERAL  wo-t    Write           Topic  LITERAL  deny-t  All, and DENY Write
    Topic  PREFIXED auto-   Create          Group  PREFIXED g-ok    Read
    TransactionalId PREFIXED tx-ok  Write   TransactionalId LITERAL tx-2pc  Write, TwoPhaseCommit
    TransactionalId LITERAL tx-no2pc Write  Cluster  Describe
    (hidden-t has no ACL at all)

Each refusal is checked for its exact code, through a real client where the client surfaces it
and at the wire (RawClient) where it does not.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, KafkaException, Producer
from confluent_kafka.admin import AclOperation

from appliance.client import KafkaError as ApplianceKafkaError
from appliance.client import Producer as ApplianceProducer
from appliance_harness import module_appliance, watching
from raw_wire import (CLUSTER_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
                      TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                      UNKNOWN_TOPIC_OR_PARTITION, RawClient)
from security_setup import Acl, Principal, any_filter, produce_one, secure

NOT_REQUESTED = -2147483648

LOCKED_ACLS = [
    Acl("Topic", "ok-", "All", pattern="PREFIXED"),
    Acl("Topic", "ro-t", "Read"),
    Acl("Topic", "wo-t", "Write"),
    Acl("Topic", "deny-t", "All"),
    Acl("Topic", "deny-t", "Write", permission="Deny"),
    Acl("Topic", "auto-", "Create", pattern="PREFIXED"),
    Acl("Group", "g-ok", "Read", pattern="PREFIXED"),
    Acl("TransactionalId", "tx-ok", "Write", pattern="PREFIXED"),
    Acl("TransactionalId", "tx-2pc", "Write"),
    Acl("TransactionalId", "tx-2pc", "TwoPhaseCommit"),
    Acl("TransactionalId", "tx-no2pc", "Write"),
    Acl("Cluster", "kafka-cluster", "Describe"),
]
LOCKED_TOPICS = {"ok-t": 2, "ro-t": 1, "wo-t": 1, "deny-t": 1, "hidden-t": 1}


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    a = module_appliance(tmp_path_factory, "acls", {"transactions": {"two_phase_commit_enable": True},
                                                    "groups": {"initial_rebalance_delay_ms": 0}},
                         start=False)
    principal = secure(a, LOCKED_ACLS, LOCKED_TOPICS)
    yield a, principal
    a.terminate()


@pytest.fixture(autouse=True)
def _watch(request):
    """On the shared appliance: the log tail on failure; an error logged or a death fails the test."""
    if "locked" not in request.fixturenames:
        yield
        return
    a, _ = request.getfixturevalue("locked")
    with watching(request, a):
        yield


def raw(principal: Principal) -> RawClient:
    return RawClient(principal.bootstrap)


# -- produce, fetch, metadata -------------------------------------------------------------------------

def test_producer_needs_write_on_the_topic(locked):
    _, p = locked
    assert produce_one(p, "ok-t") == 0
    assert produce_one(p, "wo-t") == 0
    assert produce_one(p, "ro-t") == TOPIC_AUTHORIZATION_FAILED
    assert produce_one(p, "hidden-t") == TOPIC_AUTHORIZATION_FAILED


def test_idempotent_producer_is_allowed_by_write_on_some_topic(locked):
    # InitProducerId without a transactional id: IdempotentWrite on the cluster, or (Kafka 3.x)
    # Write on any topic: the principal has Write on ok-* only.
    _, p = locked
    assert produce_one(p, "ok-t", **{"enable.idempotence": True}) == 0


def test_deny_beats_allow(locked):
    _, p = locked
    assert produce_one(p, "deny-t") == TOPIC_AUTHORIZATION_FAILED
    with raw(p) as r:
        resp = r.request(1, 12, fetch_request("deny-t"))
        assert resp.responses[0].partitions[0].error_code == 0        # All still allows Read


def test_kafka_python_producer_refused(locked):
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError
    _, p = locked
    prod = KafkaProducer(**p.kafka_python(request_timeout_ms=10000, max_block_ms=10000))
    try:
        assert prod.send("ok-t", b"v").get(timeout=20).offset >= 0
        with pytest.raises(TopicAuthorizationFailedError):
            prod.send("ro-t", b"v").get(timeout=20)
    finally:
        prod.close(timeout=5)


def test_aiokafka_producer_and_group_consumer_refused(locked):
    import asyncio
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
    _, p = locked

    async def run():
        prod = AIOKafkaProducer(bootstrap_servers=p.bootstrap, request_timeout_ms=10000)
        await prod.start()
        try:
            assert (await prod.send_and_wait("ok-t", b"v")).offset >= 0
            with pytest.raises(TopicAuthorizationFailedError):
                await prod.send_and_wait("ro-t", b"v")
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer("ok-t", bootstrap_servers=p.bootstrap, group_id="g-no-aio",
                                auto_offset_reset="earliest", session_timeout_ms=6000)
        try:
            with pytest.raises(GroupAuthorizationFailedError):     # its FindCoordinator
                await cons.start()
        finally:
            await cons.stop()
    asyncio.run(run())


def fetch_request(topic: str, replica_id: int = -1) -> dict:
    return {"replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                        "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def test_consumer_needs_read_on_the_topic(locked):
    _, p = locked
    c = Consumer(p.confluent(**{"group.id": "g-ok-read", "auto.offset.reset": "earliest",
                                "enable.auto.commit": False}))
    try:
        from confluent_kafka import TopicPartition
        c.assign([TopicPartition("wo-t", 0, 0)])
        deadline = time.monotonic() + 20
        err = None
        while err is None and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and m.error() is not None:
                err = m.error().code()
        assert err == CKError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()
    with raw(p) as r:
        for topic, code in (("wo-t", TOPIC_AUTHORIZATION_FAILED), ("hidden-t", TOPIC_AUTHORIZATION_FAILED),
                            ("ro-t", 0), ("ok-missing", UNKNOWN_TOPIC_OR_PARTITION)):
            resp = r.request(1, 12, fetch_request(topic))
            assert resp.responses[0].partitions[0].error_code == code, topic


def test_follower_fetch_needs_cluster_action(locked):
    _, p = locked
    with raw(p) as r:
        resp = r.request(1, 12, fetch_request("ok-t", replica_id=1))
        assert resp.responses[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED


def test_list_offsets_needs_describe(locked):
    _, p = locked
    with raw(p) as r:
        for topic, code in (("hidden-t", TOPIC_AUTHORIZATION_FAILED), ("ro-t", 0)):
            resp = r.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
            assert resp.topics[0].partitions[0].error_code == code, topic


def test_metadata_lists_only_describable_topics(locked):
    _, p = locked
    md = p.admin().list_topics(timeout=10)
    assert {"ok-t", "ro-t", "wo-t", "deny-t"} <= set(md.topics)
    assert "hidden-t" not in md.topics
    with raw(p) as r:
        resp = r.request(3, 12, {"topics": [{"name": "hidden-t", "topic_id": None},
                                            {"name": "nowhere", "topic_id": None},
                                            {"name": "ro-t", "topic_id": None}],
                                 "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": True})
        by_name = {t.name: t for t in resp.topics}
        assert by_name["hidden-t"].error_code == TOPIC_AUTHORIZATION_FAILED
        assert by_name["hidden-t"].topic_id in (None, uuid.UUID(int=0))   # the zero id (kio: None)
        assert by_name["nowhere"].error_code == TOPIC_AUTHORIZATION_FAILED   # exists or not
        ro = by_name["ro-t"]
        assert ro.error_code == 0
        assert ro.topic_authorized_operations == (1 << AclOperation.READ.value) | (1 << AclOperation.DESCRIBE.value)
        assert by_name["hidden-t"].topic_authorized_operations == NOT_REQUESTED


def test_metadata_by_topic_id_of_a_hidden_topic_answers_without_the_name(locked):
    a, p = locked
    from appliance.catalog.view import PUBLISHED_FILE, read_published
    cat = read_published(os.path.join(a.run_dir, PUBLISHED_FILE))
    tid = uuid.UUID(bytes=cat.topics["hidden-t"].topic_id)
    with raw(p) as r:
        resp = r.request(3, 12, {"topics": [{"name": None, "topic_id": tid}],
                                 "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        (t,) = resp.topics
        assert (t.error_code, t.name, t.topic_id) == (TOPIC_AUTHORIZATION_FAILED, None, tid)


def test_produce_v13_by_topic_id_answers_unknown_ids_before_authorizing(locked):
    """Produce v13 (KIP-516) names topics by id: a writable topic's batch is appended and
    answered under its id; an id nobody has is UNKNOWN_TOPIC_ID (before authorization, as
    Kafka's handleProduceRequest: ids are not secret); a known id the principal may not write
    is TOPIC_AUTHORIZATION_FAILED; a missing partition of a known id UNKNOWN_TOPIC_OR_PARTITION."""
    a, p = locked
    from appliance.catalog.view import PUBLISHED_FILE, read_published
    from appliance.protocol.records import Record, build_batch
    cat = read_published(os.path.join(a.run_dir, PUBLISHED_FILE))
    ok, hidden = (uuid.UUID(bytes=cat.topics[t].topic_id) for t in ("ok-t", "hidden-t"))
    nobody = uuid.uuid4()
    batch = build_batch([Record(key=b"k", value=b"by id")])
    with raw(p) as r:
        resp = r.request(0, 13, {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                                 "topic_data": [
                                     {"topic_id": ok, "partition_data": [{"index": 1, "records": batch},
                                                                         {"index": 7, "records": batch}]},
                                     {"topic_id": hidden, "partition_data": [{"index": 0, "records": batch}]},
                                     {"topic_id": nobody, "partition_data": [{"index": 0, "records": batch}]}]})
    got = {(t.topic_id, q.index): (q.error_code, q.base_offset)
           for t in resp.responses for q in t.partition_responses}
    assert got[(ok, 1)][0] == 0 and got[(ok, 1)][1] >= 0, got
    assert got[(ok, 7)][0] == UNKNOWN_TOPIC_OR_PARTITION, got
    assert got[(hidden, 0)][0] == TOPIC_AUTHORIZATION_FAILED, got
    assert got[(nobody, 0)][0] == 100, got        # UNKNOWN_TOPIC_ID
    assert len(got) == 4


def test_auto_creation_needs_create(locked):
    _, p = locked
    with raw(p) as r:
        resp = r.request(3, 9, {"topics": [{"name": "auto-made"}, {"name": "ok-made"},
                                           {"name": "nocreate-made"}],
                                "allow_auto_topic_creation": True,
                                "include_cluster_authorized_operations": True,
                                "include_topic_authorized_operations": False})
        by_name = {t.name: t.error_code for t in resp.topics}
        # auto-made: Create on it but not Describe, which Kafka checks first: refused.
        assert by_name["auto-made"] == TOPIC_AUTHORIZATION_FAILED
        assert by_name["ok-made"] == 0                               # All on ok-*
        assert by_name["nocreate-made"] == TOPIC_AUTHORIZATION_FAILED
        # v8-10 cluster operations: Describe only.
        assert resp.cluster_authorized_operations == 1 << AclOperation.DESCRIBE.value


# -- topics and configs ---------------------------------------------------------------------------------

def test_create_and_delete_topics_need_create_and_delete(locked):
    from confluent_kafka.admin import NewTopic
    _, p = locked
    admin = p.admin()
    fs = admin.create_topics([NewTopic("ok-new", 1, 1), NewTopic("other-new", 1, 1)],
                             request_timeout=20)
    assert fs["ok-new"].result() is None
    with pytest.raises(KafkaException) as e:
        fs["other-new"].result()
    assert e.value.args[0].code() == CKError.TOPIC_AUTHORIZATION_FAILED
    fs = admin.delete_topics(["ok-new", "ro-t", "no-such"], request_timeout=20)
    assert fs["ok-new"].result() is None
    for topic in ("ro-t", "no-such"):
        with pytest.raises(KafkaException) as e:
            fs[topic].result()
        assert e.value.args[0].code() == CKError.TOPIC_AUTHORIZATION_FAILED, topic


def test_describe_configs_needs_describe_configs(locked):
    from confluent_kafka.admin import ConfigResource
    _, p = locked
    admin = p.admin()
    fs = admin.describe_configs([ConfigResource("topic", "ok-t"), ConfigResource("topic", "ro-t"),
                                 ConfigResource("broker", "1")], request_timeout=20)
    results = {r.name: f for r, f in fs.items()}
    assert "retention.ms" in results["ok-t"].result()
    for name, code in (("ro-t", CKError.TOPIC_AUTHORIZATION_FAILED),
                       ("1", CKError.CLUSTER_AUTHORIZATION_FAILED)):
        with pytest.raises(KafkaException) as e:
            results[name].result()
        assert e.value.args[0].code() == code, name


def test_describe_cluster_and_topics_report_authorized_operations(locked):
    from confluent_kafka import TopicCollection
    _, p = locked
    admin = p.admin()
    cluster = admin.describe_cluster(include_authorized_operations=True, request_timeout=20).result()
    assert cluster.authorized_operations == [AclOperation.DESCRIBE]
    cluster = admin.describe_cluster(request_timeout=20).result()
    assert cluster.authorized_operations is None
    topics = admin.describe_topics(TopicCollection(["ro-t", "ok-t"]),
                                   include_authorized_operations=True, request_timeout=20)
    assert set(topics["ro-t"].result().authorized_operations) == {AclOperation.READ,
                                                                   AclOperation.DESCRIBE}
    assert len(topics["ok-t"].result().authorized_operations) == 8     # every topic operation


# -- groups -------------------------------------------------------------------------------------------

def test_consumer_group_needs_read_on_the_group(locked):
    _, p = locked
    got = {}
    for group in ("g-ok-1", "g-no-1"):
        c = Consumer(p.confluent(**{"group.id": group, "auto.offset.reset": "earliest",
                                    "session.timeout.ms": 6000}))
        try:
            c.subscribe(["ok-t"])
            deadline = time.monotonic() + 30
            while group not in got and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is None:
                    continue
                got[group] = m.error().code() if m.error() else 0
        finally:
            c.close()
    assert got == {"g-ok-1": 0, "g-no-1": CKError.GROUP_AUTHORIZATION_FAILED}


def test_group_apis_at_the_wire(locked):
    _, p = locked
    with raw(p) as r:
        join = r.request(11, 5, {"group_id": "g-no", "session_timeout_ms": 6000,
                                 "rebalance_timeout_ms": 6000, "member_id": "",
                                 "group_instance_id": None, "protocol_type": "consumer",
                                 "protocols": [{"name": "range", "metadata": b""}]})
        assert (join.error_code, join.generation_id, join.member_id) == (GROUP_AUTHORIZATION_FAILED, -1, "")
        hb = r.request(12, 3, {"group_id": "g-no", "generation_id": 1, "member_id": "m",
                               "group_instance_id": None})
        assert hb.error_code == GROUP_AUTHORIZATION_FAILED
        sync = r.request(14, 3, {"group_id": "g-no", "generation_id": 1, "member_id": "m",
                                 "group_instance_id": None, "assignments": []})
        assert sync.error_code == GROUP_AUTHORIZATION_FAILED
        leave = r.request(13, 3, {"group_id": "g-no", "members": [
            {"member_id": "m", "group_instance_id": None}]})
        assert leave.error_code == GROUP_AUTHORIZATION_FAILED
        # OffsetCommit: Read on the group, then Read on each topic.
        commit = r.request(8, 8, {"group_id": "g-ok-wire", "generation_id_or_member_epoch": -1,
                                  "member_id": "", "group_instance_id": None, "topics": [
                                      {"name": n, "partitions": [{"partition_index": 0,
                                                                  "committed_offset": 0,
                                                                  "committed_leader_epoch": -1,
                                                                  "committed_metadata": ""}]}
                                      for n in ("ok-t", "wo-t", "hidden-t")]})
        assert {t.name: t.partitions[0].error_code for t in commit.topics} == {
            "ok-t": 0, "wo-t": TOPIC_AUTHORIZATION_FAILED, "hidden-t": TOPIC_AUTHORIZATION_FAILED}
        commit = r.request(8, 8, {"group_id": "g-no", "generation_id_or_member_epoch": -1,
                                  "member_id": "", "group_instance_id": None, "topics": [
                                      {"name": "ok-t", "partitions": [{"partition_index": 0,
                                                                       "committed_offset": 0,
                                                                       "committed_leader_epoch": -1,
                                                                       "committed_metadata": ""}]}]})
        assert commit.topics[0].partitions[0].error_code == GROUP_AUTHORIZATION_FAILED
        # OffsetFetch: Describe on the group, and only describable topics.
        fetch = r.request(9, 8, {"groups": [
            {"group_id": "g-ok-wire", "topics": [{"name": "ok-t", "partition_indexes": [0]},
                                                  {"name": "hidden-t", "partition_indexes": [0]}]},
            {"group_id": "g-no", "topics": None}], "require_stable": False})
        ok, no = fetch.groups
        assert no.error_code == GROUP_AUTHORIZATION_FAILED
        assert {t.name: (t.partitions[0].error_code, t.partitions[0].committed_offset)
                for t in ok.topics} == {"ok-t": (0, 0), "hidden-t": (TOPIC_AUTHORIZATION_FAILED, -1)}
        every = r.request(9, 8, {"groups": [{"group_id": "g-ok-wire", "topics": None}],
                                 "require_stable": False})
        assert [t.name for t in every.groups[0].topics] == ["ok-t"]
        # DescribeGroups: Describe on each group, authorized operations when asked.
        d = r.request(15, 5, {"groups": ["g-ok-wire", "g-no"], "include_authorized_operations": True})
        by_id = {g.group_id: g for g in d.groups}
        assert by_id["g-no"].error_code == GROUP_AUTHORIZATION_FAILED
        assert by_id["g-ok-wire"].error_code == 0
        assert by_id["g-ok-wire"].authorized_operations == (1 << 3) | (1 << 8)   # Read, Describe
        # ListGroups with Describe on the cluster: every group.
        groups = {g.group_id for g in r.request(16, 4, {"states_filter": []}).groups}
        assert "g-ok-wire" in groups
        # DeleteGroups and OffsetDelete: Delete on the group (nobody has it).
        dg = r.request(42, 2, {"groups_names": ["g-ok-wire", "g-ok-wire"]})
        assert [(x.group_id, x.error_code) for x in dg.results] == [("g-ok-wire", GROUP_AUTHORIZATION_FAILED)]
        od = r.request(47, 0, {"group_id": "g-ok-wire", "topics": [
            {"name": "ok-t", "partitions": [{"partition_index": 0}]}]})
        assert od.error_code == GROUP_AUTHORIZATION_FAILED
        # FindCoordinator: Describe on the group or the transactional id.
        fc = r.request(10, 4, {"key_type": 0, "coordinator_keys": ["g-ok-1", "g-no"]})
        assert [(c.key, c.error_code, c.node_id) for c in fc.coordinators] == [
            ("g-ok-1", 0, 1), ("g-no", GROUP_AUTHORIZATION_FAILED, -1)]
        fc = r.request(10, 3, {"key_type": 1, "key": "tx-no"})
        assert (fc.error_code, fc.node_id) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)


def test_share_group_apis_at_the_wire(locked):
    """KIP-932 as Kafka's KafkaApis authorizes it: Read on the group for ShareGroupHeartbeat,
    ShareFetch and AlterShareGroupOffsets, Describe for ShareGroupDescribe and
    DescribeShareGroupOffsets, Delete for DeleteShareGroupOffsets; Read on the topic to fetch or
    alter, Describe to see offsets."""
    _, p = locked
    with raw(p) as r:
        member = uuid.uuid4().hex[:22]
        hb = r.request(76, 1, {"group_id": "g-no", "member_id": member, "member_epoch": 0,
                               "subscribed_topic_names": ["ok-t"]})
        assert hb.error_code == GROUP_AUTHORIZATION_FAILED
        hb = r.request(76, 1, {"group_id": "g-ok-share", "member_id": member, "member_epoch": 0,
                               "subscribed_topic_names": ["ok-t"]})
        assert hb.error_code == 0, hb
        md = r.request(3, 12, {"topics": [{"name": "ok-t", "topic_id": None},
                                          {"name": "wo-t", "topic_id": None}],
                               "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
        ids = {t.name: t.topic_id for t in md.topics}
        fetch = {"member_id": member, "share_session_epoch": 0, "max_wait": 0, "min_bytes": 0,
                 "max_bytes": 1 << 20, "max_records": 10, "batch_size": 10,
                 "forgotten_topics_data": [],
                 "topics": [{"topic_id": ids[n], "partitions": [
                     {"partition_index": 0, "acknowledgement_batches": []}]}
                     for n in ("ok-t", "wo-t")]}
        assert r.request(78, 1, {"group_id": "g-no", **fetch}).error_code == \
            GROUP_AUTHORIZATION_FAILED
        f = r.request(78, 1, {"group_id": "g-ok-share", **fetch})
        assert f.error_code == 0, f
        assert {t.topic_id: t.partitions[0].error_code for t in f.responses} == {
            ids["ok-t"]: 0, ids["wo-t"]: TOPIC_AUTHORIZATION_FAILED}, f
        d = r.request(77, 1, {"group_ids": ["g-ok-share", "g-no"],
                              "include_authorized_operations": False})
        assert [(g.group_id, g.error_code) for g in d.groups] == [
            ("g-ok-share", 0), ("g-no", GROUP_AUTHORIZATION_FAILED)]
        o = r.request(90, 1, {"groups": [
            {"group_id": "g-ok-share", "topics": [{"topic_name": "ok-t", "partitions": [0]},
                                                  {"topic_name": "hidden-t", "partitions": [0]}]},
            {"group_id": "g-no", "topics": None}]})
        ok, no = o.groups
        assert no.error_code == GROUP_AUTHORIZATION_FAILED
        assert {t.topic_name: t.partitions[0].error_code for t in ok.topics} == {
            "ok-t": 0, "hidden-t": TOPIC_AUTHORIZATION_FAILED}, ok
        r.request(76, 1, {"group_id": "g-ok-share", "member_id": member, "member_epoch": -1})
        alter = r.request(91, 0, {"group_id": "g-ok-share", "topics": [
            {"topic_name": n, "partitions": [{"partition_index": 0, "start_offset": 0}]}
            for n in ("ok-t", "wo-t")]})
        assert alter.error_code == 0, alter
        assert {t.topic_name: t.partitions[0].error_code for t in alter.responses} == {
            "ok-t": 0, "wo-t": TOPIC_AUTHORIZATION_FAILED}, alter
        assert r.request(91, 0, {"group_id": "g-no", "topics": []}).error_code == \
            GROUP_AUTHORIZATION_FAILED
        # Delete on the group: nobody has it
        assert r.request(92, 0, {"group_id": "g-ok-share", "topics": [
            {"topic_name": "ok-t"}]}).error_code == GROUP_AUTHORIZATION_FAILED


# -- transactions -------------------------------------------------------------------------------------

def test_transactional_producer_needs_write_on_its_transactional_id(locked):
    _, p = locked
    prod = Producer(p.confluent(**{"transactional.id": "tx-no", "transaction.timeout.ms": 10000}))
    with pytest.raises(KafkaException) as e:
        prod.init_transactions(20)
    assert e.value.args[0].code() == CKError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    prod = Producer(p.confluent(**{"transactional.id": "tx-ok-1", "transaction.timeout.ms": 10000}))
    prod.init_transactions(20)
    prod.begin_transaction()
    prod.produce("ok-t", b"in a transaction")
    prod.commit_transaction(20)


def test_transaction_apis_at_the_wire(locked):
    _, p = locked
    with raw(p) as r:
        ip = r.request(22, 4, {"transactional_id": "tx-no", "transaction_timeout_ms": 10000,
                               "producer_id": -1, "producer_epoch": -1})
        assert (ip.error_code, ip.producer_id) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)
        ip = r.request(22, 4, {"transactional_id": "tx-ok-wire", "transaction_timeout_ms": 10000,
                               "producer_id": -1, "producer_epoch": -1})
        assert ip.error_code == 0
        pid, epoch = ip.producer_id, ip.producer_epoch
        apt = r.request(24, 3, {"v3_and_below_transactional_id": "tx-no",
                                "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
                                "v3_and_below_topics": [{"name": "ok-t", "partitions": [0]}]})
        assert apt.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == \
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        apt = r.request(24, 3, {"v3_and_below_transactional_id": "tx-ok-wire",
                                "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
                                "v3_and_below_topics": [{"name": "ok-t", "partitions": [0]},
                                                        {"name": "ro-t", "partitions": [0]},
                                                        {"name": "__consumer_offsets", "partitions": [0]}]})
        codes = {t.name: t.results_by_partition[0].partition_error_code
                 for t in apt.results_by_topic_v3_and_below}
        assert codes == {"ok-t": 55, "ro-t": TOPIC_AUTHORIZATION_FAILED,     # 55: OPERATION_NOT_ATTEMPTED
                         "__consumer_offsets": TOPIC_AUTHORIZATION_FAILED}
        apt = r.request(24, 4, {"transactions": [{"transactional_id": "tx-ok-wire", "producer_id": pid,
                                                  "producer_epoch": epoch, "verify_only": True,
                                                  "topics": [{"name": "ok-t", "partitions": [0]}]}]})
        assert apt.error_code == CLUSTER_AUTHORIZATION_FAILED          # brokers only (ClusterAction)
        ao = r.request(25, 3, {"transactional_id": "tx-ok-wire", "producer_id": pid,
                               "producer_epoch": epoch, "group_id": "g-no"})
        assert ao.error_code == GROUP_AUTHORIZATION_FAILED
        ao = r.request(25, 3, {"transactional_id": "tx-no", "producer_id": pid,
                               "producer_epoch": epoch, "group_id": "g-ok"})
        assert ao.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        toc = r.request(28, 3, {"transactional_id": "tx-ok-wire", "group_id": "g-no",
                                "producer_id": pid, "producer_epoch": epoch, "generation_id": -1,
                                "member_id": "", "group_instance_id": None, "topics": [
                                    {"name": "ok-t", "partitions": [{"partition_index": 0,
                                                                     "committed_offset": 1,
                                                                     "committed_leader_epoch": -1,
                                                                     "committed_metadata": ""}]}]})
        assert toc.topics[0].partitions[0].error_code == GROUP_AUTHORIZATION_FAILED
        end = r.request(26, 3, {"transactional_id": "tx-no", "producer_id": pid,
                                "producer_epoch": epoch, "committed": True})
        assert end.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        # The coordinator's views: only what the principal may Describe.
        dt = r.request(65, 0, {"transactional_ids": ["tx-no"]})
        assert [(s.transactional_id, s.error_code) for s in dt.transaction_states] == [
            ("tx-no", TRANSACTIONAL_ID_AUTHORIZATION_FAILED)]
        lt = r.request(66, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1})
        listed = {s.transactional_id for s in lt.transaction_states}
        assert "tx-ok-wire" in listed and all(t.startswith(("tx-ok", "tx-2pc", "tx-no2pc")) for t in listed)
        dp = r.request(61, 0, {"topics": [{"name": "hidden-t", "partition_indexes": [0]},
                                          {"name": "ro-t", "partition_indexes": [0]},
                                          {"name": "bad/name", "partition_indexes": [0]}]})
        assert [t.partitions[0].error_code for t in dp.topics] == [TOPIC_AUTHORIZATION_FAILED, 0, 17]
        # WriteTxnMarkers: Alter or ClusterAction on the cluster; the principal has neither.
        wtm = r.request(27, 1, {"markers": [{"producer_id": pid, "producer_epoch": epoch,
                                             "transaction_result": False, "coordinator_epoch": 0,
                                             "topics": [{"name": "ok-t", "partition_indexes": [0, 1]}]}]})
        assert [pp.error_code for pp in wtm.markers[0].topics[0].partitions] == [CLUSTER_AUTHORIZATION_FAILED] * 2


def test_transactional_produce_needs_write_on_the_transactional_id(locked):
    """A transactional batch whose transactional id the principal may not write: every partition
    of the request refused, Kafka's TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    from appliance.protocol.records import Record, build_batch
    _, p = locked
    batch = build_batch([Record(key=None, value=b"x")], producer_id=1, producer_epoch=0, base_sequence=0,
                        transactional=True)
    with raw(p) as r:
        resp = r.request(0, 9, {"transactional_id": "tx-no", "acks": -1, "timeout_ms": 5000,
                                "topic_data": [{"name": "ok-t", "partition_data": [
                                    {"index": 0, "records": batch}, {"index": 1, "records": batch}]}]})
        assert [pp.error_code for pp in resp.responses[0].partition_responses] == \
            [TRANSACTIONAL_ID_AUTHORIZATION_FAILED] * 2


def test_two_phase_commit_needs_two_phase_commit_on_the_transactional_id(locked):
    """KIP-939: Enable2Pc needs TwoPhaseCommit besides Write on the transactional id."""
    _, p = locked
    prod = ApplianceProducer(**p.appliance_client(transactional_id="tx-no2pc",
                                                  enable_two_phase_commit=True))
    try:
        with pytest.raises(ApplianceKafkaError) as e:
            prod.init_transactions()
        assert e.value.code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    finally:
        prod.close()
    prod = ApplianceProducer(**p.appliance_client(transactional_id="tx-2pc",
                                                  enable_two_phase_commit=True))
    try:
        prod.init_transactions()
        prod.begin_transaction()
        prod.send("ok-t", b"prepared")
        prod.prepare_transaction()
        prod.commit_transaction()
    finally:
        prod.close()


def test_acl_changes_need_alter_on_the_cluster(locked):
    """ACL changes by a principal without Alter on the Cluster are refused; it may still list
    them with Describe on the Cluster."""
    _, p = locked
    admin = p.admin()
    listed = admin.describe_acls(any_filter(), request_timeout=20).result()
    assert len(listed) == len(LOCKED_ACLS)
    new = Acl("Topic", "hidden-t", "All").confluent()
    with pytest.raises(KafkaException) as e:
        admin.create_acls([new], request_timeout=20)[new].result()
    assert e.value.args[0].code() == CKError.CLUSTER_AUTHORIZATION_FAILED
    fs = admin.delete_acls([any_filter()], request_timeout=20)
    with pytest.raises(KafkaException) as e:
        fs[any_filter()].result()
    assert e.value.args[0].code() == CKError.CLUSTER_AUTHORIZATION_FAILED
    assert len(admin.describe_acls(any_filter(), request_timeout=20).result()) == len(listed)
    assert produce_one(p, "hidden-t") == TOPIC_AUTHORIZATION_FAILED


# -- the admin APIs ---------------------------------------------------------------------------------

def test_admin_apis_need_kafkas_permissions(locked):
    """CreatePartitions, Alter/IncrementalAlterConfigs, DeleteRecords, OffsetForLeaderEpoch,
    DescribeLogDirs, ElectLeaders, the reassignment APIs and the SCRAM credential APIs ask for
    what Kafka's KafkaApis asks (the principal has All on ok-*, Describe on the Cluster only)."""
    _, p = locked
    with raw(p) as r:
        grow = r.request(37, 3, {"topics": [{"name": n, "count": 5, "assignments": None}
                                            for n in ("ok-t", "ro-t")],
                                 "timeout_ms": 10000, "validate_only": True})
        assert {t.name: t.error_code for t in grow.results} == {"ok-t": 0, "ro-t": TOPIC_AUTHORIZATION_FAILED}
        for key, version in ((33, 2), (44, 1)):
            cfg = {"name": "retention.ms", "value": "3600000"}
            if key == 44:
                cfg["config_operation"] = 0
            alter = r.request(key, version, {"resources": [
                {"resource_type": 2, "resource_name": "ok-t", "configs": [cfg]},
                {"resource_type": 2, "resource_name": "ro-t", "configs": [cfg]},
                {"resource_type": 4, "resource_name": "", "configs": [
                    {**cfg, "name": "log.retention.ms"}]}], "validate_only": True})
            assert [x.error_code for x in alter.responses] == [
                0, TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED], key
        delete = r.request(21, 2, {"topics": [{"name": n, "partitions": [{"partition_index": 0, "offset": 0}]}
                                              for n in ("ok-t", "ro-t")], "timeout_ms": 10000})
        assert {t.name: t.partitions[0].error_code for t in delete.topics} == {
            "ok-t": 0, "ro-t": TOPIC_AUTHORIZATION_FAILED}
        epochs = {"topics": [{"topic": n, "partitions": [{"partition": 0, "current_leader_epoch": 0,
                                                          "leader_epoch": 0}]}
                             for n in ("ok-t", "hidden-t")]}
        ofle = r.request(23, 4, {"replica_id": -1, **epochs})
        assert {t.topic: t.partitions[0].error_code for t in ofle.topics} == {
            "ok-t": 0, "hidden-t": TOPIC_AUTHORIZATION_FAILED}
        follower = r.request(23, 4, {"replica_id": 1, **epochs})
        assert {t.partitions[0].error_code for t in follower.topics} == {CLUSTER_AUTHORIZATION_FAILED}
        # Describe on the Cluster: allowed.
        dirs = r.request(35, 4, {"topics": None})
        assert dirs.error_code == 0 and len(dirs.results) == 1
        assert r.request(46, 0, {"timeout_ms": 10000, "topics": None}).error_code == 0
        assert r.request(50, 0, {"users": None}).error_code == 0
        # Alter on the Cluster: refused.
        elect = r.request(43, 2, {"election_type": 0, "timeout_ms": 10000,
                                  "topic_partitions": [{"topic": "ok-t", "partitions": [0]}]})
        assert elect.error_code == CLUSTER_AUTHORIZATION_FAILED
        assert elect.replica_election_results[0].partition_result[0].error_code == CLUSTER_AUTHORIZATION_FAILED
        move = r.request(45, 0, {"timeout_ms": 10000, "topics": [
            {"name": "ok-t", "partitions": [{"partition_index": 0, "replicas": None}]}]})
        assert move.error_code == CLUSTER_AUTHORIZATION_FAILED
        scram = r.request(51, 0, {"deletions": [], "upsertions": [
            {"name": "mallory", "mechanism": 1, "iterations": 4096, "salt": b"s" * 16,
             "salted_password": b"p" * 32}]})
        assert [(x.user, x.error_code) for x in scram.results] == [("mallory", CLUSTER_AUTHORIZATION_FAILED)]


def test_cluster_describe_apis_refused_without_describe_on_the_cluster(appliance_factory):
    a = appliance_factory(start=False)
    p = secure(a, [Acl("Topic", "t", "All")], {"t": 1})
    with raw(p) as r:
        dirs = r.request(35, 4, {"topics": None})
        assert (dirs.error_code, len(dirs.results)) == (CLUSTER_AUTHORIZATION_FAILED, 0)
        assert r.request(46, 0, {"timeout_ms": 10000, "topics": None}).error_code == CLUSTER_AUTHORIZATION_FAILED
        users = r.request(50, 0, {"users": [{"name": "admin"}]})
        assert users.error_code == CLUSTER_AUTHORIZATION_FAILED
        assert [(x.user, x.error_code) for x in users.results] == [("admin", CLUSTER_AUTHORIZATION_FAILED)]


def test_consumer_group_regex_matches_only_topics_the_member_may_describe(locked):
    """KIP-848 regex subscriptions (KAFKA-18813): the broker's matches are filtered by the
    member's topic Describe ACLs; hidden-t (no ACL) matches the regex but is never assigned,
    the rest (All, Read, Write each imply Describe; deny-t denies only Write) are."""
    _, principal = locked
    allowed = ["ok-t", "ro-t", "wo-t", "deny-t"]
    with raw(principal) as c:
        md = c.request(3, 12, {"topics": [{"name": t, "topic_id": None} for t in allowed],
                               "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
        ids = {t.topic_id for t in md.topics if t.error_code == 0}
        assert len(ids) == 4, md
        group = f"g-ok-regex-{uuid.uuid4().hex[:6]}"
        mid = uuid.uuid4().hex
        r = c.request(68, 1, {"group_id": group, "member_id": mid,
                              "member_epoch": 0, "instance_id": None, "rack_id": None,
                              "rebalance_timeout": 30000, "subscribed_topic_names": None,
                              "subscribed_topic_regex": ".*-t", "server_assignor": None,
                              "topic_partitions": []})
        assert r.error_code == 0, r

        def next_heartbeat():
            # Kafka resolves a new regex after the heartbeat that brings it: the matches come
            # with a later epoch (nothing owned yet, so they are assigned at once)
            return c.request(68, 1, {"group_id": group, "member_id": mid,
                                     "member_epoch": r.member_epoch, "instance_id": None,
                                     "rack_id": None, "rebalance_timeout": -1,
                                     "subscribed_topic_names": None,
                                     "subscribed_topic_regex": None, "server_assignor": None,
                                     "topic_partitions": []})

        deadline = time.monotonic() + 30
        while True:
            r = next_heartbeat()
            assert r.error_code == 0, r
            if r.assignment is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.assignment is not None, "the regex's matches never assigned"
        got = {t.topic_id: sorted(t.partitions) for t in r.assignment.topic_partitions}
        assert set(got) == ids and sum(len(p) for p in got.values()) == 5, got
        # nothing the member may not see in the group: ConsumerGroupDescribe answers it whole
        d = c.request(69, 1, {"group_ids": [group], "include_authorized_operations": False})
        assert d.groups[0].error_code == 0, d
