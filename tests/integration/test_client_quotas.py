"""Client quotas end to end: AlterClientQuotas / DescribeClientQuotas at the wire (both versions,
Kafka's errors, validate_only, durable over a restart), through the Java Admin (what
kafka-configs.sh --entity-type users|clients sends) and `appliance configs`; a real producer and
consumer (confluent-kafka) held to their byte rates, counted across two frontends, with an
unthrottled neighbour, the throttle in the responses and the per-entity metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
import requests
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from appliance_harness import eventually, free_port
from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from java_programs import java_program  # noqa: F401 (fixture)
from raw_wire import RawClient, create_topic, parse_batches, plain

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")
# Rates over 2 samples of 1 s (Kafka: 11): a rate quota bites at once and lets go after 2 s.
APPLIANCE_CONFIG = {"server": {"frontends": 1}, "quotas": {"window_num": 2, "window_size_seconds": 1}}
INVALID_REQUEST, UNSUPPORTED_VERSION = 42, 35


def alter(raw, v, entries, validate_only=False):
    return raw.request(49, v, {"entries": [
        {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
         "ops": [{"key": k, "value": 0.0 if val is None else float(val), "remove": val is None}
                 for k, val in ops]} for entity, ops in entries], "validate_only": validate_only})


def describe(raw, v, components, strict=False):
    return raw.request(48, v, {"components": [{"entity_type": t, "match_type": m, "match": n}
                                              for t, m, n in components], "strict": strict})


def entries(resp) -> dict:
    return {tuple((e.entity_type, e.entity_name) for e in entry.entity):
            {x.key: x.value for x in entry.values} for entry in resp.entries}


def test_alter_and_describe_at_the_wire_with_kafkas_errors(shared_appliance):
    with RawClient(shared_appliance.bootstrap) as raw:
        for v in (0, 1):
            user = f"wire-{v}"
            r = alter(raw, v, [([("user", user)], [("producer_byte_rate", 1024), ("request_percentage", 12.5)]),
                               ([("user", user), ("client-id", None)], [("consumer_byte_rate", 2048)]),
                               ([("user", user), ("group", "g")], [("producer_byte_rate", 1)]),
                               ([("client-id", f"c-{v}")], [("producer_byte_rate", 1.5)]),
                               ([("ip", "127.0.0.1"), ("user", user)], [("connection_creation_rate", 1)])])
            assert [(e.error_code, e.error_message) for e in r.entries] == [
                (0, None), (0, None),
                (INVALID_REQUEST, "Unhandled client quota entity type: group"),
                (INVALID_REQUEST, "producer_byte_rate cannot be a fractional value."),
                (INVALID_REQUEST, "Invalid quota entity combination, IP entity shouldnot be combined "
                                  "with User or ClientId")], (v, r)
            # validate_only: checked, answered, nothing changed.
            r = alter(raw, v, [([("user", user)], [("producer_byte_rate", 7)])], validate_only=True)
            assert r.entries[0].error_code == 0
            r = describe(raw, v, [("user", 0, user)])
            assert r.error_code == 0
            assert entries(r) == {(("user", user),): {"producer_byte_rate": 1024.0, "request_percentage": 12.5},
                                  (("client-id", None), ("user", user)): {"consumer_byte_rate": 2048.0}}
            assert entries(describe(raw, v, [("user", 0, user)], strict=True)).keys() == {(("user", user),)}
            assert entries(describe(raw, v, [("user", 0, user), ("client-id", 1, None)])).keys() == {
                (("client-id", None), ("user", user))}
            r = describe(raw, v, [("group", 2, None)])
            assert (r.error_code, r.error_message, r.entries) == (
                UNSUPPORTED_VERSION, "Unsupported entity type group", None)
            r = describe(raw, v, [("user", 0, None)])
            assert (r.error_code, r.error_message) == (
                INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            r = alter(raw, v, [([("user", user)], [("request_percentage", None)])])
            assert r.entries[0].error_code == 0
            assert entries(describe(raw, v, [("user", 0, user)], strict=True)) == {
                (("user", user),): {"producer_byte_rate": 1024.0}}


def test_java_admin_alters_and_describes_client_quotas(shared_appliance, java_program):
    """kafka-clients 3.9's Admin: alterClientQuotas and describeClientQuotas with the filters
    kafka-configs.sh sends for --entity-type users / clients (containsOnly)."""
    out = java_program("ClientQuotas", shared_appliance.bootstrap)
    assert out["invalid"] == "InvalidRequestException:Invalid configuration key bogus_rate", out
    users = out["users"].split(";")
    assert "user=alice:producer_byte_rate=1048576.0,request_percentage=25.5" in users, out
    assert not any("client-id" in u for u in users), out          # strict: users alone
    assert out["clients"] == "client-id=<default>:producer_byte_rate=4096.0;" \
                             "client-id=app-1:consumer_byte_rate=8192.0", out
    assert out["alice"] == ("client-id=<default>,user=alice:consumer_byte_rate=2048.0;"
                            "user=alice:producer_byte_rate=1048576.0,request_percentage=25.5"), out
    assert out["default"] == "client-id=<default>:producer_byte_rate=4096.0", out     # validate-only changed nothing
    assert out["removed"] == "user=alice:producer_byte_rate=1048576.0", out


def _cli(app, *args, ok=True):
    r = subprocess.run([APPLIANCE, "configs", *args, "--bootstrap-server", app.bootstrap],
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_appliance_configs_manages_quotas_and_they_outlive_a_restart(shared_appliance):
    app = shared_appliance
    out = _cli(app, "alter", "--user", "cli-u", "--client", "cli-c", "--add-config",
               "producer_byte_rate=5000,consumer_byte_rate=6000").stdout
    assert "Completed updating config for user=cli-u, client-id=cli-c." in out
    r = _cli(app, "alter", "--ip", "10.9.9.9", "--add-config", "connection_creation_rate=3,bogus=1",
             ok=False)
    assert r.returncode == 1 and "Invalid configuration key bogus" in r.stderr, r
    app.terminate()
    app.start()
    rows = json.loads(_cli(app, "describe", "--user", "cli-u", "--client", "cli-c", "--json").stdout)
    assert rows == [{"entity": "user=cli-u, client-id=cli-c", "name": "consumer_byte_rate", "value": 6000},
                    {"entity": "user=cli-u, client-id=cli-c", "name": "producer_byte_rate", "value": 5000}]


def test_connections_over_the_address_rate_are_held_then_closed(shared_appliance):
    """KIP-612: connection_creation_rate of 127.0.0.1 at 1 a second: the first connection is
    served, the next ones are held for their throttle time and closed unanswered."""
    with RawClient(shared_appliance.bootstrap) as raw:
        assert alter(raw, 1, [([("ip", "127.0.0.1")], [("connection_creation_rate", 1)])]
                     ).entries[0].error_code == 0
    try:
        conns = [RawClient(shared_appliance.bootstrap) for _ in range(3)]
        try:
            assert conns[0].request(18, 3, {"client_software_name": "t",
                                            "client_software_version": "1"}).error_code == 0
            closed = [c.closed_by_peer(timeout=5) for c in conns[1:]]
            assert closed == [True, True], closed
        finally:
            for c in conns:
                c.close()
    finally:
        # A connection of its own now is held too: wait it out, then lift the quota.
        def lifted():
            try:
                with RawClient(shared_appliance.bootstrap) as raw:
                    r = alter(raw, 1, [([("ip", "127.0.0.1")], [("connection_creation_rate", None)])])
                    return r.entries[0].error_code == 0
            except (ConnectionError, OSError):
                return False
        eventually(lifted, timeout=30, what="the connection quota lifted")


# -- enforcement --------------------------------------------------------------------------------

def _served(bootstrap: str, **kw) -> RawClient:
    """A connection the appliance answers (the connection-rate test's quota, just lifted, may
    still hold a new connection of this address for a moment)."""
    def attempt():
        raw = RawClient(bootstrap, timeout=0.5, **kw)   # a held connection is given up at once
        try:
            raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
            raw.sock.settimeout(10.0)
            return raw
        except (ConnectionError, OSError):
            raw.close()
            return None
    return eventually(attempt, timeout=30, what="a connection served")


def test_controller_mutation_rate_strict_and_permissive(shared_appliance):
    """KIP-599 at 1 partition a second (a bucket of 2 here: 2 windows of 1 s): CreateTopics v6
    takes the 8 partitions it creates (6 below zero: seconds to refill) and refuses, with
    THROTTLING_QUOTA_EXCEEDED, the topic asked after them; while the bucket is below zero,
    CreatePartitions v3 and DeleteTopics v5 are refused too, and an older CreateTopics (v5,
    permissive) creates its topic and is only throttled."""
    THROTTLED = 89
    with _served(shared_appliance.bootstrap) as admin:
        r = alter(admin, 1, [([("client-id", "mut-capped")], [("controller_mutation_rate", 1)])])
        assert [e.error_code for e in r.entries] == [0]
        # The frontend (one here) enforces what it describes: wait for it to hold the quota
        # (regression: CreateTopics reached it before its next look at the table, in CI).
        eventually(lambda: entries(describe(admin, 1, [("client-id", 0, "mut-capped")])).get(
            (("client-id", "mut-capped"),)) == {"controller_mutation_rate": 1.0},
            timeout=10, what="the frontend to hold the mutation quota")

    def create(raw, v, *names):
        return raw.request(19, v, {"topics": [{"name": n, "num_partitions": p, "replication_factor": 1,
                                                "assignments": [], "configs": []} for n, p in names],
                                   "timeout_ms": 30000, "validate_only": False})
    conns = [_served(shared_appliance.bootstrap, client_id="mut-capped") for _ in range(4)]
    try:
        r = create(conns[0], 6, ("mut-a", 8), ("mut-b", 1))
        assert [(t.name, t.error_code) for t in r.topics] == [("mut-a", 0), ("mut-b", THROTTLED)]
        assert r.topics[1].error_message == "The throttling quota has been exceeded."
        assert r.throttle_time.total_seconds() > 0
        r = conns[1].request(37, 3, {"topics": [{"name": "mut-a", "count": 9, "assignments": None}],
                                     "timeout_ms": 30000, "validate_only": False})
        assert r.results[0].error_code == THROTTLED and r.throttle_time.total_seconds() > 0
        r = conns[2].request(20, 5, {"topic_names": ["mut-a"], "timeout_ms": 30000})
        assert r.responses[0].error_code == THROTTLED
        r = create(conns[3], 5, ("mut-b", 1))                  # permissive: created, throttled
        assert r.topics[0].error_code == 0 and r.throttle_time.total_seconds() > 0
    finally:
        for c in conns:
            c.close()
    with _served(shared_appliance.bootstrap) as admin:          # no quota for this client id
        md = admin.request(3, 12, {"topics": [{"name": n, "topic_id": None} for n in ("mut-a", "mut-b")],
                                   "allow_auto_topic_creation": False,
                                   "include_topic_authorized_operations": False})
        assert {t.name: (t.error_code, len(t.partitions)) for t in md.topics} == {
            "mut-a": (0, 8), "mut-b": (0, 1)}
        alter(admin, 1, [([("client-id", "mut-capped")], [("controller_mutation_rate", None)])])


def test_a_throttled_fetch_answers_no_records(shared_appliance):
    """Kafka's handleFetchRequest under consumer_byte_rate: the fetch that takes the client over
    its bound is answered with the throttle time, error NONE, session id 0 and no partitions
    (FetchContext.getThrottledResponse, KIP-219); its bytes are taken back, so after the mute the
    same offset is fetched again and its records come."""
    with _served(shared_appliance.bootstrap) as admin:
        # The filler is not held by the module's earlier default-client producer quota.
        r = alter(admin, 1, [([("client-id", "wire-capped")], [("consumer_byte_rate", 5000)]),
                             ([("client-id", "wire-filler")], [("producer_byte_rate", 10**9)])])
        assert [e.error_code for e in r.entries] == [0, 0]
    with _served(shared_appliance.bootstrap, client_id="wire-filler") as filler:
        create_topic(filler, "quota-empty")
        for _ in range(40):
            plain(filler, "quota-empty", 0, [b"y" * 900])         # ~970-byte batches
    with _served(shared_appliance.bootstrap, client_id="wire-capped") as raw:
        def fetch_at(offset):
            return raw.request(1, 12, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1200,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                "topics": [{"topic": "quota-empty", "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                     "log_start_offset": -1, "partition_max_bytes": 1200}]}],
                "forgotten_topics_data": [], "rack_id": ""})
        offset, throttled = 0, None
        for _ in range(30):
            r = fetch_at(offset)
            if r.throttle_time:
                throttled = r
                break
            (batch,) = parse_batches(r.responses[0].partitions[0].records)
            offset = batch.last_offset + 1
        assert throttled is not None, "never throttled at 5,000 B/s"
        assert (throttled.error_code, throttled.session_id, list(throttled.responses)) == (0, 0, []), throttled
        assert offset >= 4                     # the first fetches went through, within the bound
        got = eventually(lambda: (r := fetch_at(offset)).responses and r, timeout=30,
                         what="the records after the throttle")
        assert parse_batches(got.responses[0].partitions[0].records)[0].base_offset == offset



BOUND = 400_000            # bytes per second, for the producer's client id and for the consumer's
RECORD = b"x" * 1000
# Kafka's window (11 samples of 1 s) lets a new client burst ten seconds' worth before the first
# throttle, which a short run cannot average out: the test's appliance measures over 2 x 1 s.
QUOTA_WINDOW = {"window_num": 2, "window_size_seconds": 1}


def _scrape(port):
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    r.raise_for_status()
    return {(s.name, s.labels.get("client_id", "")): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples
            if s.name.startswith(("kafka_server_produce_", "kafka_server_fetch_"))}


def _rate(events, start, end):
    return sum(n for t, n in events if start <= t < end) / (end - start)


def _steady_rate(events, span):
    """The rate over ``span`` seconds from the first window after the client's first request:
    with 2 samples of 1 s, the first sample's burst comes back every 2 s as its sample expires
    (Kafka's Rate), so whole 2 s periods from the first request are measured."""
    assert events, "nothing went through"
    a = events[0][0] + 1.9
    return _rate(events, a, a + span), a + span


def held_to_their_byte_rates(appliance_factory, span: float):
    port = free_port()
    app = appliance_factory(server={"frontends": 2}, quotas=QUOTA_WINDOW,
                            metrics={"listen": f"127.0.0.1:{port}"},
                            topics={"default_partitions": 1})
    # The neighbour (no quota) fills the consumer's topic first.
    # Batches of 16 KiB, so that each fetch of 64 KiB stays one of many in a window.
    fill = Producer({"bootstrap.servers": app.bootstrap, "client.id": "neighbour", "linger.ms": 5,
                     "batch.size": 16384, "enable.idempotence": False})
    need = int(BOUND * (span + 8) / len(RECORD))
    for _ in range(need):
        while True:
            try:
                fill.produce("quota-in", RECORD)
                break
            except BufferError:
                fill.poll(0.05)
    assert fill.flush(60) == 0
    with RawClient(app.bootstrap) as raw:
        r = alter(raw, 1, [([("client-id", "capped")], [("producer_byte_rate", BOUND)]),
                           ([("client-id", "capped-consumer")], [("consumer_byte_rate", BOUND)])])
        assert [e.error_code for e in r.entries] == [0, 0]
    start = time.monotonic()
    deadline = [start + span + 60]      # set below, from the clients' first records
    produced: dict[str, list] = {"capped": [], "neighbour": []}
    consumed: list = []
    throttles: list = []

    def produce(client_id, events, p=None):
        p = p or Producer({"bootstrap.servers": app.bootstrap, "client.id": client_id, "linger.ms": 5,
                           "batch.size": 16384, "enable.idempotence": False,
                           "queue.buffering.max.kbytes": 1024})

        def delivered(err, msg):
            if err is None:
                events.append((time.monotonic(), len(msg.value())))
        while time.monotonic() < deadline[0]:
            try:
                p.produce("quota-out", RECORD, callback=delivered)
            except BufferError:
                p.poll(0.01)
            p.poll(0)
        p.purge()                  # what the quota held back is not waited for
        p.flush(10)

    def consume():
        c = Consumer({"bootstrap.servers": app.bootstrap, "client.id": "capped-consumer",
                      "group.id": "quota", "auto.offset.reset": "earliest",
                      "fetch.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
                      "message.max.bytes": 65536,
                      "statistics.interval.ms": 1000,
                      "stats_cb": lambda s: throttles.append(json.loads(s))})
        c.assign([TopicPartition("quota-in", 0, 0)])       # no group join to wait for
        try:
            while time.monotonic() < deadline[0]:
                m = c.poll(0.1)
                if m is not None and not m.error():
                    consumed.append((time.monotonic(), len(m.value())))
        finally:
            c.close()

    # Two producers of one client id (one client to Kafka) on a broker with two frontends.
    threads = [threading.Thread(target=produce, args=("capped", produced["capped"])),
               threading.Thread(target=produce, args=("capped", produced["capped"])),
               threading.Thread(target=produce, args=("neighbour", produced["neighbour"], fill)),
               threading.Thread(target=consume)]
    for t in threads:
        t.start()
    eventually(lambda: produced["capped"] and consumed, timeout=30, what="the first records")
    deadline[0] = max(produced["capped"][0][0], consumed[0][0]) + 1.9 + span + 0.5
    # While the traffic runs: the per-entity metrics of the window (throttle times given).
    metrics = eventually(
        lambda: (m := _scrape(port)) and m.get(("kafka_server_produce_throttle_time", "capped"), 0) > 0
        and m.get(("kafka_server_fetch_throttle_time", "capped-consumer"), 0) > 0 and m,
        timeout=span, what="the quota metrics with throttle times")
    for t in threads:
        t.join(span + 60)
    del fill, threads
    (capped, b1), (consumer, b2) = _steady_rate(produced["capped"], span), _steady_rate(consumed, span)
    assert max(b1, b2) <= deadline[0], (b1, b2, deadline)
    neighbour = _rate(produced["neighbour"], deadline[0] - span, deadline[0])
    what = f"capped {capped:.0f} B/s, consumer {consumer:.0f} B/s, neighbour {neighbour:.0f} B/s"
    # The 10 % over 20 s (--soak). The 8 s run of make test on a loaded two-core machine
    # (two frontends publishing their samples every 20 ms, scheduled late) was seen at 1.16x:
    # it is held to 25 %, which a quota not enforced (the neighbour's 28 MB/s) still fails.
    slack = 0.1 if span >= 20 else 0.25
    assert (1 - slack) * BOUND <= capped <= (1 + slack) * BOUND, what
    assert (1 - slack) * BOUND <= consumer <= (1 + slack) * BOUND, what
    assert neighbour > 2 * BOUND, what
    # librdkafka saw the throttle time in the fetch responses (its broker "throttle" window).
    assert any(br.get("throttle", {}).get("max", 0) > 0 for s in throttles
               for br in s.get("brokers", {}).values()), what
    assert metrics[("kafka_server_produce_byte_rate", "capped")] > 0, metrics
    assert metrics[("kafka_server_fetch_byte_rate", "capped-consumer")] > 0, metrics
    assert ("kafka_server_produce_byte_rate", "neighbour") not in metrics, metrics
    return what


@pytest.mark.soak
def test_producer_and_consumer_held_to_their_byte_rates(appliance_factory, request):
    """8 s measured, 20 s with --soak (the issue's length)."""
    soak = request.config.getoption("--soak")
    print(held_to_their_byte_rates(appliance_factory, span=20 if soak else 8))
