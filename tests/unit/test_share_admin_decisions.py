"""The admin side of share groups (appliance.group.share_admin): ListGroups rows, DeleteGroups,
and the share-group offsets APIs 90-92 as Kafka answers them, over a real share-state log."""

from __future__ import annotations

from appliance.errors import ErrorCode as E
from appliance.group.messages import (AlterShareOffsetsRequest, DeleteShareOffsetsRequest,
                                      DescribeShareOffsetsRequest, ShareAckBatch, ShareFetchPart,
                                      ShareFetchRequest, ShareGroupHeartbeatRequest,
                                      ShareOffsetsAsk)
from appliance.group.share_group import ShareConfig, ShareService
from appliance.group.share_partition import ACCEPT
from appliance.group.share_store import ShareStateStore

T = b"\x01" * 16


class Env:
    def __init__(self, tmp_path, others=()) -> None:
        self.now = 0
        self.hw = {(T, 0): 10, (T, 1): 4}
        self.store = ShareStateStore(str(tmp_path), "os", 0)
        self.svc = ShareService(self.store, ShareConfig(auto_offset_reset="earliest"),
                                lambda: self.now, lambda: {"t": (T, 2)},
                                lambda t, p: (self.hw[(t, p)], 0) if (t, p) in self.hw else None,
                                other_group=lambda g: g in others)
        self.svc.load()

    def join(self, group, member):
        return self.svc.heartbeat(ShareGroupHeartbeatRequest(group, member, 0, None, ["t"]))

    def fetch(self, group, member, epoch, acks=(), max_records=5):
        parts = [ShareFetchPart(T, p, [ShareAckBatch(f, l, [ACCEPT]) for f, l in acks])
                 for p in (0, 1)]
        return self.svc.fetch(ShareFetchRequest(group, member, epoch, parts, [], True, max_records))

    def describe(self, group, topics):
        (g,) = self.svc.describe_share_offsets(
            DescribeShareOffsetsRequest([ShareOffsetsAsk(group, topics)])).groups
        return g


def test_list_and_delete_share_groups(tmp_path) -> None:
    env = Env(tmp_path)
    env.join("g", "m")
    assert env.fetch("g", "m", 0).error == E.none
    rows = env.svc.list_share_groups([], [])
    assert [(r.group_id, r.protocol_type, r.group_state, r.group_type) for r in rows] == [
        ("g", "share", "Stable", "share")]
    assert env.svc.list_share_groups(["empty"], []) == []
    assert env.svc.list_share_groups([], ["consumer"]) == []
    assert env.svc.list_share_groups(["STABLE"], ["Share"]) == rows
    assert env.svc.delete_share_group("g") == E.non_empty_group
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m", -1))
    assert [r.group_state for r in env.svc.list_share_groups([], [])] == ["Empty"]
    assert env.svc.delete_share_group("g") == E.none
    assert not env.svc.is_share_group("g") and env.svc.list_share_groups([], []) == []
    env.svc.close()
    again = Env(tmp_path)            # the tombstones hold: the group's state stays gone
    assert not again.svc.is_share_group("g")
    again.svc.close()


def test_describe_alter_delete_share_group_offsets(tmp_path) -> None:
    env = Env(tmp_path, others={"classic"})
    env.join("g", "m")
    r = env.fetch("g", "m", 0, max_records=6)          # 0-5 of partition 0 acquired
    assert r.parts[0].acquired == [(0, 5, 1)]
    r = env.fetch("g", "m", 1, acks=[(0, 1), (3, 3)])  # 0, 1 and 3 done: start offset 2
    g = env.describe("g", [("t", [0, 1]), ("nope", [0])])
    assert [(t.topic, [(p.partition, p.start_offset, p.lag) for p in t.partitions])
            for t in g.topics] == [("t", [(0, 2, 7), (1, 0, 4)]), ("nope", [(0, -1, -1)])]
    assert g.topics[1].topic_id == bytes(16)
    # null topics (v1): every partition with state; a group of another type is refused
    g = env.describe("g", None)
    assert [(t.topic, sorted(p.partition for p in t.partitions)) for t in g.topics] == [
        ("t", [0, 1])]
    assert env.describe("classic", None).error == E.group_id_not_found
    assert env.describe("unknown", None).error == E.group_id_not_found
    # alter and delete want an empty share group
    alter = AlterShareOffsetsRequest("g", [("t", [(0, 8)])])
    assert env.svc.alter_share_offsets(alter).error == E.non_empty_group
    assert env.svc.alter_share_offsets(AlterShareOffsetsRequest("classic", [])).error == \
        E.group_id_not_found
    assert env.svc.delete_share_offsets(DeleteShareOffsetsRequest("nope", ["t"])).error == \
        E.group_id_not_found
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m", -1))
    r = env.svc.alter_share_offsets(AlterShareOffsetsRequest("g", [("t", [(0, 8), (5, 0)]),
                                                                   ("nope", [(0, 1)])]))
    assert r.error == E.none
    assert [[(p.partition, p.error) for p in t.partitions] for t in r.topics] == [
        [(0, E.none), (5, E.unknown_topic_or_partition)], [(0, E.unknown_topic_or_partition)]]
    assert [(p.start_offset, p.lag) for p in env.describe("g", [("t", [0])]).topics[0].partitions] \
        == [(8, 2)]
    env.join("g", "m2")
    r = env.fetch("g", "m2", 0, max_records=10)
    assert r.parts[0].acquired == [(8, 9, 1)]          # the reset start, in-flight forgotten
    env.svc.heartbeat(ShareGroupHeartbeatRequest("g", "m2", -1))
    r = env.svc.delete_share_offsets(DeleteShareOffsetsRequest("g", ["nope", "t"]))
    assert [(t.topic, t.error) for t in r.topics] == [
        ("t", E.none), ("nope", E.unknown_topic_or_partition)]
    r = env.svc.delete_share_offsets(DeleteShareOffsetsRequest("g", ["t"]))
    assert [(t.error, t.error_message) for t in r.topics] == [
        (E.unknown_topic_or_partition, "There is no offset information to delete.")]
    assert [p.start_offset for p in env.describe("g", [("t", [0])]).topics[0].partitions] == [-1]
    env.svc.close()
