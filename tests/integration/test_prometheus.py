"""A real Prometheus (Debian's package, installed by `make install-test`) scrapes the real
appliance's `[metrics] listen` endpoint every second while real clients drive a little load (a
producer, a transactional producer that leaves one transaction open, a consumer group that
commits, a share consumer, a compacted topic, a produce and a fetch and a DeleteTopics answered
with errors); `promtool check metrics` passes on a scrape, and every expression of
the Grafana dashboard (ops/grafana/appliance.json) returns data through Prometheus's query API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import requests
from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer, ShareConsumer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

from appliance_harness import eventually, free_port

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "appliance.json"

# What Grafana puts in for the dashboard's variables: $job is a multi-value query variable with
# "All" selected (its allValue), $__rate_interval is max($__interval + scrape interval,
# 4 x scrape interval), 4 s with the data source's scrape interval set to this test's 1 s.
VARIABLES = {"$__rate_interval": "4s", "$job": ".*"}

# Panels that alarm: their expression filters to the series in a bad state (a worker down, a
# ring between processes holding anything), so on a healthy appliance Grafana rightly shows
# nothing. The filter comes off and what is left (the series underneath) must return data. (The
# LSO-lag panel's "> 0" stays: the test holds a transaction open, so it has data.)
ALARM_FILTERS = (" == 0", " > 0")
ALARM_SERIES = ("appliance_worker_up", "appliance_ring_fill_ratio")

# Counters of damage, per partition, that exist from the partition's first corrupt batch on (as
# Kafka's per-topic meters exist from their first mark): bit rot is not made here (that is
# tests/integration/test_bit_rot.py), so for these the scrape must declare the family (its
# # TYPE line) and Prometheus must know the name, with no series yet.
FIRST_EVENT_COUNTERS = ("appliance_log_scrub_corrupt_batches_total",
                        "appliance_log_fetch_corrupt_batches_total",
                        # Fetch failures Kafka counts are the unexpected ones only (a read that
                        # fails: bit rot, a broken disk), never what a client can ask for.
                        "kafka_server_brokertopicmetrics_failedfetchrequests_total")

# promtool's lint asks for no `_count` suffix on a gauge and no abbreviated units; these are
# Kafka's own metric names (kafka.network:type=socket-server-metrics,name=connection-count and
# the like), kept as Kafka's dashboards know them.
KAFKA_NAMES_PROMTOOL_LINTS = {
    "kafka_log_logcleanermanager_time_since_last_run_ms",
    "kafka_log_logcleanermanager_uncleanable_partitions_count",
    "kafka_server_group_coordinator_metrics_consumer_group_count",
    "kafka_server_group_coordinator_metrics_group_count",
    "kafka_server_group_coordinator_metrics_share_group_count",
    "kafka_server_socket_server_metrics_connection_count",
}


def dashboard_expressions() -> list[str]:
    exprs: list[str] = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return exprs


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a dashboard variable the test does not know: {expr}"
    for name in ALARM_SERIES:
        for f in ALARM_FILTERS:
            expr = expr.replace(f'{name}{{job=~".*"}}{f}', f'{name}{{job=~".*"}}')
    return expr


@pytest.fixture
def prometheus(tmp_path):
    exe, tool = shutil.which("prometheus"), shutil.which("promtool")
    assert exe and tool, "Debian's prometheus is not installed: run `make install-test` as root"
    procs = []

    def start(target: str) -> str:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: appliance\n    static_configs: [{{targets: ['{target}']}}]\n")
        log = open(tmp_path / "prometheus.log", "wb")
        procs.append((subprocess.Popen(
            [exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT), log))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc, log in procs:
        proc.terminate()
        proc.wait(10)
        log.close()


def query(base: str, expr: str) -> list:
    r = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
    assert r.status_code == 200, (expr, r.text)
    return r.json()["data"]["result"]


def prometheus_ready(base: str) -> bool:
    try:
        return requests.get(f"{base}/-/ready", timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def test_prometheus_scrapes_and_every_dashboard_expression_returns_data(appliance_factory,
                                                                        prometheus, tmp_path):
    mport = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{mport}"})
    base = prometheus(f"127.0.0.1:{mport}")
    eventually(lambda: prometheus_ready(base), timeout=20, what="prometheus ready")

    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    for f in admin.create_topics([
            NewTopic("prom-plain", 2, config={"max.message.bytes": "4096"}),
            NewTopic("prom-compacted", 1, config={"cleanup.policy": "compact"}),
            NewTopic("prom-recent", 1, config={"message.timestamp.before.max.ms": "60000"})]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": app.bootstrap, "linger.ms": 5})
    for i in range(200):
        p.produce("prom-plain", b"v%d" % i, key=b"k%d" % (i % 10))
        p.produce("prom-compacted", b"v%d" % i, key=b"k%d" % (i % 5))
    assert p.flush(30) == 0
    # A produce and a fetch answered with an error on a known topic (the errors panel): a record
    # over the topic's max.message.bytes (MESSAGE_TOO_LARGE), a fetch past the end
    # (OFFSET_OUT_OF_RANGE); and one the failed-produce panel counts (Kafka counts unexpected
    # failures only): a record older than the topic takes (INVALID_TIMESTAMP).
    failed = []
    big = Producer({"bootstrap.servers": app.bootstrap, "message.max.bytes": 100000})
    big.produce("prom-plain", b"x" * 20000, partition=1, on_delivery=lambda e, m: failed.append(e))
    big.flush(30)
    assert failed and failed[0] is not None and failed[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    big.produce("prom-recent", b"old", timestamp=1000, on_delivery=lambda e, m: failed.append(e))
    big.flush(30)
    assert failed[-1] is not None and failed[-1].code() == KafkaError.INVALID_TIMESTAMP, failed
    oor = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "prom-oor",
                    "auto.offset.reset": "latest"})
    oor.assign([TopicPartition("prom-plain", 1, 10**6)])
    sc = ShareConsumer({"bootstrap.servers": app.bootstrap, "group.id": "prom-share"})
    sc.subscribe(["prom-plain"])
    tp = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "prom-txn"})
    tp.init_transactions(30)
    tp.begin_transaction()
    tp.produce("prom-plain", b"committed", partition=0)
    tp.commit_transaction(30)
    # One left open: the LSO lags the high watermark and a transaction is Ongoing.
    tp.begin_transaction()
    tp.produce("prom-plain", b"open", partition=0)
    assert tp.flush(30) == 0
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "prom-group",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(["prom-plain"])
    # A request answered with an error (the errors panel counts those that are not NONE).
    err = admin.delete_topics(["prom-no-such-topic-" + uuid.uuid4().hex[:6]])
    for f in err.values():
        with pytest.raises(KafkaException):
            f.result(30)
    try:
        got = 0

        def consumed_and_committed():
            nonlocal got
            m = c.poll(0.2)
            if m is not None and not m.error():
                got += 1
                c.commit(m, asynchronous=False)
            return got >= 20

        eventually(consumed_and_committed, timeout=30, what="the group consuming")
        eventually(lambda: query(base, 'up{job="appliance"} == 1'), timeout=20,
                   what="the appliance target up")
        # promtool on a scrape of our own: the exposition parses, and its only lint problems are
        # names that are Kafka's (what JMX-exported Kafka shows), which win over the conventions.
        body = requests.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).content
        check = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=body,
                               capture_output=True, timeout=30)
        out = (check.stdout + check.stderr).decode()
        assert check.returncode in (0, 3), out  # 3: lint problems only
        lints = {line.split()[0] for line in out.splitlines() if line.strip()}
        assert lints <= KAFKA_NAMES_PROMTOOL_LINTS, out

        def first_event(e: str) -> bool:
            names = [n for n in FIRST_EVENT_COUNTERS if n in e]
            return bool(names) and all(
                re.search(rf"^# TYPE {n.removesuffix('_total')}(_total)? counter$", text, re.M)
                and any(requests.get(f"{base}/api/v1/metadata", params={"metric": m},
                                     timeout=10).json()["data"]
                        for m in (n, n.removesuffix("_total")))
                for n in names)

        # The dashboard's $job variable: label_values(appliance_worker_up, job).
        assert {s["metric"]["job"] for s in query(base, "appliance_worker_up")} == {"appliance"}

        text = body.decode()
        exprs = [substitute(e) for e in dashboard_expressions()]
        assert len(exprs) > 40

        empty: list[str] = []

        def all_return_data():
            c.poll(0.1)
            oor.poll(0.05)
            sc.poll(0.1)
            p.produce("prom-plain", b"more")  # the rates keep samples in every window
            p.poll(0)
            empty[:] = [e for e in exprs if not query(base, e) and not first_event(e)]
            return not empty

        try:
            eventually(all_return_data, timeout=15, what="every dashboard expression")
        except AssertionError:
            raise AssertionError("dashboard expressions with no data:\n" + "\n".join(empty))
    finally:
        c.close()
        oor.close()
        sc.close()
        tp.abort_transaction(30)
