"""Prerequisites of the Spark tests that pip cannot install: a Java 17+ runtime (PySpark starts a
JVM). Checked once per test module; a missing one fails the tests with one line that names it
(the Spark pipeline is part of the product, so this is a failure, not a skip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

JAVA_MIN = 17
_checked: list[str] = []          # the failure line, once the check has run ("" when Java is fine)


def java_problem() -> str:
    """'' when a Java 17+ runtime is found the way PySpark looks for one (JAVA_HOME, else PATH),
    else one line saying what is missing."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    where = f"JAVA_HOME={home}" if home else "PATH"
    if not java or not os.access(java, os.X_OK):
        return (f"the Spark tests need Java {JAVA_MIN} or later (PySpark runs a JVM): no java found "
                f"on {where}; install one, e.g. apt-get install openjdk-{JAVA_MIN}-jre-headless")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the Spark tests need Java {JAVA_MIN} or later: {java} -version failed: {exc}"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return f"the Spark tests need Java {JAVA_MIN} or later: cannot read the version of {java}"
    major = int(m.group(1))
    if major == 1:                            # "1.8.0_392" is Java 8
        major = int(m.group(2) or 0)
    if major < JAVA_MIN:
        return (f"the Spark tests need Java {JAVA_MIN} or later (PySpark runs a JVM): {java} is "
                f"Java {major}")
    return ""


def require_java() -> None:
    """Fail the calling test with one line unless Java 17+ is there (checked once per run)."""
    if not _checked:
        _checked.append(java_problem())
    if _checked[0]:
        pytest.fail(_checked[0], pytrace=False)
