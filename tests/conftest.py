import os
import sys

# Let integration tests `import harness` and unit tests import helpers next to them.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "integration"))


def pytest_addoption(parser):
    group = parser.getgroup("appliance soak runs")
    group.addoption("--soak", action="store_true", default=False,
                    help="run the fuzz and connection-load tests at their full (soak) size")
    group.addoption("--fuzz-frames", type=int, default=None, metavar="N",
                    help="mutated frames the fuzz test sends (default 4000; 100000 with --soak)")
    group.addoption("--fuzz-seed", type=int, default=None, metavar="S",
                    help="seed of the fuzz test's mutations (default: 17)")
