"""Metrics files: each worker that has metrics publishes them as one JSON file per worker in
``<data_dir>/metrics/``, rewritten about once a second (atomically: a temporary file renamed over
the old one), and ``appliance metrics`` prints them.

A file is owned by the worker that writes it (today only the coordinator worker,
``coordinator.json``); readers never lock anything. Names are Kafka's JMX names, so dashboards
keyed on them carry over to a Kafka cluster. Each file also holds ``updated_ms`` (wall clock of
the write) so a reader can tell a stale file from a live one.
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["METRICS_DIR", "ACTIVE_TXN_OPEN_TIME_MAX", "publish", "read_all"]

METRICS_DIR = "metrics"
# Files are rewritten every second; one older than this was left by a worker that stopped.
STALE_AFTER_S = 10
# KIP-939
ACTIVE_TXN_OPEN_TIME_MAX = ("kafka.coordinator.transaction:type=TransactionStateManager,"
                            "name=ActiveTransactionOpenTimeMaxMs")


def publish(data_dir: str, source: str, values: dict[str, float | int]) -> None:
    """Replace ``<data_dir>/metrics/<source>.json`` with ``values`` (plus ``updated_ms``)."""
    d = os.path.join(data_dir, METRICS_DIR)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{source}.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({**values, "updated_ms": int(time.time() * 1000)}, f, sort_keys=True)
    os.replace(tmp, path)


def read_all(data_dir: str) -> dict[str, dict]:
    """Every published metrics file, by source name; unreadable files are left out."""
    d = os.path.join(data_dir, METRICS_DIR)
    out: dict[str, dict] = {}
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(d, name)) as f:
                out[name[:-5]] = json.load(f)
        except (OSError, ValueError):
            continue
    return out
