"""Incremental fetch sessions (KIP-227) against the real appliance: the wire semantics with
exact requests, and Kafka's Java consumers (3.9.1, what Spark ships, and 4.3.0) reading through
sessions, which they create, use incrementally and close."""

from __future__ import annotations

import pytest

from java_programs import java4_program, java_program  # noqa: F401 (fixtures)
from raw_wire import RawClient, create_topic, parse_batches, plain
from test_operating import metrics_app, scrape, total

FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR = 70, 71, 106
SESSIONS = "kafka_server_fetchsessioncache_numincrementalfetchsessions"
CACHED = "kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"


def fetch12(raw, session_id, epoch, parts=(), forgotten=(), topic="s", max_wait_ms=0):
    """Fetch v12 (topic names) of ``parts`` [(partition, offset)]; (response, {partition:
    (high watermark, values)}) of what it answered."""
    r = raw.request(1, 12, {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "session_id": session_id, "session_epoch": epoch,
        "topics": [{"topic": topic, "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": o, "log_start_offset": -1,
             "last_fetched_epoch": -1, "partition_max_bytes": 1 << 20} for p, o in parts]}]
        if parts else [],
        "forgotten_topics_data": [{"topic": topic, "partitions": list(forgotten)}] if forgotten else [],
        "rack_id": ""})
    got = {}
    for t in r.responses:
        for p in t.partitions:
            got[p.partition_index] = (p.high_watermark,
                                      [v for b in parse_batches(p.records) for v in b.values])
    return r, got


def test_a_session_answers_only_what_changed_and_refuses_stale_epochs(appliance):
    with RawClient(appliance.bootstrap) as raw:
        create_topic(raw, "s", 3)
        for p in range(3):
            plain(raw, "s", p, [b"a%d" % p])
        r, got = fetch12(raw, 0, 0, [(0, 0), (1, 0), (2, 0)])
        sid = r.session_id
        assert r.error_code == 0 and sid > 0
        assert got == {p: (1, [b"a%d" % p]) for p in range(3)}
        # The client moves every partition past what it read: nothing new, nothing answered.
        r, got = fetch12(raw, sid, 1, [(0, 1), (1, 1), (2, 1)])
        assert (r.error_code, r.session_id, got) == (0, sid, {})
        # New records on partition 1 only: an incremental fetch naming nothing answers it alone.
        plain(raw, "s", 1, [b"b1"])
        r, got = fetch12(raw, sid, 2)
        assert got == {1: (2, [b"b1"])}
        # The client moves partition 1 to its end and forgets partition 2.
        r, got = fetch12(raw, sid, 3, [(1, 2)], forgotten=[2])
        assert got == {}
        plain(raw, "s", 2, [b"b2"])
        plain(raw, "s", 0, [b"b0"])
        r, got = fetch12(raw, sid, 4)
        assert got == {0: (2, [b"b0"])}                    # partition 2 is no longer in it
        # The same epoch twice, an unknown session, a v13 fetch of a v12 session: Kafka's errors.
        assert fetch12(raw, sid, 4)[0].error_code == INVALID_FETCH_SESSION_EPOCH
        assert fetch12(raw, sid + 1, 1)[0].error_code == FETCH_SESSION_ID_NOT_FOUND
        r13 = raw.request(1, 13, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": sid, "session_epoch": 5, "topics": [],
            "forgotten_topics_data": [], "rack_id": ""})
        assert r13.error_code == FETCH_SESSION_TOPIC_ID_ERROR
        assert fetch12(raw, sid, 5)[0].error_code == 0      # the errors did not move its epoch
        # Epoch -1 closes it: it is gone.
        r, got = fetch12(raw, sid, -1, [(0, 2)])
        assert (r.error_code, r.session_id, got) == (0, 0, {0: (2, [])})
        assert fetch12(raw, sid, 6)[0].error_code == FETCH_SESSION_ID_NOT_FOUND


@pytest.mark.parametrize("client", ["java_program", "java4_program"])
def test_java_consumers_read_through_a_session_and_close_it(appliance_factory, request, client):
    """A Java consumer catching up on 24 partitions: every record read exactly, no session
    error answered, a session of all 24 partitions cached while it reads, none after it
    closed (Kafka's consumer closes its sessions with a final-epoch fetch)."""
    program = request.getfixturevalue(client)
    app = metrics_app(appliance_factory)
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "catch-up", 24)
        for p in range(24):
            for n in range(10):
                plain(raw, "catch-up", p, [b"%d-%d-%d" % (p, n, i) for i in range(20)])
    proc = program.popen("CatchUpConsumer", app.bootstrap, "catch-up", "24", "0", "1",
                         "read_uncommitted", "max.partition.fetch.bytes=300")
    try:
        assert proc.stdout.readline().strip() == "READY"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        done = proc.stdout.readline().split()
        assert done[:2] == ["DONE", str(24 * 200)], done
        # A batch a partition a fetch (the limit is below one batch): ten fetches at least, and
        # no error answered, so every one after the first was incremental in one session.
        app.wait_for(lambda: total(scrape(app.metrics_port), SESSIONS) == 1
                     and total(scrape(app.metrics_port), CACHED) == 24, what="a cached session")
        # Records produced now reach it through the same session (it polls on, following the
        # tail, until its stdin closes).
        with RawClient(app.bootstrap) as raw:
            plain(raw, "catch-up", 7, [b"tail-%d" % i for i in range(5)])
        line = proc.stdout.readline().split()
        while line != ["TAILED", "5"]:
            assert line[:1] == ["TAILED"] and int(line[1]) < 5, line
            line = proc.stdout.readline().split()
        proc.stdin.close()
        assert proc.stdout.readline().split() == ["TAIL", "5"]
        assert proc.stdout.readline().strip() == "CLOSED"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
    app.wait_for(lambda: total(scrape(app.metrics_port), SESSIONS) == 0, what="the session closed")
    m = scrape(app.metrics_port)
    errors = {dict(k)["error"]: v for k, v in m["kafka_network_requestmetrics_errors_total"].items()
              if dict(k)["request"] == "Fetch"}
    assert set(errors) == {"NONE"}, errors
    assert total({"r": {k: v for k, v in m["kafka_network_requestmetrics_requests_total"].items()
                        if dict(k)["request"] == "Fetch"}}, "r") >= 10
