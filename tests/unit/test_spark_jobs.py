"""The Spark sink's job log: how records fold into each job's phase (pure logic, no broker)."""

from appliance.spark.jobs import (ABORTED, ABORTING, COMMITTING, DONE, RUNNING, SEALED, Entry,
                                  _entry, fold, trim_point)


def rec(offset, type_, key="k", gen=0, ts=None, prefix="p", txns=(), timeout_ms=0, kind="batch"):
    return Entry(offset, 1000 + offset if ts is None else ts, type_, prefix, key, gen, kind,
                 timeout_ms, tuple(txns))


def test_a_batch_job_goes_begin_seal_commit_done():
    entries = [rec(5, "begin", timeout_ms=9000), rec(6, "seal", gen=5),
               rec(7, "commit", gen=5, txns=[("p-k-0", "1:0")])]
    job = fold(entries)[("p", "k")]
    assert (job.gen, job.phase, job.txns, job.timeout_ms) == (5, COMMITTING, (("p-k-0", "1:0"),), 9000)
    assert (job.first_offset, job.last_offset, job.last_seen_ms) == (5, 7, 1007)
    assert fold(entries + [rec(8, "done", gen=5)])[("p", "k")].phase == DONE
    assert fold(entries[:2])[("p", "k")].phase == SEALED
    assert fold(entries[:1])[("p", "k")].phase == RUNNING


def test_the_first_decision_of_a_run_wins():
    begin = rec(1, "begin")
    commit = rec(3, "commit", gen=1, txns=[("p-k-0", "1:0")])
    abort = rec(4, "abort", gen=1)
    assert fold([begin, commit, abort])[("p", "k")].phase == COMMITTING
    assert fold([begin, rec(2, "abort", gen=1), commit])[("p", "k")].phase == ABORTING
    assert fold([begin, rec(2, "abort", gen=1), rec(3, "aborted", gen=1),
                 rec(4, "done", gen=1)])[("p", "k")].phase == ABORTED
    # "aborted" completes only an abort decision; "done" only a commit decision
    assert fold([begin, rec(2, "aborted", gen=1)])[("p", "k")].phase == RUNNING
    assert fold([begin, rec(2, "done", gen=1)])[("p", "k")].phase == RUNNING


def test_a_newer_run_of_the_same_job_replaces_the_older_and_ignores_its_late_records():
    entries = [rec(1, "begin"), rec(2, "abort", gen=1), rec(3, "aborted", gen=1), rec(4, "begin"),
               rec(5, "hb", gen=1, ts=99999)]               # a zombie task of the first run
    job = fold(entries)[("p", "k")]
    assert (job.gen, job.phase, job.first_offset, job.last_seen_ms) == (4, RUNNING, 4, 1004)


def test_heartbeats_keep_a_job_alive_and_jobs_are_kept_apart_by_prefix_and_key():
    entries = [rec(1, "begin", key="a"), rec(2, "begin", key="a", prefix="q"),
               rec(3, "hb", key="a", gen=1, ts=50000), rec(4, "recover", key="")]
    jobs = fold(entries)
    assert set(jobs) == {("p", "a"), ("q", "a")}
    assert jobs[("p", "a")].last_seen_ms == 50000 and jobs[("q", "a")].last_seen_ms == 1002
    stream = fold([rec(7, "hb", key="3f2504e0-4f89-11d3-9a0c-0305e82c3301", kind="stream")])
    assert next(iter(stream.values())).kind == "stream"


def test_records_of_a_run_whose_begin_was_trimmed_are_ignored():
    # The log starts at 10: job "old" began at 3 (trimmed); its late done must not make it look
    # like a running job (a recovery would roll it back, a rerun of its jobId would write again).
    entries = [rec(10, "begin", key="new"), rec(11, "done", key="old", gen=3),
               rec(12, "hb", key="old", gen=3), rec(13, "seal", key="new", gen=10)]
    assert {k: j.phase for (_, k), j in fold(entries).items()} == {"new": SEALED}
    assert fold(iter(entries))[("p", "new")].first_offset == 10          # any iterable


DAY = 24 * 3600 * 1000
STREAM = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


def test_trim_keeps_unresolved_and_recent_jobs_and_live_queries_last_heartbeat():
    entries = [rec(0, "begin", key="a", ts=0), rec(1, "commit", key="a", gen=0, ts=0),
               rec(2, "done", key="a", gen=0, ts=0),                       # resolved long ago
               rec(3, "hb", key=STREAM, kind="stream", ts=1),
               rec(4, "begin", key="b", ts=2), rec(5, "abort", key="b", gen=4, ts=2),
               rec(6, "aborted", key="b", gen=4, ts=2),                    # resolved long ago
               rec(7, "begin", key="c", ts=3),                            # unresolved, old
               rec(8, "hb", key=STREAM, kind="stream", ts=10 * DAY),
               rec(9, "begin", key="d", ts=10 * DAY), rec(10, "done", key="d", gen=9, ts=10 * DAY)]
    assert trim_point(entries, 7 * DAY) == 7                # c's begin: still needed
    assert trim_point(entries[:7] + entries[8:], 7 * DAY) == 8     # the query's last heartbeat
    assert trim_point([e for e in entries if e.key != STREAM and e.key != "c"], 7 * DAY) == 9
    # Judged at the newest record's time: a job just done is recent; once a later record says
    # a day went by, a retention under a day lets everything go.
    assert trim_point(entries[:3], 1) == 0
    later = entries[:3] + [rec(3, "recover", key="", ts=DAY)]
    assert trim_point(later, DAY - 1) == 4 and trim_point(later, DAY) == 0
    assert trim_point([], 7 * DAY) is None


def test_records_that_are_not_job_records_are_skipped(caplog):
    assert _entry(3, 1, b"not json") is None
    assert _entry(4, 1, b'{"prefix": "p"}') is None
    e = _entry(5, 7, b'{"type": "commit", "prefix": "p", "key": "k", "gen": 2, "txns": [["p-k-0", "1:0"]]}')
    assert e == Entry(5, 7, "commit", "p", "k", 2, "batch", 0, (("p-k-0", "1:0"),))


def test_the_job_log_and_the_sinks_consumers_reach_the_broker_with_the_producers_security():
    # Regression: the streaming replay check's consumer dropped the TLS and SASL settings of the
    # sink's options, so it spoke plaintext to a SASL_SSL listener.
    from appliance.spark.jobs import JobLog, connection_config
    from appliance.spark.options import client_config
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="alice" password="pw";')
    cfg = client_config({"kafka.bootstrap.servers": "h:9093", "kafka.security.protocol": "SASL_SSL",
                         "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": jaas,
                         "kafka.ssl.truststore.location": "/etc/ca.pem", "kafka.linger.ms": "5",
                         "kafka.batch.size": "1024"}, "producer")
    conn = connection_config(cfg)
    assert conn == {"bootstrap_servers": "h:9093", "security_protocol": "SASL_SSL",
                    "sasl_mechanism": "SCRAM-SHA-512", "sasl_jaas_config": jaas,
                    "ssl_cafile": "/etc/ca.pem"}
    sec = JobLog(cfg).security
    assert (sec.protocol, sec.sasl_mechanism, sec.sasl_username, sec.ssl_cafile) == \
        ("SASL_SSL", "SCRAM-SHA-512", "alice", "/etc/ca.pem")
