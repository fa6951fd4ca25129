"""The Java AdminClient and consumer (kafka-clients 3.9.1, tests/java/AdminCheck.java) against the
admin APIs: CreatePartitions, IncrementalAlterConfigs of a topic and of the broker (with Kafka's
errors for an unknown topic config and a static broker config), DescribeConfigs sources,
DeleteRecords and ListOffsets EARLIEST, DescribeLogDirs, ElectLeaders, partition reassignments;
and a group member that commits the leader epoch of what it read, then, after a restart, a new
member that validates its position with OffsetForLeaderEpoch (KIP-320) and resumes there with
auto.offset.reset=none (a failed validation would throw)."""

from __future__ import annotations

from java_programs import java4_program, java_program  # noqa: F401 (fixtures)
from raw_wire import RawClient


def test_java_admin_client(appliance, java_program):
    got = java_program("AdminCheck", appliance.bootstrap, "admin")
    assert got["createPartitions.4"] == "ok"
    assert got["createPartitions.3"] == "InvalidPartitionsException"
    assert got["partitions"] == "4"
    assert got["alterTopic"] == "ok"
    assert got["alterTopic.unknown"] == "InvalidConfigurationException"
    assert got["alterBroker"] == "ok"
    assert got["alterBroker.static"] == "InvalidRequestException"
    assert got["topic.retention.ms"] == "3600000/DYNAMIC_TOPIC_CONFIG"
    assert got["topic.retention.bytes"] == "1000000000/DYNAMIC_BROKER_CONFIG"
    assert got["broker.log.retention.bytes"] == "1000000000/DYNAMIC_BROKER_CONFIG/false"
    assert got["deleteRecords"] == "12" and got["earliest"] == "12"
    assert got["deleteRecords.past"] == "OffsetOutOfRangeException"
    path, size, has_total = got["logDir"].split(" ")
    assert path == appliance.data_dir and int(size) > 0 and has_total == "true"
    assert got["electLeaders"] == "ElectionNotNeededException"
    assert got["reassign.same"] == "ok"
    assert got["reassign.other"] == "InvalidReplicaAssignmentException"
    assert got["reassign.cancel"] == "NoReassignmentInProgressException"
    assert got["reassignments"] == "0"


def test_java_consumer_validates_its_committed_position_after_a_restart(appliance, java_program):
    with RawClient(appliance.bootstrap) as raw:
        r = raw.request(19, 7, {"topics": [{"name": "java-epochs", "num_partitions": 1, "replication_factor": 1,
                                            "assignments": [], "configs": []}],
                                "timeout_ms": 30000, "validate_only": False})
        assert r.topics[0].error_code == 0
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": appliance.bootstrap})
    for i in range(10):
        p.produce("java-epochs", value=b"%d" % i, partition=0)
    assert p.flush(30) == 0
    del p
    got = java_program("AdminCheck", appliance.bootstrap, "commit")
    assert got["offsets"] == "[0, 1, 2, 3]"
    assert got["leaderEpoch"] == "Optional[0]"          # the epoch every stored batch carries
    assert got["committed"] == "4/Optional[0]"
    appliance.terminate()
    appliance.restart()
    got = java_program("AdminCheck", appliance.bootstrap, "resume")
    assert got["offsets"] == "[4, 5, 6, 7, 8, 9]"


def test_java_4_admin_on_kafka_4s_admin_surface(appliance_factory, java4_program):
    """kafka-clients 4.3's Admin: describeTopics pages through DescribeTopicPartitions (two
    partitions a response here, so it follows the cursor across both topics), CLIENT_METRICS
    resources are set and described (kafka-client-metrics.sh's calls) and listed by
    ListConfigResources, DescribeCluster gives the cluster's authorized operations."""
    import requests
    from appliance_harness import free_port
    port = free_port()
    appliance = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"})
    got = java4_program("Admin4", appliance.bootstrap)
    scrape = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    # The Admin asked DescribeTopicPartitions (not Metadata's fallback), once per page.
    pages = [line for line in scrape.splitlines() if line.startswith(
        'kafka_network_requestmetrics_requests_total{request="DescribeTopicPartitions"')]
    assert pages and float(pages[0].split()[-1]) >= 4, pages
    assert got["partitions.dtp-a"] == "0,1,2,3,4" and got["partitions.dtp-b"] == "0,1,2"
    assert got["ops.dtp-a"] == "true" and got["ops.dtp-b"] == "true"
    assert got["clientMetrics"] == ("interval.ms=5000/DYNAMIC_CLIENT_METRICS_CONFIG;"
                                    "match=client_id=java-.*/DYNAMIC_CLIENT_METRICS_CONFIG;"
                                    "metrics=org.apache.kafka.producer./DYNAMIC_CLIENT_METRICS_CONFIG")
    assert got["listed"] == "CLIENT_METRICS:java-sub"
    assert "dtp-a" in got["listedTopics"].split(",") and "dtp-b" in got["listedTopics"].split(",")
    assert got["clusterOps"] == "true"
