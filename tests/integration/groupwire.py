"""Group and transactional-offset requests at the wire, for the raw-protocol tests.

Thin helpers over ``RawClient``: each sends one request (kio field names) and returns the part of
the answer a test asserts on, never hiding an error code. Used by ``test_group_wire.py``.
"""

from __future__ import annotations

import time

from rawclient import RawClient

# Error codes (Kafka's Errors)
NONE = 0
ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
CONCURRENT_TRANSACTIONS = 51
MEMBER_ID_REQUIRED = 79
FENCED_INSTANCE_ID = 82
UNSTABLE_OFFSET_COMMIT = 88
PRODUCER_FENCED = 90
TRANSACTION_ABORTABLE = 120

# What a client retries while a coordinator (re)loads or a transaction is being completed.
RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
             CONCURRENT_TRANSACTIONS}

PROTOCOL = [{"name": "range", "metadata": b"\x00\x01meta"}]


# -- topics and producers -------------------------------------------------------------------------

def create_topic(raw: RawClient, name: str, partitions: int = 2) -> None:
    r = raw.request(19, 7, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                        "assignments": [], "configs": []}],
                            "timeout_ms": 30000, "validate_only": False})
    assert r.topics[0].error_code == NONE, r


def init_pid(raw: RawClient, txn_id: str, timeout_ms: int = 60000) -> tuple[int, int]:
    """InitProducerId for ``txn_id``: (producer id, epoch). Retried while the coordinator
    completes the previous instance's transaction (CONCURRENT_TRANSACTIONS), as clients do."""
    r = retry(lambda: raw.request(22, 4, {"transactional_id": txn_id, "transaction_timeout_ms": timeout_ms,
                                          "producer_id": -1, "producer_epoch": -1}))
    assert r.error_code == NONE, r
    return r.producer_id, r.producer_epoch


def add_offsets(raw: RawClient, txn_id: str, pid: int, epoch: int, group: str, version: int = 3) -> int:
    """AddOffsetsToTxn: the error code."""
    r = raw.request(25, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                  "group_id": group})
    return r.error_code


def end_txn(raw: RawClient, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3):
    """EndTxn: the response (error_code; producer id/epoch from v5)."""
    return raw.request(26, version, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                     "committed": commit})


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


def retry(op, *, timeout: float = 30.0, retriable=RETRIABLE):
    """Calls ``op()`` until its answer is not a retriable coordinator error (an int error code,
    or an object with ``error_code``; any other answer is final); returns that answer. Socket
    errors are retried too."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = op()
        except (OSError, ConnectionError) as e:       # timeouts included
            r = e
        else:
            code = r if isinstance(r, int) else getattr(r, "error_code", None)
            if code is None or code not in retriable:
                return r
        assert time.monotonic() < deadline, f"still retriable after {timeout}s: {r!r}"
        time.sleep(0.05)


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
