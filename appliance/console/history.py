"""The Overview's charts (produce and fetch rates and request latency) and the Groups page's lag
charts, over the last hour, kept in memory.

Runs in the console worker; owns the last hour of samples (one every ``SAMPLE_S``), taken from
what every process publishes (``appliance.metrics.collector``: the metrics tables, read without
waiting for or waking a worker), so charting costs the data path nothing. A console restart
starts the hour afresh. Sans-IO but for the collector handed in: ``add`` takes the counters'
totals and the time, ``series`` gives the rates between samples. ``GroupLags`` (sans-IO) holds
each watched group's lag per partition.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

SAMPLE_S = 5.0
KEEP_S = 3600.0

MESSAGES_IN = "kafka_server_brokertopicmetrics_messagesin"
BYTES_IN = "kafka_server_brokertopicmetrics_bytesin"
BYTES_OUT = "kafka_server_brokertopicmetrics_bytesout"
TOTAL_TIME = "kafka_network_requestmetrics_totaltimems"
REQUESTS = "kafka_network_requestmetrics_requests"


@dataclass(frozen=True)
class Totals:
    """Counter totals at one moment (every topic, every frontend)."""
    at: float                    # wall clock, seconds
    messages_in: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    produce_ms: float = 0.0      # sum of Produce requests' total time
    produce_n: float = 0.0
    fetch_ms: float = 0.0
    fetch_n: float = 0.0
    requests: float = 0.0


def totals(families, at: float) -> Totals:
    """``Totals`` from the collector's metric families."""
    acc = {"messages_in": 0.0, "bytes_in": 0.0, "bytes_out": 0.0, "produce_ms": 0.0,
           "produce_n": 0.0, "fetch_ms": 0.0, "fetch_n": 0.0, "requests": 0.0}
    names = {MESSAGES_IN + "_total": "messages_in", BYTES_IN + "_total": "bytes_in",
             BYTES_OUT + "_total": "bytes_out", REQUESTS + "_total": "requests"}
    for fam in families:
        if fam.name in (MESSAGES_IN, BYTES_IN, BYTES_OUT, REQUESTS):
            for s in fam.samples:
                key = names.get(s.name)
                if key:
                    acc[key] += s.value
        elif fam.name == TOTAL_TIME:
            for s in fam.samples:
                api = s.labels.get("request")
                if api not in ("Produce", "Fetch"):
                    continue
                pre = "produce" if api == "Produce" else "fetch"
                if s.name.endswith("_sum"):
                    acc[pre + "_ms"] += s.value
                elif s.name.endswith("_count"):
                    acc[pre + "_n"] += s.value
    return Totals(at, **acc)


class History:
    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self.samples: deque[Totals] = deque()

    def add(self, t: Totals) -> None:
        if self.samples and t.at <= self.samples[-1].at:
            return
        self.samples.append(t)
        while self.samples and t.at - self.samples[0].at > self.keep_s:
            self.samples.popleft()

    def series(self) -> dict[str, list]:
        """Per interval between samples: its end time, records/s and bytes/s in, bytes/s out,
        mean Produce and Fetch latency (ms; None without requests). A counter that went down
        (a frontend restarted with fresh counters) gives no point for that interval."""
        out: dict[str, list] = {k: [] for k in ("t", "messages_in", "bytes_in", "bytes_out",
                                                "produce_ms", "fetch_ms")}
        s = list(self.samples)
        for a, b in zip(s, s[1:]):
            dt = b.at - a.at
            d = {k: getattr(b, k) - getattr(a, k) for k in ("messages_in", "bytes_in", "bytes_out",
                                                            "produce_ms", "produce_n", "fetch_ms",
                                                            "fetch_n")}
            if any(v < 0 for v in d.values()) or dt <= 0:
                continue
            out["t"].append(round(b.at, 3))
            out["messages_in"].append(d["messages_in"] / dt)
            out["bytes_in"].append(d["bytes_in"] / dt)
            out["bytes_out"].append(d["bytes_out"] / dt)
            out["produce_ms"].append(d["produce_ms"] / d["produce_n"] if d["produce_n"] else None)
            out["fetch_ms"].append(d["fetch_ms"] / d["fetch_n"] if d["fetch_n"] else None)
        return out


MAX_GROUPS = 100


class GroupLags:
    """The Groups page's lag charts: per group, its lag per partition and in total over the last
    hour, one point per ``SAMPLE_S`` at most. A point is taken whenever the console reads the
    group's lag (its page and the chart's refresh, as the viewing principal: with SASL the console
    has no identity of its own to read groups with), so the hour holds what was watched. At most
    ``MAX_GROUPS`` groups are kept, the longest unwatched going first."""

    def __init__(self, keep_s: float = KEEP_S, every_s: float = SAMPLE_S,
                 max_groups: int = MAX_GROUPS) -> None:
        self.keep_s, self.every_s, self.max_groups = keep_s, every_s, max_groups
        self.groups: dict[str, deque[tuple[float, dict[str, int]]]] = {}

    def add(self, group: str, at: float, lag: dict[str, int]) -> None:
        """``lag``: "topic-partition" -> lag (partitions without a committed offset left out)."""
        q = self.groups.pop(group, None)
        if q is None:
            q = deque()
            while len(self.groups) >= self.max_groups:
                del self.groups[next(iter(self.groups))]
        self.groups[group] = q            # the most recently watched last
        if q and at - q[-1][0] < self.every_s * 0.8:
            q[-1] = (q[-1][0], dict(lag))      # too soon for a new point: the latest wins
        else:
            q.append((at, dict(lag)))
        while q and at - q[0][0] > self.keep_s:
            q.popleft()

    def series(self, group: str) -> dict:
        """uPlot's columns: ``t``, ``total`` and one list per partition (None where a
        partition had no lag to show at that point), ``partitions`` names them in order."""
        points = list(self.groups.get(group, ()))
        names = sorted({n for _, lag in points for n in lag},
                       key=lambda n: (n.rpartition("-")[0], int(n.rpartition("-")[2] or 0)))
        return {"t": [round(t, 3) for t, _ in points],
                "total": [sum(lag.values()) for _, lag in points],
                "partitions": names,
                "lag": [[lag.get(n) for _, lag in points] for n in names]}
