"""The admin side of KIP-932 share groups against the real appliance (one appliance for the
module): kafka-clients 4.3's Admin (listGroups for share groups, describeShareGroups,
listShareGroupOffsets with lag, alterShareGroupOffsets, deleteShareGroupOffsets,
deleteShareGroups), and on the wire the group namespace a share group shares with classic and
consumer groups: each type refuses the other's id with Kafka's error.
"""

from __future__ import annotations

import uuid

from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import driver
from java_programs import java4_program  # noqa: F401 (fixture)
from raw_wire import RawClient
from test_share_groups import CONFIG, produce, uid

APPLIANCE_CONFIG = CONFIG
GROUP_ID_NOT_FOUND, INCONSISTENT_GROUP_PROTOCOL, NON_EMPTY_GROUP = 69, 23, 68


def heartbeat(c: RawClient, group: str, topic: str, member: str | None = None):
    return c.request(76, 1, {"group_id": group, "member_id": member or str(uuid.uuid4()),
                             "member_epoch": 0, "subscribed_topic_names": [topic]})


def test_java_admin_lists_describes_resets_and_deletes_a_share_group(shared_appliance,
                                                                     java4_program):
    """A Java 4.3 share consumer reads 20 records and leaves; the Admin then sees the group
    Empty with start offset 20 and lag 0, resets partition 0 to 5 (lag 15), deletes the topic's
    offsets (no partitions left) and the group (no longer listed)."""
    b = shared_appliance.bootstrap
    topic, group = uid("sa"), uid("sga")
    driver("confluent").create_topics(b, {topic: (1, {})})
    produce(b, topic, 0, 20)
    out = java4_program("ShareConsumerExplicit", b, group, topic, "20", "60")
    assert out["read"] == "20", out
    out = java4_program("ShareAdmin4", b, group, topic, "5")
    assert f"{group}:Share:Empty" in out["listed"].split(","), out
    assert (out["state"], out["offsets"]) == ("Empty", "0:20:0"), out
    assert (out["altered"], out["reset"]) == ("ok", "0:5:15"), out
    assert (out["deleted"], out.get("after", "")) == ("ok", ""), out
    assert out["gone"] == "ok", out
    assert group not in out.get("finally", ""), out


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
