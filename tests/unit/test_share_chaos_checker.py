"""The share-queue workload's checker (``loadtests/chaos_share.py``) on hand-made histories, one
per anomaly class, and a clean one with redeliveries and an accept whose answer was lost."""

from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "loadtests"))

from chaos_share import ShareWorkload  # noqa: E402


def workload(sent, delivered=(), accepted=(), unconfirmed=()) -> ShareWorkload:
    w = ShareWorkload("127.0.0.1:1", 2, 1, 1, random.Random(1), 0.0)
    w.sent = dict(sent)
    for value, p, o, count, who in delivered:
        w.delivered.setdefault(value, []).append((p, o, count, who))
    for value, p, o, who in accepted:
        w.accepted.setdefault((p, o), []).append(who)
        w.accepted_values.add(value)
    w.unconfirmed = set(unconfirmed)
    w.lags = {p: 0 for p, _ in w.sent.values()}
    return w


def classes(w: ShareWorkload) -> dict[str, int]:
    return {k: len(v) for k, v in w.check()["anomalies"].items() if v}


def test_a_clean_history_with_redeliveries_and_a_lost_answer_has_no_anomaly() -> None:
    w = workload({"s0-0": (0, 0), "s0-1": (1, 0), "s0-2": (0, 1)},
                 delivered=[("s0-0", 0, 0, 1, "a"), ("s0-0", 0, 0, 2, "b"), ("s0-1", 1, 0, 1, "a"),
                            ("s0-2", 0, 1, 1, "b")],
                 accepted=[("s0-0", 0, 0, "b"), ("s0-1", 1, 0, "a")], unconfirmed=["s0-2"])
    r = w.check()
    assert classes(w) == {}
    assert (r["stats"]["accepted"], r["stats"]["redelivered"], r["stats"]["accept-unknown"]) == (2, 1, 1)


def test_each_anomaly_class_is_found() -> None:
    # never delivered; delivered and dropped (no accept, no failed accept)
    assert classes(workload({"s0-0": (0, 0), "s0-1": (0, 1)},
                            delivered=[("s0-1", 0, 1, 1, "a")])) == {"lost": 2}
    # one offset accepted with confirmation by two consumers
    assert classes(workload({"s0-0": (0, 0)}, delivered=[("s0-0", 0, 0, 1, "a"), ("s0-0", 0, 0, 2, "b")],
                            accepted=[("s0-0", 0, 0, "a"), ("s0-0", 0, 0, "b")])) == {"accepted-twice": 1}
    # a share partition left with records neither acknowledged nor archived after the drain
    w = workload({"s0-0": (0, 0), "s0-1": (1, 0)}, delivered=[("s0-0", 0, 0, 1, "a"), ("s0-1", 1, 0, 1, "a")],
                 accepted=[("s0-0", 0, 0, "a")], unconfirmed=["s0-1"])
    w.lags = {0: 0, 1: 1}
    assert classes(w) == {"stuck": 1}
    # a value nobody sent; one delivered at an offset its delivery report did not give
    assert classes(workload({"s0-0": (0, 0)}, delivered=[("x", 0, 5, 1, "a"), ("s0-0", 0, 3, 1, "a")],
                            accepted=[("s0-0", 0, 3, "a")])) == {"garbage": 1, "offset-mismatch": 1}
