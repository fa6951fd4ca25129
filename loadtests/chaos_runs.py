"""Many chaos runs in a row and their table (issue 34: Jepsen's 30 runs, scaled to a shared machine).

    .venv/bin/python loadtests/chaos_runs.py [--runs 30] [--duration 60] [--first-seed 3400]
        [--out DIR] [-- extra chaos.py arguments]

Not a test. Runs ``loadtests/chaos.py`` ``--runs`` times, one after the other, alternating two
set-ups so that every fault kind comes up:

* ``lazyfs``: the data dir on lazyfs, flush policy ``batch``: power cuts and bit flips among
  kill -9 of everything, of a writer, of the coordinator, and a writer's SIGSTOP;
* ``loop``: the data dir on a small ext4 loop device: bit flips and disk-full among kill -9 of
  everything, of a writer, of the fetcher, and the coordinator's SIGSTOP.

Each run is ``--duration`` seconds of workload (``--transactions 0``), faults every
``--fault-interval``. ``--jepsen`` is Jepsen's Bufstream settings scaled to this machine (issue 34
part 4): 300 s runs, a fault every 10 s in 60 s of faults then a 30 s calm window (every fault
healed), 10 % aborts, transactions of up to 4 sends, the Java clients in (``--java``: a subscribed
and an assigned read_committed consumer beside the Python group's), 64 KiB segments. Prints, per run, the seed, the set-up, the load average before it, the
transactions, the faults injected and every anomaly class that was not zero, and at the end a
markdown table (one line per run) and the total per anomaly class. A run's output is kept in
``--out`` (``run-<n>.out``, and a failed run's appliance log beside it). Exit status 1 if any run
failed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from queue_checker import ANOMALIES  # noqa: E402

# The storage faults come up in every run (with every kind at once, 8-10 faults a short run
# left them out of most runs); the kills and pauses of each role are in test_chaos's run.
SETUPS = {
    "lazyfs": ["--disk", "lazyfs", "--faults", "power-cut,bit-flip,kill-all,kill-writer,kill-coordinator,pause-writer"],
    "loop": ["--disk", "loop", "--disk-mb", "128",
             "--faults", "bit-flip,disk-full,kill-all,kill-writer,kill-fetcher,pause-coordinator"],
}


def parse(out: str) -> dict:
    got: dict = {"anomalies": {}}
    for name in ANOMALIES:
        m = re.search(rf"^  {re.escape(name)} +(\d+) ", out, re.M)
        got["anomalies"][name] = int(m.group(1)) if m else None
    m = re.search(r"transactions (\d+): committed (\d+), aborted (\d+), unknown outcome (\d+)", out)
    got["txns"] = tuple(int(x) for x in m.groups()) if m else None
    m = re.search(r"== faults injected ==\n  (.*)\n", out)
    got["faults"] = m.group(1) if m else "?"
    m = re.search(r"damaged batches (\d+)", out)
    got["damaged"] = int(m.group(1)) if m else 0
    m = re.search(r"clients hung in librdkafka's send_offsets_to_transaction .*: \[(.*)\]", out)
    got["hangs"] = len(m.group(1).split(",")) if m else 0
    got["pass"] = "PASS: zero anomalies" in out
    got["cuts"] = re.findall(r"^  (power cuts \(.*)$", out, re.M)
    got["problems"] = re.findall(r"PROBLEM: (.*)", out)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--fault-interval", default="3,6")
    ap.add_argument("--first-seed", type=int, default=3400)
    ap.add_argument("--segment-bytes", type=int, default=16384,
                    help="small, so that sealed segments (the bit flip's targets) come early")
    ap.add_argument("--setups", default="lazyfs,loop", help="comma list of: " + ", ".join(SETUPS))
    ap.add_argument("--jepsen", action="store_true",
                    help="300 s runs, faults every 10 s with 30 s calm windows after 60 s of faults, 10 %% aborts, "
                         "up to 4 sends a transaction, --java (overrides --duration and --fault-interval)")
    ap.add_argument("--flush-policy", default="batch", help="the lazyfs set-up's [log.flush] policy")
    ap.add_argument("--out", default="chaos-runs")
    ap.add_argument("extra", nargs="*", help="more chaos.py arguments (after --)")
    args = ap.parse_args()
    jepsen: list[str] = []
    if args.jepsen:
        args.duration, args.fault_interval, args.segment_bytes = 300, "10,10", 65536
        jepsen = ["--calm", "60,30", "--abort-probability", "0.1", "--max-sends", "4", "--java"]
    os.makedirs(args.out, exist_ok=True)
    setups = args.setups.split(",")
    rows = []
    for n in range(args.runs):
        seed = args.first_seed + n
        setup = setups[n % len(setups)]
        load = os.getloadavg()
        cmd = [sys.executable, os.path.join(HERE, "chaos.py"), "--seed", str(seed), "--transactions", "0",
               "--duration", str(args.duration), "--fault-interval", args.fault_interval,
               "--segment-bytes", str(args.segment_bytes), *SETUPS[setup], *jepsen,
               *(["--flush-policy", args.flush_policy] if setup == "lazyfs" else []), "--work-dir", args.out,
               "--history", os.path.join(args.out, f"run-{n}.history.jsonl"), *args.extra]
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
        wall = time.monotonic() - t
        with open(os.path.join(args.out, f"run-{n}.out"), "w") as f:
            f.write(r.stdout + "\n--- stderr ---\n" + r.stderr[-20000:])
        got = parse(r.stdout)
        got.update(n=n, seed=seed, setup=setup, load=load, wall=wall, rc=r.returncode)
        if got["pass"]:
            os.unlink(os.path.join(args.out, f"run-{n}.history.jsonl"))
        rows.append(got)
        bad = {k: v for k, v in got["anomalies"].items() if v}
        print(f"run {n} seed {seed} {setup} load {load[0]:.1f}: rc {r.returncode} in {wall:.0f}s, "
              f"txns {got['txns']}, faults: {got['faults']}; damaged batches {got['damaged']}; "
              f"anomalies {bad or 0}; librdkafka#5456 hangs {got['hangs']}"
              + (f"; {'; '.join(got['cuts'])}" if got["cuts"] else "")
              + (f"; problems {got['problems']}" if got["problems"] else ""),
              flush=True)
    print("\n| run | seed | set-up | load (1 min) | txns (ok/aborted/unknown) | faults | damaged batches | "
          "librdkafka#5456 hangs | anomalies | result |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for g in rows:
        bad = ", ".join(f"{k} {v}" for k, v in g["anomalies"].items() if v) or "0"
        txns = "/".join(str(x) for x in g["txns"][1:]) if g["txns"] else "?"
        print(f"| {g['n']} | {g['seed']} | {g['setup']} | {g['load'][0]:.1f} | {txns} | {g['faults']} | "
              f"{g['damaged']} | {g['hangs']} | {bad} | {'PASS' if g['pass'] else 'FAIL'} |")
    print("\ntotal per anomaly class over the runs:")
    for name in ANOMALIES:
        print(f"  {name:<22} {sum(g['anomalies'].get(name) or 0 for g in rows)}")
    failed = [g["n"] for g in rows if not g["pass"]]
    print(f"runs {len(rows)}, passed {len(rows) - len(failed)}, failed {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
