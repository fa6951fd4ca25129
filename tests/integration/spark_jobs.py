"""Spark sessions and jobs in the tests, shared by the Spark test files (test_spark*.py): the Java
check and the module's broker (two-phase commit on) as fixtures, the Spark driver subprocesses
(programs/spark_driver.py, batch and streaming, each its own Spark session and JVM, killed at a
phase with KILL_ENV), transactions to feed them, and reading back what the jobs left (rows, open
transactions, the job log's phase of a job). Runs in the pytest process; the drivers are
subprocesses of their own session, so that a test can kill one -9 with its JVM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from appliance.client import transaction_admin as admin
from appliance.client import Producer
from appliance.spark.jobs import KILL_ENV
from appliance_harness import PROGRAMS, module_appliance
from client_drivers import read_all, uid
from java_programs import require_java

HERE = os.path.dirname(os.path.abspath(__file__))     # tests/integration
SPARK_DRIVER = os.path.join(PROGRAMS, "spark_driver.py")


@pytest.fixture(scope="module", autouse=True)
def java():
    """Java 17+ first: without it every test of the module fails with one line that says so."""
    require_java()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    a = module_appliance(tmp_path_factory, "spark",
                         {"transactions": {"two_phase_commit_enable": True},
                          "log": {"retention_check_interval_ms": 200}})
    yield a
    a.terminate()


def values(records) -> list[bytes]:
    return [r.value for recs in records.values() for r in recs]


def open_transactions(bootstrap: str) -> list[str]:
    conn = admin.connect(bootstrap)
    try:
        return [t["transactional_id"] for t in admin.list_transactions(conn, states=["Ongoing"])]
    finally:
        conn.close()


def feed(bootstrap: str, topic: str, transactions: int, per_txn: int) -> list[bytes]:
    """Transactions of ``per_txn`` rows, every third aborted; returns the committed values."""
    committed = []
    p = Producer(bootstrap_servers=bootstrap, transactional_id=uid("feeder"))
    try:
        p.init_transactions()
        for t in range(transactions):
            p.begin_transaction()
            vals = [b"row-%d-%d" % (t, i) for i in range(per_txn)]
            for i, v in enumerate(vals):
                p.send(topic, v, key=b"%d" % i)
            if t % 3 == 2:
                p.abort_transaction()
            else:
                p.commit_transaction()
                committed.extend(vals)
    finally:
        p.close()
    return committed


def driver_env(kill_at: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
    if kill_at:
        env[KILL_ENV] = kill_at
    return env


def stream_driver(broker, source, sink, checkpoint, *extra, kill_at: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, SPARK_DRIVER, "stream", broker.bootstrap,
                             source, sink, checkpoint, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=driver_env(kill_at))


def batch_driver(broker, *jobs: str, kill_at: str | None = None, prefix: str = "spark",
                 rows: int = 600, timeout_ms: int | None = None) -> subprocess.CompletedProcess:
    """programs/spark_driver.py batch: each of ``jobs`` ("TOPIC[:JOB_ID]") writes ``rows`` rows from 3 Spark
    partitions; with ``kill_at`` the sink kills the driver at that phase."""
    args = [sys.executable, SPARK_DRIVER, "batch", broker.bootstrap,
            "--rows", str(rows), "--partitions", "3", "--prefix", prefix]
    for job in jobs:
        args += ["--job", job]
    if timeout_ms:
        args += ["--job-timeout-ms", str(timeout_ms)]
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, start_new_session=True, env=driver_env(kill_at))


def listed(bootstrap: str, prefix: str, states: list[str]) -> list[str]:
    conn = admin.connect(bootstrap)
    try:
        found = admin.list_transactions(conn, states=states)
    finally:
        conn.close()
    return sorted(t["transactional_id"] for t in found if t["transactional_id"].startswith(prefix + "-"))


OPEN_OR_ENDING = ["Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"]


def wait_nothing_open(bootstrap: str, prefix: str) -> None:
    """No transaction of the prefix Ongoing, and none left in a Prepare* state once the markers
    of those being completed are written (the coordinator finishes those by itself)."""
    assert not listed(bootstrap, prefix, ["Ongoing"])
    deadline = time.monotonic() + 60
    while left := listed(bootstrap, prefix, OPEN_OR_ENDING):
        assert time.monotonic() < deadline, f"still open: {left}"
        time.sleep(0.05)


def rows_once(bootstrap: str, topic: str, partitions: int, rows: int) -> None:
    got = values(read_all(bootstrap, topic, partitions))
    assert Counter(got) == Counter(b"v-%d" % i for i in range(rows)), \
        f"{topic}: {len(got)} rows, {len(set(got))} distinct, {rows} expected"


# Before prepare (a task sending its rows), between prepare and commit (a task has prepared; the
# commit decision is recorded), in the middle of the commit loop, after the commit; with the
# phase the job log shows the job in right after the kill.
KILL_PHASES = {"task_writing:1": "running", "task_prepared:0": "running",
               "after_decision": "committing", "mid_commit": "committing", "after_done": "done"}
# Each moment costs a Spark driver (about 25 s on two cores): without --soak, one job rolled back
# and one rolled forward.
QUICK_KILL_PHASES = ("task_prepared:0", "mid_commit")


def job_phase(bootstrap: str, prefix: str, key: str) -> str | None:
    from appliance.spark.jobs import JobLog, fold
    with JobLog({"bootstrap_servers": bootstrap}) as jl:
        job = fold(jl.read()).get((prefix, key))
    return job.phase if job is not None else None


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-5000:]
    return out
