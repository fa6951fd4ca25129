"""KIP-714 client telemetry's decisions (appliance.metrics.client_telemetry), without a broker."""

import gzip
import uuid

import zstandard
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (Gauge, Metric, MetricsData,
                                                        NumberDataPoint, ResourceMetrics,
                                                        ScopeMetrics, Sum)

from appliance.config import TelemetryConfig
from appliance.errors import ErrorCode
from appliance.metrics.client_telemetry import (GZIP, ZSTD, ClientMeta, ClientTelemetry,
                                                decode_snapshot, kafka_uuid, subscription_id)

META = ClientMeta("cid", "librdkafka", "2.16.1", "User:ANONYMOUS")


def payload() -> bytes:
    dp = NumberDataPoint(as_double=2.5, attributes=[KeyValue(key="topic",
                                                            value=AnyValue(string_value="t"))])
    m1 = Metric(name="org.apache.kafka.producer.record.queue.time.avg", gauge=Gauge(data_points=[dp]))
    m2 = Metric(name="org.apache.kafka.producer.node.request.total",
                sum=Sum(is_monotonic=True, data_points=[NumberDataPoint(as_int=7)]))
    return MetricsData(resource_metrics=[ResourceMetrics(scope_metrics=[
        ScopeMetrics(metrics=[m1, m2])])]).SerializeToString()


def telemetry(**kw) -> ClientTelemetry:
    return ClientTelemetry(TelemetryConfig(metrics=["*"], interval_ms=1000, **kw))


def test_subscription_then_push_exports_the_series_with_the_broker_labels():
    t = telemetry()
    r = t.get_subscriptions(None, META, 10_000)
    assert r["error_code"] == 0 and r["requested_metrics"] == ("*",)
    iid = r["client_instance_id"]
    assert t.push(iid, r["subscription_id"], False, ZSTD,
                  zstandard.ZstdCompressor().compress(payload()), META, 10_001) == 0
    snap = decode_snapshot(t.snapshot())
    names = {s[0]: s for s in snap["series"]}
    g = names["org_apache_kafka_producer_record_queue_time_avg"]
    labels = dict(g[2])
    assert g[3] == 2.5 and labels["topic"] == "t" and labels["client_instance_id"] == kafka_uuid(iid)
    assert labels["client_software_name"] == "librdkafka" and labels["principal"] == "User:ANONYMOUS"
    assert names["org_apache_kafka_producer_node_request_total"][1] == "counter"


def test_the_subscription_id_is_the_same_in_every_frontend():
    iid = uuid.uuid4()
    a, b = telemetry(), telemetry()
    assert (a.get_subscriptions(iid, META, 1)["subscription_id"]
            == b.get_subscriptions(iid, META, 5)["subscription_id"]
            == subscription_id(("*",), 1000, iid))
    # a frontend that never answered this client's GetTelemetrySubscriptions takes its push
    c = telemetry()
    assert c.push(iid, subscription_id(("*",), 1000, iid), False, GZIP,
                  gzip.compress(payload()), META, 10_000) == 0


def test_kafka_errors_in_kafkas_order():
    t = telemetry(max_bytes=1024)
    r = t.get_subscriptions(None, META, 10_000)
    iid, sid = r["client_instance_id"], r["subscription_id"]
    assert t.get_subscriptions(iid, META, 10_100)["error_code"] == ErrorCode.throttling_quota_exceeded
    assert t.push(iid, sid + 1, False, 0, b"", META, 10_200) == ErrorCode.unknown_subscription_id
    assert t.push(iid, sid, False, 0, b"", META, 10_300) == ErrorCode.throttling_quota_exceeded
    assert t.push(iid, sid, False, 9, b"", META, 12_000) == ErrorCode.unsupported_compression_type
    assert t.push(iid, sid, False, 0, b"x" * 2000, META, 13_100) == ErrorCode.telemetry_too_large
    assert t.push(iid, sid, False, 0, b"\xff\xff\xff", META, 14_200) == ErrorCode.invalid_record
    assert t.push(iid, sid, True, 0, b"", META, 14_300) == 0      # terminating: never too early
    assert t.push(iid, sid, False, 0, b"", META, 20_000) == ErrorCode.invalid_request
    assert t.push(uuid.UUID(int=0), sid, False, 0, b"", META, 20_000) == ErrorCode.invalid_request


def test_cardinality_cap_and_gone_clients_expire():
    t = telemetry(max_series=1, max_clients=2)
    ids = []
    for i in range(3):
        r = t.get_subscriptions(None, META, 10_000 + i)
        ids.append(r["client_instance_id"])
        t.push(r["client_instance_id"], r["subscription_id"], False, 0, payload(), META, 10_000 + i)
    assert len(t.instances) == 2 and ids[0] not in t.instances
    assert len(decode_snapshot(t.snapshot())["series"]) == 1
    t.expire(10_000 + 60_001 + 10)
    assert not t.instances and decode_snapshot(t.snapshot())["series"] == []


def test_reload_changes_the_subscription_id():
    t = telemetry()
    r = t.get_subscriptions(None, META, 10_000)
    t.settings = TelemetryConfig(metrics=["org.apache.kafka.producer."], interval_ms=1000)
    assert t.push(r["client_instance_id"], r["subscription_id"], False, 0, b"", META,
                  10_001) == ErrorCode.unknown_subscription_id
    r2 = t.get_subscriptions(r["client_instance_id"], META, 10_002)   # after that error: at once
    assert r2["error_code"] == 0 and r2["requested_metrics"] == ("org.apache.kafka.producer.",)


# -- CLIENT_METRICS config resources (KIP-714 subscriptions) --------------------------------------

def test_client_metrics_resources_win_over_the_section_and_match_per_client():
    from appliance.metrics import client_metrics_config as cmc
    resources = {
        "producers": {"metrics": "org.apache.kafka.producer.", "interval.ms": "2000",
                      "match": "client_software_name=librdkafka,client_id=p.*"},
        "all-java": {"metrics": "*", "interval.ms": "60000", "match": "client_software_name=apache-kafka-java"},
        "node": {"metrics": "org.apache.kafka.producer.node.,org.apache.kafka.consumer.",
                 "interval.ms": "500000"},
    }
    held = [resources]          # what the catalog holds: a new dict at each new snapshot
    t = ClientTelemetry(TelemetryConfig(metrics=["*"], interval_ms=1000), lambda: held[0])
    p = t.get_subscriptions(None, ClientMeta("p-1", "librdkafka", "2.16.1", "User:a"), 1)
    # The union of the matching subscriptions, the smallest interval (never above 5 minutes).
    assert p["requested_metrics"] == ("org.apache.kafka.consumer.", "org.apache.kafka.producer.",
                                      "org.apache.kafka.producer.node.")
    assert p["push_interval"] == 2000
    j = t.get_subscriptions(None, ClientMeta("x", "apache-kafka-java", "4.3.0", "User:a"), 1)
    assert j["requested_metrics"] == ("*",) and j["push_interval"] == 60000
    other = t.get_subscriptions(None, ClientMeta("c-1", "librdkafka", "2.16.1", "User:a"), 1)
    assert other["requested_metrics"] == ("org.apache.kafka.consumer.",
                                          "org.apache.kafka.producer.node.")
    assert other["push_interval"] == 300000
    # A change of the resources is a new subscription id at the client's next request.
    held[0] = {**resources, "producers": {"metrics": "org.apache.kafka.producer.",
                                          "interval.ms": "3000", "match": "client_id=p.*"}}
    t.instances[p["client_instance_id"]].last_get_ms = 0
    again = t.get_subscriptions(p["client_instance_id"], ClientMeta("p-1", "librdkafka", "2.16.1",
                                                                    "User:a"), 10**7)
    assert again["push_interval"] == 3000 and again["subscription_id"] != p["subscription_id"]
    # The instance id selector takes Kafka's base64 form.
    sub = cmc.Subscription("one", {"metrics": "*",
                                   "match": f"client_instance_id={kafka_uuid(p['client_instance_id'])}"})
    assert sub.matches({"client_instance_id": kafka_uuid(p["client_instance_id"])})
    assert not sub.matches({"client_instance_id": "x"}) and not sub.matches({})


def test_client_metrics_config_checks_are_kafkas():
    import pytest
    from appliance.errors import KafkaError
    from appliance.metrics import client_metrics_config as cmc
    from appliance.topic_config import apply_config_ops
    ok = cmc.alter("s", {}, [(0, "metrics", "a.,b."), (0, "interval.ms", "1000"),
                             (0, "match", "client_id=x.*")], True, apply_config_ops)
    assert ok == {"metrics": "a.,b.", "interval.ms": "1000", "match": "client_id=x.*"}
    assert cmc.alter("s", ok, [(2, "metrics", "c.")], True, apply_config_ops)["metrics"] == "a.,b.,c."
    assert cmc.alter("s", ok, [(1, "metrics", None), (1, "interval.ms", None), (1, "match", None)],
                     True, apply_config_ops) == {}
    for ops, code in (([(0, "nope", "1")], ErrorCode.invalid_request),
                      ([(0, "interval.ms", "99")], ErrorCode.invalid_request),
                      ([(0, "interval.ms", "x")], ErrorCode.invalid_config),
                      ([(0, "match", "client_color=red")], ErrorCode.invalid_config),
                      ([(0, "match", "client_id=(")], ErrorCode.invalid_config),
                      ([(0, "match", "client_id")], ErrorCode.invalid_config)):
        with pytest.raises(KafkaError) as e:
            cmc.alter("s", {}, ops, True, apply_config_ops)
        assert e.value.code == code, ops
    assert cmc.describe(ok)["interval.ms"] == ("1000", 7, "INT", [])
