"""The load tools keep working: the Locust user against the real appliance, and the benchmarks.

Each is a smoke run at the smallest size that still goes through the whole tool (its set-up, a
measurement, its report): these check that the tools work, not how fast anything is."""

import os
import subprocess
import sys

from appliance_harness import ROOT
from java_programs import require_java

BIN = os.path.dirname(sys.executable)


def test_locust_user_produces_to_the_appliance(appliance, tmp_path):
    r = subprocess.run(
        [os.path.join(BIN, "locust"), "-f", os.path.join(ROOT, "loadtests", "locustfile.py"), "--headless",
         "-u", "1", "-r", "1", "-t", "6s", "--host", appliance.bootstrap, "--only-summary",
         "--csv", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, KAFKA_TOPIC="locust-smoke"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with open(tmp_path / "run_stats.csv") as f:
        rows = [line.split(",") for line in f.read().splitlines()]
    header, agg = rows[0], rows[-1]
    requests = int(agg[header.index("Request Count")])
    failures = int(agg[header.index("Failure Count")])
    assert requests > 0 and failures == 0


def test_produce_benchmark_runs_and_prints_ratios(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_produce.py"), "--seconds", "0.5",
                        "--record-sizes", "100", "--work-dir", str(tmp_path), "--warmup", "0.3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| 100 B | appliance / sink |" in r.stdout
    assert "warm-up 0.3 s per broker start (not counted)" in r.stdout
    assert "warm-up failed" not in r.stderr


def test_authorizer_benchmark_runs():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_authorizer.py"), "--acls", "10",
                        "--checks", "1000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| allowed by an ACL, cached |" in r.stdout


def test_validation_benchmark_times_every_walk():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_validate.py"), "--records", "5",
                        "--value-sizes", "20", "--codecs", "none,zstd", "--repeat", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert [row[2] for row in rows] == ["none", "zstd"]
    assert all(row[3] != "-" and row[-1].endswith("x") for row in rows), r.stdout


def test_produce_benchmark_measures_each_security_protocol(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_produce.py"), "--seconds", "0.5",
                        "--record-sizes", "100", "--work-dir", str(tmp_path), "--only", "appliance",
                        "--security-protocols", "PLAINTEXT,SSL,SASL_SSL"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for row in ("| 100 B | appliance |", "| 100 B | appliance SSL |", "| 100 B | appliance SASL_SSL |"):
        assert row in r.stdout
    assert "| record size | config | SSL / PLAINTEXT | SASL_SSL / PLAINTEXT |" in r.stdout


def test_spark_benchmark_runs_and_prints_ratios(tmp_path):
    require_java()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_spark.py"), "--rows", "200",
                        "--rounds", "1", "--warm-up-rows", "0", "--work-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| spark local[2] (2 cores) |" in r.stdout and "| librdkafka idempotent (1 core) |" in r.stdout


def test_compaction_benchmark_runs_and_prints_its_ratio(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_compaction.py"),
                        "--clean-mb", "2", "--value-sizes", "100", "--seconds", "0.5", "--rounds", "1",
                        "--work-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| 100 B | 2 |" in r.stdout and "| 100 B | on / off |" in r.stdout


def test_latency_benchmark_prints_the_sink_floor_and_the_appliance(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "loadtests", "bench_latency.py"), "--partitions", "1",
                        "--seconds", "1", "--rate-fraction", "0.02"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {cells[1]: cells for line in r.stdout.splitlines()
            if line.startswith("| ") and len(cells := [c.strip() for c in line.split("|")]) > 7}
    # The sink keeps nothing: produce latency only. The appliance: every record acked is consumed.
    assert rows["sink (floor)"][6] == "n/a" and rows["sink (floor)"][7].endswith("/ - / 0")
    acked, consumed, errors = (c.strip() for c in rows["appliance"][7].split("/"))
    assert acked == consumed and int(acked.replace(",", "")) > 0 and errors == "0", r.stdout
    assert rows["appliance"][5] != "n/a" and rows["appliance"][6] != "n/a"
