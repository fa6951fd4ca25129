"""Spark drivers killed -9 in the middle of a job, against the real appliance (each driver a
programs/spark_driver.py subprocess, its own JVM):

- a batch job with a jobId killed at five moments (two without --soak) and run again with the
  same jobIds writes every row exactly once;
- a streaming query killed at three moments (one without --soak) and restarted from its
  checkpoint writes every committed input row exactly once, aborted input never; a micro-batch
  whose commit stopped after one partition's transaction is replayed without duplicating that
  partition.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from client_drivers import create, read_all, uid
from spark_jobs import (KILL_PHASES, QUICK_KILL_PHASES, batch_driver,  # noqa: F401 (fixtures)
                        broker, feed, finish, java, job_phase, open_transactions, rows_once,
                        stream_driver, values, wait_nothing_open)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1800)          # up to six Spark drivers, each started for one job
@pytest.mark.soak
def test_batch_job_killed_at_each_phase_then_rerun_with_its_job_id_is_exactly_once(broker, request):
    """The driver killed -9 at five moments of a batch write with a jobId (two of them without
    --soak): a task sending its rows, a task having prepared, the driver having recorded its
    commit decision, having committed one partition of three, having recorded the job done.
    Then one driver runs all those jobs again with the same jobIds: each recovers its earlier
    run (rolled back, or its decision completed) and writes what is missing, so that
    read_committed shows every row exactly once, and no transaction is left open."""
    prefix = "jobid"
    jobs = []
    phases = KILL_PHASES if request.config.getoption("--soak") else \
        {p: KILL_PHASES[p] for p in QUICK_KILL_PHASES}
    for phase, left in phases.items():
        topic, job_id = uid("spark-kill"), uid("job")
        create(broker.bootstrap, {topic: 2})
        r = batch_driver(broker, f"{topic}:{job_id}", kill_at=phase, prefix=prefix, rows=1500)
        assert r.returncode == -signal.SIGKILL, f"{phase}: {r.stdout[-3000:]}"
        # (Each killed run's own start may already have recovered the earlier ones, when their
        # jobTimeoutMs had passed: a slow machine.)
        assert job_phase(broker.bootstrap, prefix, job_id) == left, phase
        jobs.append(f"{topic}:{job_id}")
    r = batch_driver(broker, *jobs, prefix=prefix, rows=1500)
    assert r.returncode == 0, r.stdout[-5000:]
    wait_nothing_open(broker.bootstrap, prefix)
    for job in jobs:
        rows_once(broker.bootstrap, job.split(":")[0], 2, 1500)
        assert job_phase(broker.bootstrap, prefix, job.split(":")[1]) == "done"

@pytest.mark.timeout(1500)
@pytest.mark.soak
def test_streaming_query_killed_and_restarted_from_its_checkpoint_writes_every_row_once(
        broker, tmp_path, request):
    """The driver killed -9 three times (once without --soak: the partial commit), each at a
    phase of its own (a task has prepared its transaction; the commit of micro-batch 1 has
    committed one partition and not the others; the commit of micro-batch 2 has not started),
    restarted on its checkpoint each time, then run to the end: the sink holds every committed
    input row once, upper-cased, aborted input never, and no transaction stays open. (The
    restart after the partial commit replays micro-batch 1: the committed partition finds its
    marker offset and writes nothing.)"""
    source, sink = uid("spark-in"), uid("spark-out")
    create(broker.bootstrap, {source: 2, sink: 3})
    committed = feed(broker.bootstrap, source, 12, 300)          # 2,400 committed rows
    checkpoint = str(tmp_path / "checkpoint")
    kills = ("task_prepared:1", "stream_mid_commit:1", "stream_before_commit:2")
    for kill_at in kills if request.config.getoption("--soak") else ("stream_mid_commit:1",):
        proc = stream_driver(broker, source, sink, checkpoint, "--max-offsets", "400", kill_at=kill_at)
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == -signal.SIGKILL, f"{kill_at}: {out[-3000:]}"
    finish(stream_driver(broker, source, sink, checkpoint, "--max-offsets", "400", "--available-now"))
    got = values(read_all(broker.bootstrap, sink, 3))
    assert Counter(got) == Counter(v.upper() for v in committed)
    assert not [t for t in open_transactions(broker.bootstrap) if t.startswith("spark-")]
