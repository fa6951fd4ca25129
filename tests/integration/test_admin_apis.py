"""The admin APIs Kafka's tools need, through the admin clients of confluent-kafka and
kafka-python (and at the wire where a client has no call for it):

- CreatePartitions: a topic grows (new partitions numbered after the old, each with its writer,
  served to producers, consumers and transactions at once); shrinking or keeping the count is
  INVALID_PARTITIONS; validate_only changes nothing; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION.
- IncrementalAlterConfigs and AlterConfigs of topics: DescribeConfigs shows the new value as
  DYNAMIC_TOPIC_CONFIG, an unknown name or a bad value is INVALID_CONFIG, validate_only changes
  nothing; applied live (max.message.bytes refuses a batch at once; a smaller retention.ms deletes
  old segments without waiting for the next retention check).
- Dynamic broker configs: this node's (DYNAMIC_BROKER_CONFIG) and the cluster-wide default
  (DYNAMIC_DEFAULT_BROKER_CONFIG), which topics without an override follow; a config that cannot
  change live is INVALID_REQUEST.
- DeleteRecords: the low watermark moves; ListOffsets EARLIEST answers it; a fetch below it is
  OFFSET_OUT_OF_RANGE; past the high watermark is OFFSET_OUT_OF_RANGE.
- DescribeLogDirs, OffsetForLeaderEpoch, ElectLeaders, AlterPartitionReassignments and
  ListPartitionReassignments with Kafka's answers for a single node.
- Everything changed above survives a restart (catalog, log-start-offset checkpoint).
"""

from __future__ import annotations

import re
import time
import warnings

import pytest

from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import CLIENTS, case_topic, driver
from client_records import Rec
from raw_wire import RawClient, raw_topic_error

APPLIANCE_CONFIG = {"server": {"frontends": 1}}
PY_CLIENTS = [c for c in CLIENTS if c in ("confluent", "kafka-python")]
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG = 1, 2, 3
DEFAULT_CONFIG = 5
INVALID_PARTITIONS, INVALID_CONFIG, INVALID_REQUEST = 37, 40, 42
UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE, MESSAGE_TOO_LARGE = 3, 1, 10
ELECTION_NOT_NEEDED, NO_REASSIGNMENT_IN_PROGRESS, INVALID_REPLICA_ASSIGNMENT = 84, 85, 39
INVALID_REPLICATION_FACTOR = 38
TOPIC, BROKER = 2, 4


# -- the two admin clients, the calls each has -------------------------------------------------------

class ConfluentAdmin:
    def __init__(self, bootstrap):
        from confluent_kafka import admin, KafkaException, TopicPartition
        self.m, self.KafkaException, self.TP = admin, KafkaException, TopicPartition
        self.a = admin.AdminClient({"bootstrap.servers": bootstrap})

    def _one(self, fs):
        (f,) = fs.values()
        try:
            return 0, f.result(timeout=60)
        except self.KafkaException as e:
            return e.args[0].code(), e.args[0].str()

    def create_partitions(self, topic, count, validate_only=False):
        return self._one(self.a.create_partitions([self.m.NewPartitions(topic, count)],
                                                  validate_only=validate_only, request_timeout=60))[0]

    def set_configs(self, rtype, name, configs, validate_only=False, incremental=True):
        R = self.m.ConfigResource
        rt = self.m.ResourceType.TOPIC if rtype == TOPIC else self.m.ResourceType.BROKER
        if incremental:
            entries = [self.m.ConfigEntry(k, v, incremental_operation=(
                self.m.AlterConfigOpType.DELETE if v is None else self.m.AlterConfigOpType.SET))
                for k, v in configs.items()]
            fs = self.a.incremental_alter_configs([R(rt, name, incremental_configs=entries)],
                                                  validate_only=validate_only, request_timeout=60)
        else:
            with warnings.catch_warnings():
                # deprecated by the client in favour of the incremental form, still what it sends
                warnings.simplefilter("ignore", DeprecationWarning)
                fs = self.a.alter_configs([R(rt, name, set_config=configs)], validate_only=validate_only,
                                          request_timeout=60)
        return self._one(fs)[0]

    def describe(self, rtype, name):
        rt = self.m.ResourceType.TOPIC if rtype == TOPIC else self.m.ResourceType.BROKER
        res = self.m.ConfigResource(rt, name)
        entries = self.a.describe_configs([res], request_timeout=60)[res].result(timeout=60)
        return {n: (e.value, int(e.source)) for n, e in entries.items()}

    def delete_records(self, topic, partition, offset):
        code, r = self._one(self.a.delete_records([self.TP(topic, partition, offset)], request_timeout=60))
        return (code, r.low_watermark if code == 0 else None)

    def elect(self, topic, partition):
        from confluent_kafka import ElectionType
        f = self.a.elect_leaders(ElectionType.PREFERRED, [self.TP(topic, partition)])
        result = f.result(timeout=60)
        err = result[self.TP(topic, partition)]
        return 0 if err is None else err.code()


class KafkaPythonAdmin:
    def __init__(self, bootstrap):
        import kafka.admin
        import kafka.errors
        from kafka import TopicPartition
        self.m, self.errors, self.TP = kafka.admin, kafka.errors, TopicPartition
        self.a = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=60000)

    def close(self):
        self.a.close()

    def create_partitions(self, topic, count, validate_only=False):
        r = self.a.create_partitions({topic: self.m.NewPartitions(count)}, validate_only=validate_only,
                                     raise_errors=False)
        return r.results[0].error_code

    def set_configs(self, rtype, name, configs, validate_only=False, incremental=True):
        op = self.m.AlterConfigOp
        rt = self.m.ConfigResourceType.TOPIC if rtype == TOPIC else self.m.ConfigResourceType.BROKER
        cfg = {k: (op.DELETE, None) if v is None else (op.SET, v) for k, v in configs.items()}
        r = self.a.alter_configs([self.m.ConfigResource(rt, name, cfg)], validate_only=validate_only,
                                 raise_on_unknown=False, incremental=incremental)
        (got,) = [v for per_type in r.values() for v in per_type.values()]
        if got == "OK":
            return 0
        if isinstance(got, str):                # "[Error 40] InvalidConfigurationError: ..."
            m = re.match(r"\[Error (-?\d+)\]", got)
            return int(m.group(1)) if m else got
        return 0 if got is None or got is self.errors.NoError or getattr(got, "errno", 0) == 0 else got.errno

    def describe(self, rtype, name):
        CS = self.m.ConfigSourceType
        rt = self.m.ConfigResourceType.TOPIC if rtype == TOPIC else self.m.ConfigResourceType.BROKER
        r = self.a.describe_configs([self.m.ConfigResource(rt, name)], config_filter="all")
        (per_name,) = r.values()
        return {n: (c["value"], int(CS[c["config_source"]])) for n, c in per_name[name].items()}

    def delete_records(self, topic, partition, offset):
        try:
            r = self.a.delete_records({self.TP(topic, partition): offset})
        except self.errors.KafkaError as e:
            return e.errno, None
        return 0, r[self.TP(topic, partition)]["low_watermark"]

    def elect(self, topic, partition):
        r = self.a.elect_leaders(0, {topic: [partition]}, raise_errors=False)
        return r.replica_election_results[0].partition_result[0].error_code


def admin_for(client, bootstrap):
    return ConfluentAdmin(bootstrap) if client == "confluent" else KafkaPythonAdmin(bootstrap)


def _close(a):
    if hasattr(a, "close"):
        a.close()


def recs(partition, n, size=20, ts=None, start=0):
    ts = ts if ts is not None else int(time.time() * 1000)
    return [Rec(partition, b"k%d" % (start + i), b"v" * size, (), ts + i) for i in range(n)]


def small_batches(client):
    """Producer settings for batches of about 1 KB (several segments of 4 KiB)."""
    return {"batch.size": 1000} if client == "confluent" else {"batch_size": 1000}


def watermarks(bootstrap, topic, partition):
    """(log start, high watermark) as ListOffsets answers them (a confluent consumer)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
    finally:
        c.close()


def raw_fetch_error(bootstrap, topic, partition, offset):
    with RawClient(bootstrap) as raw:
        r = raw.request(1, 12, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                                "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                "topics": [{"topic": topic, "partitions": [
                                    {"partition": partition, "fetch_offset": offset,
                                     "partition_max_bytes": 1 << 20, "current_leader_epoch": -1,
                                     "log_start_offset": -1, "last_fetched_epoch": -1}]}],
                                "forgotten_topics_data": [], "rack_id": ""})
    p = r.responses[0].partitions[0]
    return p.error_code, p.log_start_offset


# -- CreatePartitions -------------------------------------------------------------------------------

@pytest.mark.parametrize("client", PY_CLIENTS)
def test_create_partitions_grows_a_topic_that_every_path_serves(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("grow", client)
    d.create_topics(b, {topic: (2, {})})
    a = admin_for(client, b)
    try:
        assert a.create_partitions(topic, 4, validate_only=True) == 0
        assert d.topic_partitions(b)[topic] == 2
        assert a.create_partitions(topic, 4) == 0
        assert d.topic_partitions(b)[topic] == 4
        assert a.create_partitions(topic, 3) == INVALID_PARTITIONS       # not an increase
        assert a.create_partitions(topic, 4) == INVALID_PARTITIONS       # already has 4
        assert a.create_partitions(case_topic("nope", client), 4) == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        _close(a)
    # the new partitions take records and serve them
    reports = d.produce(b, topic, recs(2, 3) + recs(3, 2), "none")
    assert sorted((p, o) for p, o, _ in reports) == [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1)]
    got = d.consume(b, topic, {2: 0, 3: 0}, 5)
    assert sorted((g.partition, g.offset) for g in got) == [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1)]


def test_a_transaction_spans_an_old_and_a_new_partition(shared_appliance):
    """The coordinator links a grown topic's new writers (markers reach them)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    b = shared_appliance.bootstrap
    topic = case_topic("grow-txn")
    driver("confluent").create_topics(b, {topic: (1, {})})
    a = ConfluentAdmin(b)
    assert a.create_partitions(topic, 3) == 0
    p = Producer({"bootstrap.servers": b, "transactional.id": f"{topic}-tx"})
    p.init_transactions(30)
    p.begin_transaction()
    for part in (0, 2):
        p.produce(topic, value=b"in a transaction", partition=part)
    p.commit_transaction(30)
    del p
    c = Consumer({"bootstrap.servers": b, "group.id": "rc", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, part, 0) for part in (0, 2)])
        seen = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                seen.add(m.partition())
        assert seen == {0, 2}
        # the markers are there: the LSO passed them on both partitions
        for part in (0, 2):
            assert c.get_watermark_offsets(TopicPartition(topic, part), timeout=30, cached=False)[1] == 2
    finally:
        c.close()


# -- topic configs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "legacy"])
@pytest.mark.parametrize("client", PY_CLIENTS)
def test_alter_topic_configs(shared_appliance, client, incremental):
    b = shared_appliance.bootstrap
    topic = case_topic("cfg", client, "inc" if incremental else "legacy")
    driver(client).create_topics(b, {topic: (1, {"segment.bytes": "1048576"})})
    a = admin_for(client, b)
    try:
        assert a.set_configs(TOPIC, topic, {"retention.ms": "3600000"}, validate_only=True,
                             incremental=incremental) == 0
        assert a.describe(TOPIC, topic)["retention.ms"] == ("604800000", DEFAULT_CONFIG)
        assert a.set_configs(TOPIC, topic, {"retention.ms": "3600000"}, incremental=incremental) == 0
        cfg = a.describe(TOPIC, topic)
        assert cfg["retention.ms"] == ("3600000", DYNAMIC_TOPIC_CONFIG)
        # incremental keeps the other override; legacy AlterConfigs replaces the whole set
        # (kafka-python's legacy path sends the other modified keys along, to keep them)
        replaced = not incremental and client == "confluent"
        assert cfg["segment.bytes"] == (("1073741824", DEFAULT_CONFIG) if replaced
                                        else ("1048576", DYNAMIC_TOPIC_CONFIG))
        assert a.set_configs(TOPIC, topic, {"no.such.config": "1"}, incremental=incremental) == INVALID_CONFIG
        assert a.set_configs(TOPIC, topic, {"retention.ms": "soon"}, incremental=incremental) == INVALID_CONFIG
        assert a.describe(TOPIC, topic)["retention.ms"] == ("3600000", DYNAMIC_TOPIC_CONFIG)
        if incremental:
            assert a.set_configs(TOPIC, topic, {"retention.ms": None}) == 0       # DELETE
            assert a.describe(TOPIC, topic)["retention.ms"] == ("604800000", DEFAULT_CONFIG)
    finally:
        _close(a)


def test_max_message_bytes_applies_at_once(shared_appliance):
    from confluent_kafka import Producer
    b = shared_appliance.bootstrap
    topic = case_topic("maxmsg")
    driver("confluent").create_topics(b, {topic: (1, {})})
    a = ConfluentAdmin(b)
    assert a.set_configs(TOPIC, topic, {"max.message.bytes": "2000"}) == 0
    results = []
    p = Producer({"bootstrap.servers": b, "linger.ms": 0, "retries": 0})
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, m: results.append(err))
    p.flush(30)
    p.produce(topic, value=b"x" * 100, on_delivery=lambda err, m: results.append(err))
    p.flush(30)
    assert results[0] is not None and results[0].code() == MESSAGE_TOO_LARGE and results[1] is None
    assert a.set_configs(TOPIC, topic, {"max.message.bytes": None}) == 0
    p.produce(topic, value=b"x" * 5000, on_delivery=lambda err, m: results.append(err))
    p.flush(30)
    assert results[2] is None
    del p


def test_a_smaller_retention_ms_deletes_old_segments_without_waiting_for_a_check(shared_appliance):
    """The retention check interval is 5 minutes here (the default): only the live change can
    delete the segments while the test waits."""
    b = shared_appliance.bootstrap
    d = driver("confluent")
    topic = case_topic("retention")
    d.create_topics(b, {topic: (1, {"segment.bytes": "4096"})})
    two_hours_ago = int(time.time() * 1000) - 2 * 3600 * 1000
    d.produce(b, topic, recs(0, 60, size=200, ts=two_hours_ago), "none", **small_batches("confluent"))
    d.produce(b, topic, recs(0, 2, start=60), "none")          # recent: its segment stays
    assert watermarks(b, topic, 0) == (0, 62)
    a = ConfluentAdmin(b)
    assert a.set_configs(TOPIC, topic, {"retention.ms": "3600000"}) == 0
    low = shared_appliance.wait_for(lambda: watermarks(b, topic, 0)[0] or None, 30,
                                    "retention to delete the old segments")
    assert 0 < low <= 60
    got = d.consume(b, topic, {0: low}, 62 - low)
    assert [g.offset for g in got][-2:] == [60, 61]


# -- dynamic broker configs ---------------------------------------------------------------------------

@pytest.mark.parametrize("client", PY_CLIENTS)
def test_dynamic_broker_configs(appliance_factory, client):
    app = appliance_factory()
    b = app.bootstrap
    topic = "follows-broker"
    driver(client).create_topics(b, {topic: (1, {}), "own": (1, {"retention.ms": "5000"})})
    a = admin_for(client, b)
    try:
        assert a.set_configs(BROKER, "1", {"log.retention.ms": "7200000"}) == 0
        assert a.describe(BROKER, "1")["log.retention.ms"] == ("7200000", DYNAMIC_BROKER_CONFIG)
        assert a.describe(TOPIC, topic)["retention.ms"] == ("7200000", DYNAMIC_BROKER_CONFIG)
        assert a.describe(TOPIC, "own")["retention.ms"] == ("5000", DYNAMIC_TOPIC_CONFIG)
        # static configs cannot change live: the whole resource is refused
        assert a.set_configs(BROKER, "1", {"log.dirs": "/elsewhere"}) == INVALID_REQUEST
        assert a.set_configs(BROKER, "1", {"log.retention.ms": "soon"}) == INVALID_REQUEST
        assert a.describe(BROKER, "1")["log.retention.ms"] == ("7200000", DYNAMIC_BROKER_CONFIG)
        assert a.set_configs(BROKER, "1", {"log.retention.ms": None}) == 0
        assert a.describe(TOPIC, topic)["retention.ms"] == ("604800000", DEFAULT_CONFIG)
    finally:
        _close(a)
    # the cluster-wide default resource (empty name: neither Python client can name it)
    with RawClient(b) as raw:
        r = raw.request(44, 1, {"validate_only": False, "resources": [{
            "resource_type": BROKER, "resource_name": "",
            "configs": [{"name": "log.segment.bytes", "config_operation": 0, "value": "2097152"}]}]})
        assert r.responses[0].error_code == 0, r
        r = raw.request(32, 4, {"resources": [{"resource_type": BROKER, "resource_name": "",
                                               "configuration_keys": None}],
                                "include_synonyms": False, "include_documentation": False})
        assert [(c.name, c.value, c.config_source) for c in r.results[0].configs] == [
            ("log.segment.bytes", "2097152", DYNAMIC_DEFAULT_BROKER_CONFIG)]
    a = admin_for(client, b)
    try:
        assert a.describe(TOPIC, topic)["segment.bytes"] == ("2097152", DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert a.describe(BROKER, "1")["log.segment.bytes"] == ("2097152", DYNAMIC_DEFAULT_BROKER_CONFIG)
    finally:
        _close(a)


# -- DeleteRecords ----------------------------------------------------------------------------------

@pytest.mark.parametrize("client", PY_CLIENTS)
def test_delete_records(shared_appliance, client):
    b = shared_appliance.bootstrap
    d = driver(client)
    topic = case_topic("delrec", client)
    d.create_topics(b, {topic: (1, {"segment.bytes": "4096"})})
    d.produce(b, topic, recs(0, 40, size=100), "none", **small_batches(client))
    a = admin_for(client, b)
    try:
        assert a.delete_records(topic, 0, 25) == (0, 25)
        assert watermarks(b, topic, 0) == (25, 40)
        assert raw_fetch_error(b, topic, 0, 10) == (OFFSET_OUT_OF_RANGE, 25)
        got = d.consume(b, topic, {0: 25}, 15)
        assert [g.offset for g in got] == list(range(25, 40))
        assert a.delete_records(topic, 0, 10) == (0, 25)            # never backwards
        assert a.delete_records(topic, 0, 41)[0] == OFFSET_OUT_OF_RANGE
        assert a.delete_records(topic, 0, -1) == (0, 40)            # -1: the high watermark
        assert watermarks(b, topic, 0) == (40, 40)
    finally:
        _close(a)
    d.produce(b, topic, recs(0, 1, start=40), "none")
    assert [g.offset for g in d.consume(b, topic, {0: 40}, 1)] == [40]


def test_delete_records_timeout_0_answers_each_partitions_real_result(shared_appliance):
    """librdkafka's test 0081 sends DeleteRecords with an operation timeout of 0. Kafka applies
    the delete on the leader whatever the timeout, which only bounds the wait for followers: a
    single replica answers each partition's real result. Regression: every partition whose
    records were deleted was answered REQUEST_TIMED_OUT (a wait of 1 ms for its writer)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    b = shared_appliance.bootstrap
    d = driver("confluent")
    topic = case_topic("delrec-t0")
    parts = 16
    d.create_topics(b, {topic: (parts, {"segment.bytes": "4096"})})
    d.produce(b, topic, [r for p in range(parts) for r in recs(p, 30, size=100)], "none",
              **small_batches("confluent"))
    a = AdminClient({"bootstrap.servers": b})
    fs = a.delete_records([TopicPartition(topic, p, 10 + p) for p in range(parts)],
                          request_timeout=60, operation_timeout=0)
    lows = {tp.partition: f.result(timeout=60).low_watermark for tp, f in fs.items()}
    assert lows == {p: 10 + p for p in range(parts)}
    assert [watermarks(b, topic, p)[0] for p in range(parts)] == [10 + p for p in range(parts)]


# -- DescribeLogDirs, OffsetForLeaderEpoch, ElectLeaders, reassignments ------------------------------

def test_describe_log_dirs_kafka_python(shared_appliance):
    b = shared_appliance.bootstrap
    topic = case_topic("logdirs")
    d = driver("kafka-python")
    d.create_topics(b, {topic: (2, {})})
    d.produce(b, topic, recs(0, 10, size=500), "none")
    a = KafkaPythonAdmin(b)
    try:
        (broker,) = a.a.describe_log_dirs({topic: [0, 1]})
    finally:
        a.close()
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0 and log_dir["log_dir"] == shared_appliance.data_dir
    (t,) = log_dir["topics"]
    sizes = {p["partition_index"]: p["partition_size"] for p in t["partitions"]}
    assert sizes[1] == 0 and 5000 < sizes[0] < 8000, sizes
    assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0


def test_offset_for_leader_epoch_answers_for_the_one_epoch(shared_appliance):
    b = shared_appliance.bootstrap
    topic = case_topic("ofle")
    d = driver("confluent")
    d.create_topics(b, {topic: (1, {})})
    d.produce(b, topic, recs(0, 7), "none")

    def ask(v, current, epoch, name=topic, partition=0):
        with RawClient(b) as raw:
            r = raw.request(23, v, {"replica_id": -1, "topics": [{"topic": name, "partitions": [
                {"partition": partition, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
        p = r.topics[0].partitions[0]
        return p.error_code, p.leader_epoch, p.end_offset

    for v in (2, 3, 4):
        assert ask(v, 0, 0) == (0, 0, 7)
        assert ask(v, -1, 0) == (0, 0, 7)
        assert ask(v, 0, 3) == (0, -1, -1)              # an epoch never seen: undefined
        assert ask(v, 1, 0)[0] == 75                    # UNKNOWN_LEADER_EPOCH
        assert ask(v, 0, 0, partition=5)[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert ask(v, 0, 0, name="no-such-topic")[0] == UNKNOWN_TOPIC_OR_PARTITION


def test_committed_offsets_carry_the_leader_epoch_and_resume_after_a_restart(appliance_factory):
    """A consumer commits the epoch of the batch it read (0, stamped by the writer); after a
    restart a new member of the group validates that position (KIP-320) and resumes there."""
    from confluent_kafka import Consumer
    app = appliance_factory()
    b = app.bootstrap
    d = driver("confluent")
    d.create_topics(b, {"epochs": (1, {})})
    d.produce(b, "epochs", recs(0, 10), "none")

    def consume(n):
        c = Consumer({"bootstrap.servers": b, "group.id": "epoch-group", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe(["epochs"])
        got = []
        deadline = time.monotonic() + 60
        try:
            while len(got) < n and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    got.append(m.offset())
            if n == 4:
                c.commit(asynchronous=False)
            return got
        finally:
            c.close()

    assert consume(4) == [0, 1, 2, 3]
    with RawClient(b) as raw:
        r = raw.request(9, 7, {"group_id": "epoch-group", "require_stable": False,
                               "topics": [{"name": "epochs", "partition_indexes": [0]}]})
    p = r.topics[0].partitions[0]
    assert (p.committed_offset, p.committed_leader_epoch) == (4, 0)
    app.terminate()
    app.restart()
    assert consume(6) == [4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("client", PY_CLIENTS)
def test_elect_leaders_is_never_needed(shared_appliance, client):
    b = shared_appliance.bootstrap
    topic = case_topic("elect", client)
    driver(client).create_topics(b, {topic: (2, {})})
    a = admin_for(client, b)
    try:
        assert a.elect(topic, 1) == ELECTION_NOT_NEEDED
    finally:
        _close(a)


def test_reassignments_on_one_node_kafka_python(shared_appliance):
    b = shared_appliance.bootstrap
    topic = case_topic("reassign")
    driver("kafka-python").create_topics(b, {topic: (2, {})})
    with RawClient(b) as raw:
        def alter(replicas, partition=0):
            r = raw.request(45, 0, {"timeout_ms": 10000, "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "replicas": replicas}]}]})
            return r.responses[0].partitions[0].error_code
        assert alter([1]) == 0                                 # already there: done
        assert alter([2]) == INVALID_REPLICA_ASSIGNMENT        # no such broker
        assert alter([1, 1]) == INVALID_REPLICA_ASSIGNMENT
        assert alter(None) == NO_REASSIGNMENT_IN_PROGRESS
        assert alter([1], partition=7) == UNKNOWN_TOPIC_OR_PARTITION
        # v1 (KIP-860): a replication-factor change may be refused; the answer echoes the flag
        for allow, replicas, want in ((False, [1, 2], INVALID_REPLICATION_FACTOR),
                                      (False, [1], 0), (True, [1, 2], INVALID_REPLICA_ASSIGNMENT)):
            r = raw.request(45, 1, {"timeout_ms": 10000, "allow_replication_factor_change": allow,
                                    "topics": [{"name": topic, "partitions": [
                                        {"partition_index": 0, "replicas": replicas}]}]})
            assert r.responses[0].partitions[0].error_code == want, (allow, replicas, r)
            assert r.allow_replication_factor_change == allow, r
    a = KafkaPythonAdmin(b)
    try:
        assert a.a.list_partition_reassignments() == {}
    finally:
        a.close()


# -- restart --------------------------------------------------------------------------------------------

def test_admin_changes_survive_a_restart(appliance_factory):
    app = appliance_factory()
    b = app.bootstrap
    d = driver("confluent")
    d.create_topics(b, {"kept": (1, {"segment.bytes": "4096"})})
    d.produce(b, "kept", recs(0, 30, size=100), "none", **small_batches("confluent"))
    a = ConfluentAdmin(b)
    assert a.create_partitions("kept", 3) == 0
    assert a.set_configs(TOPIC, "kept", {"retention.bytes": "1000000"}) == 0
    assert a.set_configs(BROKER, "1", {"log.roll.ms": "86400000"}) == 0
    assert a.delete_records("kept", 0, 17) == (0, 17)
    del a
    app.terminate()
    app.restart()
    assert d.topic_partitions(b)["kept"] == 3
    a = ConfluentAdmin(b)
    cfg = a.describe(TOPIC, "kept")
    assert cfg["retention.bytes"] == ("1000000", DYNAMIC_TOPIC_CONFIG)
    assert cfg["segment.ms"] == ("86400000", DYNAMIC_BROKER_CONFIG)
    assert watermarks(b, "kept", 0) == (17, 30)
    assert raw_fetch_error(b, "kept", 0, 5) == (OFFSET_OUT_OF_RANGE, 17)
    assert raw_topic_error(b, "kept") == 0
    d.produce(b, "kept", recs(2, 1), "none")
    assert [g.offset for g in d.consume(b, "kept", {2: 0}, 1)] == [0]
