"""The share-group assignor (appliance.group.share_assignor, Kafka 4.1+'s SimpleAssignor) and its
use by the share coordinator's heartbeat: balanced (sizes within one, a partition shared only
when members outnumber partitions), sticky, a leaver's partitions dealt to the others."""

from __future__ import annotations

from appliance.group.messages import ShareGroupHeartbeatRequest
from appliance.group.share_assignor import assign
from appliance.group.share_group import ShareConfig, ShareService
from appliance.group.share_store import ShareStateStore

T, U = b"\x01" * 16, b"\x02" * 16


def parts(topic: bytes, n: int) -> list[tuple[bytes, int]]:
    return [(topic, p) for p in range(n)]


def test_members_spread_over_partitions_and_cover_them_all() -> None:
    subs = {m: parts(T, 4) for m in ("a", "b")}
    got = assign(subs, {})
    assert [len(got[m]) for m in subs] == [2, 2]
    assert sorted(got["a"] + got["b"]) == parts(T, 4)    # nothing shared
    assert assign(subs, got) == got                      # sticky: a fixed point


def test_more_members_than_partitions_share_them() -> None:
    subs = {f"m{i}": parts(T, 2) for i in range(6)}
    got = assign(subs, {})
    assert all(len(v) == 1 for v in got.values())       # three members a partition
    assert sorted(tp for v in got.values() for tp in v) == sorted(parts(T, 2) * 3)


def test_a_leavers_partitions_go_to_the_others_and_held_ones_stay() -> None:
    subs = {m: parts(T, 4) for m in ("a", "b", "c")}
    first = assign(subs, {})
    assert sorted(len(v) for v in first.values()) == [1, 1, 2]
    del subs["c"]
    after = assign(subs, first)
    assert {tp for v in after.values() for tp in v} == set(parts(T, 4))
    for m in ("a", "b"):
        assert set(first[m]) <= set(after[m])


def test_different_subscriptions_deal_each_topic_to_its_subscribers() -> None:
    subs = {"a": parts(T, 3), "b": parts(T, 3) + parts(U, 3)}
    got = assign(subs, {})
    assert all(tp[0] == T for tp in got["a"]) and len(got["a"]) == 2
    assert set(parts(U, 3)) <= set(got["b"])
    assert {tp for v in got.values() for tp in v} == set(parts(T, 3) + parts(U, 3))


def test_regression_every_member_was_given_every_partition(tmp_path) -> None:
    # librdkafka 0172 mixed_ack_mode_same_group: two members of a 4-partition topic each got all
    # four, so the first to fetch took every record and the other got none; Kafka's assignor
    # gives each two (the first member, alone, had all four: it gives two up).
    store = ShareStateStore(str(tmp_path), "os", 0)
    svc = ShareService(store, ShareConfig(), lambda: 0, lambda: {"t": (T, 4)}, lambda t, p: (0, 0))
    svc.load()
    r1 = svc.heartbeat(ShareGroupHeartbeatRequest("g", "member-one", 0, None, ["t"]))
    r2 = svc.heartbeat(ShareGroupHeartbeatRequest("g", "member-two", 0, None, ["t"]))
    r1 = svc.heartbeat(ShareGroupHeartbeatRequest("g", "member-one", r1.member_epoch))
    one = set(svc.groups["g"].members["member-one"].assignment)
    two = {(T, p) for a in r2.assignment for p in a.partitions}
    assert one and two and one | two == set(parts(T, 4)) and not one & two, (one, two)
    svc.close()


def test_the_kept_assignment_follows_new_partitions_and_members(tmp_path) -> None:
    # The group's target is computed again only when its inputs change: partitions added to a
    # subscribed topic and a member joining both reach the next heartbeat's answer.
    store = ShareStateStore(str(tmp_path), "os", 0)
    count = {"n": 2}
    svc = ShareService(store, ShareConfig(), lambda: 0, lambda: {"t": (T, count["n"])},
                       lambda t, p: (0, 0))
    svc.load()
    r = svc.heartbeat(ShareGroupHeartbeatRequest("g", "a", 0, None, ["t"]))
    assert {p for x in r.assignment for p in x.partitions} == {0, 1}
    count["n"] = 4
    r = svc.heartbeat(ShareGroupHeartbeatRequest("g", "a", r.member_epoch))
    assert {p for x in r.assignment for p in x.partitions} == {0, 1, 2, 3}
    r2 = svc.heartbeat(ShareGroupHeartbeatRequest("g", "b", 0, None, ["t"]))
    assert len({p for x in r2.assignment for p in x.partitions}) == 2
    svc.close()
