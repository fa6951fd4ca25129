"""The Kafka tools of the CLI against the running appliance: ``topics``, ``groups``, ``configs``,
``get-offsets``, ``dump-log``, ``produce`` and ``consume``. Each is checked for its table output,
its ``--json`` output, and for an error that names the cause with a non-zero exit.

Most calls run the command in this process (``cli_runner.in_process``: the command's own
code, output and exit code, without the Python start and imports per call that made up most of
this module's time); at least one call per tool runs the installed ``appliance`` entry point as
an operator does (``cli_runner.installed``: a subprocess).
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from appliance.client import Producer
from appliance_harness import write_config
from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from cli_runner import Ran, in_process, installed

# Small segments and dense indexes, so that dump-log has segments and index entries to show.
APPLIANCE_CONFIG = {"server": {"frontends": 1}, "log": {"index_interval_bytes": 64}}


def tool(app, *args, ok=True, stdin=None, run=in_process) -> Ran:
    """``appliance TOOL SUBCOMMAND ... --bootstrap-server`` (the option on the command, as Kafka's
    tools take it); ``run=installed`` for the installed command."""
    return run(*args, "--bootstrap-server", app.bootstrap, ok=ok, stdin=stdin)


def fields(line: str) -> dict[str, str]:
    """dump-log's "name: value name: value ..." line as a dict."""
    words = line.split()
    return {words[i].rstrip(":"): words[i + 1] for i in range(0, len(words) - 1, 2)}


def rows(out: str) -> list[list[str]]:
    """A table's lines split into cells (header first)."""
    return [line.split() for line in out.splitlines() if line.strip()]


# -- topics ---------------------------------------------------------------------------------------

def test_topics_create_list_describe_alter_delete(shared_appliance, tmp_path):
    app = shared_appliance
    r = tool(app, "topics", "create", "--topic", "cli-t", "--partitions", "2", "--config", "retention.ms=3600000")
    assert r.stdout.strip() == "Created topic cli-t."
    again = tool(app, "topics", "create", "--topic", "cli-t", ok=False)
    assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr and "cli-t" in again.stderr
    assert tool(app, "topics", "create", "--topic", "cli-t", "--if-not-exists").returncode == 0
    rf = tool(app, "topics", "create", "--topic", "cli-rf", "--replication-factor", "3", ok=False)
    assert rf.returncode == 1 and "INVALID_REPLICATION_FACTOR" in rf.stderr and "1 broker" in rf.stderr
    bad = tool(app, "topics", "create", "--topic", "cli-bad", "--config", "no.such=1", ok=False)
    assert bad.returncode == 1 and "INVALID_CONFIG: Unknown topic config name: no.such" in bad.stderr

    assert "cli-t" in tool(app, "topics", "list").stdout.split()
    assert "cli-t" in json.loads(tool(app, "topics", "list", "--json").stdout)
    # the group's --config FILE gives the default bootstrap server (server.listen)
    cfg = tmp_path / "appliance.toml"
    write_config(str(cfg), {"server": {"listen": app.bootstrap}})
    assert "cli-t" in installed("topics", "--config", str(cfg), "list").stdout.split()

    out = rows(tool(app, "topics", "describe", "--topic", "cli-t").stdout)
    assert out[0] == ["TOPIC", "TOPIC-ID", "PARTITIONS", "REPLICATION-FACTOR", "CONFIGS"]
    assert out[1][0] == "cli-t" and out[1][2:] == ["2", "1", "retention.ms=3600000"]
    assert out[2] == ["TOPIC", "PARTITION", "LEADER", "REPLICAS", "ISR"]
    assert out[3:] == [["cli-t", "0", "1", "1", "1"], ["cli-t", "1", "1", "1", "1"]]
    (t,) = json.loads(tool(app, "topics", "describe", "--topic", "cli-t", "--json").stdout)
    assert t["name"] == "cli-t" and t["configs"] == {"retention.ms": "3600000"}
    assert [p["leader"] for p in t["partitions"]] == [1, 1] and t["replication_factor"] == 1
    under = tool(app, "topics", "describe", "--under-replicated")
    assert under.stdout == "" and "single node" in under.stderr
    assert tool(app, "topics", "describe", "--under-replicated-partitions", "--topic", "cli-t").stdout == ""

    r = tool(app, "topics", "alter", "--topic", "cli-t", "--partitions", "4", "--config", "segment.ms=100000",
             "--delete-config", "retention.ms")
    assert r.stdout.strip() == "Altered topic cli-t: partitions=4, configs."
    (t,) = json.loads(tool(app, "topics", "describe", "--topic", "cli-t", "--json").stdout)
    assert len(t["partitions"]) == 4 and t["configs"] == {"segment.ms": "100000"}
    shrink = tool(app, "topics", "alter", "--topic", "cli-t", "--partitions", "3", ok=False)
    assert shrink.returncode == 1 and "INVALID_PARTITIONS" in shrink.stderr and "would not be an increase" in shrink.stderr

    assert tool(app, "topics", "delete", "--topic", "cli-t").stdout.strip() == "Deleted topic cli-t."
    gone = tool(app, "topics", "delete", "--topic", "cli-t", ok=False)
    assert gone.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in gone.stderr
    assert tool(app, "topics", "delete", "--topic", "cli-t", "--if-exists").returncode == 0
    missing = tool(app, "topics", "describe", "--topic", "cli-t", ok=False)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def test_an_unreachable_bootstrap_server_is_named(shared_appliance):
    r = installed("topics", "list", "--bootstrap-server", "127.0.0.1:1", ok=False)
    assert r.returncode == 1 and "cannot reach 127.0.0.1:1" in r.stderr
    # spark recover ends a Kafka error as every tool does (it had its own "error: ..." line)
    r = installed("spark", "recover", "--bootstrap-server", "127.0.0.1:1", ok=False)
    assert r.returncode == 1 and r.stderr.startswith("Error: cannot reach 127.0.0.1:1"), r.stderr


# -- configs --------------------------------------------------------------------------------------

def test_configs_describe_and_alter_topics_and_brokers(appliance_factory):
    app = appliance_factory()            # its own: broker configs change for every topic
    tool(app, "topics", "create", "--topic", "cfg-t")
    r = tool(app, "configs", "alter", "--entity-type", "topics", "--entity-name", "cfg-t",
             "--add-config", "retention.ms=60000,cleanup.policy=[delete]", run=installed)
    assert r.stdout.strip() == "Completed updating config for topic cfg-t."
    out = rows(tool(app, "configs", "describe", "--topic", "cfg-t").stdout)
    assert out == [["TOPIC", "NAME", "VALUE", "SOURCE"], ["cfg-t", "cleanup.policy", "delete", "DYNAMIC_TOPIC_CONFIG"],
                   ["cfg-t", "retention.ms", "60000", "DYNAMIC_TOPIC_CONFIG"]]
    every = {r[1]: r for r in rows(tool(app, "configs", "describe", "--topic", "cfg-t", "--all").stdout)[1:]}
    assert every["segment.bytes"][2:4] == ["1073741824", "DEFAULT_CONFIG"]

    r = tool(app, "configs", "alter", "--broker", "1", "--add-config", "log.retention.bytes=99999999")
    assert r.stdout.strip() == "Completed updating config for broker 1."
    r = tool(app, "configs", "alter", "--entity-type", "brokers", "--entity-default", "--add-config", "log.roll.ms=3600000")
    assert r.stdout.strip() == "Completed updating default config for brokers in the cluster."
    got = json.loads(tool(app, "configs", "describe", "--entity-type", "brokers", "--entity-name", "1", "--json").stdout)
    assert {(c["name"], c["value"], c["source"]) for c in got} == {
        ("log.retention.bytes", "99999999", "DYNAMIC_BROKER_CONFIG"),
        ("log.roll.ms", "3600000", "DYNAMIC_DEFAULT_BROKER_CONFIG")}
    topic_cfg = {c["name"]: c for c in json.loads(tool(app, "configs", "describe", "--topic", "cfg-t", "--all", "--json").stdout)}
    assert (topic_cfg["retention.bytes"]["value"], topic_cfg["retention.bytes"]["source"]) == ("99999999", "DYNAMIC_BROKER_CONFIG")
    assert topic_cfg["retention.bytes"]["synonyms"][0] == "DYNAMIC_BROKER_CONFIG:log.retention.bytes=99999999"
    static = tool(app, "configs", "alter", "--broker", "1", "--add-config", "log.dirs=/elsewhere", ok=False)
    assert static.returncode == 1 and "INVALID_REQUEST" in static.stderr
    assert "Cannot update these configs dynamically: Set(log.dirs)" in static.stderr
    unknown = tool(app, "configs", "alter", "--topic", "cfg-t", "--add-config", "no.such=1", ok=False)
    assert unknown.returncode == 1 and "INVALID_CONFIG" in unknown.stderr
    tool(app, "configs", "alter", "--topic", "cfg-t", "--delete-config", "retention.ms,cleanup.policy")
    none = tool(app, "configs", "describe", "--topic", "cfg-t")
    assert none.stdout == "" and "No dynamic configs for topic cfg-t." in none.stderr


# -- get-offsets ----------------------------------------------------------------------------------

def test_get_offsets_with_isolation_levels_and_times(shared_appliance):
    app = shared_appliance
    tool(app, "topics", "create", "--topic", "go-t", "--partitions", "2")
    before = int(time.time() * 1000)
    p = Producer(bootstrap_servers=app.bootstrap)
    for i in range(5):
        p.send("go-t", b"v%d" % i, partition=0, timestamp=before + i * 1000)
    p.flush()
    p.close()
    tx = Producer(bootstrap_servers=app.bootstrap, transactional_id="go-open")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("go-t", b"open", partition=0)
    tx.flush()                                   # in the log, uncommitted: the LSO stays at 5
    try:
        out = rows(tool(app, "get-offsets", "--topic", "go-t", run=installed).stdout)
        assert out == [["TOPIC", "PARTITION", "OFFSET"], ["go-t", "0", "6"], ["go-t", "1", "0"]]
        rc = rows(tool(app, "get-offsets", "--topic", "go-t", "--isolation-level", "read_committed").stdout)
        assert rc[1] == ["go-t", "0", "5"]
        early = json.loads(tool(app, "get-offsets", "--topic-partitions", "go-t:0", "--time", "earliest", "--json").stdout)
        assert early == [{"topic": "go-t", "partition": 0, "offset": 0, "timestamp": None}]
        at = json.loads(tool(app, "get-offsets", "--topic", "go-t", "--partitions", "0",
                             "--time", str(before + 2500), "--json").stdout)
        assert at[0]["offset"] == 3 and at[0]["timestamp"] == before + 3000
        mx = rows(tool(app, "get-offsets", "--topic", "go-.*", "--partitions", "0", "--time", "max-timestamp").stdout)
        assert mx[0] == ["TOPIC", "PARTITION", "OFFSET", "TIMESTAMP"] and mx[1][:3] == ["go-t", "0", "4"]
    finally:
        tx.abort_transaction()
        tx.close()
    none = tool(app, "get-offsets", "--topic", "no-such-.*", ok=False)
    assert none.returncode == 1 and "no topic partition matches" in none.stderr


# -- produce / consume ----------------------------------------------------------------------------

def test_console_produce_and_consume_with_keys_headers_and_isolation(shared_appliance):
    app = shared_appliance
    tool(app, "topics", "create", "--topic", "con-t")
    r = tool(app, "produce", "--topic", "con-t", "--property", "parse.key=true", "--property", "parse.headers=true",
             "--json", stdin="h:1,x:2\tk1\thello\nz:9\tk2\tworld\n", run=installed)
    assert [json.loads(line)["offset"] for line in r.stdout.splitlines()] == [0, 1]
    tool(app, "produce", "--topic", "con-t", stdin="plain\n")
    out = tool(app, "consume", "--topic", "con-t", "--from-beginning", "--max-messages", "3",
               "--property", "print.key=true", "--property", "print.headers=true", "--property", "print.offset=true",
               run=installed)
    assert out.stdout.splitlines() == ["Offset:0\th:1,x:2\tk1\thello", "Offset:1\tz:9\tk2\tworld",
                                       "Offset:2\tNO_HEADERS\tnull\tplain"]
    assert "Processed a total of 3 messages" in out.stderr
    # a transaction left open: read_uncommitted sees its record, read_committed does not
    tx = Producer(bootstrap_servers=app.bootstrap, transactional_id="con-open")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("con-t", b"uncommitted", partition=0)
    tx.flush()
    try:
        ru = tool(app, "consume", "--topic", "con-t", "--from-beginning", "--timeout-ms", "1500", "--json")
        assert [json.loads(line)["value"] for line in ru.stdout.splitlines()] == ["hello", "world", "plain", "uncommitted"]
        rc = tool(app, "consume", "--topic", "con-t", "--from-beginning", "--timeout-ms", "1500",
                  "--isolation-level", "read_committed")
        assert rc.stdout.splitlines() == ["hello", "world", "plain"]
    finally:
        tx.abort_transaction()
        tx.close()
    one = tool(app, "consume", "--topic", "con-t", "--partition", "0", "--offset", "1", "--max-messages", "1", "--json")
    assert json.loads(one.stdout)["key"] == "k2"
    missing = tool(app, "consume", "--topic", "con-none", "--timeout-ms", "500", ok=False)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
    bad = tool(app, "produce", "--topic", "con-t", "--property", "parse.key=true", stdin="no separator\n", ok=False)
    assert bad.returncode == 1 and "line 1" in bad.stderr


# -- groups ---------------------------------------------------------------------------------------

def _member(app, group, topic):
    """A live confluent-kafka group member that has consumed everything and committed."""
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": app.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "cli-test-member"})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < 6 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got += 1
    assert got == 6
    c.commit(asynchronous=False)
    return c


def test_groups_list_describe_reset_and_delete(shared_appliance):
    app = shared_appliance
    tool(app, "topics", "create", "--topic", "grp-t", "--partitions", "2")
    tool(app, "produce", "--topic", "grp-t", "--partition", "0", stdin="a\nb\nc\nd\n")
    tool(app, "produce", "--topic", "grp-t", "--partition", "1", stdin="e\nf\n")
    c = _member(app, "cli-group", "grp-t")
    try:
        tool(app, "produce", "--topic", "grp-t", "--partition", "1", stdin="g\nh\nh2\n")   # lag 3 on partition 1
        listed = rows(tool(app, "groups", "list", run=installed).stdout)
        assert listed[0] == ["GROUP", "TYPE", "STATE", "GROUP-TYPE"]
        assert ["cli-group", "consumer", "Stable", "classic"] in listed
        assert tool(app, "groups", "list", "--state", "Empty").stdout.split()[4:] == []
        lag = json.loads(tool(app, "groups", "describe", "--group", "cli-group", "--json").stdout)
        assert [(r["partition"], r["current_offset"], r["log_end_offset"], r["lag"]) for r in lag] == [
            (0, 4, 4, 0), (1, 2, 5, 3)]
        assert all(r["client_id"] == "cli-test-member" for r in lag)
        table = rows(tool(app, "groups", "describe", "--group", "cli-group").stdout)
        assert table[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                            "CONSUMER-ID", "HOST", "CLIENT-ID"]
        assert table[2][:6] == ["cli-group", "grp-t", "1", "2", "5", "3"]
        members = rows(tool(app, "groups", "describe", "--group", "cli-group", "--members", "--verbose").stdout)
        assert members[1][-4:] == ["cli-test-member", "-", "2", "grp-t-0,grp-t-1"]
        state = rows(tool(app, "groups", "describe", "--group", "cli-group", "--state").stdout)
        # a classic group has no epochs (KIP-848's are shown for consumer groups)
        assert state[1] == ["cli-group", "classic", "1", "range", "Stable", "-", "-", "1"]
        active = tool(app, "groups", "reset-offsets", "--group", "cli-group", "--topic", "grp-t", "--to-earliest",
                      "--execute", ok=False)
        assert active.returncode == 1 and "inactive, but the current state is Stable" in active.stderr
        busy = tool(app, "groups", "delete", "--group", "cli-group", ok=False)
        assert busy.returncode == 1 and "NON_EMPTY_GROUP" in busy.stderr
    finally:
        c.close()

    def committed():
        return {r["partition"]: r["current_offset"]
                for r in json.loads(tool(app, "groups", "describe", "--group", "cli-group", "--json").stdout)}

    gone = tool(app, "groups", "describe", "--group", "cli-group")
    assert "has no active members" in gone.stderr
    dry = tool(app, "groups", "reset-offsets", "--group", "cli-group", "--topic", "grp-t", "--to-earliest")
    assert "Dry run" in dry.stderr and rows(dry.stdout)[1:] == [["cli-group", "grp-t", "0", "0"], ["cli-group", "grp-t", "1", "0"]]
    assert committed() == {0: 4, 1: 2}                       # a dry run commits nothing
    cases = [
        (["--topic", "grp-t", "--to-earliest"], {0: 0, 1: 0}),
        (["--topic", "grp-t:1", "--to-latest"], {0: 0, 1: 5}),
        (["--all-topics", "--to-offset", "3"], {0: 3, 1: 3}),
        (["--all-topics", "--to-offset", "99"], {0: 4, 1: 5}),       # kept within the log
        (["--topic", "grp-t", "--shift-by", "-2"], {0: 2, 1: 3}),
        (["--topic", "grp-t:0", "--shift-by", "-9"], {0: 0, 1: 3}),
        (["--topic", "grp-t", "--to-datetime", "2000-01-01T00:00:00.000"], {0: 0, 1: 0}),
        (["--topic", "grp-t", "--to-datetime", "2999-01-01T00:00:00.000Z"], {0: 4, 1: 5}),
    ]
    for args, want in cases:
        r = json.loads(tool(app, "groups", "reset-offsets", "--group", "cli-group", *args, "--execute", "--json").stdout)
        assert r["executed"] is True
        assert committed() == want, args
    usage = tool(app, "groups", "reset-offsets", "--group", "cli-group", "--topic", "grp-t", ok=False)
    assert usage.returncode == 2 and "exactly one of" in usage.stderr
    r = tool(app, "groups", "delete", "--group", "cli-group")
    assert r.stdout.strip() == "Deletion of requested consumer groups ('cli-group') was successful."
    missing = tool(app, "groups", "describe", "--group", "cli-group", ok=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    again = tool(app, "groups", "delete", "--group", "cli-group", ok=False)
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr


# -- dump-log -------------------------------------------------------------------------------------

def test_dump_log_shows_batches_markers_and_indexes_offline(shared_appliance, tmp_path):
    app = shared_appliance
    tool(app, "topics", "create", "--topic", "dump-t", "--config", "segment.bytes=2048")
    p = Producer(bootstrap_servers=app.bootstrap, transactional_id="dump-tx", linger_ms=0)
    p.init_transactions()
    p.begin_transaction()
    p.send("dump-t", b"committed", key=b"k", partition=0, headers=[("h", b"1")])
    p.commit_transaction()
    p.begin_transaction()
    p.send("dump-t", b"aborted", partition=0)
    p.flush()
    p.abort_transaction()
    for i in range(30):                   # enough plain batches for a few segments and index entries
        p.begin_transaction()
        p.send("dump-t", b"x" * 100, partition=0)
        p.commit_transaction()
    p.close()
    d = os.path.join(app.data_dir, "dump-t-0")
    first = os.path.join(d, "00000000000000000000")
    out = installed("dump-log", first + ".log", "--print-data-log").stdout.splitlines()
    assert out[0] == f"Dumping {first}.log" and out[1] == "Log starting offset: 0"
    batches = [fields(line) for line in out if line.startswith("baseOffset:")]
    pid = batches[0]["producerId"]
    assert int(pid) >= 0 and batches[0]["producerEpoch"] == "0" and batches[0]["partitionLeaderEpoch"] == "0"
    assert (batches[0]["isTransactional"], batches[0]["isControl"], batches[1]["isControl"]) == ("true", "false", "true")
    assert (batches[0]["baseSequence"], batches[0]["lastSequence"], batches[0]["isvalid"]) == ("0", "0", "true")
    assert "| offset: 0 CreateTime:" in out[3] and "headerKeys: [h] key: k payload: committed" in out[3]
    markers = [line for line in out if "endTxnMarker" in line]
    assert "endTxnMarker: COMMIT coordinatorEpoch:" in markers[0] and "endTxnMarker: ABORT" in markers[1]
    js = [json.loads(line) for line in in_process("dump-log", first + ".log", "--json").stdout.splitlines()]
    assert [b["batch"]["isControl"] for b in js if "batch" in b][:4] == [False, True, False, True]

    txn = in_process("dump-log", first + ".txnindex").stdout.splitlines()
    assert txn[1] == f"version: 0 producerId: {pid} firstOffset: 2 lastOffset: 3 lastStableOffset: 4"
    index = in_process("dump-log", first + ".index", first + ".timeindex").stdout.splitlines()
    assert any(line.startswith("offset: ") and " position: " in line for line in index)
    assert any(line.startswith("timestamp: ") for line in index)
    checks = in_process("dump-log", "--index-sanity-check", first + ".index", first + ".timeindex", first + ".txnindex")
    assert checks.stdout.count("passed sanity check.") == 3
    assert "every entry matches the log." in in_process("dump-log", "--verify-index-only", first + ".index").stdout

    # a damaged copy, offline: a failed CRC, an index whose entries go backwards
    bad = tmp_path / "bad"
    bad.mkdir()
    for suffix in (".log", ".index"):
        shutil.copy(first + suffix, bad / ("00000000000000000000" + suffix))
    with open(bad / "00000000000000000000.log", "r+b") as f:
        f.seek(70)
        f.write(b"\xff")
    r = in_process("dump-log", str(bad / "00000000000000000000.log"), ok=False)
    assert r.returncode == 1 and "isvalid: false" in r.stdout
    with open(bad / "00000000000000000000.index", "r+b") as f:
        entries = f.read()
        n = len(entries.rstrip(b"\0")) // 8
        assert n >= 2
        f.seek((n - 1) * 8)
        f.write(entries[0:4] + entries[(n - 1) * 8 + 4:n * 8])      # last entry's offset = the first's
    r = in_process("dump-log", "--index-sanity-check", str(bad / "00000000000000000000.index"), ok=False)
    assert r.returncode == 1 and "not increasing" in r.stdout
    unknown = in_process("dump-log", os.path.join(d, "partition.metadata"), ok=False)
    assert unknown.returncode == 1 and "Ignoring unknown file" in unknown.stderr


@pytest.mark.parametrize("command", ["topics", "groups", "configs"])
def test_tool_groups_take_the_bootstrap_server_before_the_command(shared_appliance, command):
    """As ``appliance transactions --bootstrap-server H:P list`` does."""
    sub = {"topics": ["list"], "groups": ["list"], "configs": ["describe", "--broker", "1"]}[command]
    r = in_process(command, "--bootstrap-server", shared_appliance.bootstrap, *sub)
    assert r.returncode == 0
