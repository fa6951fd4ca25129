"""KIP-848 online migration with real clients: confluent-kafka classic members
(``group.protocol=classic``, eager round-robin: ``programs/group_member.py confluent``) and
consumer-protocol members (``confluent-consumer``) in one group, each member its own process,
while a producer writes throughout.

- rolling upgrade: the classic members are replaced one by one by consumer-protocol members (the
  first one's heartbeat converts the live classic group; the classic members are answered from
  the consumer group's target assignment); then a rolling downgrade: classic members come back
  and the consumer-protocol members leave one by one (the last one's leave converts the group
  back). Every record is read, none twice unless a member reported a refused commit, and the
  commits are kept to the end of every partition;
- ``consumer_migration_policy = "disabled"``: a consumer-protocol heartbeat to a live classic
  group is GROUP_ID_NOT_FOUND "Group X is not a consumer group." (at the wire); the classic
  member's generation goes on;
- static members: a classic static member taking the ``group.instance.id`` of the last
  consumer-protocol static member (gone with a static leave) downgrades the group in its
  JoinGroup.
"""

from __future__ import annotations

import signal
import threading
import uuid

import group_wire
from client_drivers import driver
from java_programs import java4_program  # noqa: F401 (fixture)
from raw_wire import RawClient
from test_groups import Member, committed_offsets, consumed, wait_until

import test_groups

PARTITIONS = 4
CONFIG = {"groups": {"consumer_heartbeat_interval_ms": 500, "consumer_session_timeout_ms": 6000,
                     "initial_rebalance_delay_ms": 0}}
E_GROUP_ID_NOT_FOUND = 69


def uid(*parts) -> str:
    return "-".join(str(p) for p in parts) + "-" + uuid.uuid4().hex[:6]


def group_type(bootstrap, group) -> str | None:
    with RawClient(bootstrap) as c:
        lg = c.request(16, 5, {"states_filter": [], "types_filter": []})
    return {g.group_id: g.group_type for g in lg.groups}.get(group)


def settled(members) -> bool:
    """Every partition owned by exactly one live member, each with one at least."""
    owned = [m.current() for m in members]
    return sorted(p for o in owned for p in o) == list(range(PARTITIONS)) and all(owned)


class Producer(threading.Thread):
    """Writes r0, r1, ... round-robin over the partitions until stopped (about 200 a second)."""

    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        from confluent_kafka import Producer as P
        self.p = P({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.sent: set[str] = set()
        self.halt = threading.Event()

    def run(self):
        i = 0
        while not self.halt.is_set():
            for _ in range(10):
                v = f"r{i}"
                self.p.produce(self.topic, value=v.encode(), partition=i % PARTITIONS)
                self.sent.add(v)
                i += 1
            self.p.poll(0)
            self.halt.wait(0.05)

    def stop(self) -> int:
        self.halt.set()
        self.join(30)
        assert self.p.flush(30) == 0
        return len(self.sent)


def test_rolling_upgrade_and_downgrade_while_producing(appliance_factory, monkeypatch,
                                                      java4_program):
    monkeypatch.setattr(test_groups, "PARTITIONS", PARTITIONS)
    a = appliance_factory(**CONFIG)
    b = a.bootstrap
    topic, group = uid("mig"), uid("g")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    producer = Producer(b, topic)
    everyone: list[Member] = []

    def start(client):
        m = Member(client, b, group, topic)
        everyone.append(m)
        return m

    try:
        live = [start("confluent"), start("confluent")]
        wait_until(lambda: settled(live), 60, "two classic members sharing the partitions")
        assert group_type(b, group) == "classic"
        producer.start()
        # Rolling upgrade: each classic member replaced by a consumer-protocol one.
        for i in range(2):
            new = start("confluent-consumer")
            if i == 0:
                wait_until(lambda: group_type(b, group) == "consumer", 60,
                           "the live classic group upgraded by the first heartbeat")
            wait_until(lambda: new.current(), 60, "the consumer-protocol member assigned")
            if i == 0:
                # ConsumerGroupDescribe v1 tells the classic members (MemberType 0) apart
                with RawClient(b) as c:
                    g = c.request(69, 1, {"group_ids": [group],
                                          "include_authorized_operations": False}).groups[0]
                assert sorted(m.member_type for m in g.members) == [0, 0, 1], g
            old = live.pop(0)
            old.stop(signal.SIGTERM)
            live.append(new)
            wait_until(lambda: settled(live), 60, "the partitions shared after the replacement")
        assert group_type(b, group) == "consumer"
        # Rolling downgrade: consumer-protocol members replaced by classic ones; the last
        # consumer-protocol member's leave makes it a classic group again.
        for i in range(2):
            new = start("confluent")
            wait_until(lambda: new.current(), 60, "the classic member assigned")
            old = live.pop(0)
            old.stop(signal.SIGTERM)
            live.append(new)
            if i == 1:
                wait_until(lambda: group_type(b, group) == "classic", 60,
                           "the group downgraded by the last consumer-protocol member's leave")
            wait_until(lambda: settled(live), 60, "the partitions shared after the replacement")
        # Kafka's Java client 4.3 as a passing member of each kind: with group.protocol=consumer
        # it upgrades the classic group (its Admin describes a consumer group of three), and its
        # leave downgrades it again; with group.protocol=classic, inside the consumer group.
        out = java4_program("Kip848Consumer", b, group, topic, "0", "consumer")
        assert (out["type"], out["members"]) == ("Consumer", "3"), out
        assert out["assigned"] and out["closed"] == "yes", out
        wait_until(lambda: group_type(b, group) == "classic" and settled(live), 60,
                   "the group downgraded after the Java member left")
        n = producer.stop()
        sent = producer.sent
        wait_until(lambda: set(consumed(everyone)) >= sent, 60, "every record read")
        got = consumed(everyone)
        refused = [e for m in everyone for e in m.commit_errors]
        if not refused:
            assert len(got) == len(set(got)), "a record was read twice with every commit taken"
        per_partition = {p: len([i for i in range(n) if i % PARTITIONS == p])
                         for p in range(PARTITIONS)}
        wait_until(lambda: committed_offsets(b, group, topic) == per_partition, 60,
                   "the commits at the end of every partition")
    finally:
        producer.halt.set()
        for m in everyone:
            m.stop(signal.SIGKILL)


def _heartbeat(c, group, topic, member, epoch):
    return c.request(68, 1, {"group_id": group, "member_id": member, "member_epoch": epoch,
                             "instance_id": None, "rack_id": None,
                             "rebalance_timeout": 30000 if epoch == 0 else -1,
                             "subscribed_topic_names": [topic] if epoch == 0 else None,
                             "subscribed_topic_regex": None, "server_assignor": None,
                             "topic_partitions": [] if epoch == 0 else None})


def test_migration_policy_disabled_refuses_the_upgrade(appliance_factory):
    """With the policy disabled a live classic group is not a consumer group: a
    consumer-protocol heartbeat is GROUP_ID_NOT_FOUND with Kafka's message, and the classic
    member's generation goes on undisturbed (the downgrade refused is a unit test:
    tests/unit/test_group_migration.py)."""
    a = appliance_factory(groups={**CONFIG["groups"], "consumer_migration_policy": "disabled"})
    b = a.bootstrap
    topic, group = uid("pol"), uid("gc")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    with RawClient(b) as c:
        j = group_wire.join(c, group)
        s = group_wire.sync(c, group, j.generation_id, j.member_id, {j.member_id: b""})
        assert s.error_code == 0, s
        r = _heartbeat(c, group, topic, uuid.uuid4().hex, 0)
        assert (r.error_code, r.error_message) == (
            E_GROUP_ID_NOT_FOUND, f"Group {group} is not a consumer group."), r
        assert group_type(b, group) == "classic"
        hb = c.request(12, 3, {"group_id": group, "generation_id": j.generation_id,
                               "member_id": j.member_id, "group_instance_id": None})
        assert hb.error_code == 0, hb


class _Polling(threading.Thread):
    """A confluent-kafka consumer in this process, polled until stopped; its assignment kept."""

    def __init__(self, bootstrap, group, topic, instance, protocol):
        super().__init__(daemon=True)
        from confluent_kafka import Consumer
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": instance,
                "auto.offset.reset": "earliest", "enable.auto.commit": False}
        if protocol == "consumer":
            conf["group.protocol"] = "consumer"
        else:
            conf.update({"partition.assignment.strategy": "range", "session.timeout.ms": 60000,
                         "heartbeat.interval.ms": 500})
        self.c = Consumer(conf)
        self.owned: set[int] = set()
        self.halt = threading.Event()
        self.c.subscribe([topic], on_assign=lambda _c, ps: self.owned.update(p.partition for p in ps),
                         on_revoke=lambda _c, ps: self.owned.difference_update(p.partition for p in ps))

    def run(self):
        while not self.halt.is_set():
            self.c.poll(0.1)
        self.c.close()

    def stop(self):
        self.halt.set()
        self.join(30)


def test_regression_a_static_classic_member_replacing_the_last_static_consumer_member_downgrades_at_once(
        appliance_factory):
    """confluent-kafka static members (group.instance.id): a classic one, then a
    consumer-protocol one (the group upgrades); the latter closes (a static leave, epoch -2: it
    keeps its place until its session times out, 60 s here) and its instance id comes back on
    the classic protocol: that JoinGroup makes the group classic again (Kafka's
    validateOnlineDowngradeWithReplacedMemberId), long before the session timeout would have
    removed the old member; the newcomer gets partitions in the classic group."""
    a = appliance_factory(groups={**CONFIG["groups"], "consumer_session_timeout_ms": 60000})
    b = a.bootstrap
    topic, group = uid("static"), uid("gs")
    driver("confluent").create_topics(b, {topic: (PARTITIONS, {})})
    members = [_Polling(b, group, topic, "i-a", "classic")]
    try:
        members[0].start()
        wait_until(lambda: members[0].owned, 60, "the classic member assigned")
        members.append(_Polling(b, group, topic, "i-b", "consumer"))
        members[1].start()
        wait_until(lambda: group_type(b, group) == "consumer" and members[1].owned, 60,
                   "the consumer-protocol static member in the upgraded group")
        members[1].stop()                      # ConsumerGroupHeartbeat epoch -2
        assert group_type(b, group) == "consumer"
        members.append(_Polling(b, group, topic, "i-b", "classic"))
        members[2].start()
        wait_until(lambda: group_type(b, group) == "classic", 30,
                   "the group downgraded by the classic member taking the instance id")
        wait_until(lambda: members[2].owned and members[0].owned
                   and sorted(members[0].owned | members[2].owned) == list(range(PARTITIONS))
                   and not members[0].owned & members[2].owned, 60,
                   "both classic members sharing the partitions")
    finally:
        for m in members:
            if m.is_alive():
                m.stop()
