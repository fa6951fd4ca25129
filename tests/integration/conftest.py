"""Fixtures that start the real appliance for each test (``appliance``, ``appliance_factory``; the
process itself is appliance_harness.py's), and the hooks every integration test shares: the
warnings a leaked client socket may raise, and each phase's report kept on the item (``rep_call``)
for the fixtures that print an appliance's log when a test failed."""

from pathlib import Path

import pytest

from appliance_harness import Appliance

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    # Every warning is an error (pyproject.toml), except here a ResourceWarning: the real clients
    # (confluent-kafka, kafka-python, aiokafka, Spark's py4j) hold sockets that the garbage
    # collector may report during any later test, which would fail that test for another's leak.
    # They stay visible in the warnings summary.
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.filterwarnings("default::ResourceWarning"))
            item.add_marker(pytest.mark.filterwarnings("default::pytest.PytestUnraisableExceptionWarning"))


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture
def appliance_factory(tmp_path, request):
    """appliance_factory(args=(), env=None, **config_sections) -> a started Appliance on a free
    port (args: more `appliance run` flags; env: more environment)."""
    started: list[Appliance] = []

    def make(data_dir: str | None = None, start: bool = True, args=(), env=None,
             **config) -> Appliance:
        a = Appliance(data_dir=data_dir or str(tmp_path / "data"),
                      log_path=str(tmp_path / f"appliance-{len(started)}.log"), config=config,
                      args=list(args), env=dict(env or {}))
        started.append(a)
        return a.start() if start else a

    yield make
    for a in started:
        if a.proc is not None:
            a.terminate()
    failed = any(getattr(request.node, f"rep_{w}", None) and getattr(request.node, f"rep_{w}").failed
                 for w in ("setup", "call"))
    if failed:
        for a in started:
            print(f"\n--- appliance log {a.log_path} (tail) ---\n{a.log_tail(200)}")


@pytest.fixture
def appliance(appliance_factory):
    return appliance_factory()


@pytest.fixture
def lazy_mount(tmp_path):
    """lazyfs (tests/integration/lazyfs.py) mounted over a backing dir under tmp_path: what is not
    synced is lost at ``cut()``. Fails the test, naming what is missing, without FUSE."""
    from lazyfs import LazyMount, available
    why = available()
    if why:
        pytest.fail(why)
    m = LazyMount(str(tmp_path / "backing"), str(tmp_path / "mnt"))
    m.mount()
    yield m
    m.cut()
