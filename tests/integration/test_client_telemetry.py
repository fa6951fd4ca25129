"""KIP-714 client telemetry end to end: a real librdkafka producer and consumer (which push by
default, enable.metrics.push) get the `[telemetry]` subscription and their metrics appear in a
scrape of /metrics, labelled by client instance, client id, software and principal."""

from __future__ import annotations

import requests
from confluent_kafka import Consumer, Producer
from prometheus_client.parser import text_string_to_metric_families

from appliance_harness import eventually, free_port
from java_programs import java4_program  # noqa: F401 (fixture)


def client_series(port: int, prefix: str, client_id: str) -> list:
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    r.raise_for_status()
    return [s for fam in text_string_to_metric_families(r.text) for s in fam.samples
            if s.name.startswith(prefix) and s.labels.get("client_id") == client_id]


def test_librdkafka_producer_and_consumer_metrics_appear_in_a_scrape(appliance_factory):
    port = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"},
                            telemetry={"metrics": ["*"], "interval_ms": 1000})
    p = Producer({"bootstrap.servers": app.bootstrap, "client.id": "tele-producer"})
    c = Consumer({"bootstrap.servers": app.bootstrap, "client.id": "tele-consumer",
                  "group.id": "tele", "auto.offset.reset": "earliest"})
    try:
        for i in range(10):
            p.produce("tele", b"v%d" % i)
        assert p.flush(30) == 0
        c.subscribe(["tele"])
        got = 0

        def consumer_pushed():
            nonlocal got
            m = c.poll(0.2)
            if m is not None and not m.error():
                got += 1
            p.poll(0)
            return client_series(port, "org_apache_kafka_consumer_", "tele-consumer")

        series = eventually(consumer_pushed, timeout=60, what="the consumer's telemetry")
        produced = eventually(
            lambda: p.poll(0.1) is not None and False
            or client_series(port, "org_apache_kafka_producer_", "tele-producer"),
            timeout=60, what="the producer's telemetry")
        labels = produced[0].labels
        assert labels["client_software_name"] == "confluent-kafka-python"
        assert labels["principal"] == "User:ANONYMOUS" and len(labels["client_instance_id"]) == 22
        assert {s.labels["client_instance_id"] for s in series} != {labels["client_instance_id"]}
    finally:
        c.close()


def test_java_4_producer_and_consumer_metrics_appear_in_a_scrape(appliance_factory, java4_program):
    """kafka-clients 4.3: clientInstanceId() is the id GetTelemetrySubscriptions handed out, and
    the metrics of its pushes (the last one terminating, at close) are scraped under it."""
    port = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"},
                            telemetry={"metrics": ["*"], "interval_ms": 1000})
    out = java4_program("Telemetry4", app.bootstrap, "java-tele")
    assert int(out["read"]) >= 20, out
    for role in ("producer", "consumer"):
        series = eventually(
            lambda: client_series(port, f"org_apache_kafka_{role}_", f"java-tele-{role}"),
            timeout=60, what=f"the Java {role}'s telemetry")
        assert {s.labels["client_instance_id"] for s in series} == {out[role]}, out
        assert series[0].labels["client_software_name"] == "apache-kafka-java"


def test_kafka_errors_at_the_wire(appliance_factory):
    """GetTelemetrySubscriptions hands out an instance id and Kafka's subscription; a push with
    another subscription id is UNKNOWN_SUBSCRIPTION_ID, an oversized one TELEMETRY_TOO_LARGE,
    one that does not decode INVALID_RECORD; the connection stays open through all of them."""
    import uuid
    from raw_wire import RawClient
    app = appliance_factory(telemetry={"metrics": ["*"], "interval_ms": 100, "max_bytes": 1024})
    with RawClient(app.bootstrap) as c:
        r = c.request(71, 0, {"client_instance_id": uuid.UUID(int=0)})
        assert r.error_code == 0 and r.requested_metrics == ("*",) and r.telemetry_max_bytes == 1024
        iid, sid = r.client_instance_id, r.subscription_id
        assert iid.int != 0 and 4 in r.accepted_compression_types

        def push(**kw):
            req = dict(client_instance_id=iid, subscription_id=sid, terminating=False,
                       compression_type=0, metrics=b"")
            req.update(kw)
            return c.request(72, 0, req).error_code
        assert push(subscription_id=sid + 1) == 117          # UNKNOWN_SUBSCRIPTION_ID
        # THROTTLING_QUOTA_EXCEEDED (89) until the push interval passed, then the real answer
        assert eventually(lambda: (e := push(metrics=b"x" * 2048)) != 89 and e, timeout=10) == 118
        assert eventually(lambda: (e := push(metrics=b"\xff" * 3)) != 89 and e, timeout=10) == 87


def _client_metrics(app, *args: str) -> str:
    import subprocess
    from appliance_harness import APPLIANCE
    r = subprocess.run([APPLIANCE, "client-metrics", *args, "--bootstrap-server", app.bootstrap],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_client_metrics_resources_drive_the_subscriptions(appliance_factory):
    """KIP-714's CLIENT_METRICS resources, made with ``appliance client-metrics`` (Kafka's
    kafka-client-metrics.sh): with no ``[telemetry]`` metrics, a resource that matches the
    librdkafka producer's client id subscribes it (its metrics reach a scrape), a client it does
    not match gets no metrics; listed by ListConfigResources, gone once deleted."""
    import uuid
    from raw_wire import RawClient
    port = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"})
    out = _client_metrics(app, "alter", "--name", "producers", "--metrics",
                          "org.apache.kafka.producer.", "--interval", "1000",
                          "--match", "client_id=cm-prod.*,client_software_name=confluent-kafka-python")
    assert out.strip() == "Altered client metrics config for producers."
    assert _client_metrics(app, "list").split() == ["producers"]
    assert _client_metrics(app, "describe", "--name", "producers").splitlines() == [
        "Client metrics configs for producers are:", "  metrics=org.apache.kafka.producer.",
        "  interval.ms=1000", "  match=client_id=cm-prod.*,client_software_name=confluent-kafka-python"]
    with RawClient(app.bootstrap, client_id="not-a-producer") as c:
        r = c.request(71, 0, {"client_instance_id": uuid.UUID(int=0)})
        assert r.error_code == 0 and r.requested_metrics == () and r.push_interval.total_seconds() == 300
        listed = c.request(74, 1, {"resource_types": [16]})
        assert [(x.resource_name, x.resource_type) for x in listed.config_resources] == [("producers", 16)]
    p = Producer({"bootstrap.servers": app.bootstrap, "client.id": "cm-producer"})
    p.produce("cm", b"v")
    assert p.flush(30) == 0
    series = eventually(lambda: p.poll(0.1) is not None and False
                        or client_series(port, "org_apache_kafka_producer_", "cm-producer"),
                        timeout=60, what="the subscribed producer's telemetry")
    assert series
    assert _client_metrics(app, "delete", "--name", "producers").strip() == \
        "Deleted client metrics config for producers."
    assert _client_metrics(app, "list").split() == []
    assert "doesn't exist" in _client_metrics(app, "describe", "--name", "producers")
