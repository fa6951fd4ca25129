"""The classic group membership coordinator (appliance.group.membership), sans-IO: a fake clock,
an in-memory "group log" for persist, and respond callables that record what they get."""

import itertools

import pytest

from appliance.errors import ErrorCode as E
from appliance.group.classic_group import GroupState, parse_subscription_topics
from appliance.group.membership import GroupCoordinator, MembershipConfig
from appliance.group.messages import (HeartbeatRequest, JoinGroupRequest, LeaveMember,
                                      SyncGroupRequest, SyncGroupResult)
from appliance.group.records import GroupRecord

T0 = 1_700_000_000_000
SESSION = 10_000
REBALANCE = 30_000
DELAY = 3_000
PROTOS = (("range", b"meta-range"), ("roundrobin", b"meta-rr"))


class Reply:
    """A respond callable that must be called exactly once."""

    def __init__(self):
        self.calls = []

    def __call__(self, result):
        self.calls.append(result)

    @property
    def done(self) -> bool:
        assert len(self.calls) <= 1, self.calls
        return bool(self.calls)

    @property
    def r(self):
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


class Env:
    def __init__(self, *, load=True, stored=None, **cfg):
        self.clock = T0
        self.stored: dict[str, GroupRecord] = {} if stored is None else stored
        self.writes: list[tuple[str, GroupRecord | None]] = []
        self.persist_error = None
        self.empties: list[tuple[str, int]] = []
        ids = itertools.count(1)
        self.cfg = MembershipConfig(**{"group_initial_rebalance_delay_ms": DELAY, **cfg})
        self.gc = GroupCoordinator(self.cfg, self.persist, lambda: self.clock,
                                   on_empty=lambda g, ts: self.empties.append((g, ts)),
                                   new_uuid=lambda: f"u{next(ids)}")
        if load:
            self.gc.load(dict(self.stored))

    def persist(self, gid, rec):
        if self.persist_error is not None:
            return self.persist_error
        self.writes.append((gid, rec))
        if rec is None:
            self.stored.pop(gid, None)
        else:
            self.stored[gid] = rec
        return None

    def advance(self, ms: int) -> None:
        self.clock += ms
        self.gc.tick(self.clock)

    def join(self, member_id="", gid="g", iid=None, client="c", protocols=PROTOS, version=9,
             session=SESSION, rebalance=REBALANCE, ptype="consumer") -> Reply:
        rep = Reply()
        self.gc.join_group(JoinGroupRequest(gid, member_id, session, rebalance, ptype,
                                            list(protocols), iid, client, "/127.0.0.1", version),
                           rep)
        return rep

    def join_new(self, client, gid="g", **kw) -> Reply:
        """KIP-394 round trip: the first JoinGroup gets MEMBER_ID_REQUIRED and an id."""
        first = self.join("", gid, client=client, **kw).r
        assert first.error == E.member_id_required
        assert first.member_id.startswith(client + "-")
        return self.join(first.member_id, gid, client=client, **kw)

    def sync(self, mid, gen, gid="g", assignments=(), iid=None, version=5, ptype="consumer",
             pname="range") -> Reply:
        rep = Reply()
        self.gc.sync_group(SyncGroupRequest(gid, gen, mid, list(assignments), iid, ptype, pname,
                                            version), rep)
        return rep

    def hb(self, mid, gen, gid="g", iid=None):
        return self.gc.heartbeat(HeartbeatRequest(gid, gen, mid, iid))

    def state(self, gid="g"):
        return self.gc.group_state(gid)

    def stable_group(self, clients=("a", "b", "c"), gid="g", statics=False):
        """Join and sync ``clients`` into a Stable group; returns (generation, {client: id},
        leader id)."""
        reps = {}
        for c in clients:
            if statics:
                reps[c] = self.join("", gid, iid=c, client=c)
            else:
                reps[c] = self.join_new(c, gid)
        for _ in range(20):
            if all(r.done for r in reps.values()):
                break
            self.advance(DELAY)
        res = {c: r.r for c, r in reps.items()}
        assert {r.error for r in res.values()} == {E.none}
        gen = res[clients[0]].generation_id
        ids = {c: r.member_id for c, r in res.items()}
        leader = res[clients[0]].leader
        syncs = [self.sync(i, gen, gid) for i in ids.values() if i != leader]
        lead = self.sync(leader, gen, gid, [(i, f"assign-{i}".encode()) for i in ids.values()])
        for s in syncs + [lead]:
            assert s.r.error == E.none
        assert self.state(gid) == "Stable"
        return gen, ids, leader


# -- the protocol ---------------------------------------------------------------------------------

def test_full_join_sync_round_of_three_members():
    env = Env()
    a = env.join_new("a")
    assert not a.done and env.state() == "PreparingRebalance"      # initial delay (KIP-134)
    b = env.join_new("b")
    c = env.join_new("c")
    env.advance(DELAY)
    # new members arrived during the first delay: it is extended once more
    assert not a.done and not b.done and not c.done
    env.advance(DELAY)
    ra, rb, rc = a.r, b.r, c.r
    assert ra.error == rb.error == rc.error == E.none
    assert ra.generation_id == rb.generation_id == rc.generation_id == 1
    assert ra.protocol_name == "range" and ra.protocol_type == "consumer"
    assert ra.leader == rb.leader == rc.leader == ra.member_id        # first member leads
    assert [m.member_id for m in ra.members] == [ra.member_id, rb.member_id, rc.member_id]
    assert {m.metadata for m in ra.members} == {b"meta-range"}
    assert rb.members == [] and rc.members == []
    assert env.state() == "CompletingRebalance"
    assert env.hb(rb.member_id, 1) == E.none                         # heartbeats while syncing

    sb, sc = env.sync(rb.member_id, 1), env.sync(rc.member_id, 1)
    assert not sb.done and not sc.done and env.writes == []
    sa = env.sync(ra.member_id, 1, assignments=[(ra.member_id, b"A"), (rb.member_id, b"B")])
    assert sa.r == SyncGroupResult(E.none, "consumer", "range", b"A")
    assert sb.r.assignment == b"B"
    assert sc.r.assignment == b""                                     # leader left it out
    assert env.state() == "Stable"
    # stored before anyone got the assignment, with every member
    (gid, rec), = env.writes
    assert gid == "g" and rec.generation == 1 and rec.protocol == "range"
    assert rec.leader == ra.member_id and rec.protocol_type == "consumer"
    assert [(m.member_id, m.assignment, m.subscription) for m in rec.members] == [
        (ra.member_id, b"A", b"meta-range"), (rb.member_id, b"B", b"meta-range"),
        (rc.member_id, b"", b"meta-range")]
    assert rec.members[0].client_host == "/127.0.0.1" and rec.members[0].session_timeout == SESSION
    # a follower's SyncGroup in Stable gets its assignment again
    assert env.sync(rb.member_id, 1).r.assignment == b"B"
    d, = env.gc.describe_groups(["g"])
    assert (d.error, d.group_state, d.protocol_type, d.protocol_data) == (E.none, "Stable",
                                                                          "consumer", "range")
    assert [(m.member_id, m.client_id, m.member_assignment) for m in d.members] == [
        (ra.member_id, "a", b"A"), (rb.member_id, "b", b"B"), (rc.member_id, "c", b"")]


def test_initial_delay_is_bounded_by_the_rebalance_timeout():
    env = Env(group_initial_rebalance_delay_ms=3_000)
    first = env.join_new("m0", rebalance=7_000)
    n = 1
    waited = 0
    while not first.done:
        env.join_new(f"m{n}", rebalance=7_000)            # a new member in every delay
        n += 1
        env.advance(1_000)
        waited += 1_000
        assert waited <= 10_000
    assert waited == 7_000                                  # 3000 + 3000 + min(3000, 1000)


def test_protocol_selected_by_vote():
    env = Env(group_initial_rebalance_delay_ms=0)
    rr_first = (("roundrobin", b"x"), ("range", b"y"))
    reps = [env.join_new("a", protocols=rr_first), env.join_new("b", protocols=rr_first),
            env.join_new("c", protocols=PROTOS + (("sticky", b"z"),))]
    env.advance(0)          # members arrived during the (zero) delay: one more zero delay
    env.advance(0)
    assert {r.r.protocol_name for r in reps} == {"roundrobin"}
    # a member supporting none of the group's protocols cannot join
    assert env.join("", protocols=[("sticky", b"")]).r.error == E.inconsistent_group_protocol


def test_member_id_required_round_trip_and_pending_expiry():
    env = Env()
    r = env.join("", client="cli").r
    assert (r.error, r.member_id) == (E.member_id_required, "cli-u1")
    assert env.state() == "Empty"
    env.advance(SESSION)                                   # never came back: forgotten
    assert env.join("cli-u1", client="cli").r.error == E.unknown_member_id
    # JoinGroup v3 gets in without the round trip
    v3 = env.join("", client="old", version=3)
    env.advance(DELAY)
    assert v3.r.error == E.none and v3.r.member_id == "old-u2"


def test_join_phase_waits_for_pending_member_ids():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    ra = env.join(ids["a"])                                # the leader rejoins: rebalance
    assert env.state() == "PreparingRebalance" and not ra.done
    c = env.join("", client="c").r                          # pending id, not a member yet
    assert c.error == E.member_id_required
    rb = env.join(ids["b"])
    assert not ra.done                                     # still waiting for the pending id
    rc = env.join(c.member_id, client="c")
    assert ra.r.generation_id == rb.r.generation_id == rc.r.generation_id == gen + 1
    assert len(ra.r.members) == 3


def test_rebalance_on_leave():
    env = Env()
    gen, ids, leader = env.stable_group()
    res = env.gc.leave_group("g", [LeaveMember(ids["b"]), LeaveMember("nobody"),
                                   LeaveMember("", "no-such-instance")])
    assert res.error == E.none
    assert [m.error for m in res.members] == [E.none, E.unknown_member_id, E.unknown_member_id]
    assert res.legacy_error == E.unknown_member_id
    assert env.state() == "PreparingRebalance"
    assert env.hb(ids["a"], gen) == E.rebalance_in_progress
    assert env.hb(ids["b"], gen) == E.unknown_member_id
    ra = env.join(ids["a"])
    rc = env.join(ids["c"])                                # everyone known rejoined: at once
    assert ra.r.generation_id == rc.r.generation_id == gen + 1
    assert [m.member_id for m in ra.r.members] == [ids["a"], ids["c"]]
    # v0-2 form: one member id, one error
    assert env.gc.leave_group("g", [(ids["c"], None)]).legacy_error == E.none
    assert env.gc.leave_group("unknown", [("x", None)]).legacy_error == E.unknown_member_id


def test_last_member_leaving_empties_and_stores_the_group():
    env = Env()
    gen, ids, leader = env.stable_group(("a",))
    env.writes.clear()
    env.gc.leave_group("g", [LeaveMember(ids["a"])])
    assert env.state() == "Empty"
    (gid, rec), = env.writes
    assert rec.members == [] and rec.protocol is None and rec.generation == gen + 1
    assert env.empties == [("g", env.clock)]
    assert env.gc.empty_since("g") == env.clock and env.gc.is_empty_or_dead("g")


def test_rebalance_on_session_expiry():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    for _ in range(3):
        env.advance(SESSION // 3)
        assert env.hb(ids["a"], gen) == E.none             # b stays silent
    assert env.state() == "Stable"
    env.advance(SESSION // 3)
    assert env.state() == "PreparingRebalance"             # b expired and was removed
    assert env.hb(ids["a"], gen) == E.rebalance_in_progress
    assert env.hb(ids["b"], gen) == E.unknown_member_id
    r = env.join(ids["a"]).r
    assert r.generation_id == gen + 1 and [m.member_id for m in r.members] == [ids["a"]]


def test_rebalance_timeout_removes_a_member_that_does_not_rejoin():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    ra = env.join(ids["a"])
    t = 0
    while t + 3_000 < REBALANCE:
        env.advance(3_000)
        t += 3_000
        # b heartbeats but never rejoins; a sits in JoinGroup longer than its session timeout
        assert env.hb(ids["b"], gen) == E.rebalance_in_progress
    assert not ra.done
    env.advance(REBALANCE - t)
    assert ra.r.error == E.none and ra.r.generation_id == gen + 1
    assert [m.member_id for m in ra.r.members] == [ids["a"]]
    assert env.hb(ids["b"], gen) == E.unknown_member_id
    # b comes back as a new member and gets a rebalance of its own
    rb = env.join_new("b")
    assert env.state() == "PreparingRebalance" and not rb.done


def test_member_that_never_syncs_is_removed_after_the_rebalance_timeout():
    env = Env()
    a, b = env.join_new("a"), env.join_new("b")
    env.advance(DELAY)
    env.advance(DELAY)
    ra, rb = a.r, b.r
    sa = env.sync(ra.member_id, ra.generation_id)          # leader syncs, b never does
    assert sa.r.error == E.none and env.state() == "Stable"
    for _ in range(REBALANCE // 3_000):
        env.advance(3_000)
        env.hb(ra.member_id, ra.generation_id)
    assert env.state() == "PreparingRebalance"
    assert env.hb(rb.member_id, rb.generation_id) == E.unknown_member_id


def test_follower_sync_parked_until_leader_and_answered_on_rebalance():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    ra, rb = env.join(ids["a"]), env.join(ids["b"])
    gen2 = ra.r.generation_id
    sb = env.sync(ids["b"], gen2)
    assert not sb.done
    env.join_new("c")                                      # a newcomer before the leader syncs
    assert sb.r.error == E.rebalance_in_progress
    assert env.sync(ids["a"], gen2).r.error == E.rebalance_in_progress


# -- static membership (KIP-345) ------------------------------------------------------------------

def test_static_member_replaced_without_rebalance_and_old_id_fenced():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    assert ids["a"].startswith("a-")                        # instance id prefixes static ids
    env.writes.clear()
    r = env.join("", iid="b", client="b").r                 # b restarted, lost its member id
    assert r.error == E.none and r.generation_id == gen and r.member_id != ids["b"]
    assert not r.skip_assignment and r.members == []        # a follower
    assert env.state() == "Stable"                          # no rebalance
    (gid, rec), = env.writes                                # the new id is stored
    assert [m.member_id for m in rec.members] == [ids["a"], r.member_id]
    assert rec.members[1].assignment == f"assign-{ids['b']}".encode()
    assert env.hb(ids["b"], gen, iid="b") == E.fenced_instance_id
    assert env.sync(ids["b"], gen, iid="b").r.error == E.fenced_instance_id
    assert env.gc.leave_group("g", [LeaveMember(ids["b"], "b")]).members[0].error == \
        E.fenced_instance_id
    assert env.hb(r.member_id, gen, iid="b") == E.none
    assert env.sync(r.member_id, gen, iid="b").r.assignment == f"assign-{ids['b']}".encode()


def test_static_leader_rejoin_v9_skip_assignment_and_before_v9_old_leader():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    assert leader == ids["a"]
    r = env.join("", iid="a", client="a").r
    assert r.error == E.none and r.skip_assignment and r.leader == r.member_id
    assert {m.member_id for m in r.members} == {r.member_id, ids["b"]}
    assert env.state() == "Stable"
    r8 = env.join("", iid="a", client="a", version=8).r
    assert not r8.skip_assignment and r8.members == []
    assert r8.leader == r.member_id                         # the previous leader id
    assert r8.member_id != r.member_id and env.state() == "Stable"


def test_static_member_with_new_protocols_triggers_rebalance():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    r = env.join("", iid="b", client="b", protocols=(("roundrobin", b"x"), ("range", b"y")))
    # votes: a range, b roundrobin: a tie, won by the first vote (range): no change, no rebalance
    assert r.done and env.state() == "Stable"
    r2 = env.join("", iid="a", client="a", protocols=(("roundrobin", b"x"),))
    assert not r2.done and env.state() == "PreparingRebalance"


def test_static_member_replacement_during_sync_fences_parked_sync_and_rebalances():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    ra, rb = env.join(ids["a"], iid="a"), env.join(ids["b"], iid="b")
    gen2 = rb.r.generation_id
    sb = env.sync(ids["b"], gen2, iid="b")
    new_b = env.join("", iid="b", client="b")
    assert sb.r.error == E.fenced_instance_id
    assert env.state() == "PreparingRebalance" and not new_b.done


def test_static_members_survive_rebalance_timeout_but_not_session_timeout():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    ra = env.join(ids["a"], iid="a")
    for _ in range(REBALANCE // 3_000):                     # b heartbeats but never rejoins
        env.advance(3_000)
        env.hb(ids["b"], gen, iid="b")
    assert ra.r.error == E.none
    assert {m.member_id for m in ra.r.members} == {ids["a"], ids["b"]}   # b kept (static)


def test_failed_store_of_static_replacement_reverts():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    env.persist_error = E.not_enough_replicas
    r = env.join("", iid="b", client="b").r
    assert r.error == E.coordinator_not_available and r.member_id == ""
    env.persist_error = None
    assert env.hb(ids["b"], gen, iid="b") == E.none         # the old id is still the member


# -- heartbeat, admin -----------------------------------------------------------------------------

def test_heartbeat_errors():
    env = Env()
    assert env.hb("x", 0, gid="") == E.invalid_group_id
    assert env.hb("x", 0, gid="nope") == E.unknown_member_id
    a, b = env.join_new("a"), env.join_new("b")
    env.advance(DELAY)
    assert not a.done                                       # initial delay extended once
    assert env.hb("a-u1", 0) == E.rebalance_in_progress     # a member, parked in JoinGroup
    env.advance(DELAY)
    mid, gen = a.r.member_id, a.r.generation_id
    assert env.hb(mid, gen) == E.none                       # CompletingRebalance
    assert env.hb(mid, gen + 1) == E.illegal_generation
    assert env.hb("stranger", gen) == E.unknown_member_id
    assert env.hb(mid, gen, iid="inst") == E.unknown_member_id
    assert env.join(b.r.member_id).r.generation_id == gen    # a follower's lost answer again
    assert env.state() == "CompletingRebalance"
    env.join(mid, protocols=[("range", b"changed")])        # new metadata: rebalance
    assert env.hb(b.r.member_id, gen) == E.rebalance_in_progress


def test_describe_list_delete():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), gid="busy")
    env.gc.validate_offset_commit("simple", -1, "", None)   # a standalone consumer's group
    d = {g.group_id: g for g in env.gc.describe_groups(["busy", "simple", "ghost"])}
    assert d["ghost"].group_state == "Dead" and d["ghost"].error == E.none
    assert d["simple"].group_state == "Empty" and d["simple"].protocol_type == ""
    lg = env.gc.list_groups()
    assert lg.error == E.none
    assert sorted((g.group_id, g.protocol_type, g.group_state, g.group_type) for g in lg.groups) \
        == [("busy", "consumer", "Stable", "classic"), ("simple", "", "Empty", "classic")]
    assert [g.group_id for g in env.gc.list_groups(states=["STABLE"]).groups] == ["busy"]
    assert env.gc.list_groups(states=["dead"]).groups == []
    assert env.gc.list_groups(types=["consumer"]).groups == []
    assert len(env.gc.list_groups(types=["Classic"]).groups) == 2

    deleted = []
    res = env.gc.delete_groups(["busy", "simple", "ghost", "simple"], deleted.append)
    assert res == {"busy": E.non_empty_group, "simple": E.none, "ghost": E.group_id_not_found}
    assert deleted == ["simple"] and env.state("simple") is None
    env.gc.leave_group("busy", [LeaveMember(i) for i in ids.values()])
    assert env.state("busy") == "Empty"
    assert env.gc.delete_groups(["busy"], lambda g: E.coordinator_not_available) == \
        {"busy": E.coordinator_not_available}
    assert env.state("busy") == "Empty"                     # kept when the offsets side fails
    assert env.gc.delete_groups(["busy"], deleted.append) == {"busy": E.none}
    assert "busy" not in env.stored                         # tombstone
    # a JoinGroup with a member id of the deleted group
    assert env.join(ids["a"], gid="busy").r.error == E.unknown_member_id


def test_group_max_size():
    env = Env(group_max_size=2)
    gen, ids, leader = env.stable_group(("a", "b"))
    r = env.join("", client="c").r                           # refused before any member id
    assert (r.error, r.member_id) == (E.group_max_size_reached, "")
    assert env.state() == "Stable"


# -- offset commit checks -------------------------------------------------------------------------

def test_validate_offset_commit_rules():
    env = Env()
    v = env.gc.validate_offset_commit
    assert v("simple", -1, "", None) == E.none and env.state("simple") == "Empty"
    assert v("unknown", 3, "m", None) == E.illegal_generation
    assert v("unknown", 3, "m", None, api_version=9) == E.group_id_not_found
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    a = ids["a"]
    assert v("g", gen, a, "a") == E.none
    assert v("g", -1, "", None) == E.unknown_member_id      # only members commit to a live group
    assert v("g", gen - 1, a, "a") == E.illegal_generation
    assert v("g", gen, "zombie", None) == E.unknown_member_id
    assert v("g", gen, "zombie", "a") == E.fenced_instance_id
    ra, rb = env.join(a, iid="a"), env.join(ids["b"], iid="b")
    assert v("g", gen, a, "a") == E.illegal_generation      # the rebalance moved on
    assert v("g", ra.r.generation_id, a, "a") == E.rebalance_in_progress   # not synced yet


def test_offset_commit_counts_as_heartbeat():
    env = Env()
    gen, ids, leader = env.stable_group(("a",))
    for _ in range(5):
        env.advance(SESSION // 2)
        assert env.gc.validate_offset_commit("g", gen, ids["a"], None) == E.none
    assert env.state() == "Stable"


def test_validate_txn_offset_commit_rules():
    env = Env()
    v = env.gc.validate_txn_offset_commit
    assert v("fresh", -1, "", None) == E.none and env.state("fresh") == "Empty"
    assert v("other", 2, "m", None) == E.illegal_generation
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    assert v("g", -1, "", None) == E.none                   # v0-2 clients: no checks at all
    assert v("g", gen, ids["a"], "a") == E.none
    assert v("g", gen, "stranger", None) == E.unknown_member_id
    assert v("g", gen, "stranger", "a") == E.fenced_instance_id
    # zombie: the group moved to a new generation while it was stalled (KIP-447)
    ra, rb = env.join(ids["a"], iid="a"), env.join(ids["b"], iid="b")
    gen2 = ra.r.generation_id
    assert v("g", gen, ids["a"], "a") == E.illegal_generation
    assert v("g", gen2, ids["a"], "a") == E.none            # state does not matter


# -- restart ---------------------------------------------------------------------------------------

def test_load_after_restart():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    env.gc.validate_offset_commit("solo", -1, "", None)
    env.stable_group(("x",), gid="gone")
    env.gc.leave_group("gone", [LeaveMember(env.gc.describe_groups(["gone"])[0].members[0].member_id)])
    # restart: a new coordinator from what was stored
    env2 = Env(stored=dict(env.stored), load=False)
    env2.clock = env.clock + 1_000
    assert env2.hb(ids["a"], gen) == E.none                 # blindly while loading
    assert env2.join("", client="z").r.error == E.coordinator_load_in_progress
    env2.gc.load(dict(env.stored), offset_groups=["solo"])
    assert env2.state() == "Stable" and env2.state("solo") == "Empty"
    assert env2.state("gone") == "Empty" and ("gone", env.gc.empty_since("gone")) in env2.empties
    d, = env2.gc.describe_groups(["g"])
    assert d.protocol_data == "range" and {m.member_id for m in d.members} == set(ids.values())
    assert env2.sync(ids["b"], gen).r.assignment == f"assign-{ids['b']}".encode()
    assert env2.hb(ids["a"], gen) == E.none
    # a heartbeats, b does not come back: removed after its session timeout
    for _ in range(4):
        env2.advance(SESSION // 3)
        env2.hb(ids["a"], gen)
    assert env2.state() == "PreparingRebalance"
    r = env2.join(ids["a"]).r
    assert r.generation_id == gen + 1 and [m.member_id for m in r.members] == [ids["a"]]


def test_load_of_static_group_keeps_instance_mapping():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"), statics=True)
    env2 = Env(stored=dict(env.stored))
    assert env2.hb("someone-else", gen, iid="a") == E.fenced_instance_id
    r = env2.join("", iid="a", client="a").r                # restarted static leader
    assert r.error == E.none and r.skip_assignment and env2.state() == "Stable"


# -- bad input gets error codes -------------------------------------------------------------------

def test_illegal_requests_get_error_codes():
    env = Env()
    assert env.join("", gid="").r.error == E.invalid_group_id
    assert env.join("", session=1).r.error == E.invalid_session_timeout
    assert env.join("", session=10**9).r.error == E.invalid_session_timeout
    assert env.join("", ptype="").r.error == E.inconsistent_group_protocol
    assert env.join("", protocols=()).r.error == E.inconsistent_group_protocol
    assert env.join("made-up", gid="nope").r.error == E.unknown_member_id
    assert env.sync("m", 1, gid="nope").r.error == E.unknown_member_id
    assert env.sync("m", 1, gid="").r.error == E.invalid_group_id
    gen, ids, leader = env.stable_group(("a",))
    assert env.join("", ptype="connect").r.error == E.inconsistent_group_protocol
    assert env.sync(ids["a"], gen, ptype=None, version=5).r.error == E.inconsistent_group_protocol
    assert env.sync(ids["a"], gen, ptype=None, pname=None, version=4).r.error == E.none
    assert env.sync(ids["a"], gen, pname="roundrobin").r.error == E.inconsistent_group_protocol
    assert env.sync(ids["a"], gen + 5).r.error == E.illegal_generation
    assert env.gc.leave_group("", [("x", None)]).error == E.invalid_group_id
    pending = env.join("", client="p").r.member_id
    assert env.join(pending, iid="weird").r.error == E.unknown_server_error
    assert env.state() == "Stable"


def test_failed_assignment_store_fails_sync_and_rebalances():
    env = Env()
    a, b = env.join_new("a"), env.join_new("b")
    env.advance(DELAY)
    env.advance(DELAY)
    sb = env.sync(b.r.member_id, 1)
    env.persist_error = E.not_leader_or_follower
    sa = env.sync(a.r.member_id, 1, assignments=[(a.r.member_id, b"A")])
    assert sa.r.error == sb.r.error == E.not_coordinator
    assert sa.r.protocol_name is None
    assert env.state() == "PreparingRebalance"


def test_respond_that_raises_or_reenters_is_harmless():
    env = Env(group_initial_rebalance_delay_ms=0)
    seen = []

    def bad(result):
        raise RuntimeError("socket gone")

    def reentrant(result):
        seen.append(result)
        if result.error == E.none:
            env.gc.sync_group(SyncGroupRequest("g", result.generation_id, result.member_id,
                                               [], None, "consumer", "range"), seen.append)

    first = env.join("", client="a").r.member_id
    env.gc.join_group(JoinGroupRequest("g", first, SESSION, REBALANCE, "consumer", list(PROTOS),
                                       None, "a", "h", 9), reentrant)
    env.gc.join_group(JoinGroupRequest("g", "", SESSION, REBALANCE, "consumer", list(PROTOS),
                                       None, "b", "h", 9), bad)
    env.advance(0)
    env.advance(0)
    assert seen[0].error == E.none and seen[1].error == E.none
    assert env.state() == "Stable"


def test_duplicate_join_answers_the_superseded_request():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b"))
    first = env.join(ids["a"])
    second = env.join(ids["a"])
    assert first.r.error == E.coordinator_not_available and not second.done
    env.join(ids["b"])
    assert second.r.error == E.none


def test_heartbeats_do_not_grow_the_timer_heap():
    env = Env()
    gen, ids, leader = env.stable_group(("a", "b", "c"))
    base = len(env.gc.table.heap)
    for _ in range(200):
        env.clock += 100
        for i in ids.values():
            assert env.hb(i, gen) == E.none
        env.gc.tick(env.clock)
    assert len(env.gc.table.heap) <= base + 3
    assert env.gc.next_deadline_ms() is not None


def test_subscribed_topics_of_a_consumer_group():
    def sub(*topics):
        out = b"\x00\x01" + len(topics).to_bytes(4, "big")
        for t in topics:
            out += len(t).to_bytes(2, "big") + t.encode()
        return out + b"\xff\xff\xff\xff"                  # null user data, then v1 fields
    assert parse_subscription_topics(sub("t1", "t2")) == {"t1", "t2"}
    assert parse_subscription_topics(b"\x00") is None
    env = Env(group_initial_rebalance_delay_ms=0)
    a = env.join_new("a", protocols=[("range", sub("t1"))])
    b = env.join_new("b", protocols=[("range", sub("t2", "t3"))])
    env.advance(0)
    env.advance(0)
    env.sync(b.r.member_id, 1)
    env.sync(a.r.member_id, 1)
    assert env.gc.subscribed_topics("g") == {"t1", "t2", "t3"}
    info = env.gc.group_info("g")
    assert info.state == "Stable" and info.members == 2 and info.generation_id == 1


def test_state_table_is_kafkas():
    from appliance.group.classic_group import VALID_PREVIOUS, ClassicGroup, IllegalGroupTransition
    G = GroupState
    assert VALID_PREVIOUS[G.Stable] == {G.CompletingRebalance}
    assert VALID_PREVIOUS[G.Empty] == {G.PreparingRebalance}
    g = ClassicGroup("x", G.Empty, 0)
    with pytest.raises(IllegalGroupTransition):
        g.transition_to(G.Stable, 1)


def test_cleanup_hooks_for_the_offsets_side():
    env = Env()
    gen, ids, leader = env.stable_group(("a",))
    env.gc.validate_offset_commit("simple", -1, "", None)
    env.join("", gid="abandoned", client="x")               # MEMBER_ID_REQUIRED, never back
    assert env.gc.empty_since("simple") is None            # standalone: per-commit retention
    assert env.gc.empty_since("g") is None and not env.gc.is_empty_or_dead("g")
    assert env.gc.is_empty_or_dead("never-heard-of")
    assert env.gc.forget_group("g") is False               # members: kept
    assert env.gc.remove_empty_groups(lambda g: g == "simple") == []   # pending id still there
    env.advance(SESSION // 2)
    env.hb(ids["a"], gen)
    env.advance(SESSION // 2)                              # the pending id is forgotten
    assert env.gc.remove_empty_groups(lambda g: g == "simple") == ["abandoned"]
    assert env.gc.forget_group("simple") and env.state("simple") is None
