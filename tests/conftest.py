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


def pytest_collection_modifyitems(config, items):
    # A soak run is longer than the suite's per-test timeout (pyproject.toml).
    if config.getoption("--soak"):
        for item in items:
            if item.get_closest_marker("soak") is not None:
                item.add_marker(pytest.mark.timeout(4 * 3600))
