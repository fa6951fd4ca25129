"""The Spark tests without Java: they fail at once, with one line that names the prerequisite."""

import os
import subprocess
import sys

from appliance_harness import ROOT


def test_spark_tests_without_java_fail_with_one_line_naming_it(tmp_path):
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "no-java"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.join(ROOT, "tests", "integration", "test_spark.py")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode != 0, r.stdout[-3000:]
    line = "the Spark tests need Java 17 or later (PySpark runs a JVM): no java found on JAVA_HOME="
    assert line in r.stdout, r.stdout[-3000:]
    assert "passed" not in r.stdout.splitlines()[-1]
    # One line per test, no traceback: the fixture fails before any appliance or JVM starts.
    assert "Traceback" not in r.stdout and "appliance log" not in r.stdout
