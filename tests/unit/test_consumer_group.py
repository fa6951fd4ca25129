"""KIP-848 consumer groups (appliance.group.consumer_protocol / consumer_group / assignors),
sans-IO: a fake clock and a fake catalog, ConsumerGroupHeartbeat requests as clients send them."""

import pytest

from appliance.errors import ErrorCode as E
from appliance.group.assignors import range_assignor, uniform
from appliance.group.membership import GroupCoordinator, MembershipConfig
from appliance.group.messages import ConsumerGroupHeartbeatRequest, TopicPartitions

T0 = 1_700_000_000_000
HB = 5000
SESSION = 45000
T1 = b"\x01" * 16
T2 = b"\x02" * 16


class Env:
    def __init__(self, topics=None, **cfg):
        self.clock = T0
        self.topics = {"t1": (T1, 4)} if topics is None else topics
        self.empties = []
        self.writes = []
        self.gc = GroupCoordinator(MembershipConfig(**cfg), self.persist, lambda: self.clock,
                                   on_empty=lambda g, ts: self.empties.append(g),
                                   topics=lambda: self.topics)
        self.gc.load({})

    def persist(self, gid, rec):
        self.writes.append((gid, rec))

    def hb(self, member, epoch, *, group="g", topics=("t1",), owned=None, rebalance=60000,
           instance=None, assignor=None, version=1, full=None):
        """A heartbeat; ``owned`` is {topic_id: [partitions]} (None: not sent), join sends []."""
        if epoch == 0 and owned is None:
            owned = {}
        tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
        return self.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
            group, member, epoch, instance, None, rebalance if epoch == 0 or full else -1,
            list(topics) if (epoch == 0 or full) else None, None, assignor, tps,
            "client", "/127.0.0.1", version))

    def tick(self, ms):
        self.clock += ms
        self.gc.tick(self.clock)

    def group(self, gid="g"):
        return self.gc.table.groups[gid]


def parts(result, tid=T1):
    assert result.error == E.none, result
    if result.assignment is None:
        return None
    return {p for t in result.assignment if t.topic_id == tid for p in t.partitions}


def test_first_member_gets_every_partition_at_epoch_1():
    env = Env()
    r = env.hb("m1", 0)
    assert (r.member_id, r.member_epoch, r.heartbeat_interval_ms) == ("m1", 1, HB)
    assert parts(r) == {0, 1, 2, 3}
    g = env.group()
    assert (g.group_epoch, g.assignment_epoch, g.state.value) == (1, 1, "Stable")


def test_second_member_waits_until_first_revokes_then_gets_its_half():
    env = Env()
    env.hb("m1", 0)
    r2 = env.hb("m2", 0)
    # epoch 2's target gives m2 half, but m1 still owns everything: nothing free yet
    assert r2.member_epoch == 2 and parts(r2) == set()
    assert env.group().state.value == "Reconciling"
    # m1's next heartbeat: it must give up two partitions first, at its old epoch
    r1 = env.hb("m1", 1)
    assert r1.member_epoch == 1
    kept = parts(r1)
    assert len(kept) == 2
    # m2 still gets nothing while m1 has not confirmed the revocation
    assert parts(env.hb("m2", 2, owned={})) in (None, set())
    # m1 confirms (owned = what it kept): it moves to epoch 2
    r1 = env.hb("m1", 1, owned={T1: kept})
    assert r1.member_epoch == 2
    assert parts(r1) == kept or r1.assignment is None
    # now m2 receives the released partitions
    r2 = env.hb("m2", 2, owned={})
    assert parts(r2) == {0, 1, 2, 3} - kept
    assert env.group().state.value == "Stable"


def test_no_partition_ever_owned_by_two_members():
    env = Env(topics={"t1": (T1, 8)})
    owned: dict[str, set] = {}
    epochs: dict[str, int] = {}

    def beat(m):
        r = env.hb(m, epochs.get(m, 0), owned=None if m not in epochs else {T1: owned.get(m, set())})
        assert r.error == E.none, r
        epochs[m] = r.member_epoch
        if r.assignment is not None:
            owned[m] = parts(r)
        all_parts = [p for s in owned.values() for p in s]
        assert len(all_parts) == len(set(all_parts)), owned

    for m in ("a", "b", "c"):
        beat(m)
        for _ in range(3):
            for x in list(epochs):
                beat(x)
    assert sorted(len(s) for s in owned.values()) == [2, 3, 3]
    assert set().union(*owned.values()) == set(range(8))


def test_fenced_and_unknown_and_stale_epochs():
    env = Env()
    env.hb("m1", 0)
    assert env.hb("m1", 5).error == E.fenced_member_epoch
    assert env.hb("nobody", 3).error == E.unknown_member_id
    env.hb("m2", 0)
    env.hb("m1", 1)                         # revocation asked at epoch 1
    g = env.group()
    kept = set(g.members["m1"].assigned[T1])
    env.hb("m1", 1, owned={T1: kept})       # now at epoch 2, previous 1
    # the answer that bumped it was lost: epoch 1 with a subset of the assignment is accepted
    assert env.hb("m1", 1, owned={T1: kept}).member_epoch == 2
    # epoch 1 claiming partitions it does not have is fenced
    assert env.hb("m1", 1, owned={T1: {0, 1, 2, 3}}).error == E.fenced_member_epoch


def test_leave_moves_partitions_to_the_remaining_member():
    env = Env()
    env.hb("m1", 0)
    env.hb("m2", 0)
    kept = parts(env.hb("m1", 1))
    env.hb("m1", 1, owned={T1: kept})
    r = env.hb("m1", -1)
    assert (r.member_epoch, r.error) == (-1, E.none)
    r2 = env.hb("m2", 2, owned={T1: {0, 1, 2, 3} - kept})
    assert r2.member_epoch == 3 and parts(r2) == {0, 1, 2, 3}
    assert env.hb("m2", -1).member_epoch == -1
    assert env.group().state.value == "Empty" and env.empties == ["g"]


def test_session_timeout_fences_a_silent_member():
    env = Env()
    env.hb("m1", 0)
    env.hb("m2", 0)
    env.tick(SESSION - 1000)
    env.hb("m2", 2, owned={})
    env.tick(2000)                          # m1 silent for 46 s
    assert "m1" not in env.group().members
    r = env.hb("m2", 2, owned={})
    assert r.member_epoch == 3 and parts(r) == {0, 1, 2, 3}


def test_rebalance_timeout_fences_a_member_that_does_not_revoke():
    env = Env()
    env.hb("m1", 0, rebalance=10_000)
    env.hb("m2", 0)
    env.hb("m1", 1)                         # asked to revoke
    env.tick(5000)
    env.hb("m1", 1, owned={T1: {0, 1, 2, 3}})   # still holding everything
    env.tick(6000)
    assert "m1" not in env.group().members
    assert env.hb("m1", 1).error == E.unknown_member_id


def test_static_member_leaves_temporarily_and_its_replacement_inherits():
    env = Env()
    r = env.hb("a1", 0, instance="i1")
    env.hb("b", 0)
    a_parts = parts(env.hb("a1", 1, instance="i1"))
    env.hb("a1", 1, owned={T1: a_parts}, instance="i1")
    epoch = env.group().group_epoch
    r = env.hb("a1", -2, instance="i1")
    assert r.member_epoch == -2
    # an instance id held by a member that has not left
    assert env.hb("x", 0, instance="i9").error == E.none
    assert env.hb("y", 0, instance="i9").error == E.unreleased_instance_id
    epoch = env.group().group_epoch
    r = env.hb("a2", 0, instance="i1")
    assert parts(r) == a_parts and env.group().group_epoch == epoch   # no rebalance
    assert "a1" not in env.group().members


def test_request_checks():
    env = Env()
    assert env.hb("", 0).error == E.invalid_request                      # v1 needs an id
    r = env.hb("", 0, version=0)                                         # v0: the server picks
    assert r.error == E.none and len(r.member_id) == 22
    assert env.hb("m", 0, assignor="sticky").error == E.unsupported_assignor
    assert env.hb("m", -3).error == E.invalid_request
    assert env.hb("m", -2).error == E.invalid_request                    # no instance id
    assert env.hb("m", 0, owned={T1: {1}}).error == E.invalid_request


def test_unknown_topics_are_not_an_error_and_new_topics_and_partitions_reassign():
    env = Env(topics={})
    r = env.hb("m1", 0, topics=("later",))
    assert r.error == E.none and parts(r) == set()
    env.topics = {"later": (T2, 2)}
    r = env.hb("m1", r.member_epoch, owned={})
    assert parts(r, T2) == {0, 1}
    env.topics = {"later": (T2, 3)}                 # CreatePartitions
    r = env.hb("m1", r.member_epoch, owned={T2: {0, 1}})
    assert parts(r, T2) == {0, 1, 2}
    env.topics = {}                                 # DeleteTopics
    r = env.hb("m1", r.member_epoch, owned={T2: {0, 1, 2}})
    assert parts(r, T2) == set()


def test_group_max_size():
    env = Env(consumer_max_size=1)
    env.hb("m1", 0)
    assert env.hb("m2", 0).error == E.group_max_size_reached


def test_classic_and_consumer_share_the_namespace():
    env = Env()
    env.hb("m1", 0)
    listed = env.gc.list_groups((), ("consumer",)).groups
    assert [(g.group_id, g.group_type, g.group_state, g.protocol_type) for g in listed] == [
        ("g", "consumer", "Stable", "consumer")]
    assert env.gc.list_groups((), ("classic",)).groups == []
    (d,) = env.gc.describe_groups(["g"])
    assert d.error == E.group_id_not_found
    assert env.gc.delete_groups(["g"], lambda g: E.none) == {"g": E.non_empty_group}
    # an empty classic group (offsets only) becomes a consumer group
    env.gc.ensure_group("c")
    assert env.hb("m1", 0, group="c").error == E.none
    assert env.gc.table.groups["c"].group_type == "consumer"
    # a non-zero epoch to a group that is not a consumer group, or none at all, is
    # GROUP_ID_NOT_FOUND (Kafka's getOrMaybeCreateConsumerGroup), a leave too
    env.gc.ensure_group("lost")
    assert env.hb("m9", 4, group="lost").error == E.group_id_not_found
    assert env.hb("m9", 4, group="never").error == E.group_id_not_found
    assert env.hb("m9", -1, group="never").error == E.group_id_not_found
    (cd,) = env.gc.consumer_group_describe(["nope"])
    assert cd.error == E.group_id_not_found


def test_offset_commit_and_fetch_check_the_member_epoch():
    env = Env()
    r = env.hb("m1", 0)
    gc = env.gc
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9) == E.none
    assert gc.validate_offset_commit("g", 0, "m1", None, api_version=9) == E.stale_member_epoch
    assert gc.validate_offset_commit("g", 1, "zz", None, api_version=9) == E.unknown_member_id
    assert gc.validate_offset_commit("g", -1, "", None, api_version=9) == E.unknown_member_id
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=8) == E.unsupported_version
    assert gc.validate_offset_fetch("g", "m1", 1) == E.none
    assert gc.validate_offset_fetch("g", "m1", 7) == E.stale_member_epoch
    assert gc.validate_offset_fetch("g", "zz", 1) == E.unknown_member_id
    assert gc.validate_offset_fetch("g", None, -1) == E.none
    assert gc.validate_txn_offset_commit("g", 0, "m1", None) == E.stale_member_epoch
    env.hb("m1", -1)
    assert gc.validate_offset_commit("g", -1, "", None, api_version=9) == E.none


def test_regression_a_commit_at_the_epoch_before_a_rebalance_was_stale_for_kept_partitions():
    # KIP-1251 (assignment epochs): m1's epoch moves to 2 when m2 joins, but its client learns
    # that only from its next heartbeat; its commit of the partitions it keeps, still at epoch
    # 1, was STALE_MEMBER_EPOCH, and a consumer committing synchronously after every batch
    # stopped (its kept partitions too) until that heartbeat. Now it is accepted when every
    # partition it names has been the member's since epoch 1; not for one assigned later, not
    # from a member that does not own it, not with an epoch from the future.
    env = Env()
    gc = env.gc
    env.hb("m1", 0)
    env.hb("m2", 0)
    kept = parts(env.hb("m1", 1))
    moved = {0, 1, 2, 3} - kept
    k, m = min(kept), min(moved)
    # revoking (still epoch 1): its own epoch, every partition it still owns
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9,
                                     partitions=[("t1", k), ("t1", m)]) == E.none
    assert env.hb("m1", 1, owned={T1: kept}).member_epoch == 2        # revoked: epoch 2
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9,
                                     partitions=[("t1", p) for p in kept]) == E.none
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9,
                                     partitions=[("t1", m)]) == E.stale_member_epoch
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9) == E.stale_member_epoch
    # TxnOffsetCommit (KIP-447's group-fenced commits) is checked the same way, as in Kafka
    assert gc.validate_txn_offset_commit("g", 1, "m1", None, [("t1", k)]) == E.none
    assert gc.validate_txn_offset_commit("g", 1, "m1", None, [("t1", m)]) == E.stale_member_epoch
    assert gc.validate_offset_commit("g", 3, "m1", None, api_version=9,
                                     partitions=[("t1", k)]) == E.stale_member_epoch
    assert gc.validate_offset_commit("g", 1, "m1", None, api_version=9,
                                     partitions=[("nope", k)]) == E.stale_member_epoch
    # m2 got the moved ones at epoch 2: a commit of them at epoch 1 is not its
    assert parts(env.hb("m2", 2, owned={})) == moved
    assert gc.validate_offset_commit("g", 2, "m2", None, api_version=9,
                                     partitions=[("t1", m)]) == E.none
    assert gc.validate_offset_commit("g", 1, "m2", None, api_version=9,
                                     partitions=[("t1", m)]) == E.stale_member_epoch


# -- assignors -----------------------------------------------------------------------------------

def _count(res):
    return {m: sum(len(ps) for ps in a.values()) for m, a in res.items()}


@pytest.mark.parametrize("assignor", [uniform, range_assignor])
def test_assignors_balance_and_cover(assignor):
    topics = {"a": (T1, 7), "b": (T2, 5)}
    members = {m: (frozenset({"a", "b"}), {}) for m in ("m1", "m2", "m3")}
    res = assignor(members, topics)
    every = [(t, p) for a in res.values() for t, ps in a.items() for p in ps]
    assert len(every) == len(set(every)) == 12
    assert max(_count(res).values()) - min(_count(res).values()) <= (1 if assignor is uniform else 2)


@pytest.mark.parametrize("assignor", [uniform, range_assignor])
def test_assignors_are_sticky(assignor):
    topics = {"a": (T1, 12)}
    two = {m: (frozenset({"a"}), {}) for m in ("m1", "m2")}
    before = assignor(two, topics)
    three = {m: (frozenset({"a"}), before.get(m, {})) for m in ("m1", "m2", "m3")}
    after = assignor(three, topics)
    moved = sum(len(before[m][T1] - after[m].get(T1, frozenset())) for m in ("m1", "m2"))
    assert moved == 4                       # only what m3 needs moves
    assert _count(after) == {"m1": 4, "m2": 4, "m3": 4}


def test_uniform_heterogeneous_subscriptions():
    topics = {"a": (T1, 4), "b": (T2, 4)}
    members = {"m1": (frozenset({"a"}), {}), "m2": (frozenset({"a", "b"}), {}),
               "m3": (frozenset({"b", "gone"}), {})}
    res = uniform(members, topics)
    assert res["m1"].keys() <= {T1} and res["m3"].keys() <= {T2}
    every = [(t, p) for a in res.values() for t, ps in a.items() for p in ps]
    assert len(every) == len(set(every)) == 8
    assert sorted(_count(res).values()) == [2, 3, 3]


# -- durability: the records in the group log ----------------------------------------------------

def _service(path, clock, topics):
    from appliance.config import GroupsConfig
    from appliance.group.service import GroupService
    gs = GroupService(str(path), GroupsConfig(), "os", None, lambda: clock[0],
                      topics=lambda: topics)
    gs.load()
    return gs


def _hb(gs, member, epoch, owned=None, topics=("t1",)):
    if epoch == 0:
        owned = {}
    tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
    return gs.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
        "g", member, epoch, None, None, 60000 if epoch == 0 else -1,
        list(topics) if epoch == 0 else None, None, None, tps, "c", "/h", 1))


@pytest.mark.parametrize("clean", [True, False])
def test_a_restart_keeps_epochs_and_assignments(tmp_path, clean):
    """ConsumerGroupMetadata, PartitionMetadata, MemberMetadata, TargetAssignment and
    CurrentMemberAssignment records: a coordinator restarted (closed, or not: a kill -9) gives
    every member back its epoch, assignment and pending revocation, so members heartbeat on
    without rejoining; the group's records also survive a compaction."""
    clock = [T0]
    topics = {"t1": (T1, 4)}
    gs = _service(tmp_path, clock, topics)
    _hb(gs, "m1", 0)
    _hb(gs, "m2", 0)
    kept = parts(_hb(gs, "m1", 1))                      # m1 asked to revoke two
    before = gs.groups.consumer_group_describe(["g"])[0]
    gs.close(clean)
    gs = _service(tmp_path, clock, topics)
    after = gs.groups.consumer_group_describe(["g"])[0]
    assert after == before
    g = gs.groups.table.groups["g"]
    assert g.members["m1"].state.value == "unrevoked_partitions"
    # m1 goes on from where it was: revokes, moves to epoch 2; m2 gets the released half
    r = _hb(gs, "m1", 1, owned={T1: kept})
    assert (r.error, r.member_epoch) == (E.none, 2)
    r = _hb(gs, "m2", 2, owned={})
    assert parts(r) == {0, 1, 2, 3} - kept
    gs.offsets.store.compact(clock[0])
    gs.close(True)
    gs = _service(tmp_path, clock, topics)
    g = gs.groups.table.groups["g"]
    assert {m: (x.member_epoch, dict(x.assigned)) for m, x in g.members.items()} == {
        "m1": (2, {T1: frozenset(kept)}), "m2": (2, {T1: frozenset({0, 1, 2, 3} - kept)})}
    # a leave and a delete leave nothing behind
    _hb(gs, "m1", -1)
    _hb(gs, "m2", -1)
    assert gs.groups.delete_groups(["g"], lambda _g: E.none) == {"g": E.none}
    gs.close(True)
    gs = _service(tmp_path, clock, topics)
    assert "g" not in gs.groups.table.groups and gs.offsets.consumer_group_records() == {}
    gs.close(True)


def test_regex_subscriptions_use_re2_full_match_and_follow_the_catalog():
    env = Env(topics={"orders-eu": (T1, 2), "orders": (T2, 1), "xorders-us": (b"\x03" * 16, 1)})

    def hb(member, epoch, regex, owned=None):
        if epoch == 0:
            owned = {}
        tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
        return env.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
            "g", member, epoch, None, None, 60000 if epoch == 0 else -1,
            [] if epoch == 0 else None, regex, None, tps, "c", "/h", 1))

    r = hb("m1", 0, "orders-.*")            # full match: not "xorders-us", not "orders"
    env.tick(0)                             # resolved after the heartbeat, as Kafka does
    r = hb("m1", r.member_epoch, None, owned={})
    assert parts(r, T1) == {0, 1} and parts(r, T2) == set()
    env.topics = {**env.topics, "orders-us": (b"\x04" * 16, 1)}   # created: re-evaluated
    r = hb("m1", r.member_epoch, None, owned={T1: {0, 1}})
    assert parts(r, b"\x04" * 16) == {0}
    assert hb("m2", 0, "(?<=a)b").error == E.invalid_regular_expression     # RE2 refuses it
    r = hb("m1", r.member_epoch, "", owned={T1: {0, 1}, b"\x04" * 16: {0}})  # "" clears it
    assert r.error == E.none and env.group().members["m1"].subscribed_topic_regex is None


def test_group_configs_override_the_broker_session_timeout_and_interval():
    """Issue 35: a GROUP resource's consumer.* configs apply to that group only (Kafka's
    consumerGroupSessionTimeoutMs / consumerGroupHeartbeatIntervalMs)."""
    env = Env()
    configs = {"g": {"consumer.heartbeat.interval.ms": "7000",
                     "consumer.session.timeout.ms": "50000"}}
    env.gc.table.group_configs = lambda gid: configs.get(gid, {})
    r = env.hb("m1", 0)
    assert r.heartbeat_interval_ms == 7000
    assert env.hb("m2", 0, group="h").heartbeat_interval_ms == env.gc.config.consumer_heartbeat_interval_ms
    # the session is the group's: alive past the broker's timeout, fenced after the group's
    env.tick(env.gc.config.consumer_session_timeout_ms + 1)
    assert "m1" in env.group().members and "m2" not in env.group("h").members
    env.tick(50000)
    assert "m1" not in env.group().members


def test_regex_matches_are_filtered_by_the_members_topic_describe_acls():
    """KAFKA-18813: with the authorizer on, a regex subscription gets only the topics the member
    may Describe; an ACL change applies at its next heartbeat."""
    T3 = b"\x03" * 16
    env = Env(topics={"orders-eu": (T1, 2), "orders-us": (T3, 1)})
    denied = {("User:alice", "orders-us")}
    env.gc.consumer.describe_topic = lambda p, a, t: (p, t) not in denied

    def hb(member, epoch, regex, owned=None, principal="User:alice"):
        if epoch == 0:
            owned = {}
        tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
        return env.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
            "g", member, epoch, None, None, 60000 if epoch == 0 else -1,
            [] if epoch == 0 else None, regex, None, tps, "c", "/h", 1, principal, "127.0.0.1"))

    hb("m1", 0, "orders-.*")
    env.tick(0)                               # the new regex resolved
    r = hb("m1", 1, None, owned={})
    assert parts(r, T1) == {0, 1} and parts(r, T3) == set()
    assert set(env.group().subscription_metadata) == {"orders-eu"}
    denied.clear()                            # allowed now: the next heartbeat gets it
    r = hb("m1", r.member_epoch, None, owned={T1: {0, 1}})
    assert parts(r, T3) == {0}
    denied.add(("User:alice", "orders-eu"))   # denied now: revoked
    r = hb("m1", r.member_epoch, None, owned={T1: {0, 1}, T3: {0}})
    assert parts(r, T1) == set() and set(env.group().subscription_metadata) == {"orders-us"}


def test_protocol_metrics_count_groups_by_type_and_state_and_the_rebalances():
    env = Env()
    env.hb("m1", 0)
    env.gc.ensure_group("c")
    by_type, by_state, rebalances = env.gc.protocol_metrics()
    assert by_type == {"classic": 1, "consumer": 1}
    assert by_state == {"empty": 0, "assigning": 0, "reconciling": 0, "stable": 1, "dead": 0}
    assert rebalances == 1
    env.hb("m2", 0)                      # joins: a new target, m1 must give up partitions
    by_type, by_state, rebalances = env.gc.protocol_metrics()
    assert by_state["reconciling"] == 1 and rebalances == 2


def test_a_new_regex_is_resolved_after_the_heartbeat_that_brings_it():
    """Kafka resolves a regex no member of the group has yet asynchronously
    (maybeUpdateRegularExpressions): the heartbeat that brings it gets the literal topics, the
    matches come with the epoch the resolution bumps (librdkafka's 0045 resubscribe_with_regex
    expects the two steps); a regex another member already has is resolved at once."""
    T3 = b"\x03" * 16
    env = Env(topics={"t1": (T1, 2), "orders-eu": (T2, 2), "orders-us": (T3, 1)})

    def hb(member, epoch, owned=None):
        if epoch == 0:
            owned = {}
        tps = None if owned is None else [TopicPartitions(t, sorted(ps)) for t, ps in owned.items()]
        return env.gc.consumer_group_heartbeat(ConsumerGroupHeartbeatRequest(
            "g", member, epoch, None, None, 60000 if epoch == 0 else -1,
            ["t1"] if epoch == 0 else None, "orders-.*" if epoch == 0 else None, None, tps,
            "c", "/h", 1))

    r = hb("m1", 0)
    assert (r.member_epoch, parts(r, T1), parts(r, T2)) == (1, {0, 1}, set())
    env.tick(0)
    assert env.group().group_epoch == 2
    r = hb("m1", 1, owned={T1: {0, 1}})
    assert (r.member_epoch, parts(r, T2), parts(r, T3)) == (2, {0, 1}, {0})
    # a second member with the same regex: no wait, its join computes the matches
    r = hb("m2", 0)
    assert r.member_epoch == 3 and not env.group().unresolved_regexes
    assert set(env.group().subscription_metadata) == {"t1", "orders-eu", "orders-us"}
