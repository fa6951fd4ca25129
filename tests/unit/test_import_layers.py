"""The import layering of docs/architecture.md ("Layers"), held: every import of the product's
code (appliance/, workers/, shm/) goes to its own layer or a lower one, the units import each other
without a circle, and the client side (our Kafka client, the Spark source) reaches nothing of the
broker's state. Regression: config imported appliance.security, the log imported the catalog,
and the catalog and nine other packages imported appliance.log for atomic_write alone.

The walk reads the source (ast), so it also sees the imports inside functions."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("appliance", "workers", "shm")

# Bottom first. A unit is a top-level module or subpackage of appliance/, or workers/, or shm/.
LAYERS = [
    {"shm", "appliance.errors", "appliance.durable", "appliance.testhooks",
     "appliance.principal_rules", "appliance.listeners", "appliance.config_checks",
     "appliance.http"},
    {"appliance.protocol", "appliance.config", "appliance.config_print",
     "appliance.broker_dynamic_configs", "appliance.group_config"},
    {"appliance.ipc", "appliance.service", "appliance.runtime", "appliance.topic_config",
     "appliance.data_layout", "appliance.reload", "appliance.fetch_session"},
    {"appliance.catalog", "appliance.log", "appliance.acl", "appliance.security",
     "appliance.metrics", "appliance.quota"},
    {"appliance.txn", "appliance.client"},
    {"appliance.group", "appliance.spark"},
    {"appliance.api", "appliance.console"},
    {"workers"},
    {"appliance.supervisor"},
    {"appliance.cli"},
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}
# The client side runs in the clients' processes: it speaks the protocol, never the broker's
# state or its channels (it must work against a Kafka cluster unchanged).
CLIENT_SIDE = {"appliance.client", "appliance.spark"}
BROKER_SIDE = {"appliance.ipc", "appliance.service", "appliance.catalog", "appliance.log",
               "appliance.metrics", "appliance.quota", "appliance.txn", "appliance.group", "appliance.api", "workers",
               "appliance.supervisor", "appliance.runtime", "appliance.reload",
               "appliance.fetch_session"}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "appliance" else ".".join(parts[:2])


def imports(root: Path = ROOT) -> list[tuple[str, str]]:
    """(importing module, imported module) for every import between product modules."""
    mods = _modules(root)
    found = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            for t in targets:
                if t.split(".")[0] not in PACKAGES:
                    continue
                while t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                found.append((name, t))
    return found


def test_every_unit_has_a_layer():
    units = {unit(m) for m in _modules()} - {"appliance"}
    assert sorted(units - set(LAYER)) == []


def test_no_import_climbs_a_layer():
    climbs = sorted(f"{a} -> {b}" for a, b in imports()
                    if unit(a) in LAYER and unit(b) in LAYER and LAYER[unit(b)] > LAYER[unit(a)])
    assert climbs == []


def test_units_import_each_other_without_a_circle():
    graph = collections.defaultdict(set)
    for a, b in imports():
        if unit(a) != unit(b):
            graph[unit(a)].add(unit(b))
    state: dict[str, int] = {}
    circles = []

    def visit(u, path):
        state[u] = 1
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                circles.append(" -> ".join(path[path.index(v):] + [v]))
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2
    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    assert circles == []


def test_the_client_side_reaches_nothing_of_the_broker():
    reached = sorted(f"{a} -> {b}" for a, b in imports()
                     if unit(a) in CLIENT_SIDE and unit(b) in BROKER_SIDE)
    assert reached == []


def test_the_walk_sees_every_form_of_import(tmp_path):
    """The walk itself (otherwise the tests above could not fail): absolute, relative, ``from
    package import module`` and function-level imports are all found."""
    (tmp_path / "appliance" / "api").mkdir(parents=True)
    (tmp_path / "appliance" / "__init__.py").write_text("")
    (tmp_path / "appliance" / "api" / "__init__.py").write_text("")
    (tmp_path / "appliance" / "api" / "fetch.py").write_text("")
    (tmp_path / "appliance" / "config.py").write_text("")
    (tmp_path / "appliance" / "errors.py").write_text(
        "from . import config\n"
        "def f():\n    from appliance.api import fetch\n    import appliance.api\n")
    assert sorted(imports(tmp_path)) == [("appliance.errors", "appliance.api"),
                                         ("appliance.errors", "appliance.api.fetch"),
                                         ("appliance.errors", "appliance.config")]
