"""KIP-848 online migration (appliance.group.migration), sans-IO: classic members (JoinGroup /
SyncGroup / Heartbeat / LeaveGroup with the embedded consumer protocol) and consumer-protocol
members (ConsumerGroupHeartbeat) in one group, the upgrade and downgrade conversions, the
migration policy, and the conversions' records across a restart."""

import struct

import pytest

from appliance.errors import ErrorCode as E
from appliance.group.embedded_protocol import parse_assignment, parse_subscription
from appliance.group.membership import GroupCoordinator, MembershipConfig
from appliance.group.messages import (ConsumerGroupHeartbeatRequest, HeartbeatRequest,
                                      JoinGroupRequest, LeaveMember, SyncGroupRequest,
                                      TopicPartitions)

T0 = 1_700_000_000_000
T1 = b"\x01" * 16
TOPICS = {"t1": (T1, 4)}


def subscription(topics=("t1",), owned=None, version=1):
    """A ConsumerProtocolSubscription as the Java client / librdkafka write it."""
    out = struct.pack(">h", version) + struct.pack(">i", len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1)
    if version >= 1:
        owned = owned or {}
        out += struct.pack(">i", len(owned))
        for t, ps in owned.items():
            out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
            out += b"".join(struct.pack(">i", p) for p in ps)
    if version >= 2:
        out += struct.pack(">i", -1)
    if version >= 3:
        out += struct.pack(">h", -1)
    return out


def assignment(parts_by_topic):
    out = struct.pack(">h", 1) + struct.pack(">i", len(parts_by_topic))
    for t, ps in parts_by_topic.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


class Env:
    def __init__(self, **cfg):
        self.clock = T0
        cfg.setdefault("group_initial_rebalance_delay_ms", 0)
        self.gc = GroupCoordinator(MembershipConfig(**cfg), lambda g, r: None,
                                   lambda: self.clock, topics=lambda: TOPICS,
                                   new_uuid=lambda: "x")
        self.gc.load({})

    def join(self, member, *, owned=None, protocol_type="consumer", name="range",
             instance=None, session=10000, rebalance=20000):
        """A JoinGroup; a member "cN" not yet in the group joins a classic group as a new one
        (v3, no member id: it gets the id "cN-x")."""
        got = []
        g = self.gc.table.groups.get("g")
        new = g is None or not g.members or (g.group_type == "classic" and member not in g.members)
        self.gc.join_group(JoinGroupRequest(
            "g", "" if new else member, session, rebalance, protocol_type,
            [(name, subscription(owned=owned))], instance,
            member[:-2] if new and member.endswith("-x") else member, "/127.0.0.1",
            3 if new else 5), got.append)
        return got

    def sync(self, member, generation, assignments=(), name="range"):
        got = []
        self.gc.sync_group(SyncGroupRequest("g", generation, member, list(assignments), None,
                                            "consumer", name), got.append)
        (r,) = got
        return r

    def heartbeat(self, member, generation):
        return self.gc.heartbeat(HeartbeatRequest("g", generation, member))

    def hb(self, member, epoch, owned=None):
        if epoch == 0:
            owned = {}
        tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
        return self.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
            "g", member, epoch, None, None, 60000 if epoch == 0 else -1,
            ["t1"] if epoch == 0 else None, None, None, tps, "client", "/127.0.0.1", 1))

    def tick(self, ms):
        self.clock += ms
        self.gc.tick(self.clock)

    def group(self):
        return self.gc.table.groups["g"]

    def classic_group_of(self, *members):
        """A Stable classic group: the members join, the first (leader) assigns partitions
        round-robin."""
        pending = [self.join(m + "-x") for m in members]
        while not all(pending):
            self.tick(1)                        # KIP-134's initial delay (0 here), once more
        results = [p[0] for p in pending]
        gen = results[0].generation_id
        split = {m + "-x": [p for p in range(4) if p % len(members) == i]
                 for i, m in enumerate(members)}
        leader = next(r for r in results if r.leader == r.member_id)
        syncs = []
        for r in results:
            if r.member_id != leader.member_id:
                self.gc.sync_group(SyncGroupRequest("g", gen, r.member_id, [], None, "consumer",
                                                    "range"), syncs.append)
        self.sync(leader.member_id, gen,
                  [(m, assignment({"t1": ps})) for m, ps in split.items()])
        assert self.group().group_type == "classic" and self.group().state.value == "Stable"
        return gen


def partitions(sync_result):
    assert sync_result.error == E.none, sync_result
    return set(parse_assignment(sync_result.assignment).get("t1", ()))


def parts(result):
    assert result.error == E.none, result
    if result.assignment is None:
        return None
    return {p for t in result.assignment for p in t.partitions}


def test_a_consumer_member_upgrades_a_live_classic_group_and_the_last_one_downgrades_it():
    env = Env()
    gen = env.classic_group_of("c1")
    # a consumer-protocol member joins: the group becomes a consumer group at the classic
    # generation, the classic member keeps its four partitions until it rejoins
    r = env.hb("m1", 0)
    assert r.error == E.none and r.member_epoch == gen + 1 and parts(r) == set()
    g = env.group()
    assert g.group_type == "consumer" and g.members["c1-x"].classic.session_timeout_ms == 10000
    assert g.members["c1-x"].member_epoch == gen
    assert env.gc.validate_offset_commit("g", gen, "c1-x", None, api_version=8) == E.none
    # the classic member is told to rejoin; it revokes everything (eager) and rejoins
    assert env.heartbeat("c1-x", gen) == E.rebalance_in_progress
    (j,) = env.join("c1-x")
    assert (j.error, j.generation_id, j.leader, j.members, j.protocol_name) == (
        E.none, gen + 1, "", [], "range")
    mine = partitions(env.sync("c1-x", gen + 1))
    assert len(mine) == 2
    assert env.heartbeat("c1-x", gen + 1) == E.none
    assert env.gc.validate_offset_commit("g", gen, "c1-x", None, api_version=8) == \
        E.illegal_generation
    assert env.gc.validate_offset_fetch("g", "c1-x", gen) == E.illegal_generation
    # the consumer member now gets the other half; no partition is owned twice
    assert parts(env.hb("m1", gen + 1, owned={})) == {0, 1, 2, 3} - mine
    assert env.sync("c1-x", gen + 7).error == E.illegal_generation
    assert env.sync("m1", gen + 1).error == E.unknown_member_id        # not a classic member
    # the last consumer-protocol member leaves: the group is classic again, rebalancing
    assert env.hb("m1", -1).error == E.none
    g = env.group()
    assert g.group_type == "classic" and g.state.value == "PreparingRebalance"
    assert set(parse_assignment(g.members["c1-x"].assignment)["t1"]) == mine
    assert env.heartbeat("c1-x", gen + 1) == E.rebalance_in_progress
    (j,) = env.join("c1-x")
    assert j.error == E.none and j.leader == "c1-x"
    env.sync("c1-x", j.generation_id, [("c1-x", assignment({"t1": [0, 1, 2, 3]}))])
    assert env.group().state.value == "Stable"


def test_a_cooperative_classic_member_revokes_before_its_partitions_move():
    env = Env()
    gen = env.classic_group_of("c1")
    env.hb("m1", 0)
    # it rejoins still owning all four: two are to be revoked, its epoch stays
    (j,) = env.join("c1-x", owned={"t1": [0, 1, 2, 3]})
    assert j.generation_id == gen
    kept = partitions(env.sync("c1-x", gen))
    assert len(kept) == 2
    assert env.heartbeat("c1-x", gen) == E.rebalance_in_progress     # revoke, then rejoin
    assert parts(env.hb("m1", gen + 1, owned={})) in (None, set())  # not released yet
    (j,) = env.join("c1-x", owned={"t1": sorted(kept)})
    assert j.generation_id == gen + 1
    assert partitions(env.sync("c1-x", gen + 1)) == kept
    assert parts(env.hb("m1", gen + 1, owned={})) == {0, 1, 2, 3} - kept


def test_classic_members_join_a_consumer_group_and_leave_it():
    env = Env()
    env.hb("m1", 0)
    got = []
    env.gc.join_group(JoinGroupRequest("g", "", 10000, 20000, "consumer",
                                       [("range", subscription())], None, "c", "/h", 5),
                      got.append)
    (r,) = got
    assert r.error == E.member_id_required and r.member_id
    cid = r.member_id
    (j,) = env.join(cid)
    assert j.error == E.none and j.generation_id == 2
    # unknown to SyncGroup/Heartbeat until joined; a wrong protocol name is refused
    assert env.heartbeat("zz", 2) == E.unknown_member_id
    assert env.sync(cid, 2, name="roundrobin").error == E.inconsistent_group_protocol
    # another classic member must share a protocol with the classic members
    (bad,) = env.join("x", name="roundrobin")
    assert bad.error == E.inconsistent_group_protocol
    (bad,) = env.join("y", protocol_type="connect")
    assert bad.error == E.inconsistent_group_protocol
    res = env.gc.leave_group("g", [LeaveMember(cid), LeaveMember("m1")])
    assert [(m.member_id, m.error) for m in res.members] == [
        (cid, E.none), ("m1", E.unknown_member_id)]
    g = env.group()
    assert set(g.members) == {"m1"} and g.group_type == "consumer"


def test_classic_members_that_do_not_rejoin_or_sync_are_fenced():
    env = Env()
    gen = env.classic_group_of("c1", "c2")
    env.hb("m1", 0)
    assert env.heartbeat("c1-x", gen) == E.rebalance_in_progress
    (j,) = env.join("c2-x")                 # c2 rejoins but never syncs
    env.tick(20001)                       # both rebalance timeouts pass
    assert set(env.group().members) == {"m1"}


def test_the_migration_policy():
    # disabled: a live classic group is not a consumer group (Kafka's GROUP_ID_NOT_FOUND)
    env = Env(consumer_migration_policy="disabled")
    env.classic_group_of("c1")
    r = env.hb("m1", 0)
    assert r.error == E.group_id_not_found and "not a consumer group" in r.error_message
    assert env.group().group_type == "classic"
    # downgrade only: no upgrade either
    env = Env(consumer_migration_policy="downgrade")
    env.classic_group_of("c1")
    assert env.hb("m1", 0).error == E.group_id_not_found
    # upgrade only: the last consumer member leaving leaves a consumer group of classic members
    env = Env(consumer_migration_policy="upgrade")
    gen = env.classic_group_of("c1")
    assert env.hb("m1", 0).error == E.none
    assert env.hb("m1", -1).error == E.none
    g = env.group()
    assert g.group_type == "consumer" and set(g.members) == {"c1-x"}
    assert env.heartbeat("c1-x", gen) == E.rebalance_in_progress
    (j,) = env.join("c1-x")
    assert partitions(env.sync("c1-x", j.generation_id)) == {0, 1, 2, 3}
    # an empty group converts whatever the policy: classic members only, then none
    env.gc.leave_group("g", [LeaveMember("c1-x")])
    env.join("c9-x")                      # parked in the new classic group's join phase
    assert env.group().group_type == "classic"


def test_size_limits_refuse_the_conversion_and_the_join():
    env = Env(consumer_max_size=1)
    env.classic_group_of("c1", "c2")
    assert env.hb("m1", 0).error == E.group_id_not_found        # 2 members > max 1
    # one classic member converts, but the joining one does not fit: the heartbeat fails and
    # the conversion is undone (nothing of it was written), the classic member heartbeats on
    env = Env(consumer_max_size=1)
    gen = env.classic_group_of("c1")
    assert env.hb("m1", 0).error == E.group_max_size_reached
    assert env.group().group_type == "classic" and env.group().state.value == "Stable"
    assert env.heartbeat("c1-x", gen) == E.none
    env = Env(consumer_max_size=1)
    env.hb("m1", 0)
    (j,) = env.join("c1-x")
    assert j.error == E.group_max_size_reached


def _service(path, clock, **cfg):
    from appliance.config import GroupsConfig
    from appliance.group.service import GroupService
    gs = GroupService(str(path), GroupsConfig(initial_rebalance_delay_ms=0, **cfg), "os", None,
                      lambda: clock[0], topics=lambda: TOPICS)
    gs.load()
    return gs


@pytest.mark.parametrize("clean", [True, False])
def test_the_conversions_survive_a_restart(tmp_path, clean):
    """The upgrade writes the classic record's tombstone with the consumer group's records (the
    classic members' ClassicMemberMetadata among them), the downgrade the consumer records'
    tombstones with the classic record: each in one batch, each restored as written."""
    clock = [T0]
    gs = _service(tmp_path, clock)
    got = []
    gs.join_group(JoinGroupRequest("g", "", 10000, 20000, "consumer",
                                   [("range", subscription())], None, "c", "/h", 3), got.append)
    gs.groups.tick(clock[0] + 1)
    (j,) = got
    c1_id = j.member_id
    gs.sync_group(SyncGroupRequest("g", j.generation_id, c1_id,
                                   [(c1_id, assignment({"t1": [0, 1, 2, 3]}))], None,
                                   "consumer", "range"), got.append)
    r = gs.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
        "g", "m1", 0, None, None, 60000, ["t1"], None, None, [], "c", "/h", 1))
    assert r.error == E.none
    assert gs.offsets.stored_group("g") is None
    gs.close(clean)
    gs = _service(tmp_path, clock)
    g = gs.groups.table.groups["g"]
    assert g.group_type == "consumer" and set(g.members) == {c1_id, "m1"}
    c1 = g.members[c1_id]
    assert c1.classic.session_timeout_ms == 10000 and c1.classic.protocols[0][0] == "range"
    assert parse_subscription(c1.classic.protocols[0][1]).topics == ("t1",)
    assert c1.assigned == {T1: frozenset({0, 1, 2, 3})}
    # the consumer member leaves: classic again, and so after a restart
    r = gs.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
        "g", "m1", -1, None, None, -1, None, None, None, None, "c", "/h", 1))
    assert r.error == E.none
    assert gs.groups.table.groups["g"].group_type == "classic"
    gs.close(clean)
    gs = _service(tmp_path, clock)
    g = gs.groups.table.groups["g"]
    assert g.group_type == "classic" and set(g.members) == {c1_id}
    assert gs.offsets.consumer_group_records() == {}
    gs.close(True)


def _static_hb(env, member, epoch, instance, owned=None):
    tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
    return env.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
        "g", member, epoch, instance, None, 60000 if epoch == 0 else -1,
        ["t1"] if epoch == 0 else None, None, None, [] if epoch == 0 else tps, "client",
        "/127.0.0.1", 1))


def _static_join(env, instance, member_id=""):
    got = []
    env.gc.join_group(JoinGroupRequest("g", member_id, 10000, 20000, "consumer",
                                       [("range", subscription())], instance, "c", "/h", 5),
                      got.append)
    return got


def test_regression_a_classic_static_member_replacing_the_last_consumer_static_member_downgrades_at_once():
    """Kafka's classicGroupJoinToConsumerGroup step 4 (validateOnlineDowngradeWithReplacedMemberId,
    convertToClassicGroup with the joining member): a static member of the classic protocol
    taking the instance id of the group's last consumer-protocol member converts the group to a
    classic one in that JoinGroup, Stable, the joining member holding the replaced one's
    assignment (was: the group stayed a consumer group of classic members only)."""
    env = Env()
    gen = env.classic_group_of("c1")
    assert _static_hb(env, "m1", 0, "i-1").error == E.none         # upgrade, static
    assert env.heartbeat("c1-x", gen) == E.rebalance_in_progress
    (j,) = env.join("c1-x")
    c1_parts = partitions(env.sync("c1-x", j.generation_id))
    epoch = env.group().group_epoch
    r = _static_hb(env, "m1", epoch, "i-1", owned={})
    m1_parts = parts(r)
    assert m1_parts == {0, 1, 2, 3} - c1_parts
    assert _static_hb(env, "m1", epoch, "i-1", owned={T1: m1_parts}).error == E.none
    # the static consumer member leaves for a while (epoch -2): it keeps its place
    assert _static_hb(env, "m1", -2, "i-1").error == E.none
    assert env.group().group_type == "consumer" and "m1" in env.group().members
    # the same instance comes back on the classic protocol: the group is classic at once
    (j,) = _static_join(env, "i-1")
    assert j.error == E.none and j.member_id not in ("", "m1")
    g = env.group()
    assert g.group_type == "classic" and g.state.value == "Stable", g.group_type
    assert set(g.members) == {"c1-x", j.member_id}
    assert g.generation_id == epoch
    assert set(parse_assignment(g.members[j.member_id].assignment)["t1"]) == m1_parts
    assert set(parse_assignment(g.members["c1-x"].assignment)["t1"]) == c1_parts
    # its SyncGroup gets the replaced member's partitions, no rebalance on the way
    assert j.generation_id == epoch
    assert partitions(env.sync(j.member_id, j.generation_id)) == m1_parts
    assert env.heartbeat("c1-x", epoch) == E.none
    assert env.heartbeat(j.member_id, epoch) == E.none


def test_a_classic_static_member_replacing_a_consumer_static_member_keeps_the_group_when_others_use_the_consumer_protocol():
    """Not the last consumer-protocol member (another one is in), or the policy forbids the
    downgrade: the group stays a consumer group (Kafka's same checks)."""
    for policy, second in (("bidirectional", True), ("upgrade", False)):
        env = Env(consumer_migration_policy=policy)
        assert _static_hb(env, "m1", 0, "i-1").error == E.none
        if second:
            assert env.hb("m2", 0).error == E.none
        else:
            (j,) = env.join("c1-x")             # a classic member: all but m1 classic
            assert j.error == E.none
        assert _static_hb(env, "m1", -2, "i-1").error == E.none
        (j,) = _static_join(env, "i-1")
        assert j.error == E.none
        assert env.group().group_type == "consumer", policy
