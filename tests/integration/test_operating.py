"""Operating the appliance: the Prometheus endpoint scraped with a real HTTP client after real
clients produced, consumed in a group and ran transactions; counters across a worker restart;
`appliance metrics`; SIGHUP reloads that apply live settings and refuse the rest without stopping
service; JSON logs for log shippers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import requests
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from prometheus_client.parser import text_string_to_metric_families

from appliance_harness import free_port
from raw_wire import RawClient
from test_txn_2pc_wire import init_v6

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """GET /metrics as Prometheus does; name -> {sorted labels: value}."""
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    r.raise_for_status()
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def val(m: dict, name: str, **labels) -> float | None:
    return m.get(name, {}).get(tuple(sorted((k, str(v)) for k, v in labels.items())))


def total(m: dict, name: str) -> float:
    return sum(m.get(name, {}).values())


def metrics_app(appliance_factory, **config):
    port = free_port()
    app = appliance_factory(metrics={"listen": f"127.0.0.1:{port}"}, **config)
    app.metrics_port = port
    return app


def create_topics(app, *topics: NewTopic) -> None:
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    for f in admin.create_topics(list(topics)).values():
        f.result(30)


def test_metrics_move_with_produce_consume_a_transaction_and_a_group_join(appliance_factory):
    app = metrics_app(appliance_factory)
    port = app.metrics_port
    # The appliance is ready once its writers are; the other workers (the cleaner runs at idle
    # priority) may come up a moment later: wait for every one to be up.
    app.wait_for(lambda: (ups := scrape(port)["appliance_worker_up"]) and
                 all(v == 1 for v in ups.values()), what="every worker up")
    before = scrape(port)
    ups = before["appliance_worker_up"]
    assert ups and all(v == 1 for v in ups.values()), ups
    assert {dict(k)["role"] for k in ups} == {"coordinator", "fetcher", "frontend", "metrics",
                                              "cleaner"}
    assert total(before, "appliance_worker_restarts_total") == 0
    assert val(before, "appliance_worker_restarts_total", role="writer") == 0
    assert val(before, "appliance_recovery_seconds") >= 0

    create_topics(app, NewTopic("m", 1), NewTopic("small", 1, config={"max.message.bytes": "2048"}),
                  NewTopic("recent", 1, config={"message.timestamp.before.max.ms": "60000"}))
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(20):
        p.produce("m", value=b"v" * 100, key=b"%d" % i)
    assert p.flush(30) == 0
    # A batch over the topic's max.message.bytes: refused by the broker, not by the client.
    failed = []
    big = Producer({"bootstrap.servers": app.bootstrap, "message.max.bytes": 100000,
                    "compression.type": "none", "retries": 0})
    big.produce("small", value=b"x" * 4000, on_delivery=lambda err, msg: failed.append(err))
    big.flush(30)
    assert failed and failed[0] is not None and failed[0].name() == "MSG_SIZE_TOO_LARGE", failed
    # A record stamped in 1970 on a topic that takes the last minute only: INVALID_TIMESTAMP, a
    # record validation failure, which Kafka's failed-produce meter counts (a too-large batch it
    # does not: an expected error).
    big.produce("recent", value=b"old", timestamp=1000, on_delivery=lambda err, msg: failed.append(err))
    big.flush(30)
    assert failed[-1] is not None and failed[-1].name() == "INVALID_TIMESTAMP", failed

    tp = Producer({"bootstrap.servers": app.bootstrap, "transactional.id": "metrics-tx"})
    tp.init_transactions(30)
    tp.begin_transaction()
    for i in range(5):
        tp.produce("m", value=b"committed %d" % i)
    tp.commit_transaction(30)
    tp.begin_transaction()
    for i in range(3):
        tp.produce("m", value=b"aborted %d" % i)
    assert tp.flush(30) == 0                 # in the log before the abort (else only purged)
    tp.abort_transaction(30)

    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": "mg", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.subscribe(["m"])
    got = 0
    for _ in range(120):
        msg = c.poll(1.0)
        if msg is not None and not msg.error():
            got += 1
            if got == 25:
                break
    assert got == 25
    c.commit(asynchronous=False)
    app.wait_for(lambda: (lambda m: val(m, "kafka_consumergroup_members", group="mg") == 1 and
                          val(m, "kafka_coordinator_group_groupmetadatamanager_numgroupsstable") == 1)(
        scrape(port)), what="the group, Stable with its member, in the metrics")
    c.close()

    # The coordinator publishes once a second: wait for its values, then check everything. Its
    # gauges go into its metrics table and the groups' offsets into a snapshot file, so one scrape
    # can read the table before a publish and the file after it (seen: the lag exposed,
    # numoffsets still 0): wait for both.
    m = app.wait_for(lambda: (lambda m: m if (val(m, "kafka_coordinator_transaction_aborts_total") or 0) >= 1
                              and val(m, "kafka_consumergroup_lag", group="mg", topic="m", partition=0)
                              is not None
                              and (val(m, "kafka_coordinator_group_groupmetadatamanager_numoffsets")
                                   or 0) >= 1 else None)(scrape(port)),
                     what="the coordinator's metrics")
    assert val(m, "kafka_server_brokertopicmetrics_messagesin_total", topic="m") == 28
    assert val(m, "kafka_server_brokertopicmetrics_bytesin_total", topic="m") > 2000
    assert val(m, "kafka_server_brokertopicmetrics_bytesout_total", topic="m") > 2000
    # FailedProduceRequestsPerSec as Kafka's ReplicaManager counts: not MESSAGE_TOO_LARGE (a known
    # exception), INVALID_TIMESTAMP yes; no failed fetch (the consumer met none).
    assert val(m, "kafka_server_brokertopicmetrics_failedproducerequests_total", topic="small") is None
    assert val(m, "kafka_server_brokertopicmetrics_failedproducerequests_total", topic="recent") == 1
    assert total(m, "kafka_server_brokertopicmetrics_failedfetchrequests_total") == 0
    assert val(m, "kafka_network_requestmetrics_errors_total", request="Produce",
               error="MESSAGE_TOO_LARGE") >= 1
    assert val(m, "kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") >= 1
    for api in ("Produce", "Fetch", "Metadata", "FindCoordinator", "JoinGroup", "SyncGroup",
                "OffsetCommit", "InitProducerId", "EndTxn"):
        n = val(m, "kafka_network_requestmetrics_requests_total", request=api)
        assert n and n > (val(before, "kafka_network_requestmetrics_requests_total", request=api) or 0), api
    produce_count = val(m, "kafka_network_requestmetrics_totaltimems_count", request="Produce")
    assert produce_count == val(m, "kafka_network_requestmetrics_totaltimems_bucket",
                                request="Produce", le="+Inf") >= 1
    assert val(m, "kafka_network_requestmetrics_totaltimems_sum", request="Produce") > 0
    # The log: 28 records and 2 transaction markers.
    assert val(m, "kafka_log_log_logendoffset", topic="m", partition=0) == 30
    assert val(m, "kafka_log_log_logstartoffset", topic="m", partition=0) == 0
    assert val(m, "kafka_log_log_laststableoffset", topic="m", partition=0) == 30
    assert val(m, "kafka_cluster_partition_laststableoffsetlag", topic="m", partition=0) == 0
    assert val(m, "kafka_log_log_numlogsegments", topic="m", partition=0) == 1
    assert val(m, "kafka_log_log_size", topic="m", partition=0) >= \
        val(m, "kafka_server_brokertopicmetrics_bytesin_total", topic="m")
    assert val(m, "kafka_server_replicamanager_produceridcount") >= 2
    # The transaction coordinator.
    assert val(m, "kafka_coordinator_transaction_commits_total") == 1
    assert val(m, "kafka_coordinator_transaction_aborts_total") == 1
    assert val(m, "kafka_coordinator_transaction_timedout_aborts_total") == 0
    assert val(m, "kafka_coordinator_transaction_transactionstatemanager_transactions",
               state="CompleteAbort") == 1
    assert val(m, "kafka_coordinator_transaction_transactionstatemanager_activetransactionopentimemaxms") == 0
    # The group: joined while consuming (one member then), empty after close, lag per partition.
    assert val(m, "kafka_coordinator_group_groupmetadatamanager_numgroups") >= 1
    committed = val(m, "kafka_consumergroup_current_offset", group="mg", topic="m", partition=0)
    assert committed >= 25
    assert val(m, "kafka_consumergroup_lag", group="mg", topic="m", partition=0) == 30 - committed
    assert val(m, "kafka_coordinator_group_groupmetadatamanager_numoffsets") >= 1
    carrier = f"writer {app.writer('m', 0)['index']}"       # the writer process that carries m-0
    assert val(m, "appliance_produce_ring_fill_ratio", worker=carrier) is not None
    assert val(m, "appliance_worker_up", role="writer", worker=carrier) == 1

    # Counters live in shared tables that outlive a worker: kill -9 the writer of m.
    victim = app.writer("m", 0)
    os.kill(victim["pid"], signal.SIGKILL)
    app.wait_for(lambda: app.writer("m", 0)["pid"] != victim["pid"], what="writer restart")
    after = app.wait_for(lambda: (lambda m: m if val(m, "appliance_worker_up", role="writer",
                                                      worker=carrier) == 1 else None)(scrape(port)),
                         what="the restarted writer up")
    assert val(after, "appliance_worker_restarts_total", role="writer") == 1
    assert val(after, "kafka_server_brokertopicmetrics_messagesin_total", topic="m") == 28
    assert val(after, "kafka_log_log_logendoffset", topic="m", partition=0) == 30

    # HTTP as scrapers use it: gzip when asked, HEAD, other paths.
    r = requests.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=30)
    assert r.headers.get("Content-Encoding") == "gzip" and "kafka_log_log_size" in r.text
    h = requests.head(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert h.status_code == 200 and h.content == b""
    assert requests.get(f"http://127.0.0.1:{port}/nope", timeout=30).status_code == 404
    assert requests.post(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 405
    with requests.Session() as s:            # keep-alive: two scrapes on one connection
        assert s.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200
        assert s.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200

    # `appliance metrics` prints what the scrape shows, from the runtime dir or the endpoint.
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    for how in (["--data-dir", app.data_dir], ["--url", f"http://127.0.0.1:{port}/metrics"]):
        out = subprocess.run([APPLIANCE, "metrics", *how, "messagesin"], capture_output=True,
                             text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert 'kafka_server_brokertopicmetrics_messagesin_total{topic="m"} 28.0' in out.stdout
        assert all("messagesin" in line for line in out.stdout.splitlines())


def test_sighup_applies_live_settings_refuses_the_rest_and_keeps_serving(appliance_factory):
    app = metrics_app(appliance_factory, log={"retention_check_interval_ms": 200})
    port = app.metrics_port
    # "r" follows the broker's retention; "keep" overrides it. Small segments: many of them.
    create_topics(app, NewTopic("r", 1, config={"segment.bytes": "2048"}),
                  NewTopic("keep", 1, config={"segment.bytes": "2048", "retention.ms": "-1"}))
    p = Producer({"bootstrap.servers": app.bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(60):
        for t in ("r", "keep"):
            p.produce(t, value=b"%04d" % i + b"." * 300)
        p.flush(30)
    m = scrape(port)
    assert val(m, "kafka_log_log_numlogsegments", topic="r", partition=0) > 3
    assert val(m, "kafka_log_log_logstartoffset", topic="r", partition=0) == 0
    assert total(m, "kafka_log_logflushstats_logflushrateandtimems_count") == 0   # policy os
    pids = {w["name"]: w["pid"] for w in app.workers()}
    supervisor = app.processes()["supervisor"]
    with RawClient(app.bootstrap) as raw:     # KIP-939's switch, off: the coordinator refuses
        assert init_v6(raw, "reload-2pc", enable_2pc=True).error_code == \
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED

    app.reload(log={"retention_ms": 1, "flush": {"policy": "batch"}},
               transactions={"two_phase_commit_enable": True},
               server={"fetchers": 2}, shm={"small_ring_bytes": 1 << 21})
    app.wait_for(lambda: "reload done" in app.log_text(), what="the reload")
    log = app.log_text()
    assert "reload: log.retention_ms: 604800000 -> 1" in log
    assert "reload: log.flush.policy: 'os' -> 'batch'" in log
    assert "reload: server.fetchers cannot change while the appliance runs" in log
    assert "reload: shm.small_ring_bytes cannot change while the appliance runs" in log

    # The writer of "r" deletes its old segments under the new default; "keep" has its own.
    m = app.wait_for(lambda: (lambda m: m if val(m, "kafka_log_log_logstartoffset", topic="r",
                                                 partition=0) > 0 else None)(scrape(port)),
                     what="retention under the reloaded default")
    assert val(m, "kafka_log_log_numlogsegments", topic="r", partition=0) == 1
    # acks=all now waits for an fdatasync (the new flush policy), in both writers.
    for t in ("r", "keep"):
        p.produce(t, value=b"after the reload")
    assert p.flush(30) == 0
    m = scrape(port)
    assert total(m, "kafka_log_logflushstats_logflushrateandtimems_count") >= 2
    assert val(m, "kafka_log_log_logstartoffset", topic="keep", partition=0) == 0
    # What clients see: the new broker default, and the topic override untouched.
    admin = AdminClient({"bootstrap.servers": app.bootstrap})
    res = {r.name: f.result(30) for r, f in admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, "r"), ConfigResource(ResourceType.TOPIC, "keep")]).items()}
    assert res["r"]["retention.ms"].value == "1" and res["keep"]["retention.ms"].value == "-1"
    # The coordinator's: the switch is on now (from its next loop turn).
    with RawClient(app.bootstrap) as raw:
        app.wait_for(lambda: init_v6(raw, "reload-2pc", enable_2pc=True).error_code == 0,
                     what="Enable2Pc allowed by the reloaded coordinator")
    # Service never stopped: same processes, no restart, and only one fetcher still.
    assert app.processes()["supervisor"] == supervisor
    assert {w["name"]: w["pid"] for w in app.workers()} == pids
    assert total(m, "appliance_worker_restarts_total") == 0
    assert val(m, "appliance_config_reloads_total", result="applied") == 1

    # A file that does not parse changes nothing, and says why.
    with open(app.config_path, "a") as f:
        f.write("[log\nretention_ms = \n")
    app.proc.send_signal(signal.SIGHUP)
    app.wait_for(lambda: val(scrape(port), "appliance_config_reloads_total", result="failed") == 1,
                 what="the refused reload")
    assert "reload refused, the running configuration stays" in app.log_text()
    p.produce("r", value=b"still serving")
    assert p.flush(30) == 0


def test_json_logs_are_one_object_per_line_with_role_and_process(appliance_factory):
    app = appliance_factory(args=["--log-format", "json"])
    p = Producer({"bootstrap.servers": app.bootstrap})
    p.produce("jsonlog", value=b"x")
    assert p.flush(30) == 0
    carrier = f"writer {app.writer('jsonlog', 0)['index']}"    # the writer process of jsonlog-0
    assert app.terminate() == 0
    roles, processes = set(), set()
    for line in app.log_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)          # every line: no plain-text line from any process
        assert {"time", "level", "role", "process", "pid", "logger", "message"} <= d.keys(), d
        roles.add(d["role"])
        processes.add(d["process"])
    assert {"supervisor", "writer", "frontend", "coordinator"} <= roles, roles
    assert carrier in processes and "supervisor" in processes, processes


def test_a_metrics_address_in_use_stops_the_start_with_status_5(appliance_factory):
    import socket
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        app = appliance_factory(start=False, metrics={"listen": f"127.0.0.1:{port}"})
        app.start(wait=False)
        assert app.proc.wait(60) == 5
    assert f"metrics.listen 127.0.0.1:{port}: address 127.0.0.1:{port} already in use" in app.log_text()
