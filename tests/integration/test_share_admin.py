"""The admin side of KIP-932 share groups against the real appliance (one appliance for the
module): on the wire, the group namespace a share group shares with classic and consumer groups
(each type refuses the other's id with Kafka's error), and ``appliance share-groups``. Kafka
4.3's Admin on a share group is in test_share_groups.py (its Java share consumer's group).
"""

from __future__ import annotations

import uuid

from appliance_harness import free_port, shared_appliance, watch_shared_appliance  # noqa: F401
from cli_runner import in_process
from client_drivers import driver
from java_programs import java4_program  # noqa: F401 (fixture)
from raw_wire import RawClient
from test_share_groups import CONFIG, produce, uid

METRICS_PORT = free_port()
APPLIANCE_CONFIG = {**CONFIG, "metrics": {"listen": f"127.0.0.1:{METRICS_PORT}"}}
GROUP_ID_NOT_FOUND, INCONSISTENT_GROUP_PROTOCOL, NON_EMPTY_GROUP = 69, 23, 68


def tool(bootstrap: str, *args: str):
    """``appliance ARGS --bootstrap-server B`` run in this process (``cli_runner.in_process``:
    the command's own code and output, without a Python start per call); must exit 0."""
    return in_process(*args, "--bootstrap-server", bootstrap)


def heartbeat(c: RawClient, group: str, topic: str, member: str | None = None):
    return c.request(76, 1, {"group_id": group, "member_id": member or str(uuid.uuid4()),
                             "member_epoch": 0, "subscribed_topic_names": [topic]})


def test_share_and_other_group_types_refuse_each_others_ids(shared_appliance):
    """A share group's id: JoinGroup INCONSISTENT_GROUP_PROTOCOL, ConsumerGroupHeartbeat and
    OffsetCommit GROUP_ID_NOT_FOUND, DescribeGroups v6 "not a classic group" (Dead below v6),
    ListGroups type filter; a classic group's id: ShareGroupHeartbeat GROUP_ID_NOT_FOUND; offsets
    of a share group with a member cannot be altered or deleted (NON_EMPTY_GROUP), nor the group."""
    b = shared_appliance.bootstrap
    topic, share, classic = uid("sx"), uid("sgx"), uid("cgx")
    driver("confluent").create_topics(b, {topic: (1, {})})
    with RawClient(b) as c:
        r = heartbeat(c, share, topic)
        assert r.error_code == 0, r
        r = c.request(11, 5, {"group_id": share, "session_timeout_ms": 10000,
                              "rebalance_timeout_ms": 10000, "member_id": "",
                              "protocol_type": "consumer",
                              "protocols": [{"name": "range", "metadata": b""}]})
        assert (r.error_code, r.member_id) == (INCONSISTENT_GROUP_PROTOCOL, ""), r
        r = c.request(68, 0, {"group_id": share, "member_id": str(uuid.uuid4()),
                              "member_epoch": 0, "rebalance_timeout_ms": 10000,
                              "subscribed_topic_names": [topic], "topic_partitions": []})
        assert (r.error_code, r.error_message) == (
            GROUP_ID_NOT_FOUND, f"Group {share} is not a consumer group."), r
        r = c.request(8, 8, {"group_id": share, "generation_id_or_member_epoch": -1,
                             "member_id": "", "topics": [{"name": topic, "partitions": [
                                 {"partition_index": 0, "committed_offset": 1}]}]})
        assert r.topics[0].partitions[0].error_code == GROUP_ID_NOT_FOUND, r
        (g,) = c.request(15, 6, {"groups": [share]}).groups
        assert (g.error_code, g.error_message, g.group_state) == (
            GROUP_ID_NOT_FOUND, f"Group {share} is not a classic group.", "Dead"), g
        (g,) = c.request(15, 5, {"groups": [share]}).groups
        assert (g.error_code, g.group_state) == (0, "Dead"), g
        listed = c.request(16, 5, {"states_filter": [], "types_filter": ["share"]}).groups
        assert [(x.protocol_type, x.group_state, x.group_type) for x in listed
                if x.group_id == share] == [("share", "Stable", "share")], listed
        assert share not in {x.group_id for x in c.request(
            16, 5, {"states_filter": [], "types_filter": ["consumer", "classic"]}).groups}
        # the share group has a member: its offsets and the group itself stay
        r = c.request(91, 0, {"group_id": share, "topics": [{"topic_name": topic, "partitions": [
            {"partition_index": 0, "start_offset": 0}]}]})
        assert r.error_code == NON_EMPTY_GROUP, r
        r = c.request(92, 0, {"group_id": share, "topics": [{"topic_name": topic}]})
        assert r.error_code == NON_EMPTY_GROUP, r
        (d,) = c.request(42, 2, {"groups_names": [share]}).results
        assert d.error_code == NON_EMPTY_GROUP, d
        # a classic group's id is not a share group's
        r = c.request(11, 5, {"group_id": classic, "session_timeout_ms": 10000,
                              "rebalance_timeout_ms": 10000, "member_id": "",
                              "protocol_type": "consumer",
                              "protocols": [{"name": "range", "metadata": b""}]})
        assert r.error_code in (0, 79), r         # joined, or MEMBER_ID_REQUIRED (v4+)
        r = heartbeat(c, classic, topic)
        assert (r.error_code, r.error_message) == (
            GROUP_ID_NOT_FOUND, f"Group {classic} is not a share group."), r
        (g,) = c.request(90, 1, {"groups": [{"group_id": classic, "topics": None}]}).groups
        assert g.error_code == GROUP_ID_NOT_FOUND, g


def test_share_groups_cli_lists_describes_resets_and_deletes(shared_appliance):
    """``appliance share-groups`` (kafka-share-groups.sh) on a share group whose member left:
    list, reset-offsets --execute, describe with start offset and lag, delete-offsets, delete;
    the admin client behind ``appliance groups list`` asks only for classic and consumer
    groups."""
    from appliance.cli.groups import CONSUMER_TYPES
    from appliance.client.admin import AdminClient
    from test_cli_tools import rows
    app = shared_appliance
    b = app.bootstrap
    topic, group = uid("sc"), uid("sgc")
    driver("confluent").create_topics(b, {topic: (1, {})})
    produce(b, topic, 0, 10)
    member = str(uuid.uuid4())
    with RawClient(b) as c:
        assert heartbeat(c, group, topic, member).error_code == 0
        r = c.request(76, 1, {"group_id": group, "member_id": member, "member_epoch": -1})
        assert r.error_code == 0, r
    out = rows(tool(b, "share-groups", "list").stdout)
    assert out[0] == ["GROUP", "STATE"] and [group, "Empty"] in out, out
    with AdminClient(b) as a:
        assert group not in {g["group"] for g in a.list_groups((), CONSUMER_TYPES)}
    tool(b, "share-groups", "reset-offsets", "--group", group, "--topic", topic, "--to-offset",
         "4", "--execute")
    out = rows(tool(b, "share-groups", "describe", "--group", group).stdout)
    assert out == [["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"],
                   [group, topic, "0", "4", "6"]], out
    # the metrics: the group counted among the share groups, its partition's lag and in-flight
    from test_groups import wait_until
    from test_operating import scrape, val

    def shown():
        m = scrape(METRICS_PORT)
        labels = dict(group=group, topic=topic, partition=0)
        return ((val(m, "kafka_server_group_coordinator_metrics_group_count", protocol="share")
                 or 0) >= 1,
                (val(m, "kafka_server_group_coordinator_metrics_share_group_count", state="empty")
                 or 0) >= 1,
                val(m, "appliance_share_partition_lag", **labels),
                val(m, "kafka_server_sharepartitionmetrics_inflightmessagecount", **labels))
    wait_until(lambda: shown() == (True, True, 6, 0), 30, "the share group's metrics")
    out = rows(tool(b, "share-groups", "delete-offsets", "--group", group, "--topic",
                    topic).stdout)
    assert [group, topic, "deleted"] in out, out
    with AdminClient(b) as a:
        assert a.delete_share_offsets(group, [topic]) == {
            topic: (3, "There is no offset information to delete.")}
    r = tool(b, "share-groups", "delete", "--group", group)
    assert "was successful" in r.stdout
    with AdminClient(b) as a:
        assert group not in {g["group"] for g in a.list_groups((), ("share",))}


def test_read_committed_share_group_never_delivers_aborted_records(shared_appliance,
                                                                  java4_program):
    """``share.isolation.level=read_committed`` set on the GROUP resource (IncrementalAlterConfigs):
    kafka-clients 4.3's KafkaShareConsumer (which, as KIP-932 has it, leaves aborted records to
    the broker: librdkafka's drops them itself) gets the committed transaction's records and none
    of the aborted one's, which lie before them in the partition."""
    from confluent_kafka import Producer
    b = shared_appliance.bootstrap
    topic, group = uid("src"), uid("sgrc")
    driver("confluent").create_topics(b, {topic: (1, {})})
    with RawClient(b) as c:
        r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": group,
                                             "configs": [{"name": "share.isolation.level",
                                                          "config_operation": 0,
                                                          "value": "read_committed"}]}],
                              "validate_only": False})
        assert [x.error_code for x in r.responses] == [0], r
    p = Producer({"bootstrap.servers": b, "transactional.id": uid("tx")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"aborted{i}".encode(), partition=0)
    assert p.flush(30) == 0           # in the log before the abort (else librdkafka purges them)
    p.abort_transaction(30)
    p.begin_transaction()
    committed = [f"committed{i}" for i in range(5)]
    for v in committed:
        p.produce(topic, value=v.encode(), partition=0)
    p.commit_transaction(30)
    out = java4_program("ShareConsumerExplicit", b, group, topic, "5", "60")
    assert (out["read"], out["values"]) == ("5", ",".join(committed)), out


def test_a_share_group_switched_to_read_uncommitted_delivers_aborted_records(shared_appliance):
    """librdkafka 0177 dynamic_committed_to_uncommitted: a share group read_committed at first
    (aborted transactions' records archived, never delivered), then IncrementalAlterConfigs to
    read_uncommitted: the records of the transactions produced after it are all delivered,
    aborted ones included, as a read_uncommitted fetch returns them."""
    from confluent_kafka import Producer
    from test_share_groups import ShareMember
    from test_groups import wait_until
    b = shared_appliance.bootstrap
    topic, group = uid("rcu"), uid("sgrcu")
    driver("confluent").create_topics(b, {topic: (1, {})})

    def isolation(level):
        with RawClient(b) as c:
            r = c.request(44, 1, {"resources": [{"resource_type": 32, "resource_name": group,
                                                 "configs": [
                                                     {"name": "share.isolation.level",
                                                      "config_operation": 0, "value": level},
                                                     {"name": "share.auto.offset.reset",
                                                      "config_operation": 0, "value": "earliest"}]}],
                                  "validate_only": False})
            assert [x.error_code for x in r.responses] == [0], r
    isolation("read_committed")
    p = Producer({"bootstrap.servers": b, "transactional.id": uid("tx")})
    p.init_transactions(30)

    def txn(value, commit):
        p.begin_transaction()
        p.produce(topic, value=value.encode(), partition=0)
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)
    m = ShareMember("accept", b, group, topic, 10)
    try:
        txn("m1", True)                                  # offset 0, marker 1
        txn("m2", False)                                 # 2, 3
        txn("m3", True)                                  # 4, 5
        wait_until(lambda: {"m1", "m3"} <= set(m.values()), 60, "the committed records")
        assert "m2" not in m.values()
        isolation("read_uncommitted")
        for v, commit in (("m5", True), ("m6", False), ("m7", False), ("m8", True)):
            txn(v, commit)
        wait_until(lambda: {"m5", "m6", "m7", "m8"} <= set(m.values()), 60,
                   "every record produced after the switch, aborted ones too")
        assert "m2" not in m.values()
    finally:
        m.kill()
