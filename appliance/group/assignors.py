"""The server-side assignors of KIP-848 consumer groups: ``uniform`` (the default) and ``range``,
both sticky; pure functions.

Runs in the coordinator worker, called by ``appliance.group.consumer_protocol`` whenever a
consumer group's epoch is bumped (Kafka's TargetAssignmentBuilder with its
ConsumerGroupPartitionAssignor). Owns nothing. Input: every member's subscribed topic names and
its current target (what stickiness keeps), and the subscribed topics' ids and partition counts;
output: every member's new target, ``{topic_id: frozenset(partitions)}``. Topics that do not
exist are simply not assigned (KIP-848: an unknown topic in a subscription is not an error).

- ``uniform`` (Kafka's UniformAssignor): every member gets as many partitions as any other that
  can take the same topics, within one; a partition stays with its owner unless balance needs
  it elsewhere; a member's partitions of topics it no longer subscribes to move.
- ``range`` (Kafka's RangeAssignor): per topic, the subscribed members in member-id order get
  consecutive shares, the first ``n % m`` one partition more; sticky in that a member keeps
  its previous partitions of the topic up to its share before free ones are dealt out.

Departure (ours): Kafka's uniform assignor spreads a homogeneous group's partitions
round-robin over topics and members; this one reaches the same balance by moving partitions
from the most to the least loaded member, so its exact choice of partitions differs.
"""

from __future__ import annotations

from typing import Callable, Mapping

__all__ = ["ASSIGNORS", "uniform", "range_assignor", "MemberSpec", "TopicSpec"]

# member id -> (subscribed topic names, current target {topic_id: partitions})
MemberSpec = Mapping[str, tuple[frozenset[str], Mapping[bytes, frozenset[int]]]]
# topic name -> (topic id, partition count)
TopicSpec = Mapping[str, tuple[bytes, int]]
Result = dict[str, dict[bytes, frozenset[int]]]


def _pack(owned: dict[str, set[tuple[bytes, int]]]) -> Result:
    out: Result = {}
    for mid, tps in owned.items():
        by_topic: dict[bytes, set[int]] = {}
        for tid, p in tps:
            by_topic.setdefault(tid, set()).add(p)
        out[mid] = {tid: frozenset(ps) for tid, ps in by_topic.items()}
    return out


def uniform(members: MemberSpec, topics: TopicSpec) -> Result:
    names = {tid: name for name, (tid, _) in topics.items()}
    subs = {mid: frozenset(t for t in s if t in topics) for mid, (s, _) in members.items()}
    order = sorted(members)
    owned: dict[str, set[tuple[bytes, int]]] = {mid: set() for mid in order}
    taken: set[tuple[bytes, int]] = set()
    # 1. stickiness: keep what is still valid (the topic exists, is subscribed, partition exists)
    for mid in order:
        for tid, ps in members[mid][1].items():
            name = names.get(tid)
            if name is None or name not in subs[mid]:
                continue
            n = topics[name][1]
            for p in ps:
                if p < n and (tid, p) not in taken:
                    owned[mid].add((tid, p))
                    taken.add((tid, p))
    # 2. every free partition to the least loaded member that can take it
    for name in sorted(topics):
        tid, n = topics[name]
        eligible = [mid for mid in order if name in subs[mid]]
        if not eligible:
            continue
        for p in range(n):
            if (tid, p) in taken:
                continue
            mid = min(eligible, key=lambda m: (len(owned[m]), m))
            owned[mid].add((tid, p))
            taken.add((tid, p))
    # 3. balance: move from the most loaded to a member at least two below that can take it
    moved = True
    while moved:
        moved = False
        for src in sorted(order, key=lambda m: (-len(owned[m]), m)):
            for tp in sorted(owned[src], reverse=True):
                name = names[tp[0]]
                dst = min((m for m in order if name in subs[m]),
                          key=lambda m: (len(owned[m]), m))
                if len(owned[dst]) + 1 < len(owned[src]):
                    owned[src].discard(tp)
                    owned[dst].add(tp)
                    moved = True
                    break
            if moved:
                break
    return _pack(owned)


def range_assignor(members: MemberSpec, topics: TopicSpec) -> Result:
    owned: dict[str, set[tuple[bytes, int]]] = {mid: set() for mid in members}
    for name in sorted(topics):
        tid, n = topics[name]
        subscribed = sorted(mid for mid, (s, _) in members.items() if name in s)
        if not subscribed:
            continue
        m = len(subscribed)
        quota = {mid: n // m + (1 if i < n % m else 0) for i, mid in enumerate(subscribed)}
        taken: set[int] = set()
        for mid in subscribed:
            prev = sorted(p for p in members[mid][1].get(tid, ()) if p < n)
            for p in prev[:quota[mid]]:
                owned[mid].add((tid, p))
                taken.add(p)
        free = iter(p for p in range(n) if p not in taken)
        for mid in subscribed:
            have = sum(1 for t, _ in owned[mid] if t == tid)
            for _ in range(quota[mid] - have):
                owned[mid].add((tid, next(free)))
    return _pack(owned)


ASSIGNORS: dict[str, Callable[[MemberSpec, TopicSpec], Result]] = {
    "uniform": uniform,
    "range": range_assignor,
}
