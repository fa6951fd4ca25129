"""Metrics: the shared tables (shm.metrics), the owners' helpers (appliance.metrics), the frontend's
error counting, and the collector's union over a runtime dir made here as the supervisor and its
workers would leave it (no fork)."""

from __future__ import annotations

import datetime
import json
import os
from collections import Counter

import msgspec
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from appliance.catalog.model import Catalog, TopicInfo
from appliance.catalog.view import PUBLISHED_FILE, publish
from appliance.errors import ErrorCode
from appliance.metrics import CATALOG, COORDINATOR_SNAPSHOT, Histogram, key, parse_key
from appliance.metrics.collector import Collector, NotRunning, render
from appliance.runtime import (FRONTEND_PAGE_FIELDS, HEARTBEAT_FILE, PARTITION_PAGE_FIELDS, PROCESSES_FILE, READY,
                               SUPERVISOR, WRITER_PROCESS_PAGE_FIELDS, writer_name)
from shm.heartbeat import HeartbeatTable
from shm.metrics import MetricsTable
from shm.statepage import StatePage
from shm.topology import Topology
from workers.frontend.metrics import FrontendMetrics, error_counts


# -- the table ----------------------------------------------------------------------------------

def test_series_are_appended_once_and_read_lock_free_by_another_mapping(tmp_path):
    path = str(tmp_path / "metrics.fe0")
    with MetricsTable.create(path, 16) as owner, MetricsTable.open(path, readonly=True) as reader:
        a = owner.slot("a|x=1")
        assert owner.slot("a|x=1") == a
        owner.values[a] += 5
        owner.add("b", 2)
        owner.set("c", -7)
        assert reader.items() == [("a|x=1", 5), ("b", 2), ("c", -7)]
        owner.values[a] += 1
        assert reader.get("a|x=1") == 6 and reader.get("missing") is None


def test_a_restarted_owner_continues_its_predecessors_series(tmp_path):
    path = str(tmp_path / "metrics.w1")
    with MetricsTable.create(path, 16) as first:
        first.add("messages", 10)
    with MetricsTable.open(path) as second:
        i = second.slot("messages")
        second.values[i] += 1
        assert second.items() == [("messages", 11)]


def test_a_full_table_sends_new_series_to_an_unlisted_sink(tmp_path):
    with MetricsTable.create(str(tmp_path / "m"), 4) as t:
        for k in "abc":
            t.add(k)
        sink = t.slot("d")
        t.values[sink] += 100
        assert t.slot("e") == sink and t.dropped == 2
        assert [k for k, _ in t.items()] == ["a", "b", "c"]


def test_a_key_whose_crc_does_not_match_is_not_listed_yet(tmp_path):
    path = str(tmp_path / "m")
    with MetricsTable.create(path, 8) as owner:
        owner.add("good")
        owner.add("torn")
        # What a reader on a weakly ordered machine may see: the count before the key's bytes.
        off = owner._keys_off + 1 * owner.key_bytes + 8
        owner._mv[off] ^= 0xFF
        with MetricsTable.open(path, readonly=True) as reader:
            assert [k for k, _ in reader.items()] == ["good"]
            owner._mv[off] ^= 0xFF
            assert [k for k, _ in reader.items()] == ["good", "torn"]


def test_keys_carry_labels_and_histograms_count_into_their_bucket():
    assert parse_key(key("n", [("topic", "t"), ("partition", 3)])) == ("n", (("topic", "t"), ("partition", "3")))
    t = MetricsTable.anonymous(64)
    h = Histogram(t, "kafka_network_requestmetrics_totaltimems", [("request", "Produce")])
    h.observe_us(500)          # 0.5 ms: the 1 ms bucket
    h.observe_us(1000)         # exactly 1 ms: still le="1"
    h.observe_us(40_000_000)   # 40 s: +Inf
    got = dict(t.items())
    assert got["kafka_network_requestmetrics_totaltimems:b0|request=Produce"] == 2
    assert got[f"kafka_network_requestmetrics_totaltimems:b{len(h.bounds)}|request=Produce"] == 1
    assert got["kafka_network_requestmetrics_totaltimems:sum|request=Produce"] == 40_001_500


# -- the frontend's counting --------------------------------------------------------------------

def test_error_counts_walk_every_error_code_of_a_response_entity():
    from kio.schema.metadata.v12.response import (MetadataResponse, MetadataResponsePartition,
                                                  MetadataResponseTopic)
    from kio.static.primitive import i32, i32Timedelta
    from kio.schema.types import BrokerId, TopicName

    def part(i, code):
        return MetadataResponsePartition(error_code=code, partition_index=i32(i), leader_id=BrokerId(1),
                                         leader_epoch=i32(0), replica_nodes=(), isr_nodes=(),
                                         offline_replicas=())
    resp = MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)), brokers=(), cluster_id=None, controller_id=BrokerId(1),
        topics=(MetadataResponseTopic(error_code=ErrorCode.none, name=TopicName("t"), topic_id=None,
                                      is_internal=False, topic_authorized_operations=i32(0),
                                      partitions=(part(0, ErrorCode.none),
                                                  part(1, ErrorCode.leader_not_available))),))
    assert error_counts(resp) == Counter({0: 2, int(ErrorCode.leader_not_available): 1})


def test_error_counts_count_the_partition_errors_of_add_partitions_to_txn():
    # Regression: AddPartitionsToTxn's errors are PartitionErrorCode fields, and were not counted
    # (no CONCURRENT_TRANSACTIONS or NONE of that API ever reached the scrape).
    from kio.schema.add_partitions_to_txn.v3.response import (
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnTopicResult)
    from kio.static.primitive import i32, i32Timedelta
    from kio.schema.types import TopicName

    resp = AddPartitionsToTxnResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        results_by_topic_v3_and_below=(AddPartitionsToTxnTopicResult(
            name=TopicName("t"), results_by_partition=(
                AddPartitionsToTxnPartitionResult(partition_index=i32(0),
                                                  partition_error_code=ErrorCode.none),
                AddPartitionsToTxnPartitionResult(
                    partition_index=i32(1), partition_error_code=ErrorCode.concurrent_transactions))),))
    assert error_counts(resp) == Counter({0: 1, int(ErrorCode.concurrent_transactions): 1})


def test_frontend_metrics_count_requests_errors_and_topics():
    t = MetricsTable.anonymous(256)
    fm = FrontendMetrics(t)
    fm.connections(1)
    fm.request("Produce", 0, Counter({0: 2, int(ErrorCode.message_too_large): 1}))
    fm.request("Produce", 0, None)
    fm.topic("kafka_server_brokertopicmetrics_bytesout", "orders", 100)
    got = dict(t.items())
    assert got["kafka_network_requestmetrics_requests|request=Produce"] == 2
    assert got["kafka_network_requestmetrics_errors|request=Produce|error=NONE"] == 2
    assert got["kafka_network_requestmetrics_errors|request=Produce|error=MESSAGE_TOO_LARGE"] == 1
    assert got["kafka_server_brokertopicmetrics_bytesout|topic=orders"] == 100
    assert got["kafka_server_socket_server_metrics_connection_count|listener=PLAINTEXT"] == 1


def test_frontend_metrics_count_connections_per_listener():
    t = MetricsTable.anonymous(64)
    fm = FrontendMetrics(t, ["PLAINTEXT", "SASL_SSL"])
    fm.connections(1, "SASL_SSL")
    fm.connections(1, "SASL_SSL")
    fm.connections(-1, "SASL_SSL")
    got = dict(t.items())
    assert got["kafka_server_socket_server_metrics_connection_count|listener=SASL_SSL"] == 1
    # Every listener's series exists from the start, at 0.
    assert got["kafka_server_socket_server_metrics_connection_count|listener=PLAINTEXT"] == 0


# -- the collector --------------------------------------------------------------------------------

TOPIC_ID = bytes(range(16))


@pytest.fixture
def run_dir(tmp_path):
    """A runtime dir with the supervisor (this process), one writer process carrying orders-0,
    two frontends."""
    d = str(tmp_path / "run")
    os.makedirs(d)
    topo = Topology(d)
    hb = HeartbeatTable.create(os.path.join(d, HEARTBEAT_FILE), 8)
    w = writer_name(TOPIC_ID, 0)
    catalog = Catalog(1, {"orders": TopicInfo(name="orders", topic_id=TOPIC_ID,
                                                      partitions=1, configs={})})
    publish(catalog, topo.file_path(PUBLISHED_FILE))
    workers = [{"role": "writer", "name": "wp0", "pid": os.getpid(), "generation": 1,
                "partitions": [["orders", 0]], "index": 0, "slot": 0},
               {"role": "frontend", "name": "fe0", "pid": os.getpid(), "generation": 1,
                "topic": None, "partition": None, "index": 0, "slot": 1},
               {"role": "frontend", "name": "fe1", "pid": None, "generation": 1,
                "topic": None, "partition": None, "index": 1, "slot": 2}]
    with open(os.path.join(d, PROCESSES_FILE), "w") as f:
        json.dump({"supervisor": os.getpid(), "port": 9092, "workers": workers}, f)
    with StatePage.create(topo.page_path(w), PARTITION_PAGE_FIELDS) as page:
        page.publish(generation=1, status=READY, pid=os.getpid(), high_watermark=120,
                     last_stable_offset=100, log_start_offset=10)
    with StatePage.create(topo.page_path("wp0"), WRITER_PROCESS_PAGE_FIELDS) as page:
        page.publish(generation=1, status=READY, pid=os.getpid())
    for fe in ("fe0", "fe1"):
        with StatePage.create(topo.page_path(fe), FRONTEND_PAGE_FIELDS) as page:
            page.publish(generation=1, status=READY, pid=os.getpid())
    hb.beat(0)
    hb.beat(1)
    tables = {name: MetricsTable.create(topo.metrics_path(name), 64)
              for name in (SUPERVISOR, "wp0", w, "fe0", "fe1")}
    tables[w].add(key("kafka_server_brokertopicmetrics_messagesin", [("topic", "orders")]), 7)
    tables[w].set(key("kafka_log_log_numlogsegments", [("topic", "orders"), ("partition", 0)]), 2)
    # Both frontends count failures of the same topic: the scrape shows their sum.
    for name, n in (("fe0", 1), ("fe1", 2)):
        tables[name].add(key("kafka_server_brokertopicmetrics_failedproducerequests",
                             [("topic", "orders")]), n)
        h = Histogram(tables[name], "kafka_network_requestmetrics_totaltimems",
                      [("request", "Fetch")])
        h.observe_us(3000 * n)
    tables[SUPERVISOR].add(key("appliance_worker_restarts", [("role", "frontend")]), 1)
    tables[SUPERVISOR].set(key("appliance_recovery_seconds"), 2_500_000)
    topo.create_ring("fe0", "wp0", 1 << 16).close()
    ring = topo.create_ring("fe0", "co", 4096)
    assert ring.try_put(b"x" * 1000)
    ring.close()
    with open(topo.file_path(COORDINATOR_SNAPSHOT), "wb") as f:
        f.write(msgspec.msgpack.encode({"groups": [["g", "Stable", 2]],
                                        "offsets": [["g", "orders", 0, 90]]}))
    yield d
    for t in tables.values():
        t.close()
    hb.close()
    topo.close()


def scrape(run_dir: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(render(run_dir).decode()):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_the_scrape_is_the_union_of_tables_pages_heartbeats_rings_and_the_group_snapshot(run_dir):
    m = scrape(run_dir)
    orders = (("topic", "orders"),)
    tp = (("partition", "0"), ("topic", "orders"))
    assert m["kafka_server_brokertopicmetrics_messagesin_total"][orders] == 7
    assert m["kafka_server_brokertopicmetrics_failedproducerequests_total"][orders] == 3
    assert m["kafka_log_log_logendoffset"][tp] == 120
    assert m["kafka_log_log_logstartoffset"][tp] == 10
    assert m["kafka_log_log_laststableoffset"][tp] == 100
    assert m["kafka_cluster_partition_laststableoffsetlag"][tp] == 20
    assert m["kafka_log_log_numlogsegments"][tp] == 2
    fetch = (("request", "Fetch"),)
    assert m["kafka_network_requestmetrics_totaltimems_count"][fetch] == 2
    assert m["kafka_network_requestmetrics_totaltimems_sum"][fetch] == pytest.approx(9.0)
    assert m["kafka_network_requestmetrics_totaltimems_bucket"][(("le", "5.0"), ("request", "Fetch"))] == 1
    assert m["kafka_network_requestmetrics_totaltimems_bucket"][(("le", "10.0"), ("request", "Fetch"))] == 2
    assert m["appliance_worker_restarts_total"][(("role", "frontend"),)] == 1
    assert m["appliance_recovery_seconds"][()] == pytest.approx(2.5)
    up = m["appliance_worker_up"]
    assert up[(("role", "writer"), ("worker", "writer 0"))] == 1
    assert up[(("role", "frontend"), ("worker", "frontend 0"))] == 1
    assert up[(("role", "frontend"), ("worker", "frontend 1"))] == 0      # no pid: restarting
    assert m["appliance_worker_heartbeat_age_seconds"][(("role", "frontend"), ("worker", "frontend 0"))] >= 0
    assert m["appliance_ring_fill_ratio"][(("from", "fe0"), ("to", "co"))] > 0.2
    assert m["appliance_produce_ring_fill_ratio"][(("worker", "writer 0"),)] == 0
    group = (("group", "g"), ("partition", "0"), ("topic", "orders"))
    assert m["kafka_consumergroup_current_offset"][group] == 90
    assert m["kafka_consumergroup_lag"][group] == 30
    assert m["kafka_consumergroup_members"][(("group", "g"),)] == 2


def test_every_catalog_metric_is_exposed_with_its_help(run_dir):
    c = Collector(run_dir)
    try:
        text = generate_latest(c.registry()).decode()
    finally:
        c.close()
    for name, m in CATALOG.items():
        assert f"# HELP {name}" in text and m.help.split(" (")[0] in text


def test_a_runtime_dir_whose_supervisor_is_gone_is_not_running(run_dir):
    with open(os.path.join(run_dir, PROCESSES_FILE)) as f:
        procs = json.load(f)
    procs["supervisor"] = 2**22 + 12345          # above pid_max's default: no such process
    with open(os.path.join(run_dir, PROCESSES_FILE), "w") as f:
        json.dump(procs, f)
    with pytest.raises(NotRunning, match="is not running"):
        render(run_dir)
    with pytest.raises(NotRunning, match="no appliance runtime directory"):
        render(os.path.join(run_dir, "nope"))
