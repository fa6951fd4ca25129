"""ops/grafana/appliance.json against the metric catalog (appliance.metrics): every series a panel
queries is one the endpoint exposes, every metric has a panel, and every label a panel groups by
is one of its metric's labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from appliance.metrics import CATALOG, COUNTER, HISTOGRAM

DASHBOARD = Path(__file__).resolve().parents[2] / "ops" / "grafana" / "appliance.json"
NAME = re.compile(r"\b((?:kafka|appliance)_[a-z0-9_]+)")
BY = re.compile(r"\bby \(([^)]*)\)")


def exposed() -> dict[str, str]:
    """Series name as scraped -> catalog name."""
    out = {}
    for name, m in CATALOG.items():
        if m.kind == COUNTER:
            out[f"{name}_total"] = name
        elif m.kind == HISTOGRAM:
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = name
        else:
            out[name] = name
    return out


def exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_every_queried_series_is_exposed_and_every_metric_has_a_panel():
    names = exposed()
    used = set()
    for e in exprs():
        found = NAME.findall(e)
        assert found, e
        for n in found:
            assert n in names, f"{n} (in {e}) is not a metric of the appliance"
            used.add(names[n])
    assert set(CATALOG) - used == set()


def test_panels_group_by_labels_their_metrics_have():
    names = exposed()
    for e in exprs():
        labels = set()
        for n in NAME.findall(e):
            labels |= set(CATALOG[names[n]].labels)
        for group in BY.findall(e):
            for label in (x.strip() for x in group.split(",")):
                assert label in labels | {"le", "job", "instance"}, (label, e)
