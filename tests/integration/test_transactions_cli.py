"""`appliance transactions ...` and `appliance metrics` against the real appliance: the commands
run as subprocesses, as an operator would run them (KIP-939 admin: list, describe, abort a hanging
transaction, force-terminate a prepared one; the ActiveTransactionOpenTimeMaxMs metric, printed
in Prometheus' text format)."""

from __future__ import annotations

import os
import subprocess
import sys

from raw_wire import READ_COMMITTED, RawClient, create_topic, fetch
from test_txn_2pc_wire import committed_values, init_v6, open_2pc_txn
from txn_wire import Txn, describe

APPLIANCE = os.path.join(os.path.dirname(sys.executable), "appliance")
# KIP-939's kafka.coordinator.transaction:type=TransactionStateManager,name=ActiveTransactionOpenTimeMaxMs
ACTIVE_TXN_OPEN_TIME_MAX = \
    "kafka_coordinator_transaction_transactionstatemanager_activetransactionopentimemaxms"


def open_time_max(app) -> float | None:
    """The metric's value as `appliance metrics` prints it (the scrape's text format)."""
    out = cli(app, "metrics", "--data-dir", app.data_dir, ACTIVE_TXN_OPEN_TIME_MAX).stdout
    for line in out.splitlines():
        if line.startswith(ACTIVE_TXN_OPEN_TIME_MAX + " "):
            return float(line.split()[1])
    return None


def cli(app, *args, ok=True):
    r = subprocess.run([APPLIANCE, *args], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def tx(app, *args, ok=True):
    return cli(app, "transactions", "--bootstrap-server", app.bootstrap, *args, ok=ok)


def test_list_describe_metrics_and_force_terminate_a_prepared_transaction(appliance_factory):
    app = appliance_factory(transactions={"two_phase_commit_enable": True})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "cli")
        t = open_2pc_txn(raw, "cli-2pc", "cli", [b"prepared"])
        assert init_v6(raw, "cli-2pc", enable_2pc=True, keep=True).error_code == 0
        done = Txn(raw, "cli-done")
        done.must_add("cli", [0])
        done.must_send("cli", 0, [b"done"])
        done.commit()
        out = tx(app, "list").stdout.splitlines()
        assert out[0] == "TransactionalId\tProducerId\tTransactionState"
        assert f"cli-2pc\t{t.pid}\tOngoing" in out and f"cli-done\t{done.pid}\tCompleteCommit" in out
        only = tx(app, "list", "--state", "Ongoing").stdout.splitlines()[1:]
        assert only == [f"cli-2pc\t{t.pid}\tOngoing"]
        row = tx(app, "describe", "--transactional-id", "cli-2pc").stdout.splitlines()[1].split("\t")
        assert row[:6][:5] == ["cli-2pc", str(t.pid), str(t.epoch), "Ongoing", "-1"] and row[6] == "cli-0", row
        # a transactional id with no transaction yet (start time -1) describes too
        Txn(raw, "cli-empty")
        row = tx(app, "describe", "--transactional-id", "cli-empty").stdout.splitlines()[1].split("\t")
        assert row[3] == "Empty" and row[5] == "-1", row
        missing = tx(app, "describe", "--transactional-id", "nope", ok=False)
        assert missing.returncode == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr
        # the metric: the prepared transaction has been open a while (a second, at least)
        app.wait_for(lambda: (open_time_max(app) or 0) >= 1000, timeout=15,
                     what="the prepared transaction's open time in the metrics")
        # force-terminate: aborted, both incarnations fenced
        r = tx(app, "force-terminate", "--transactional-id", "cli-2pc")
        assert "terminated" in r.stdout, r.stdout
        assert describe(raw, "cli-2pc").transaction_state == "Empty"
        assert committed_values(raw, "cli") == [b"done"]
        f = fetch(raw, "cli", 0, isolation=READ_COMMITTED)
        assert (t.pid, 0) in f.aborted
        # nothing open any more
        app.wait_for(lambda: open_time_max(app) == 0, timeout=10,
                     what="no open transaction in the metrics")


def test_abort_a_hanging_transaction_by_its_start_offset(appliance_factory):
    # Without KIP-890 verification a producer can write to a partition it never added: the
    # coordinator does not know that transaction, and only an admin abort ends it.
    app = appliance_factory(transactions={"partition_verification_enable": False})
    with RawClient(app.bootstrap) as raw:
        create_topic(raw, "hang")
        t = Txn(raw, "hanger")
        t.must_send("hang", 0, [b"hanging"])
        assert fetch(raw, "hang", 0, isolation=READ_COMMITTED).last_stable_offset == 0
        usage = tx(app, "abort", "--topic", "hang", "--partition", "0", ok=False)
        assert usage.returncode != 0
        tx(app, "abort", "--topic", "hang", "--partition", "0", "--start-offset", "0")
        f = fetch(raw, "hang", 0, isolation=READ_COMMITTED)
        assert f.last_stable_offset == 2 and f.aborted == [(t.pid, 0)], f
        assert committed_values(raw, "hang") == []
        wrong = tx(app, "abort", "--topic", "hang", "--partition", "0", "--start-offset", "7", ok=False)
        assert wrong.returncode == 1 and "no open transaction" in wrong.stderr


def test_metrics_of_a_stopped_appliance_are_reported_stale(appliance_factory, tmp_path):
    """After the broker stopped (killed: its runtime dir is left behind), `appliance metrics`
    says so and exits 1 instead of printing what is left as if it were live. The runtime dir is
    the test's own: any appliance starting meanwhile removes the dead supervisors' runtime dirs
    under /dev/shm (a parallel test run's did, between the kill and the check)."""
    app = appliance_factory(server={"runtime_dir": str(tmp_path / "run")})
    assert open_time_max(app) == 0
    run_dir = app.run_dir
    app.kill9_all()
    r = cli(app, "metrics", "--data-dir", app.data_dir, ok=False)
    assert r.returncode == 1 and r.stdout == ""
    assert f"stale: the appliance that made {run_dir}" in r.stderr
    assert "is the appliance running?" in r.stderr
    app.restart()
    app.terminate()
    r = cli(app, "metrics", "--data-dir", app.data_dir, ok=False)
    assert r.returncode == 1 and "no appliance runs on" in r.stderr
