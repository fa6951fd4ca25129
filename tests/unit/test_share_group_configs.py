"""Share groups' GROUP config resources (appliance.group_config's share.* names) over the
``[groups]`` defaults, as the share coordinator (appliance.group.share_group) applies them."""

from __future__ import annotations

from appliance.group.messages import (ShareFetchPart, ShareFetchRequest,
                                      ShareGroupHeartbeatRequest)
from appliance.group.share_group import ShareConfig, ShareService
from appliance.group.share_store import ShareStateStore
from appliance.group_config import GROUP_CONFIGS, describe_group_configs

T = b"\x02" * 16


def service(tmp_path, configs, lso=6):
    svc = ShareService(ShareStateStore(str(tmp_path), "os", 0),
                       ShareConfig(record_lock_duration_ms=30000, auto_offset_reset="latest"),
                       lambda: now[0], lambda: {"t": (T, 1)}, lambda t, p: (10, 0, lso),
                       group_configs=lambda g: configs.get(g, {}))
    svc.load()
    return svc


now = [0]


def fetch(svc, group, member="m", epoch=0, n=100):
    return svc.fetch(ShareFetchRequest(group, member, epoch, [ShareFetchPart(T, 0)], [], True, n))


def test_group_configs_override_the_broker_defaults(tmp_path) -> None:
    now[0] = 0
    svc = service(tmp_path, {
        "g": {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": "15000",
              "share.delivery.count.limit": "2", "share.heartbeat.interval.ms": "6000"},
        "rc": {"share.auto.offset.reset": "earliest", "share.isolation.level": "read_committed"}})
    r = svc.heartbeat(ShareGroupHeartbeatRequest("g", "m", 0, None, ["t"]))
    assert r.heartbeat_interval_ms == 6000
    r = fetch(svc, "g")
    assert (r.lock_ms, r.parts[0].acquired) == (15000, [(0, 9, 1)])   # earliest, 15 s locks
    now[0] = 15001
    svc.tick(now[0])
    assert fetch(svc, "g", "m2").parts[0].acquired == [(0, 9, 2)]
    now[0] = 30002
    svc.tick(now[0])                          # second expiry: the limit of 2 archives them
    assert fetch(svc, "g", "m3").parts[0].acquired == []
    # the broker defaults: latest, 30 s; read_committed acquires only below the LSO
    r = fetch(svc, "other")
    assert (r.lock_ms, r.parts[0].acquired) == (30000, [])
    assert fetch(svc, "rc").parts[0].acquired == [(0, 5, 1)]
    svc.close()


def test_a_groups_share_partition_max_record_locks_sets_its_window(tmp_path) -> None:
    # KIP-1240 (Kafka 4.3): share.partition.max.record.locks on a GROUP resource over
    # [groups] share_partition_max_record_locks.
    now[0] = 0
    svc = service(tmp_path, {"w": {"share.auto.offset.reset": "earliest",
                                   "share.partition.max.record.locks": "100"}})
    svc.cfg = ShareConfig(record_lock_duration_ms=30000, auto_offset_reset="earliest",
                          max_record_locks=6)
    svc.marks = lambda t, p: (1000, 0, 1000)
    assert fetch(svc, "w", n=500).parts[0].acquired == [(0, 99, 1)]
    assert fetch(svc, "w", "m2", n=500).parts[0].acquired == []       # the window is full
    assert fetch(svc, "other", n=500).parts[0].acquired == [(0, 5, 1)]  # the broker's 6
    assert GROUP_CONFIGS["share.partition.max.record.locks"].check("99")
    assert GROUP_CONFIGS["share.partition.max.record.locks"].check("10000") is None
    svc.close()


def test_share_group_configs_are_described_with_the_groups_defaults() -> None:
    assert GROUP_CONFIGS["share.delivery.count.limit"].check("11")
    assert GROUP_CONFIGS["share.delivery.count.limit"].check("3") is None

    class Groups:
        consumer_session_timeout_ms, consumer_heartbeat_interval_ms = 45000, 5000
        share_session_timeout_ms, share_heartbeat_interval_ms = 45000, 5000
        share_record_lock_duration_ms, share_delivery_count_limit = 20000, 4
        share_auto_offset_reset = "earliest"
        share_partition_max_record_locks = 3000
    d = describe_group_configs({"share.delivery.count.limit": "3"}, Groups)
    assert d["share.delivery.count.limit"][:2] == ("3", 8)
    assert d["share.record.lock.duration.ms"][:2] == ("20000", 5)
    assert d["share.auto.offset.reset"][:2] == ("earliest", 5)
    assert d["share.partition.max.record.locks"][:2] == ("3000", 5)


def test_read_committed_share_fetch_finds_the_aborted_records_it_acquired() -> None:
    """The frontend's filter (appliance.api.share_fetch): producer 7's batch 0-1 is aborted
    (its ABORT marker at 4), producer 8's 2-3 committed (marker at 5), producer 7's 6-7 is a
    later transaction: only 0-1 are archived and cut from the acquired ranges."""
    from appliance.api.share_fetch import _aborted_spans, _without
    from appliance.protocol.records import Record, build_batch, build_control_batch

    def data(base, pid):
        return build_batch([Record(None, b"v"), Record(None, b"w")], base_offset=base,
                           producer_id=pid, producer_epoch=0, base_sequence=0, transactional=True)
    log = (data(0, 7) + data(2, 8)
           + build_control_batch(commit=False, producer_id=7, producer_epoch=0,
                                 coordinator_epoch=0, timestamp_ms=1, base_offset=4)
           + build_control_batch(commit=True, producer_id=8, producer_epoch=0,
                                 coordinator_epoch=0, timestamp_ms=1, base_offset=5)
           + data(6, 7))
    acquired = [(1, 7, 1)]
    spans = _aborted_spans(memoryview(log), [(7, 0)], acquired)
    assert spans == [(1, 1)]
    assert _without(acquired, spans) == [(2, 7, 1)]
    assert _without([(0, 9, 2)], [(0, 1), (4, 4)]) == [(2, 3, 2), (5, 9, 2)]
    assert _aborted_spans(memoryview(log), [], acquired) == []
