"""Broker-side recompression (topic ``compression.type`` other than ``producer``): the cost per
MiB of record data of ``recompress.recompress``, as a frontend pays it in Produce.

Not a test; run by hand in the user's shell:

    .venv/bin/python loadtests/bench_recompress.py [--values text,random] [--repeat 5]

For each (producer codec -> topic codec) pair it builds one batch of 1 KiB values holding about
1 MiB of records (the appliance's own encoder, keys of 10 bytes), then times ``recompress`` at
the topic codec's KIP-390 default level (gzip -1 = zlib 6, lz4 9 = LZ4 HC, zstd 3), best of
``--repeat`` runs, and prints milliseconds per MiB of record data (decompression of the source
included) and the stored size. "text" values are repetitive log-like lines (compress 5-10x),
"random" ones do not compress. The ``producer`` topic codec costs nothing here: its batches
never reach ``recompress``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from appliance.protocol import records as R  # noqa: E402
from appliance.protocol.recompress import TOPIC_CODECS, level_for, recompress  # noqa: E402
from appliance.topic_config import LogSettings  # noqa: E402

NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
PAIRS = [("none", "lz4"), ("none", "zstd"), ("none", "gzip"), ("none", "snappy"),
         ("lz4", "zstd"), ("zstd", "lz4"), ("snappy", "zstd"), ("gzip", "zstd"), ("zstd", "none")]
TOPIC_NAME = {"none": "uncompressed", "gzip": "gzip", "snappy": "snappy", "lz4": "lz4", "zstd": "zstd"}
MiB = 1 << 20


def values(kind: str, n: int) -> list[bytes]:
    if kind == "random":
        return [os.urandom(1024) for _ in range(n)]
    rnd = random.Random(7)
    words = ["GET", "POST", "/api/v1/orders", "/health", "200", "404", "user=", "latency_ms=",
             "INFO", "WARN", "request", "served", "from", "cache", "backend"]
    out = []
    for i in range(n):
        line = " ".join(rnd.choice(words) + str(rnd.randrange(1000)) for _ in range(200))
        out.append(line.encode()[:1024].ljust(1024, b" "))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", default="text,random")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print("| values | producer codec | topic codec | ms per MiB | MiB/s per core | stored bytes per MiB |")
    print("|---|---|---|---|---|---|")
    for kind in args.values.split(","):
        vals = values(kind, 1000)
        recs = [R.Record(b"key%07d" % i, v, [], 1_700_000_000_000 + i) for i, v in enumerate(vals)]
        raw_bytes = sum(len(v) + 10 for v in vals)
        for src, dst in PAIRS:
            src_id = [k for k, v in NAMES.items() if v == src][0]
            dst_id = TOPIC_CODECS[TOPIC_NAME[dst]]
            buf = R.build_batch(recs, compression=src_id)
            h = R.validate_batch(buf, 64 * MiB)
            level = level_for(LogSettings(), dst_id)
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                out = recompress(buf, h, dst_id, level, 64 * MiB)
                best = min(best, time.perf_counter() - t)
            ms_per_mib = best * 1000 * MiB / raw_bytes
            print(f"| {kind} | {src} | {dst} | {ms_per_mib:.2f} | {1000 / ms_per_mib:.0f} | "
                  f"{len(out) * MiB // raw_bytes:,} |")


if __name__ == "__main__":
    main()
