"""Groups over the wire, for the raw-protocol group tests: committed offsets (OffsetCommit,
OffsetFetch, TxnOffsetCommit: the group's side of a transaction, KIP-447) and membership
(JoinGroup, SyncGroup, DescribeGroups).

Thin helpers over ``RawClient``: each sends one request (kio field names) and returns the part of
the answer a test asserts on, never hiding an error code. Error codes and ``retry`` are
raw_wire.py's; InitProducerId, AddOffsetsToTxn and EndTxn are txn_wire.py's. Runs in the pytest
process.
"""

from __future__ import annotations

import time

from raw_wire import MEMBER_ID_REQUIRED, NONE, UNSTABLE_OFFSET_COMMIT, RawClient

PROTOCOL = [{"name": "range", "metadata": b"\x00\x01meta"}]


# -- offsets --------------------------------------------------------------------------------------

def offset_commit(raw: RawClient, group: str, offsets: dict[tuple[str, int], int], *, generation: int = -1,
                  member: str = "", instance: str | None = None) -> dict[tuple[str, int], int]:
    """OffsetCommit v8: {(topic, partition): error}."""
    topics: dict[str, list] = {}
    for (t, p), off in offsets.items():
        topics.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                         "committed_leader_epoch": -1, "committed_metadata": f"plain-{off}"})
    r = raw.request(8, 8, {"group_id": group, "generation_id_or_member_epoch": generation, "member_id": member,
                           "group_instance_id": instance,
                           "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def fetch_offsets(raw: RawClient, group: str, partitions: list[tuple[str, int]], *,
                  require_stable: bool = False, version: int = 7) -> tuple[int, dict[tuple[str, int], tuple[int, int]]]:
    """OffsetFetch (v7: one group; v8+: the batched form with one group):
    (group error, {(topic, partition): (error, committed offset)})."""
    topics: dict[str, list[int]] = {}
    for t, p in partitions:
        topics.setdefault(t, []).append(p)
    asked = [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]
    if version >= 8:
        r = raw.request(9, version, {"groups": [{"group_id": group, "member_id": None, "member_epoch": -1,
                                                 "topics": asked}],
                                     "require_stable": require_stable})
        (g,) = r.groups
        err, got = g.error_code, g.topics
    else:
        r = raw.request(9, version, {"group_id": group, "topics": asked, "require_stable": require_stable})
        err, got = getattr(r, "error_code", NONE), r.topics      # no group-level error before v2
    return err, {(t.name, p.partition_index): (p.error_code, p.committed_offset) for t in got for p in t.partitions}


def committed(raw: RawClient, group: str, partitions: list[tuple[str, int]], *,
              require_stable: bool = False) -> dict[tuple[str, int], int]:
    """The committed offsets; every partition must answer without error. With
    ``require_stable`` a partition holding pending offsets answers UNSTABLE_OFFSET_COMMIT,
    which appears here as the offset ``"unstable"``."""
    err, got = fetch_offsets(raw, group, partitions, require_stable=require_stable)
    assert err == NONE, (err, got)
    out: dict = {}
    for tp, (e, off) in got.items():
        if e == UNSTABLE_OFFSET_COMMIT and require_stable:
            out[tp] = "unstable"
        else:
            assert e == NONE, (tp, e, got)
            out[tp] = off
    return out


def wait_committed(raw: RawClient, group: str, want: dict[tuple[str, int], int], timeout: float = 15.0) -> None:
    """Polls OffsetFetch with RequireStable until it answers ``want`` (the transaction's markers
    are written after EndTxn is answered)."""
    deadline = time.monotonic() + timeout
    while True:
        got = committed(raw, group, list(want), require_stable=True)
        if got == want:
            return
        assert time.monotonic() < deadline, f"group {group}: offsets {got}, never {want}"
        time.sleep(0.02)


def committed_offset(bootstrap: str, group: str, topic: str, partition: int) -> int:
    """OffsetFetch v7 with RequireStable, on a connection of its own: the group's committed
    offset (-1 when none), asked again while the markers of a transaction are on their way."""
    with RawClient(bootstrap) as raw:
        for _ in range(600):
            err, got = fetch_offsets(raw, group, [(topic, partition)], require_stable=True)
            e, offset = got[(topic, partition)]
            if e == UNSTABLE_OFFSET_COMMIT:
                time.sleep(0.05)
                continue
            assert e == NONE and err == NONE, (err, got)
            return offset
    raise AssertionError("offsets stayed unstable")


def txn_offset_commit(raw: RawClient, txn_id: str, group: str, pid: int, epoch: int,
                      offsets: dict[tuple[str, int], int], *, version: int = 3, generation: int = -1,
                      member: str = "", instance: str | None = None) -> dict[tuple[str, int], int]:
    """TxnOffsetCommit of ``offsets`` {(topic, partition): offset}: {(topic, partition): error}.
    ``generation``/``member``/``instance`` exist from v3 only (ignored by the encoder before)."""
    topics: dict[str, list] = {}
    for (t, p), off in offsets.items():
        topics.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                         "committed_leader_epoch": -1, "committed_metadata": f"txn-{off}"})
    r = raw.request(28, version, {"transactional_id": txn_id, "group_id": group, "producer_id": pid,
                                  "producer_epoch": epoch, "generation_id": generation, "member_id": member,
                                  "group_instance_id": instance,
                                  "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


# -- membership -----------------------------------------------------------------------------------

def _join_req(group, member_id, instance, session_ms, rebalance_ms):
    return {"group_id": group, "session_timeout": session_ms, "rebalance_timeout": rebalance_ms,
            "member_id": member_id, "group_instance_id": instance, "protocol_type": "consumer",
            "protocols": PROTOCOL, "reason": None}


def send_join(raw: RawClient, group: str, member_id: str = "", instance: str | None = None, *,
              version: int = 5, session_ms: int = 10000, rebalance_ms: int = 5000) -> int:
    """Sends a JoinGroup without waiting (the coordinator parks it until the rebalance
    completes); returns the correlation id for ``recv_join``."""
    raw.request(11, version, _join_req(group, member_id, instance, session_ms, rebalance_ms),
                expect_response=False)
    return raw.correlation


def recv_join(raw: RawClient, corr: int, version: int = 5):
    return raw.read_response(11, version, corr)


def new_member_id(raw: RawClient, group: str, version: int = 5) -> str:
    """The first JoinGroup of a dynamic member (KIP-394): MEMBER_ID_REQUIRED and its id."""
    r = raw.request(11, version, _join_req(group, "", None, 10000, 5000))
    assert r.error_code == MEMBER_ID_REQUIRED and r.member_id, r
    return r.member_id


def join(raw: RawClient, group: str, member_id: str = "", instance: str | None = None, *, version: int = 5):
    """A JoinGroup that completes at once (the only member, or a rejoin that completes the
    rebalance); a new dynamic member does the member-id round trip first."""
    if not member_id and instance is None:
        member_id = new_member_id(raw, group, version)
    r = recv_join(raw, send_join(raw, group, member_id, instance, version=version), version)
    assert r.error_code == NONE, r
    return r


def sync(raw: RawClient, group: str, generation: int, member_id: str, assignments: dict[str, bytes] | None = None,
         instance: str | None = None, *, wait: bool = True):
    """SyncGroup v3 (the leader passes ``assignments``); with ``wait=False`` returns the
    correlation id (a follower's sync is parked until the leader's)."""
    raw.request(14, 3, {"group_id": group, "generation_id": generation, "member_id": member_id,
                        "group_instance_id": instance,
                        "assignments": [{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()]},
                expect_response=False)
    corr = raw.correlation
    if not wait:
        return corr
    return raw.read_response(14, 3, corr)


def describe_group(raw: RawClient, group: str):
    return raw.request(15, 5, {"groups": [group], "include_authorized_operations": False}).groups[0]
