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


# make test runs the suite over two processes a module at a time (--dist loadfile), handing out
# modules in collection order: the longest (Spark's JVMs, the kill-and-recover runs) go first, so
# that one process is not left running a two-minute module alone after the other has finished
# (seen in .ci/run: the last 6 % of the tests took 13 of its 33 minutes).
LONGEST_FIRST = ("test_spark_example.py", "test_spark.py", "test_spark_killed_drivers.py",
                 "test_eos_copier.py", "test_loadtools.py", "test_cli_tools.py", "test_chaos.py",
                 "test_spark_recover.py", "test_start_failures.py")


def pytest_collection_modifyitems(config, items):
    # A soak run is longer than the suite's per-test timeout (pyproject.toml).
    if config.getoption("--soak"):
        for item in items:
            if item.get_closest_marker("soak") is not None:
                item.add_marker(pytest.mark.timeout(4 * 3600))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: modules stay whole
