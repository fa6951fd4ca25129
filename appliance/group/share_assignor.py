"""The share-group partition assignor (KIP-932's ``simple`` assignor, as Kafka 4.1+ finalized its
SimpleAssignor: KAFKA-19362, KAFKA-19363).

Pure function, run by the coordinator worker's share coordinator (``appliance.group.share_group``)
at every ShareGroupHeartbeat. Balance first, then stickiness, which clients observe in their
assignments and in ShareGroupDescribe:

- each partition is wanted by ``ceil(members / partitions)`` members (so a partition is shared
  only when members outnumber partitions), and member ``i`` of ``M`` wants
  ``ceil(x * (i + 1)) - ceil(x * i)`` partitions, ``x = sharing * partitions / members`` (sizes
  differ by at most one);
- a member keeps what it held of topics it still subscribes to, down to what it wants;
- a partition held by more members than wanted loses the extra ones;
- partitions short of members go to members short of partitions, cycling over them.

With different subscriptions the balance is per topic, over the members subscribing to it, and
the topics' assignments are combined (as Kafka's heterogeneous builder). Share partitions are read
by many members at once, so a change needs no revocation step: a member's epoch follows the
group epoch when its assignment changes.
"""

from __future__ import annotations

import math

__all__ = ["assign"]

TopicPartition = tuple[bytes, int]


def assign(subscriptions: dict[str, list[TopicPartition]],
           current: dict[str, list[TopicPartition]]) -> dict[str, list[TopicPartition]]:
    """The target assignment: ``subscriptions`` maps each member (in a stable order) to the
    partitions of the topics it subscribes to; ``current`` to what it held."""
    topics_of = {m: {t for t, _ in parts} for m, parts in subscriptions.items()}
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    if len({frozenset(ts) for ts in topics_of.values()}) <= 1:
        groups = [(list(subscriptions), _ordered(p for ps in subscriptions.values() for p in ps))]
    else:
        by_topic: dict[bytes, list[TopicPartition]] = {}
        for ps in subscriptions.values():
            for tp in ps:
                by_topic.setdefault(tp[0], [])
                if tp not in by_topic[tp[0]]:
                    by_topic[tp[0]].append(tp)
        groups = [([m for m in subscriptions if t in topics_of[m]], tps)
                  for t, tps in by_topic.items()]
    for members, partitions in groups:
        wanted = set(partitions)
        held = {m: [tp for tp in current.get(m, ()) if tp in wanted] for m in members}
        for m, tps in _balance(members, partitions, held).items():
            out[m] |= tps
    return {m: sorted(tps) for m, tps in out.items()}


def _ordered(tps) -> list[TopicPartition]:
    seen: dict[TopicPartition, None] = {}
    for tp in tps:
        seen.setdefault(tp, None)
    return list(seen)


def _balance(members: list[str], partitions: list[TopicPartition],
             held: dict[str, list[TopicPartition]]) -> dict[str, set[TopicPartition]]:
    n_m, n_p = len(members), len(partitions)
    if not n_m or not n_p:
        return {m: set() for m in members}
    sharing = (n_m + n_p - 1) // n_p
    x = sharing * n_p / n_m
    want = {m: math.ceil(x * (i + 1)) - math.ceil(x * i) for i, m in enumerate(members)}
    by_member = {m: list(dict.fromkeys(held.get(m, ()))) for m in members}
    for m in members:                                  # too many: keep the first ones held
        del by_member[m][want[m]:]
    by_partition: dict[TopicPartition, list[str]] = {tp: [] for tp in partitions}
    for m in members:
        for tp in by_member[m]:
            by_partition[tp].append(m)
    for tp, ms in by_partition.items():                # shared more than wanted
        for m in ms[sharing:]:
            by_member[m].remove(tp)
        del ms[sharing:]
    unfilled = [m for m in members if len(by_member[m]) < want[m]]
    i = 0
    for tp in partitions:                              # short of members
        need = sharing - len(by_partition[tp])
        tried = 0
        while need > 0 and unfilled and tried < len(unfilled):
            m = unfilled[i % len(unfilled)]
            if tp in by_member[m]:
                i += 1
                tried += 1
                continue
            by_member[m].append(tp)
            by_partition[tp].append(m)
            need -= 1
            tried = 0
            if len(by_member[m]) >= want[m]:
                unfilled.remove(m)
            else:
                i += 1
        if not unfilled:
            break
    return {m: set(tps) for m, tps in by_member.items()}
