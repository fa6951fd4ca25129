"""KIP-848 consumer groups with real clients: confluent-kafka with ``group.protocol=consumer``
(the default assignor, uniform, and ``group.remote.assignor=range``),
each member its own process (``programs/group_member.py confluent-consumer``), on a topic of 4
partitions; and the new APIs at the wire (ConsumerGroupDescribe, ListGroups v5's type filter,
DescribeGroups of a consumer group, OffsetCommit/OffsetFetch v9's member epoch).

- two members split the partitions and read every record once;
- a third joins: partitions move to it (incrementally, revoked before assigned: no partition is
  ever held by two members at once in what they print), still every record once;
- one leaves (close: epoch -1): its partitions go to the others; the commits hold (the group's
  committed offsets end at the topic's end).
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from client_drivers import driver
from java_programs import java4_program  # noqa: F401 (fixture)
from raw_wire import RawClient
from test_groups import Member, committed_offsets, consumed, produce, wait_until

import test_groups

PARTITIONS = 4
GROUP_CONFIG = {"groups": {"consumer_heartbeat_interval_ms": 500,
                           "consumer_session_timeout_ms": 6000}}
E_GROUP_ID_NOT_FOUND = 69
E_UNKNOWN_MEMBER_ID = 25
E_STALE_MEMBER_EPOCH = 113
E_UNKNOWN_TOPIC_ID = 100


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


def settled(members, sizes) -> bool:
    """Every partition owned, by exactly one member, in the given shares."""
    owned = [m.current() for m in members]
    every = sorted(p for o in owned for p in o)
    return every == list(range(PARTITIONS)) and sorted(len(o) for o in owned) == sorted(sizes)


def describe(bootstrap, group):
    with RawClient(bootstrap) as c:
        r = c.request(69, 1, {"group_ids": [group], "include_authorized_operations": False})
    (g,) = r.groups
    return g


@pytest.mark.parametrize("assignor", [None, "range"])
def test_consumer_protocol_members_share_rebalance_and_commit(appliance_factory, monkeypatch,
                                                              assignor):
    monkeypatch.setattr(test_groups, "PARTITIONS", PARTITIONS)   # produce()'s partitioning
    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group = uid("kip848"), uid("g")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    client = "confluent-consumer" + (f":{assignor}" if assignor else "")
    members = [Member(client, b, group, topic) for _ in range(2)]
    try:
        wait_until(lambda: settled(members, [2, 2]), 60, "two members with two partitions each")
        wait_until(lambda: describe(b, group).group_state == "Stable", 30, "the group Stable")
        g = describe(b, group)
        assert (g.error_code, g.group_state, g.assignor_name) == (0, "Stable",
                                                                  assignor or "uniform"), g
        assert len(g.members) == 2
        assert all(m.member_epoch == g.assignment_epoch == g.group_epoch for m in g.members), g
        sent = produce(b, topic, 0, 400)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "every record consumed")
        got = consumed(members)
        assert len(got) == len(set(got)) == 400, "a record was read twice in a stable group"

        # A third member joins: it takes partitions from the others.
        members.append(Member(client, b, group, topic))
        wait_until(lambda: settled(members, [1, 1, 2]), 60, "three members sharing four partitions")
        sent |= produce(b, topic, 400, 400)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "records after the join")

        # One leaves (close: ConsumerGroupHeartbeat with epoch -1).
        members[0].stop(signal.SIGTERM)
        rest = members[1:]
        wait_until(lambda: settled(rest, [2, 2]), 60, "two members after the leave")
        sent |= produce(b, topic, 800, 400)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "records after the leave")
        got = consumed(members)
        assert set(got) == sent
        # Each member commits what it printed before its next poll, so a partition that moves
        # is picked up at the committed offset: nothing is read twice.
        assert len(got) == len(set(got)), "a record was read twice across the rebalances"
        wait_until(lambda: committed_offsets(b, group, topic) == {p: 300 for p in range(PARTITIONS)},
                   30, "the commits at the end of every partition")

        # ListGroups v5 with the type filter, DescribeGroups (not a classic group). The members
        # own their partitions before their last heartbeat reports it: wait for Stable.
        wait_until(lambda: describe(b, group).group_state == "Stable", 30, "the group Stable")
        with RawClient(b) as c:
            lg = c.request(16, 5, {"states_filter": [], "types_filter": ["consumer"]})
            listed = {x.group_id: (x.group_type, x.protocol_type, x.group_state) for x in lg.groups}
            assert listed.get(group) == ("consumer", "consumer", "Stable"), listed
            lg = c.request(16, 5, {"states_filter": [], "types_filter": ["classic"]})
            assert group not in {x.group_id for x in lg.groups}
            # Kafka's DescribeGroups looks only for a classic group: Dead, and from v6 (KIP-1043)
            # GROUP_ID_NOT_FOUND "Group X is not a classic group."
            dg = c.request(15, 5, {"groups": [group], "include_authorized_operations": False})
            assert (dg.groups[0].error_code, dg.groups[0].group_state) == (0, "Dead"), dg
            assert not dg.groups[0].members, dg
            dg = c.request(15, 6, {"groups": [group], "include_authorized_operations": False})
            assert dg.groups[0].error_code == E_GROUP_ID_NOT_FOUND, dg
            assert dg.groups[0].error_message == f"Group {group} is not a classic group.", dg
            # OffsetCommit v9 from someone who is not a member, and with a stale epoch
            g = describe(b, group)
            member = g.members[0]
            base = {"group_id": group, "group_instance_id": None, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                "committed_leader_epoch": -1,
                                                "committed_metadata": ""}]}]}
            r = c.request(8, 9, {**base, "generation_id_or_member_epoch": 1, "member_id": "nobody"})
            assert r.topics[0].partitions[0].error_code == E_UNKNOWN_MEMBER_ID, r
            # KIP-1251: an older epoch is stale for a partition the member does not own (it
            # would be taken for a partition it has owned since that epoch), a newer one always
            owned = {p for tp in member.assignment.topic_partitions for p in tp.partitions}
            other = min(set(range(PARTITIONS)) - owned)
            mine = min(owned)

            def commit(epoch, partition):
                return c.request(8, 9, {**base, "generation_id_or_member_epoch": epoch,
                                        "member_id": member.member_id, "topics": [
                                            {"name": topic, "partitions": [
                                                {"partition_index": partition, "committed_offset": 300,
                                                 "committed_leader_epoch": -1,
                                                 "committed_metadata": ""}]}]})
            r = commit(member.member_epoch - 1, other)
            assert r.topics[0].partitions[0].error_code == E_STALE_MEMBER_EPOCH, r
            r = commit(member.member_epoch + 1, mine)
            assert r.topics[0].partitions[0].error_code == E_STALE_MEMBER_EPOCH, r
            f = c.request(9, 9, {"groups": [{"group_id": group, "member_id": member.member_id,
                                             "member_epoch": member.member_epoch + 5,
                                             "topics": None}], "require_stable": False})
            assert f.groups[0].error_code == E_STALE_MEMBER_EPOCH, f
        for m in rest:
            m.stop(signal.SIGTERM)
        wait_until(lambda: describe(b, group).group_state == "Empty", 30, "the group empty")
    finally:
        for m in members:
            m.stop(signal.SIGKILL)
    assert committed_offsets(b, group, topic) == {p: 300 for p in range(PARTITIONS)}


def test_consumer_group_describe_of_a_classic_or_unknown_group(appliance_factory):
    a = appliance_factory()
    b = a.bootstrap
    with RawClient(b) as c:
        # a standalone commit makes an (empty, classic) group
        topic = uid("t")
        driver("confluent").create_topics(b, {topic: (1, {})})
        r = c.request(8, 8, {"group_id": "classic-one", "generation_id_or_member_epoch": -1,
                             "member_id": "", "group_instance_id": None, "topics": [
                                 {"name": topic, "partitions": [{"partition_index": 0,
                                                                 "committed_offset": 3,
                                                                 "committed_leader_epoch": -1,
                                                                 "committed_metadata": ""}]}]})
        assert r.topics[0].partitions[0].error_code == 0, r
    for gid in ("classic-one", "never-seen"):
        assert describe(b, gid).error_code == E_GROUP_ID_NOT_FOUND
    with RawClient(b) as c:
        av = c.request(18, 4, {"client_software_name": "t", "client_software_version": "1"})
    finalized = {f.name: f.max_version_level for f in av.finalized_features}
    assert finalized.get("group.version") == 1, av
    assert {k.api_key: (k.min_version, k.max_version) for k in av.api_keys}[68] == (0, 1)


# -- Kafka's Java client 4.3 -----------------------------------------------------------------------

def test_java_4_consumer_protocol_reads_commits_and_the_admin_describes(appliance_factory,
                                                                       java4_program,
                                                                       monkeypatch):
    """kafka-clients 4.3.0 with group.protocol=consumer (it refuses to start unless the broker
    finalizes group.version >= 1): it reads every record once and commits (OffsetCommit v9+ with
    its member epoch); its Admin describes the group through ConsumerGroupDescribe (type
    CONSUMER, Stable, one member with its epoch and four partitions) and lists it with its type.
    Then a confluent-kafka member joins the same group beside a second Java run: the broker
    assigns across the two client implementations."""
    monkeypatch.setattr(test_groups, "PARTITIONS", PARTITIONS)
    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group = uid("kip848j"), uid("gj")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    produce(b, topic, 0, 400)
    out = java4_program("Kip848Consumer", b, group, topic, "400")
    assert (out["read"], out["duplicates"], out["assigned"]) == ("400", "0", "0,1,2,3"), out
    assert (out["type"], out["state"], out["members"]) == ("Consumer", "Stable", "1"), out
    assert int(out["member_epoch"]) >= 1 and out["member_partitions"] == "4", out
    assert out["listed"] == "Consumer", out
    assert committed_offsets(b, group, topic) == {p: 100 for p in range(PARTITIONS)}

    # A confluent-kafka member and the Java client in one KIP-848 group.
    produce(b, topic, 400, 400)
    other = Member("confluent-consumer", b, group, topic)
    try:
        wait_until(lambda: other.current(), 60, "the confluent member assigned")
        wait_until(lambda: committed_offsets(b, group, topic) == {p: 200 for p in range(PARTITIONS)},
                   60, "the confluent member read and committed the second batch")
        out = java4_program("Kip848Consumer", b, group, topic, "0")
        assert out["members"] == "2" and out["type"] == "Consumer", out
        assert out["assigned"] and len(out["assigned"].split(",")) < PARTITIONS, out
        # the Java member left: the confluent one ends up with every partition and reads on
        wait_until(lambda: settled([other], [PARTITIONS]), 60, "the confluent member alone")
        produce(b, topic, 800, 400)
        wait_until(lambda: committed_offsets(b, group, topic) == {p: 300 for p in range(PARTITIONS)},
                   60, "the third batch read and committed by the confluent member")
    finally:
        other.stop(signal.SIGKILL)


def test_coordinator_kill9_keeps_the_consumer_group(appliance_factory, monkeypatch):
    """The group's records are in the group log before a heartbeat is answered: a kill -9 of the
    coordinator worker (the supervisor restarts it) brings back every member with its epoch and
    assignment, so the members heartbeat on without losing a partition (no revoke or assign
    callback after the kill), the group epoch does not move (no rebalance), and nothing is read
    twice."""
    import os

    from appliance_harness import coordinator_pid

    monkeypatch.setattr(test_groups, "PARTITIONS", PARTITIONS)
    # Kafka's default session timeout: librdkafka's reconnect backoff after losing its
    # coordinator may exceed the short one of the other tests on a loaded machine.
    a = appliance_factory(groups={"consumer_heartbeat_interval_ms": 500,
                                  "consumer_session_timeout_ms": 45000})
    b = a.bootstrap
    topic, group = uid("kip848k"), uid("gk")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    members = [Member("confluent-consumer", b, group, topic) for _ in range(2)]
    try:
        wait_until(lambda: settled(members, [2, 2]), 60, "two members with two partitions each")
        wait_until(lambda: describe(b, group).group_state == "Stable", 30, "the group Stable")
        sent = produce(b, topic, 0, 400)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "every record consumed")
        before = describe(b, group)
        callbacks = [len(m.assignments) for m in members]
        old = coordinator_pid(a)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: (a.workers("coordinator") or [{"pid": old}])[0]["pid"] != old, 30,
                   "a new coordinator")
        sent |= produce(b, topic, 400, 400)
        wait_until(lambda: set(consumed(members)) >= sent, 60, "records after the kill")
        after = describe(b, group)
        assert after.group_epoch == before.group_epoch, (before, after)
        assert sorted((m.member_id, m.member_epoch) for m in after.members) == sorted(
            (m.member_id, m.member_epoch) for m in before.members)
        assert [len(m.assignments) for m in members] == callbacks, "a member lost partitions"
        got = consumed(members)
        assert len(got) == len(set(got)) == 800
        wait_until(lambda: committed_offsets(b, group, topic) == {p: 200 for p in range(PARTITIONS)},
                   30, "the commits after the kill")
    finally:
        for m in members:
            m.stop(signal.SIGKILL)


def test_regex_subscription_evaluated_by_the_broker_follows_new_topics(appliance_factory):
    """librdkafka sends a ``^``-pattern as SubscribedTopicRegex; the broker evaluates it (RE2,
    full match) and re-evaluates it when a topic is created: the new topic's partitions are
    assigned without the client re-subscribing."""
    from confluent_kafka import Consumer

    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    prefix = uid("rx")
    driver("confluent").create_topics(b, {f"{prefix}-a": (2, {}), f"other-{prefix}": (1, {})})
    owned: set = set()
    c = Consumer({"bootstrap.servers": b, "group.id": uid("grx"), "group.protocol": "consumer",
                  "topic.metadata.refresh.interval.ms": 1000})
    c.subscribe([f"^{prefix}-.*"],
                on_assign=lambda _c, ps: owned.update((p.topic, p.partition) for p in ps),
                on_revoke=lambda _c, ps: owned.difference_update((p.topic, p.partition) for p in ps))
    try:
        def polled(want):
            c.poll(0.1)
            return owned == want
        wait_until(lambda: polled({(f"{prefix}-a", 0), (f"{prefix}-a", 1)}), 60,
                   "the regex's topic assigned, not the other")
        driver("confluent").create_topics(b, {f"{prefix}-b": (1, {})})
        wait_until(lambda: polled({(f"{prefix}-a", 0), (f"{prefix}-a", 1), (f"{prefix}-b", 0)}),
                   60, "the new matching topic assigned")
    finally:
        c.close()


def test_static_member_restart_keeps_its_partitions(appliance_factory):
    """group.instance.id with the consumer protocol: closing sends epoch -2 (a temporary leave),
    the group keeps the member's partitions (the other member gets none of them), and a new
    process with the same instance id takes them back without a rebalance (same group epoch)."""
    from confluent_kafka import Consumer

    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group = uid("kip848s"), uid("gs")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})

    def consumer(instance):
        owned: set = set()
        c = Consumer({"bootstrap.servers": b, "group.id": group, "group.protocol": "consumer",
                      "group.instance.id": instance})
        c.subscribe([topic], on_assign=lambda _c, ps: owned.update(p.partition for p in ps),
                    on_revoke=lambda _c, ps: owned.difference_update(p.partition for p in ps))
        return c, owned

    def poll_until(pred, what, *cs):
        def step():
            for c in cs:
                c.poll(0.05)
            return pred()
        wait_until(step, 60, what)

    c1, o1 = consumer("static-1")
    c2, o2 = consumer("static-2")
    try:
        poll_until(lambda: len(o1) == len(o2) == 2 and not o1 & o2, "two static members", c1, c2)
        poll_until(lambda: describe(b, group).group_state == "Stable", "Stable", c1, c2)
        epoch = describe(b, group).group_epoch
        # `appliance groups describe` reads it through ConsumerGroupDescribe, as Kafka's Admin
        import json
        import subprocess
        import sys
        cli = [os.path.join(os.path.dirname(sys.executable), "appliance"), "groups", "describe",
               "--group", group, "--json", "--members", "--bootstrap-server", b]
        shown = json.loads(subprocess.run(cli, capture_output=True, text=True, timeout=60,
                                          check=True).stdout)
        assert sorted(r["instance_id"] for r in shown) == ["static-1", "static-2"], shown
        assert all(r["member_epoch"] == epoch and r["partitions"] == 2 for r in shown), shown
        cli[cli.index("--members")] = "--state"
        (st,) = json.loads(subprocess.run(cli, capture_output=True, text=True, timeout=60,
                                          check=True).stdout)
        assert (st["type"], st["state"], st["group_epoch"], st["assignment_epoch"]) == (
            "consumer", "Stable", epoch, epoch), st
        mine = set(o1)
        c1.close()
        g = describe(b, group)
        epochs = {m.instance_id: m.member_epoch for m in g.members}
        assert epochs["static-1"] == -2 and g.group_epoch == epoch, g
        for _ in range(20):                  # the other member is not given them meanwhile
            c2.poll(0.1)
        assert len(o2) == 2 and not o2 & mine
        c1, o1 = consumer("static-1")
        poll_until(lambda: o1 == mine, "the restarted static member's partitions back", c1, c2)
        g = describe(b, group)
        assert g.group_epoch == epoch and len(g.members) == 2, g
    finally:
        c1.close()
        c2.close()


def test_group_config_heartbeat_interval_applies_to_the_consumer_group(appliance_factory):
    """Issue 35: a GROUP resource's consumer.heartbeat.interval.ms (IncrementalAlterConfigs)
    overrides ``[groups]`` for that group's ConsumerGroupHeartbeat answers, as in Kafka 4.x;
    another group keeps the broker's value."""
    from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry,
                                       ConfigResource, ResourceType)
    a = appliance_factory(**GROUP_CONFIG)
    b = a.bootstrap
    topic, group, other = uid("t"), uid("g"), uid("other")
    driver("confluent").create_topics(b, {topic: (1, {})})

    def join(c, gid):
        return c.request(68, 1, {"group_id": gid, "member_id": uuid.uuid4().hex,
                                 "member_epoch": 0, "instance_id": None, "rack_id": None,
                                 "rebalance_timeout": 30000,
                                 "subscribed_topic_names": [topic],
                                 "subscribed_topic_regex": None, "server_assignor": None,
                                 "topic_partitions": []})

    with RawClient(b) as c:
        r = join(c, group)
        assert (r.error_code, r.heartbeat_interval.total_seconds() * 1000) == (0, 500), r
    admin = AdminClient({"bootstrap.servers": b})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.heartbeat.interval.ms", "7000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=30)[res].result(30)

    def interval():
        with RawClient(b) as c:
            r = join(c, group)
            assert r.error_code == 0, r
            return r.heartbeat_interval.total_seconds() * 1000
    wait_until(lambda: interval() == 7000, 30, "the group's heartbeat interval in the answer")
    with RawClient(b) as c:
        r = join(c, other)
        assert (r.error_code, r.heartbeat_interval.total_seconds() * 1000) == (0, 500), r


def test_offset_commit_and_fetch_v10_name_topics_by_id(appliance_factory):
    """OffsetCommit v10 / OffsetFetch v10 (Kafka 4.1): topics by topic id both ways; an id the
    broker does not have is UNKNOWN_TOPIC_ID; a v10 commit is read back by name at v9 too."""
    a = appliance_factory()
    b = a.bootstrap
    topic, group = uid("t"), uid("g")
    driver("confluent").create_topics(b, {topic: (2, {})})
    nobody = uuid.uuid4()
    with RawClient(b) as c:
        md = c.request(3, 12, {"topics": [{"name": topic, "topic_id": None}],
                               "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})
        tid = md.topics[0].topic_id
        part = {"partition_index": 1, "committed_offset": 7, "committed_leader_epoch": -1,
                "committed_metadata": "m"}
        r = c.request(8, 10, {"group_id": group, "generation_id_or_member_epoch": -1,
                              "member_id": "", "group_instance_id": None, "topics": [
                                  {"topic_id": tid, "partitions": [part]},
                                  {"topic_id": nobody, "partitions": [part]}]})
        got = {t.topic_id: [(p.partition_index, p.error_code) for p in t.partitions]
               for t in r.topics}
        assert got == {tid: [(1, 0)], nobody: [(1, E_UNKNOWN_TOPIC_ID)]}, r
        f = c.request(9, 10, {"groups": [{"group_id": group, "member_id": None,
                                          "member_epoch": -1, "topics": [
                                              {"topic_id": tid, "partition_indexes": [0, 1]},
                                              {"topic_id": nobody, "partition_indexes": [0]}]}],
                              "require_stable": False})
        got = {t.topic_id: [(p.partition_index, p.committed_offset, p.error_code)
                            for p in t.partitions] for t in f.groups[0].topics}
        assert got == {tid: [(0, -1, 0), (1, 7, 0)], nobody: [(0, -1, E_UNKNOWN_TOPIC_ID)]}, f
        f = c.request(9, 10, {"groups": [{"group_id": group, "member_id": None,
                                          "member_epoch": -1, "topics": None}],
                              "require_stable": False})
        assert [(t.topic_id, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in f.groups[0].topics] == [(tid, [(1, 7)])], f
        f = c.request(9, 9, {"groups": [{"group_id": group, "member_id": None,
                                         "member_epoch": -1, "topics": None}],
                             "require_stable": False})
        assert [(t.name, [p.committed_offset for p in t.partitions])
                for t in f.groups[0].topics] == [(topic, [7])], f


def test_group_protocol_metrics_count_groups_by_type_state_and_rebalances(appliance_factory):
    """Kafka's group-coordinator-metrics (KIP-848): groups by protocol, consumer groups by state,
    consumer group rebalances, at /metrics."""
    from test_operating import metrics_app, scrape, val
    a = metrics_app(appliance_factory, **GROUP_CONFIG)
    b = a.bootstrap
    topic, group = uid("t"), uid("g")
    driver("confluent").create_topics(b, {topic: (2, {})})
    with RawClient(b) as c:
        r = c.request(68, 1, {"group_id": group, "member_id": uuid.uuid4().hex,
                              "member_epoch": 0, "instance_id": None, "rack_id": None,
                              "rebalance_timeout": 30000, "subscribed_topic_names": [topic],
                              "subscribed_topic_regex": None, "server_assignor": None,
                              "topic_partitions": []})
        assert r.error_code == 0, r
        c.request(8, 8, {"group_id": uid("classic"), "generation_id_or_member_epoch": -1,
                         "member_id": "", "group_instance_id": None, "topics": [
                             {"name": topic, "partitions": [{"partition_index": 0,
                                                             "committed_offset": 1,
                                                             "committed_leader_epoch": -1,
                                                             "committed_metadata": ""}]}]})
    name = "kafka_server_group_coordinator_metrics_"

    def shown(m):
        return (val(m, name + "group_count", protocol="consumer"),
                val(m, name + "group_count", protocol="classic"),
                val(m, name + "consumer_group_count", state="stable"),
                val(m, name + "consumer_group_count", state="empty"),
                (val(m, name + "consumer_group_rebalance_total") or 0) >= 1)
    wait_until(lambda: shown(scrape(a.metrics_port)) == (1, 1, 1, 0, True), 30,
               "one consumer group (Stable), one classic, a rebalance in the metrics")
