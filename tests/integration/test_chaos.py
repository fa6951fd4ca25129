"""The chaos suite, short: ``loadtests/chaos.py`` with a fixed seed, every fault kind once.

Transactional producers (confluent-kafka and the appliance's own client), read_committed group
consumers and consume-transform-produce clients run against the real appliance while the
nemesis kills (-9) and pauses (SIGSTOP/SIGCONT) every role, kills the whole process group and
restarts it on the same data dir, fills the data dir's file system (a small ext4 loop device:
needs root, as CI runs; without it the test fails, it never skips) and flips a bit of a sealed
segment; the same run with ``--group-protocol consumer`` (KIP-848 groups), kill -9 and SIGSTOP of
every role only, with the share-queue workload beside it (KIP-932 share consumers killed -9 in
turn: no acknowledged value lost, none accepted twice). A further run puts the data dir on lazyfs (FUSE, root) with the flush policy ``batch``
and cuts the power (every unsynced write dropped) besides the bit flips. The checker must find
zero of every anomaly class (a damaged batch's records are given up, and none may be read after
the damage), the final read must reach every partition's end, the appliance must stop cleanly,
and no worker may die of anything but the faults. The long run is the same tool with more
transactions (README, "Fault testing"; loadtests/README.md, the 30-run table)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from appliance_harness import ROOT

SEED = 17
sys.path.insert(0, os.path.join(ROOT, "loadtests"))

from chaos_nemesis import FAULT_KINDS, ROLES  # noqa: E402
from queue_checker import ANOMALIES  # noqa: E402


def run_chaos(tmp_path, seed: int, *args: str, timeout: float = 400) -> str:
    cmd = [sys.executable, os.path.join(ROOT, "loadtests", "chaos.py"), "--seed", str(seed), *args,
           "--work-dir", str(tmp_path), "--history", str(tmp_path / "history.jsonl")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    out = r.stdout
    print(out[-12000:])                     # the seed, the fault schedule and the counts
    assert f"chaos: seed {seed}" in out
    assert r.returncode == 0, out[-6000:] + r.stderr[-3000:]
    return out


def injected(out: str) -> dict[str, int]:
    line = re.search(r"== faults injected ==\n  (.*)\n", out).group(1)
    return dict((k, int(n)) for k, n in re.findall(r"(\S+) (\d+)", line))


def assert_zero_anomalies(out: str) -> None:
    for name in ANOMALIES:
        m = re.search(rf"^  {re.escape(name)} +(\d+) ", out, re.M)
        assert m and m.group(1) == "0", name


# kill -9 and SIGSTOP of every role; the supervisor's kill -9 as kill-all (the whole group at once,
# restarted in 2-4 s) rather than kill-supervisor (its workers wait out their 5 s heartbeat
# timeout first: 12 s a restart), which the classic run has.
ROLE_FAULTS = [f"kill-{role}" for role in ROLES if role != "supervisor"] + \
    [f"pause-{role}" for role in ROLES] + ["kill-all"]


@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_queue_workload_under_every_fault_has_no_anomaly(tmp_path, group_protocol):
    """``classic``: every fault kind a loop device allows. ``consumer`` (KIP-848, issue 33 item
    7): the group consumers and the consume-transform-produce clients on ``group.protocol=consumer``
    (their TxnOffsetCommits fenced by the member epoch) under kill -9 and SIGSTOP of every role
    (ROLE_FAULTS), shorter (no disk: the storage faults do not touch the group protocol)."""
    if group_protocol == "classic":
        out = run_chaos(tmp_path, SEED, "--transactions", "300", "--fault-interval", "1,2", "--fault-cycles", "1",
                        "--pause", "0.3,6.5", "--disk", "loop", "--disk-mb", "128", "--segment-bytes", "16384")
        expected = set(FAULT_KINDS) - {"power-cut"}
        least = 300
    else:
        out = run_chaos(tmp_path, SEED, "--group-protocol", "consumer", "--transactions", "100",
                        "--fault-interval", "0.8,1.2", "--fault-cycles", "1", "--faults", ",".join(ROLE_FAULTS),
                        "--pause", "0.3,3", "--disk", "none", "--segment-bytes", "16384",
                        "--share-consumers", "3", "--share-kill-interval", "2,4")
        expected = set(ROLE_FAULTS)
        least = 100
        # The groups really ran the new protocol (ListGroups v5's type, while the members were in).
        assert "groups chaos-consumers CONSUMER, chaos-txn CONSUMER" in out, out[-3000:]
        # Issue 36: the share-queue workload beside it (share consumers killed -9 in turn, every
        # role's faults): every acknowledged value accepted, none accepted twice.
        assert_share_queue_clean(out)
    # Every fault kind asked for was injected (not skipped) at least once.
    counts = injected(out)
    assert set(counts) == expected and all(n >= 1 for n in counts.values()), counts
    # Every anomaly class was counted, and each is zero.
    assert_zero_anomalies(out)
    m = re.search(r"transactions (\d+): committed (\d+), aborted (\d+)", out)
    assert int(m.group(1)) >= least and int(m.group(2)) > 0 and int(m.group(3)) > 0, m.group(0)
    # The checker saw a real history: values sent and read back.
    assert os.path.getsize(tmp_path / "history.jsonl") > 0


def assert_share_queue_clean(out: str) -> None:
    """The share-queue workload's section (chaos_share.py): values accepted, consumers killed,
    every acknowledged value accepted (or its accept sent and the partition's lag 0 after the
    drain: done), and every anomaly class zero."""
    m = re.search(r"== share-queue workload ==\n  (.*)\n  anomalies: (.*)", out)
    assert m, out[-3000:]
    stats = dict(kv.rsplit(" ", 1) for kv in m.group(1).split(", "))
    assert int(stats["accepted"]) > 0 and int(stats["consumer kills"]) >= 1, stats
    assert int(stats["accepted"]) == int(stats["acknowledged"]) - int(stats["accept-unknown"]), stats
    classes = m.group(2).split(", ")
    assert {kv.rsplit(" ", 1)[0] for kv in classes} == {"lost", "accepted-twice", "stuck", "garbage",
                                                        "offset-mismatch"}, classes
    assert all(kv.endswith(" 0") for kv in classes), classes


@pytest.mark.soak
def test_queue_workload_under_power_cuts_and_bit_flips_has_no_anomaly(tmp_path, request):
    """Policy ``batch`` on lazyfs: a power cut loses nothing acknowledged (every class holds as
    under kill -9, and the share-queue workload's accepts stay done), and a flipped batch is never
    read after the damage. With ``--soak``: longer,
    every kill of a whole group and of a writer besides, and Kafka's Java clients (kafka-clients
    3.9.1 and 4.3.0) beside the Python ones (their javac and JVMs cost more than the make test
    budget allows)."""
    soak = request.config.getoption("--soak")
    size = (["--transactions", "3000", "--fault-interval", "3,8", "--fault-cycles", "20",
             "--faults", "power-cut,bit-flip,kill-all,kill-writer", "--java"] if soak else
            ["--transactions", "40", "--fault-interval", "2,3", "--fault-cycles", "1",
             "--faults", "power-cut,bit-flip", "--producers", "2", "--consumers", "1", "--txn-clients", "1"])
    # The share-queue workload beside it: an ACCEPT answered before a power cut stays done
    # (the share-state log under the batch policy), a record acquired by a consumer killed -9
    # comes back.
    out = run_chaos(tmp_path, 34, *size, "--disk", "lazyfs", "--segment-bytes", "4096",
                    "--share-consumers", "2", "--share-kill-interval", "2,4",
                    timeout=4 * 3600 if soak else 400)
    counts = injected(out)
    assert counts.get("power-cut", 0) >= 1 and counts.get("bit-flip", 0) >= 1, counts
    assert "flush policy batch" in out
    assert_zero_anomalies(out)
    m = re.search(r"damaged batches (\d+)", out)
    assert m and int(m.group(1)) == counts["bit-flip"], out[-3000:]
    assert_share_queue_clean(out)
    if soak:
        # Kafka's Java clients took part: transactions of both versions' producers, polls of
        # both consumers, in the history the checker read.
        processes = {json.loads(line).get("process", "").split(".")[0]
                     for line in open(tmp_path / "history.jsonl")}
        assert {"jp3", "jp4", "jc4", "ja3"} <= processes, processes
