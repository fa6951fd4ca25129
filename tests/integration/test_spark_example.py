"""examples/spark_pipeline.py against the real appliance, run as a user runs it (a subprocess,
its own Spark session): a load that fails mid-way leaves nothing visible and a second load plus
the report count every order once; two-phase commit off is one line naming the setting; a CSV
load writes each valid order once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from appliance.client import Producer
from client_drivers import create, read_all, settle, uid
from spark_jobs import HERE, broker, java, values  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "spark_pipeline.py")


def _example(broker, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, EXAMPLE, *args, "--bootstrap", broker.bootstrap],
                          capture_output=True, text=True, timeout=600)


def test_pipeline_example_loads_once_after_a_failed_load_and_reports(broker, tmp_path):
    """examples/spark_pipeline.py: a load that fails mid-way leaves nothing to report; the
    load run again, then the report, count every valid order once with the right totals."""
    topic = uid("orders")
    create(broker.bootstrap, {topic: 2})
    n = 20_000
    expected: dict[str, list] = {}
    for i in range(n):
        amount = round(((i * 7919) % 10000) / 100.0, 2) - 5
        if amount > 0:
            expected.setdefault(f"customer-{i % 50}", []).append(amount)
    valid = sum(len(v) for v in expected.values())

    failed = _example(broker, "load", "--topic", topic, "--rows", str(n), "--fail-after", "3000")
    assert failed.returncode != 0 and "injected failure" in failed.stdout + failed.stderr
    settle(broker.bootstrap, topic, 2)
    assert values(read_all(broker.bootstrap, topic, 2, "read_uncommitted")), "rows were sent"
    assert values(read_all(broker.bootstrap, topic, 2)) == [], "nothing of the failed load is visible"

    ok = _example(broker, "load", "--topic", topic, "--rows", str(n))
    assert ok.returncode == 0, ok.stderr[-3000:]
    # Records that are not orders (examples/dual_write.py's payloads) are refused and counted,
    # not reported under a customer "null".
    with Producer(bootstrap_servers=broker.bootstrap) as p:
        for i in range(7):
            p.send(topic, b"order %d (0a1b2c3d)" % i, b"%d" % i)
        p.send(topic, b'{"order_id": 1, "amount": 2.5}', b"x")
        p.send(topic, None, b"tombstone")
    rep = _example(broker, "report", "--topic", topic, "--json")
    assert rep.returncode == 0, rep.stderr[-3000:]
    got = json.loads(rep.stdout.strip().splitlines()[-1])
    assert got["refused"] == 9 and f"refused 9 records of {topic}" in rep.stderr
    assert got["orders"] == got["distinct_orders"] == valid
    assert {c: v["orders"] for c, v in got["customers"].items()} == {c: len(v) for c, v in expected.items()}
    for c, v in got["customers"].items():
        assert v["total"] == pytest.approx(sum(expected[c]), abs=0.01)


def test_pipeline_example_says_in_one_line_that_two_phase_commit_is_off(appliance_factory):
    """Against a broker with two-phase commit off, the load fails before any task runs, and the
    example prints the data source's error as one line naming the setting, not Spark's traceback."""
    off = appliance_factory()
    r = _example(off, "load", "--rows", "10")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: the broker at {off.bootstrap} has two-phase commit off") and \
        "two_phase_commit_enable = true" in last and "APPLIANCE_TRANSACTIONS__TWO_PHASE_COMMIT_ENABLE=true" in last
    assert "Traceback" not in r.stderr


def test_pipeline_example_loads_a_csv(broker, tmp_path):
    """``load --csv``: the valid orders of the file (a positive amount), each once, keyed by
    customer, as the JSON the report reads. (The report's own counting is checked above; read
    back here with a client, the records themselves are checked, without a second Spark run.)"""
    topic = uid("orders-csv")
    create(broker.bootstrap, {topic: 1})
    csv = tmp_path / "orders.csv"
    csv.write_text("order_id,customer,amount\n1,ann,10.5\n2,bob,-3\n3,ann,4.5\n4,cy,0\n5,bob,1.25\n")
    ok = _example(broker, "load", "--topic", topic, "--csv", str(csv))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert f"loaded 3 orders into {topic}" in ok.stdout
    got = sorted(((r.key, json.loads(r.value)) for recs in read_all(broker.bootstrap, topic, 1).values()
                  for r in recs), key=lambda kv: kv[1]["order_id"])
    assert got == [(b"ann", {"order_id": 1, "customer": "ann", "amount": 10.5}),
                   (b"ann", {"order_id": 3, "customer": "ann", "amount": 4.5}),
                   (b"bob", {"order_id": 5, "customer": "bob", "amount": 1.25})]
