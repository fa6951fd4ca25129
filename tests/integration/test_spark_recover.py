"""``appliance spark recover`` on a data dir holding a dead Spark write job in each state.

The jobs are the sink's own code driven without a JVM (programs/spark_dead_job.py), killed -9 by the
sink's test hook: a task sending its rows, every task prepared, the job sealed, the commit
decided, one partition committed, every partition committed (``done`` not recorded), the abort
decided, and a streaming micro-batch with its tasks prepared. The appliance is then restarted on
its data dir; ``recover`` first leaves the jobs alone (they were heard of within their
jobTimeoutMs), then with ``--include-running`` rolls the decided ones forward and the others
back: every decided job's rows are all visible, the others' none, nothing stays open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from appliance.client import transaction_admin as admin
from appliance.spark.jobs import ABORTED, DONE, JOB_LOG_TOPIC, JobLog, fold
from appliance_harness import PROGRAMS
from client_drivers import create, read_all, uid

BIN = os.path.dirname(sys.executable)
ROWS = 200
# phase -> rolled forward (True) or back (False)
PHASES = {"task_writing:1": False, "before_seal": False, "after_seal": False,
          "after_decision": True, "mid_commit": True, "after_commit": True, "abort_decided": False}


def run_job(bootstrap: str, topic: str, phase: str, *extra: str, prefix: str = "dead",
            rows: int = ROWS) -> str:
    """Runs the job (programs/spark_dead_job.py) until the hook kills it at ``phase``, or to its end
    for the phase ``none``; returns the job's key."""
    r = subprocess.run([sys.executable, os.path.join(PROGRAMS, "spark_dead_job.py"), bootstrap, topic,
                        phase, "--prefix", prefix, "--rows", str(rows), *extra],
                       capture_output=True, text=True, timeout=300, start_new_session=True)
    want = 0 if phase == "none" else -signal.SIGKILL
    assert r.returncode == want, f"{phase}: {r.returncode} {r.stderr[-3000:]}"
    return r.stdout.split()[0]


def recover(bootstrap: str, *extra: str) -> list[str]:
    r = subprocess.run([os.path.join(BIN, "appliance"), "spark", "recover", "--bootstrap-server",
                        bootstrap, *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def open_ids(bootstrap: str) -> list[str]:
    conn = admin.connect(bootstrap)
    try:
        return sorted(t["transactional_id"] for t in admin.list_transactions(conn, states=["Ongoing"])
                      if t["transactional_id"].startswith("dead-"))
    finally:
        conn.close()


def test_recover_on_a_data_dir_with_a_dead_job_in_each_state(appliance_factory):
    a = appliance_factory(transactions={"two_phase_commit_enable": True})
    topics, keys = {}, {}
    for phase in PHASES:
        topics[phase] = uid("dead")
        create(a.bootstrap, {topics[phase]: 2})
        keys[phase] = run_job(a.bootstrap, topics[phase], phase)
    stream_topic = uid("dead-stream")
    create(a.bootstrap, {stream_topic: 2})
    query = run_job(a.bootstrap, stream_topic, "task_prepared:1", "--stream")
    before = open_ids(a.bootstrap)
    assert len(before) >= 2 * len(PHASES), before

    a.terminate()
    a.start()
    with JobLog({"bootstrap_servers": a.bootstrap}) as jl:
        jobs = {j.key: j for (p, _), j in fold(jl.read()).items() if p == "dead"}
    assert set(jobs) == set(keys.values()) and not any(j.resolved for j in jobs.values())

    # Heard of a moment ago, with a timeout of 10 minutes: live jobs, as far as anyone can tell.
    lines = recover(a.bootstrap, "--prefix", "dead")
    for phase, key in keys.items():
        assert any(key in line and "running" in line for line in lines), (phase, lines)
    assert set(before) - {t for t in before if query in t} <= set(open_ids(a.bootstrap))

    lines = recover(a.bootstrap, "--include-running")
    out = "\n".join(lines)
    for phase, forward in PHASES.items():
        want = "rolled forward" if forward else "rolled back"
        assert any(keys[phase] in line and want in line for line in lines), (phase, out)
    assert open_ids(a.bootstrap) == [], out

    for phase, forward in PHASES.items():
        got = [r.value for recs in read_all(a.bootstrap, topics[phase], 2).values() for r in recs]
        if forward:
            assert sorted(got) == sorted(b"v-%d" % i for i in range(3 * ROWS)), phase
        else:
            assert got == [], phase
    assert [r for recs in read_all(a.bootstrap, stream_topic, 2).values() for r in recs] == []
    with JobLog({"bootstrap_servers": a.bootstrap}) as jl:
        after = {j.key: j.phase for (p, _), j in fold(jl.read()).items() if p == "dead"}
    assert after == {keys[ph]: DONE if f else ABORTED for ph, f in PHASES.items()}
    assert recover(a.bootstrap) == ["nothing to recover"]


def _complete_job(bootstrap: str, topic: str, *extra: str) -> str:
    return run_job(bootstrap, topic, "none", *extra, prefix="trim", rows=20)


def _log_start(bootstrap: str) -> int:
    from appliance.client import Consumer
    with Consumer(bootstrap_servers=bootstrap) as c:
        return c.beginning_offsets([(JOB_LOG_TOPIC, 0)])[(JOB_LOG_TOPIC, 0)]


def test_the_job_log_is_trimmed_past_resolved_jobs_older_than_the_retention(appliance_factory):
    """A resolved job's driver deletes the job log's records that no job needs: those of jobs
    resolved longer ago than jobRetentionMs, never an unresolved job's, and nothing while every
    job is within the retention (default 7 days). The rows the jobs wrote stay."""
    a = appliance_factory(transactions={"two_phase_commit_enable": True})
    topic = uid("trim")
    create(a.bootstrap, {topic: 2})
    first = _complete_job(a.bootstrap, topic)
    assert _log_start(a.bootstrap) == 0                       # within the default retention
    dead = run_job(a.bootstrap, topic, "after_seal", prefix="trim2")
    _complete_job(a.bootstrap, topic, "--job-retention-ms", "1")
    with JobLog({"bootstrap_servers": a.bootstrap}) as jl:
        jobs = {j.key: j for j in fold(jl.read()).values()}
    # The first job is gone; the dead one, unresolved, holds the log from its begin on.
    assert first not in jobs and jobs[dead].first_offset == _log_start(a.bootstrap) > 0
    recover(a.bootstrap, "--prefix", "trim2", "--include-running")
    last = _complete_job(a.bootstrap, topic, "--job-retention-ms", "1")
    with JobLog({"bootstrap_servers": a.bootstrap}) as jl:
        jobs = {j.key: j for j in fold(jl.read()).values()}
    assert list(jobs) == [last] and jobs[last].phase == DONE
    assert jobs[last].first_offset == _log_start(a.bootstrap)
    got = [r.value for recs in read_all(a.bootstrap, topic, 2).values() for r in recs]
    assert sorted(got) == sorted(b"v-%d" % i for i in range(60) for _ in range(3))
