"""The per-record walk of produce validation: our C walk, aiokafka's parser and the Python walk.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_validate.py [--records 10,60,1000] [--value-sizes 100,1024]
        [--codecs none,lz4,zstd] [--repeat 5]

For each batch shape (records per batch, value size, codec; built by the appliance's own record
encoder, keys of 10 bytes, no headers, CreateTime) it times ``record_contents.validate_records``
as the frontend calls it (header already read, a message.timestamp.before.max.ms limit set so
that every record's timestamp is looked at) with each walk in turn, best of ``--repeat`` runs,
and prints nanoseconds per record, the call's fixed cost included, and each walk's ratio to the
C walk. Compressed rows include the decompression, which is the same for every walk.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from appliance.protocol import record_contents as RC  # noqa: E402
from appliance.protocol import records as R  # noqa: E402

NOW_MS = 1_700_000_000_000
CODECS = {"none": 0, "gzip": R.COMPRESSION_GZIP, "snappy": R.COMPRESSION_SNAPPY,
          "lz4": R.COMPRESSION_LZ4, "zstd": R.COMPRESSION_ZSTD}
WALKS = ("c", "aiokafka", "python")


def batch(records: int, value_size: int, codec: int) -> bytes:
    value = os.urandom(value_size)
    return R.build_batch([R.Record(b"key%07d" % i, value, [], NOW_MS + i) for i in range(records)],
                         compression=codec)


def per_record_ns(buf: bytes, walk: str, repeat: int, budget_s: float = 0.2) -> float | None:
    """Best of ``repeat`` timed loops (each about ``budget_s``) in ns per record; None when the
    walk is not available in this install."""
    saved = RC._native_ok, RC._FastBatch
    if (walk == "c" and saved[0] is None) or (walk == "aiokafka" and saved[1] is None):
        return None
    if walk != "c":
        RC._native_ok = None
    if walk == "python":
        RC._FastBatch = None
    try:
        h = R.read_header(buf)
        kw = dict(max_bytes=64 << 20, now_ms=NOW_MS, before_ms=3_600_000)
        t = time.perf_counter()
        RC.validate_records(buf, h, **kw)
        loops = max(1, int(budget_s / max(time.perf_counter() - t, 1e-7)))
        best = float("inf")
        for _ in range(repeat):
            t = time.perf_counter()
            for _ in range(loops):
                RC.validate_records(buf, h, **kw)
            best = min(best, (time.perf_counter() - t) / loops)
        return best / h.records_count * 1e9
    finally:
        RC._native_ok, RC._FastBatch = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", default="10,60,1000", help="records per batch, comma-separated")
    ap.add_argument("--value-sizes", default="100,1024", help="value bytes, comma-separated")
    ap.add_argument("--codecs", default="none,lz4,zstd", help=f"of {', '.join(CODECS)}")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    if RC._native_ok is None:
        print("the C walk is not built (no compiler at install time?): its column stays empty")
    print(f"{'records':>8} {'value':>6} {'codec':>6} " + " ".join(f"{w + ' ns/rec':>16}" for w in WALKS)
          + f" {'aiokafka/c':>11} {'python/c':>9}")
    for codec in a.codecs.split(","):
        for size in map(int, a.value_sizes.split(",")):
            for n in map(int, a.records.split(",")):
                buf = batch(n, size, CODECS[codec])
                got = {w: per_record_ns(buf, w, a.repeat) for w in WALKS}
                cells = " ".join(f"{got[w]:16.1f}" if got[w] is not None else f"{'-':>16}"
                                 for w in WALKS)
                ratio = (lambda w: f"{got[w] / got['c']:.1f}x" if got[w] and got["c"] else "-")
                print(f"{n:8d} {size:6d} {codec:>6} {cells} {ratio('aiokafka'):>11} "
                      f"{ratio('python'):>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
