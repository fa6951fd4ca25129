import os
import sys

import pytest

# Let tests import the integration helpers by name (`from appliance_harness import Appliance`):
# tests/README.md lists them. Unit tests import the helpers next to them.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))


def pytest_addoption(parser):
    group = parser.getgroup("appliance soak runs")
    group.addoption("--soak", action="store_true", default=False,
                    help="run the fuzz, connection-load and Spark kill tests at their full (soak) size")
    group.addoption("--fuzz-frames", type=int, default=None, metavar="N",
                    help="mutated frames the fuzz test sends (default 4000; 100000 with --soak)")
    group.addoption("--fuzz-seed", type=int, default=None, metavar="S",
                    help="seed of the fuzz test's mutations (default: 17)")
    group.addoption("--power-cuts", type=int, default=None, metavar="N",
                    help="power cuts of the flush-policy tests (default 3; 200 with --soak)")


# make test runs the suite over two processes (-n 2 --dist loadfile --no-loadscope-reorder,
# Makefile), a unit of work at a time, handed out in collection order. A unit is a module (its
# module-scoped appliance stays whole), except the modules that start Spark's JVMs: one unit
# (ModuleScheduling below), so they run one after the other on one process instead of two at once
# (each was a third slower beside another: 158 s instead of 107 s for the killed-driver batch
# test). The longest units go first, so that one process is not left running a two-minute module
# alone at the end (seen in .ci/run: the last 6 % of the tests took 13 of its 33 minutes). xdist's
# default reorders units by their number of tests, which put these few-test long modules last
# (and made the order below moot until --no-loadscope-reorder).
SPARK_JVM_MODULES = ("test_spark_killed_drivers.py", "test_spark.py", "test_spark_example.py")
LONGEST_FIRST = SPARK_JVM_MODULES + (
    "test_eos_copier.py", "test_loadtools.py", "test_chaos.py", "test_cli_tools.py",
    "test_spark_recover.py", "test_start_failures.py", "test_console.py",
    "test_connections.py", "test_cli_tools_secured.py")


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None                    # xdist's own
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        """--dist loadfile with Spark's JVM modules as one unit. (xdist's loadgroup marks do the
        same in principle but set Node._nodeid, which pytest 9 no longer reads.)"""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "spark-jvms" if os.path.basename(scope) in SPARK_JVM_MODULES else scope

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    # A soak run is longer than the suite's per-test timeout (pyproject.toml).
    if config.getoption("--soak"):
        for item in items:
            if item.get_closest_marker("soak") is not None:
                item.add_marker(pytest.mark.timeout(4 * 3600))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: modules stay whole
