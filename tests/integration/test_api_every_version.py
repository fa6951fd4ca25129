"""Every API the appliance advertises, at every version it advertises, gets a well-formed answer.

Catches handlers that build a field or nested entity that exists only in some versions: each
request here is encoded by kio for exactly that version and the answer decoded the same way.
"""

import datetime
import time
import uuid

import pytest

from appliance.protocol.records import Record, build_batch
from raw_wire import RawClient


def _ranges(raw: RawClient) -> dict[int, tuple[int, int]]:
    resp = raw.request(18, 3, {"client_software_name": "test", "client_software_version": "1.0"})
    assert resp.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.mark.parametrize("authorizer", ["off", "super user"])
def test_every_version_of_every_api(appliance_factory, authorizer):
    # No initial rebalance delay: every group request below starts a fresh one-member group.
    # With the authorizer on and the client (User:ANONYMOUS) a super user, every handler's
    # authorization path runs and allows, and the ACL APIs answer.
    config = {"groups": {"initial_rebalance_delay_ms": 0}}
    if authorizer == "super user":
        config["authorizer"] = {"enable": True, "super_users": ["User:ANONYMOUS"]}
    appliance = appliance_factory(**config)
    security = 54 if authorizer == "off" else 0          # SECURITY_DISABLED without an authorizer
    with RawClient(appliance.bootstrap) as raw:
        ranges = _ranges(raw)
        assert {0, 1, 2, 3, 10, 18, 19, 20, 22, 24, 25, 26, 27, 32, 60, 61, 65, 66} <= ranges.keys()
        assert GROUP_APIS <= ranges.keys()
        topic_ids = {}
        # CreateTopics first: one topic per version, used by the APIs below.
        lo, hi = ranges[19]
        for v in range(lo, hi + 1):
            name = f"every-{v}"
            r = raw.request(19, v, {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 1,
                                                "assignments": [], "configs": []}],
                                    "timeout_ms": 30000, "validate_only": False})
            assert r.topics[0].error_code == 0, (v, r)
        md = raw.request(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        topic_ids = {t.name: t.topic_id for t in md.topics}
        assert "every-2" in topic_ids and topic_ids["every-2"] != uuid.UUID(int=0)
        topic = "every-2"
        batch = build_batch([Record(key=b"k", value=b"v")])
        env = Env(raw, topic, topic_ids[topic], batch)
        for key, (lo, hi) in sorted(ranges.items()):
            for v in range(lo, hi + 1):
                if key == 19:
                    continue
                if key in TXN_APIS:
                    req = _txn_request_for(env, key, v)
                elif key in GROUP_APIS:
                    req = _group_request_for(env, key, v)
                else:
                    req = _request_for(key, v, topic, topic_ids[topic], batch)
                resp = raw.request(key, v, req)
                if key in TXN_APIS:
                    _txn_check(env, key, v, resp)
                elif key in GROUP_APIS:
                    _group_check(env, key, v, resp)
                else:
                    _check(key, v, resp, security)


def _request_for(key, v, topic, topic_id, batch):
    if key == 0:
        return {"transactional_id": None, "acks": -1, "timeout_ms": 10000,
                "topic_data": [{"name": topic, "topic_id": topic_id,
                                "partition_data": [{"index": 0, "records": batch}]}]}
    if key == 1:
        return {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": topic, "topic_id": topic_id,
                            "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
                "forgotten_topics_data": [], "rack_id": ""}
    if key == 2:
        return {"replica_id": -1, "isolation_level": 0,
                "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
    if key == 3:
        return {"topics": [{"name": topic, "topic_id": None}], "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": True}
    if key == 10:
        return {"key": "g", "key_type": 0, "coordinator_keys": ["g"]}
    if key == 18:
        return {"client_software_name": "test", "client_software_version": "1.0"}
    if key == 20:
        return {"topic_names": [f"every-missing-{v}"], "topics": [{"name": f"every-missing-{v}"}],
                "timeout_ms": 10000}
    if key == 22:
        return {"transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1,
                "producer_epoch": -1}
    if key == 61:
        return {"topics": [{"name": topic, "partition_indexes": [0, 1]}]}
    if key == 32:
        return {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None},
                              {"resource_type": 4, "resource_name": "1", "configuration_keys": None}],
                "include_synonyms": True, "include_documentation": True}
    if key == 60:
        return {"include_cluster_authorized_operations": False}
    if key == 29:
        return {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}
    if key == 30:
        return {"creations": [{"resource_type": 2, "resource_name": topic, "resource_pattern_type": 3,
                               "principal": "User:alice", "host": "*", "operation": 3,
                               "permission_type": 3}]}
    if key == 31:
        return {"filters": [{"resource_type_filter": 1, "resource_name_filter": None,
                             "pattern_type_filter": 1, "principal_filter": None, "host_filter": None,
                             "operation": 1, "permission_type": 1}]}
    if key == 17:
        return {"mechanism": "SCRAM-SHA-256"}
    if key == 36:
        return {"auth_bytes": b"n,,n=u,r=x"}
    if key == 48:
        return {"components": [{"entity_type": "user", "match_type": 0, "match": f"every-{v}"}],
                "strict": False}
    if key == 49:
        # Quotas every later request is held to (none reached): they run through the frontends'
        # quota accounting from here on.
        return {"entries": [{"entity": [{"entity_type": "client-id", "entity_name": None}],
                             "ops": [{"key": "request_percentage", "value": 1e6, "remove": False},
                                     {"key": "producer_byte_rate", "value": 1e12, "remove": False}]},
                            {"entity": [{"entity_type": "user", "entity_name": f"every-{v}"}],
                             "ops": [{"key": "nonsense_rate", "value": 1.0, "remove": False}]}],
                "validate_only": False}
    if key == 50:
        return {"users": [{"name": f"every-{v}"}]}
    if key == 51:
        return {"deletions": [], "upsertions": [{"name": f"every-{v}", "mechanism": 1,
                                                 "iterations": 4096, "salt": b"s" * 16,
                                                 "salted_password": b"p" * 32}]}
    if key == 21:
        return {"topics": [{"name": topic, "partitions": [{"partition_index": 0, "offset": 0}]}],
                "timeout_ms": 10000}
    if key == 23:
        return {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0}]}]}
    if key in (33, 44):
        cfg = {"name": "retention.ms", "value": str(3600000 + v)}
        if key == 44:
            cfg["config_operation"] = 0
        return {"resources": [{"resource_type": 2, "resource_name": topic, "configs": [cfg]}],
                "validate_only": False}
    if key == 35:
        return {"topics": [{"topic": topic, "partitions": [0, 1]}]}
    if key == 37:
        # every-3 .. every-6 (made above with 2 partitions) grow to 3, one per version
        return {"topics": [{"name": f"every-{v + 3}", "count": 3, "assignments": None}],
                "timeout_ms": 30000, "validate_only": False}
    if key == 43:
        return {"election_type": 0, "topic_partitions": [{"topic": topic, "partitions": [0]}],
                "timeout_ms": 10000}
    if key == 45:
        return {"timeout_ms": 10000, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "replicas": None}]}]}
    if key == 46:
        return {"timeout_ms": 10000, "topics": None}
    if key == 71:
        return {"client_instance_id": uuid.UUID(int=0)}      # the broker gives one (KIP-714)
    if key == 72:
        # A random instance the broker never subscribed: Kafka's UNKNOWN_SUBSCRIPTION_ID.
        return {"client_instance_id": uuid.uuid4(), "subscription_id": 12345,
                "terminating": False, "compression_type": 0, "metrics": b""}
    if key == 74:
        return {"resource_types": []} if v >= 1 else {}
    if key == 75:
        # A one-partition page of the topic: the cursor goes on at its partition 1.
        return {"topics": [{"name": topic}], "response_partition_limit": 1, "cursor": None}
    raise AssertionError(f"no request written for api key {key}: add one")


def _check(key, v, resp, acl_error=54):
    if key == 0:
        p = resp.responses[0].partition_responses[0]
        assert p.error_code == 0 and p.base_offset >= 0, (v, resp)
    elif key == 1:
        p = resp.responses[0].partitions[0]
        assert p.error_code == 0 and p.high_watermark >= 1 and p.records, (v, resp)
    elif key == 2:
        p = resp.topics[0].partitions[0]
        assert p.error_code == 0 and p.offset >= 1, (v, resp)
    elif key == 3:
        assert resp.topics[0].error_code == 0 and len(resp.topics[0].partitions) == 2, (v, resp)
    elif key == 10:
        err = resp.coordinators[0].error_code if v >= 4 else resp.error_code
        assert err == 0, (v, resp)
    elif key == 18:
        assert resp.error_code == 0 and resp.api_keys, (v, resp)
    elif key == 20:
        r = resp.responses[0]
        assert r.error_code == 3, (v, resp)          # UNKNOWN_TOPIC_OR_PARTITION
    elif key == 32:
        assert [r.error_code for r in resp.results] == [0, 0], (v, resp)
        assert any(c.name == "retention.ms" for c in resp.results[0].configs)
    elif key == 22:
        assert resp.error_code == 0 and resp.producer_id >= 0 and resp.producer_epoch == 0, (v, resp)
    elif key == 61:
        assert [p.error_code for p in resp.topics[0].partitions] == [0, 0], (v, resp)
    elif key == 60:
        assert resp.error_code == 0 and resp.brokers[0].port > 0, (v, resp)
    elif key == 29:       # SECURITY_DISABLED with the authorizer off, as Kafka without one
        assert resp.error_code == acl_error, (v, resp)
    elif key == 30:
        assert [r.error_code for r in resp.results] == [acl_error], (v, resp)
    elif key == 31:
        assert [r.error_code for r in resp.filter_results] == [acl_error], (v, resp)
    elif key in (17, 36):
        # A PLAINTEXT listener has no SASL: Kafka answers ILLEGAL_SASL_STATE.
        assert resp.error_code == 34, (v, resp)
    elif key == 51:
        assert [(r.user, r.error_code) for r in resp.results] == [(f"every-{v}", 0)], (v, resp)
    elif key == 48:
        assert resp.error_code == 0 and resp.entries == (), (v, resp)
    elif key == 49:
        assert [e.error_code for e in resp.entries] == [0, 42], (v, resp)      # INVALID_REQUEST
        assert resp.entries[1].error_message == "Invalid configuration key nonsense_rate", (v, resp)
    elif key == 50:
        # Asked before the upsertion of the same version: not there yet.
        assert [r.error_code for r in resp.results] == [91], (v, resp)
    elif key == 21:
        p = resp.topics[0].partitions[0]
        assert p.error_code == 0 and p.low_watermark == 0, (v, resp)
    elif key == 23:
        p = resp.topics[0].partitions[0]
        assert p.error_code == 0 and (p.leader_epoch, p.end_offset >= 1) == (0, True), (v, resp)
    elif key in (33, 44):
        assert resp.responses[0].error_code == 0, (v, resp)
    elif key == 35:
        (r,) = resp.results
        assert r.error_code == 0 and [p.partition_index for p in r.topics[0].partitions] == [0, 1], (v, resp)
        assert r.topics[0].partitions[0].partition_size > 0, (v, resp)
    elif key == 37:
        assert resp.results[0].error_code == 0, (v, resp)
    elif key == 43:
        assert resp.replica_election_results[0].partition_result[0].error_code == 84, (v, resp)   # ELECTION_NOT_NEEDED
    elif key == 45:
        assert resp.responses[0].partitions[0].error_code == 85, (v, resp)   # NO_REASSIGNMENT_IN_PROGRESS
    elif key == 46:
        assert resp.error_code == 0 and resp.topics == (), (v, resp)
    elif key == 71:
        assert resp.error_code == 0 and resp.client_instance_id != uuid.UUID(int=0), (v, resp)
    elif key == 72:
        assert resp.error_code == 117, (v, resp)               # UNKNOWN_SUBSCRIPTION_ID
    elif key == 74:
        assert resp.error_code == 0, (v, resp)
        if v == 0:                       # CLIENT_METRICS only, and none is defined here
            assert resp.config_resources == (), resp
        else:
            assert {(r.resource_name, r.resource_type) for r in resp.config_resources} >= {
                ("1", 4), ("every-2", 2)}, resp
    elif key == 75:
        t = resp.topics[0]
        assert t.error_code == 0 and [p.partition_index for p in t.partitions] == [0], resp
        assert (resp.next_cursor.topic_name, resp.next_cursor.partition_index) == (t.name, 1)


# -- transaction APIs -----------------------------------------------------------------------------
# They need state (a producer id from InitProducerId, a transaction the request can act on), so
# each request is preceded by the setup it needs, on partition 1 (partition 0 serves the plain
# produce/fetch checks above). Keys run in ascending order: the transactions AddPartitionsToTxn
# leaves open are what DescribeTransactions and ListTransactions then describe and list.

TXN_APIS = {24, 25, 26, 27, 65, 66}
TXN_PART = 1


class Env:
    def __init__(self, raw, topic, topic_id, batch):
        self.raw, self.topic, self.topic_id, self.batch = raw, topic, topic_id, batch
        self.pending: dict = {}            # what the check of the current request needs
        self.open_txns: dict[str, int] = {}   # transactional id -> producer id, left Ongoing

    def init_pid(self, txn_id):
        r = self.raw.request(22, 4, {"transactional_id": txn_id, "transaction_timeout_ms": 60000,
                                     "producer_id": -1, "producer_epoch": -1})
        assert r.error_code == 0, r
        return r.producer_id, r.producer_epoch

    def add_partitions(self, txn_id, pid, epoch, partitions):
        r = self.raw.request(24, 3, {"v3_and_below_transactional_id": txn_id,
                                     "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
                                     "v3_and_below_topics": [{"name": self.topic, "partitions": partitions}]})
        assert [p.partition_error_code for t in r.results_by_topic_v3_and_below
                for p in t.results_by_partition] == [0] * len(partitions), r


def _txn_request_for(env: Env, key, v):
    topic = env.topic
    if key == 24:
        txn_id = f"every-apt-{v}"
        pid, epoch = env.init_pid(txn_id)
        env.open_txns[txn_id] = pid
        topics = [{"name": topic, "partitions": [0, 1]}]
        if v <= 3:
            return {"v3_and_below_transactional_id": txn_id, "v3_and_below_producer_id": pid,
                    "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": topics}
        # The broker-to-coordinator form (KIP-890): an add, and a verify-only check of a second
        # transaction that already holds partition 1 (NONE) and not partition 0: TRANSACTION_ABORTABLE,
        # the coordinator's own code, which Kafka's KafkaApis passes through at v4 and v5.
        other = f"every-apt-{v}-verify"
        opid, oepoch = env.init_pid(other)
        env.add_partitions(other, opid, oepoch, [TXN_PART])
        env.open_txns[other] = opid
        env.pending = {"add": txn_id, "verify": other}
        return {"transactions": [
            {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
             "verify_only": False, "topics": topics},
            {"transactional_id": other, "producer_id": opid, "producer_epoch": oepoch,
             "verify_only": True, "topics": [{"name": topic, "partitions": [TXN_PART, 0]}]}]}
    if key == 25:
        txn_id = f"every-aot-{v}"
        pid, epoch = env.init_pid(txn_id)
        env.open_txns[txn_id] = pid
        return {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                "group_id": f"every-group-{v}"}
    if key == 26:
        # A transaction with one record on partition 1, committed.
        txn_id = f"every-end-{v}"
        pid, epoch = env.init_pid(txn_id)
        env.add_partitions(txn_id, pid, epoch, [TXN_PART])
        batch = build_batch([Record(key=b"k", value=b"txn")], producer_id=pid, producer_epoch=epoch,
                            base_sequence=0, transactional=True)
        r = env.raw.request(0, 9, {"transactional_id": txn_id, "acks": -1, "timeout_ms": 10000,
                                   "topic_data": [{"name": topic, "partition_data": [
                                       {"index": TXN_PART, "records": batch}]}]})
        assert r.responses[0].partition_responses[0].error_code == 0, r
        env.pending = {"pid": pid, "epoch": epoch, "txn_id": txn_id}
        return {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "committed": True}
    if key == 27:
        # An admin-style abort marker for a producer with no transaction on the partition (Kafka
        # writes it), plus a partition that does not exist.
        r = env.raw.request(22, 4, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                    "producer_id": -1, "producer_epoch": -1})
        pid, epoch = r.producer_id, r.producer_epoch
        env.pending = {"pid": pid}
        return {"markers": [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": False,
                             "coordinator_epoch": 0, "transaction_version": 0,
                             "topics": [{"name": topic, "partition_indexes": [TXN_PART]},
                                        {"name": f"every-missing-marker-{v}", "partition_indexes": [0]}]}]}
    if key == 65:
        return {"transactional_ids": ["every-apt-0", "every-end-0", f"every-unknown-{v}"]}
    if key == 66:
        env.pending = {"filters": ["Ongoing", "NoSuchState"]}
        return {"state_filters": ["Ongoing", "NoSuchState"], "producer_id_filters": [],
                "duration_filter": -1, "transactional_id_pattern": "every-apt-.*"}
    raise AssertionError(key)


def _describe(env: Env, txn_id):
    return env.raw.request(65, 0, {"transactional_ids": [txn_id]}).transaction_states[0]


def _txn_check(env: Env, key, v, resp):
    if key == 24:
        if v <= 3:
            codes = [p.partition_error_code for t in resp.results_by_topic_v3_and_below
                     for p in t.results_by_partition]
            assert codes == [0, 0], (v, resp)
            txn_id = f"every-apt-{v}"
        else:
            assert resp.error_code == 0, (v, resp)
            by_txn = {r.transactional_id: {(t.name, p.partition_index): p.partition_error_code
                                           for t in r.topic_results for p in t.results_by_partition}
                      for r in resp.results_by_transaction}
            assert by_txn[env.pending["add"]] == {(env.topic, 0): 0, (env.topic, 1): 0}, (v, resp)
            assert by_txn[env.pending["verify"]] == {(env.topic, TXN_PART): 0, (env.topic, 0): 120}, (v, resp)
            # verify-only changed nothing: the second transaction still holds partition 1 only
            d = _describe(env, env.pending["verify"])
            assert [(t.topic, list(t.partitions)) for t in d.topics] == [(env.topic, [TXN_PART])], d
            txn_id = env.pending["add"]
        d = _describe(env, txn_id)
        assert d.transaction_state == "Ongoing", d
        assert [(t.topic, list(t.partitions)) for t in d.topics] == [(env.topic, [0, 1])], d
    elif key == 25:
        assert resp.error_code == 0, (v, resp)
        d = _describe(env, f"every-aot-{v}")
        assert d.transaction_state == "Ongoing" and [t.topic for t in d.topics] == ["__consumer_offsets"], d
    elif key == 26:
        assert resp.error_code == 0, (v, resp)
        pid, epoch = env.pending["pid"], env.pending["epoch"]
        if v >= 5:
            # transaction version 2 (KIP-890): every commit bumps the epoch
            assert (resp.producer_id, resp.producer_epoch) == (pid, epoch + 1), (v, resp)
        # the commit completes (markers written) and the record becomes stable
        deadline = time.monotonic() + 10
        while _describe(env, env.pending["txn_id"]).transaction_state != "CompleteCommit":
            assert time.monotonic() < deadline, "EndTxn(commit) never completed"
            time.sleep(0.02)
    elif key == 27:
        (m,) = resp.markers
        assert m.producer_id == env.pending["pid"], (v, resp)
        codes = {(t.name, p.partition_index): p.error_code for t in m.topics for p in t.partitions}
        assert codes == {(env.topic, TXN_PART): 0, (f"every-missing-marker-{v}", 0): 3}, (v, resp)
    elif key == 65:
        a, b, c = resp.transaction_states
        assert a.error_code == 0 and a.transaction_state == "Ongoing", resp
        assert a.producer_id == env.open_txns["every-apt-0"] and a.producer_epoch == 0, resp
        assert a.transaction_timeout == datetime.timedelta(seconds=60), resp
        assert [(t.topic, list(t.partitions)) for t in a.topics] == [(env.topic, [0, 1])], resp
        assert b.error_code == 0 and b.transaction_state == "CompleteCommit" and not b.topics, resp
        assert c.error_code == 105 and c.transactional_id == f"every-unknown-{v}", resp   # TRANSACTIONAL_ID_NOT_FOUND
    elif key == 66:
        assert resp.error_code == 0 and list(resp.unknown_state_filters) == ["NoSuchState"], (v, resp)
        listed = {t.transactional_id: (t.producer_id, t.transaction_state) for t in resp.transaction_states}
        expect = {t: (pid, "Ongoing") for t, pid in env.open_txns.items()}
        if v < 2:
            # no id pattern before v2: also the AddOffsetsToTxn transactions, never the completed ones
            assert expect.items() <= listed.items(), (v, resp)
            assert not any(t.startswith("every-end-") for t in listed), (v, resp)
        else:
            assert listed == {t: x for t, x in expect.items() if t.startswith("every-apt-")}, (v, resp)


# -- group APIs -----------------------------------------------------------------------------------
# Each version gets a group of its own with one member (JoinGroup then SyncGroup makes it Stable),
# so a request never depends on what another version left behind, except ListGroups, which lists
# the groups DescribeGroups (key 15, run before it) made.

GROUP_APIS = {8, 9, 11, 12, 13, 14, 15, 16, 28, 42, 47, 68, 69, 76, 77, 78, 79, 90, 91, 92}
PROTOCOL = [{"name": "range", "metadata": b"\x00\x01meta"}]


def _join(env: Env, group: str, version: int = 5):
    """A one-member group at generation 1: (member_id, generation)."""
    req = {"group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
           "group_instance_id": None, "protocol_type": "consumer", "protocols": PROTOCOL, "reason": None}
    r = env.raw.request(11, version, req)
    if version >= 4:
        assert r.error_code == 79 and r.member_id, r       # MEMBER_ID_REQUIRED (KIP-394)
        r = env.raw.request(11, version, {**req, "member_id": r.member_id})
    assert r.error_code == 0 and r.leader == r.member_id, r
    return r.member_id, r.generation_id


def _stable(env: Env, group: str, assignment: bytes = b"assigned"):
    member, gen = _join(env, group)
    r = env.raw.request(14, 3, {"group_id": group, "generation_id": gen, "member_id": member,
                                "group_instance_id": None,
                                "assignments": [{"member_id": member, "assignment": assignment}]})
    assert r.error_code == 0 and bytes(r.assignment) == assignment, r
    return member, gen


def _commit(env: Env, group: str, offset: int, member: str = "", gen: int = -1):
    r = env.raw.request(8, 8, {"group_id": group, "generation_id_or_member_epoch": gen, "member_id": member,
                               "group_instance_id": None, "topics": [{"name": env.topic, "partitions": [
                                   {"partition_index": 0, "committed_offset": offset,
                                    "committed_leader_epoch": -1, "committed_metadata": "m"}]}]})
    assert [p.error_code for t in r.topics for p in t.partitions] == [0], r


def _fetched(env: Env, group: str) -> tuple[int, str | None]:
    r = env.raw.request(9, 6, {"group_id": group, "topics": [{"name": env.topic, "partition_indexes": [0]}]})
    assert r.error_code == 0, r
    (p,) = r.topics[0].partitions
    assert p.error_code == 0, r
    return p.committed_offset, p.metadata


def _group_request_for(env: Env, key, v):
    topic = env.topic
    if key == 8:
        group = f"every-oc-{v}"
        member, gen = _stable(env, group)
        env.pending = {"group": group, "offset": 10 + v}
        return {"group_id": group, "generation_id_or_member_epoch": gen, "member_id": member,
                "group_instance_id": None, "retention_time": -1,
                "topics": [{"name": topic, "topic_id": env.topic_id, "partitions": [   # v10: id
                    {"partition_index": 0, "committed_offset": 10 + v, "committed_leader_epoch": -1,
                     "committed_metadata": f"meta-{v}"}]}]}
    if key == 9:
        group = f"every-of-{v}"
        _commit(env, group, 20 + v)
        env.pending = {"offset": 20 + v}
        if v <= 7:
            return {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0, 1]}],
                    "require_stable": True}
        return {"groups": [{"group_id": group, "member_id": None, "member_epoch": -1,
                            "topics": [{"name": topic, "topic_id": env.topic_id,
                                        "partition_indexes": [0, 1]}]}],
                "require_stable": True}
    if key == 11:
        group = f"every-jg-{v}"
        req = {"group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
               "group_instance_id": None, "protocol_type": "consumer", "protocols": PROTOCOL,
               "reason": "every version"}
        if v >= 4:
            first = env.raw.request(11, v, req)
            assert first.error_code == 79 and first.member_id, (v, first)
            req["member_id"] = first.member_id
        env.pending = {"member": req["member_id"]}
        return req
    if key == 12:
        member, gen = _stable(env, f"every-hb-{v}")
        return {"group_id": f"every-hb-{v}", "generation_id": gen, "member_id": member, "group_instance_id": None}
    if key == 13:
        group = f"every-lg-{v}"
        member, _ = _stable(env, group)
        env.pending = {"group": group, "member": member}
        return {"group_id": group, "member_id": member,
                "members": [{"member_id": member, "group_instance_id": None, "reason": "bye"}]}
    if key == 14:
        group = f"every-sg-{v}"
        member, gen = _join(env, group)
        env.pending = {"assignment": b"assign-%d" % v}
        return {"group_id": group, "generation_id": gen, "member_id": member, "group_instance_id": None,
                "protocol_type": "consumer", "protocol_name": "range",
                "assignments": [{"member_id": member, "assignment": b"assign-%d" % v}]}
    if key == 15:
        group = f"every-dg-{v}"
        member, _ = _stable(env, group, b"dg-assignment")
        env.pending = {"group": group, "member": member}
        return {"groups": [group, f"every-dg-missing-{v}"], "include_authorized_operations": False}
    if key == 16:
        return {"states_filter": [], "types_filter": []}
    if key == 28:
        group, txn_id = f"every-toc-{v}", f"every-toc-txn-{v}"
        member, gen = _stable(env, group)
        pid, epoch = env.init_pid(txn_id)
        if v < 5:
            # transaction version 2 (v5) adds the group's partition implicitly (KIP-890)
            r = env.raw.request(25, 3, {"transactional_id": txn_id, "producer_id": pid,
                                        "producer_epoch": epoch, "group_id": group})
            assert r.error_code == 0, r
        env.pending = {"group": group, "txn_id": txn_id, "pid": pid, "epoch": epoch, "offset": 30 + v}
        return {"transactional_id": txn_id, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
                "generation_id": gen, "member_id": member, "group_instance_id": None,
                "topics": [{"name": topic, "partitions": [
                    {"partition_index": 0, "committed_offset": 30 + v, "committed_leader_epoch": -1,
                     "committed_metadata": "txn"}]}]}
    if key == 42:
        group = f"every-del-{v}"
        _commit(env, group, 5)
        env.pending = {"group": group}
        return {"groups_names": [group, f"every-del-missing-{v}"]}
    if key == 47:
        group = f"every-od-{v}"
        _commit(env, group, 5)
        env.pending = {"group": group}
        return {"group_id": group, "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}]}
    if key in (68, 69):
        # KIP-848: a first ConsumerGroupHeartbeat (v0 may leave the member id to the broker)
        group = f"every-cg{key}-{v}"
        member = uuid.uuid4().hex[:22] if key == 69 or v >= 1 else ""
        join = {"group_id": group, "member_id": member, "member_epoch": 0, "instance_id": None,
                "rack_id": None, "rebalance_timeout": 30000, "subscribed_topic_names": [topic],
                "subscribed_topic_regex": None, "server_assignor": None, "topic_partitions": []}
        env.pending = {"group": group, "member": member}
        if key == 68:
            return join
        r = env.raw.request(68, 1, join)
        assert r.error_code == 0 and r.member_epoch == 1, r
        return {"group_ids": [group, f"every-cg-missing-{v}"], "include_authorized_operations": False}
    if key in (76, 77, 78, 79):
        group, member = f"every-sg{key}-{v}", uuid.uuid4().hex[:22]
        join = {"group_id": group, "member_id": member, "member_epoch": 0, "rack_id": None,
                "subscribed_topic_names": [topic]}
        env.pending = {"group": group, "member": member}
        if key == 76:
            return join
        r = env.raw.request(76, 1, join)
        assert r.error_code == 0 and r.member_epoch == 1, r
        if key == 77:
            return {"group_ids": [group, f"every-sg-missing-{v}"],
                    "include_authorized_operations": False}
        parts = [{"topic_id": env.topic_id, "partitions": [
            {"partition_index": 0, "acknowledgement_batches": []}]}]
        if key == 78:
            return {"group_id": group, "member_id": member, "share_session_epoch": 0,
                    "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "max_records": 10,
                    "batch_size": 10, "topics": parts, "forgotten_topics_data": []}
        return {"group_id": group, "member_id": member, "share_session_epoch": 0, "topics": parts}
    if key in (90, 91, 92):
        # a share group whose member joined and left: Empty, no share state yet
        group, member = f"every-sg{key}-{v}", uuid.uuid4().hex[:22]
        r = env.raw.request(76, 1, {"group_id": group, "member_id": member, "member_epoch": 0,
                                    "rack_id": None, "subscribed_topic_names": [topic]})
        assert r.error_code == 0, r
        r = env.raw.request(76, 1, {"group_id": group, "member_id": member, "member_epoch": -1})
        assert r.error_code == 0, r
        env.pending = {"group": group}
        if key == 90:
            return {"groups": [{"group_id": group, "topics": [
                {"topic_name": topic, "partitions": [0, 1]}]}]}
        if key == 91:
            return {"group_id": group, "topics": [{"topic_name": topic, "partitions": [
                {"partition_index": 1, "start_offset": 0}]}]}
        return {"group_id": group, "topics": [{"topic_name": topic}]}
    raise AssertionError(key)


def _group_check(env: Env, key, v, resp):
    if key == 8:
        assert [p.error_code for t in resp.topics for p in t.partitions] == [0], (v, resp)
        assert _fetched(env, env.pending["group"]) == (env.pending["offset"], f"meta-{v}"), v
    elif key == 9:
        if v <= 7:
            parts = resp.topics[0].partitions
            if v >= 2:
                assert resp.error_code == 0, (v, resp)
        else:
            (g,) = resp.groups
            assert g.error_code == 0, (v, resp)
            parts = g.topics[0].partitions
        got = {p.partition_index: (p.error_code, p.committed_offset) for p in parts}
        assert got == {0: (0, env.pending["offset"]), 1: (0, -1)}, (v, resp)
    elif key == 11:
        assert resp.error_code == 0 and resp.generation_id == 1, (v, resp)
        assert resp.leader == resp.member_id, (v, resp)
        if v >= 4:
            assert resp.member_id == env.pending["member"], (v, resp)
        assert [(m.member_id, bytes(m.metadata)) for m in resp.members] == \
            [(resp.member_id, PROTOCOL[0]["metadata"])], (v, resp)
        if v >= 7:
            assert resp.protocol_type == "consumer", (v, resp)
        assert resp.protocol_name == "range", (v, resp)
    elif key == 12:
        assert resp.error_code == 0, (v, resp)
    elif key == 13:
        assert resp.error_code == 0, (v, resp)
        if v >= 3:
            assert [(m.member_id, m.error_code) for m in resp.members] == [(env.pending["member"], 0)], (v, resp)
        d = env.raw.request(15, 5, {"groups": [env.pending["group"]], "include_authorized_operations": False})
        assert d.groups[0].group_state == "Empty" and not d.groups[0].members, d
    elif key == 14:
        assert resp.error_code == 0 and bytes(resp.assignment) == env.pending["assignment"], (v, resp)
        if v >= 5:
            assert (resp.protocol_type, resp.protocol_name) == ("consumer", "range"), (v, resp)
    elif key == 15:
        found, missing = resp.groups
        assert found.error_code == 0 and found.group_state == "Stable", (v, resp)
        assert (found.protocol_type, found.protocol_data) == ("consumer", "range"), (v, resp)
        assert [(m.member_id, bytes(m.member_assignment)) for m in found.members] == \
            [(env.pending["member"], b"dg-assignment")], (v, resp)
        # Kafka describes an unknown group as Dead: no error in v0-5, from v6 (KIP-1043)
        # GROUP_ID_NOT_FOUND with a message
        assert missing.group_state == "Dead", (v, resp)
        if v >= 6:
            assert missing.error_code == 69 and missing.error_message.endswith(" not found."), (v, resp)
        else:
            assert missing.error_code == 0, (v, resp)
    elif key == 16:
        assert resp.error_code == 0, (v, resp)
        listed = {g.group_id: g.protocol_type for g in resp.groups}
        assert listed.get("every-dg-0") == "consumer" and listed.get("every-oc-2") == "consumer", (v, resp)
    elif key == 28:
        assert [p.error_code for t in resp.topics for p in t.partitions] == [0], (v, resp)
        group = env.pending["group"]
        # pending until the commit marker, then visible
        r = env.raw.request(9, 7, {"group_id": group, "topics": [{"name": env.topic, "partition_indexes": [0]}],
                                   "require_stable": True})
        assert r.topics[0].partitions[0].error_code == 88, r       # UNSTABLE_OFFSET_COMMIT
        r = env.raw.request(26, 3, {"transactional_id": env.pending["txn_id"], "producer_id": env.pending["pid"],
                                    "producer_epoch": env.pending["epoch"], "committed": True})
        assert r.error_code == 0, r
        deadline = time.monotonic() + 10
        while True:
            try:
                assert _fetched(env, group)[0] == env.pending["offset"], v
                break
            except AssertionError:
                assert time.monotonic() < deadline, "transactional offset never became visible"
                time.sleep(0.02)
    elif key == 42:
        codes = {r.group_id: r.error_code for r in resp.results}
        assert codes == {env.pending["group"]: 0, f"every-del-missing-{v}": 69}, (v, resp)   # GROUP_ID_NOT_FOUND
    elif key == 47:
        assert resp.error_code == 0, (v, resp)
        assert [p.error_code for t in resp.topics for p in t.partitions] == [0], (v, resp)
        assert _fetched(env, env.pending["group"])[0] == -1, v
    elif key == 68:
        assert (resp.error_code, resp.member_epoch) == (0, 1), (v, resp)
        assert resp.heartbeat_interval == datetime.timedelta(milliseconds=5000), (v, resp)
        assert resp.member_id and (v == 0 or resp.member_id == env.pending["member"]), (v, resp)
        assert [(t.topic_id, sorted(t.partitions)) for t in resp.assignment.topic_partitions] == \
            [(env.topic_id, [0, 1])], (v, resp)
    elif key == 76:
        assert (resp.error_code, resp.member_epoch, resp.member_id) == (
            0, 1, env.pending["member"]), (v, resp)
        assert [(t.topic_id, sorted(t.partitions)) for t in resp.assignment.topic_partitions] == \
            [(env.topic_id, [0, 1])], (v, resp)
    elif key == 77:
        found, missing = resp.groups
        assert (found.error_code, found.group_state, found.assignor_name) == (
            0, "Stable", "simple"), (v, resp)
        assert [m.member_id for m in found.members] == [env.pending["member"]], (v, resp)
        assert missing.error_code == 69, (v, resp)                 # GROUP_ID_NOT_FOUND
    elif key == 78:
        # a new share group starts at the end (share.auto.offset.reset latest): nothing yet
        assert resp.error_code == 0 and resp.acquisition_lock_timeout.total_seconds() == 30, (v, resp)
        assert [(p.partition_index, p.error_code, p.acquired_records)
                for t in resp.responses for p in t.partitions] == [(0, 0, ())], (v, resp)
    elif key == 79:
        assert resp.error_code == 123, (v, resp)     # INVALID_SHARE_SESSION_EPOCH: no session opened
    elif key == 90:
        (g,) = resp.groups
        assert (g.group_id, g.error_code) == (env.pending["group"], 0), (v, resp)
        assert [(t.topic_id, [(p.partition_index, p.start_offset, p.error_code) for p in t.partitions])
                for t in g.topics] == [(env.topic_id, [(0, -1, 0), (1, -1, 0)])], (v, resp)
        if v >= 1:
            assert [p.lag for p in g.topics[0].partitions] == [-1, -1], (v, resp)
    elif key == 91:
        assert resp.error_code == 0, (v, resp)
        assert [(t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
                for t in resp.responses] == [(env.topic_id, [(1, 0)])], (v, resp)
    elif key == 92:
        # no state for the topic: Kafka's UNKNOWN_TOPIC_OR_PARTITION row
        assert resp.error_code == 0, (v, resp)
        assert [(t.topic_id, t.error_code, t.error_message) for t in resp.responses] == [
            (env.topic_id, 3, "There is no offset information to delete.")], (v, resp)
    elif key == 69:
        found, missing = resp.groups
        assert (found.error_code, found.group_state, found.group_epoch, found.assignment_epoch,
                found.assignor_name) == (0, "Stable", 1, 1, "uniform"), (v, resp)
        (m,) = found.members
        assert (m.member_id, m.member_epoch) == (env.pending["member"], 1), (v, resp)
        assert [(t.topic_name, sorted(t.partitions)) for t in m.assignment.topic_partitions] == \
            [(env.topic, [0, 1])], (v, resp)
        if v >= 1:
            assert m.member_type == 1, (v, resp)
        assert missing.error_code == 69, (v, resp)           # GROUP_ID_NOT_FOUND
