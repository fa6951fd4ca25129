"""The brokers the benchmarks measure, started and stopped by them: the appliance (one process group,
a temporary data dir and config, optional TLS and SASL listeners) and the do-nothing sink
(``loadtests/sink.py``); and the AdminClient calls every benchmark makes (create and delete a
topic). Tansu, the peer, is in ``peers.py``.

Imported by ``bench_produce.py`` and the other benchmarks; runs in the benchmark's own process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _quiet(bootstrap: str) -> dict[str, Any]:
    # librdkafka logs every refused connection while we poll for readiness; keep the output a table.
    return {"bootstrap.servers": bootstrap, "log_level": 0, "log.connection.close": False}


def wait_metadata(bootstrap: str, proc: subprocess.Popen, timeout: float, what: str,
                  log_path: str | None = None) -> None:
    """Block until the broker at ``bootstrap`` answers a Metadata request, or fail loudly."""
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    admin = None
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode} before it was ready"
                             + _log_tail(log_path))
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                pass
        except OSError as e:
            last = str(e)
            time.sleep(0.1)
            continue
        if admin is None:
            admin = AdminClient(_quiet(bootstrap))
        try:
            admin.list_topics(timeout=min(5.0, max(0.1, deadline - time.monotonic())))
            return
        except KafkaException as e:
            last = str(e)
    raise SystemExit(f"{what} did not answer a Metadata request within {timeout:.0f} s ({last})"
                     + _log_tail(log_path))


def _log_tail(path: str | None, lines: int = 40) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        tail = f.readlines()[-lines:]
    return f"\n--- last lines of {path} ---\n" + "".join(tail)


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the group leader, wait ``grace`` seconds, then SIGKILL the whole process group.

    Only the leader gets SIGTERM: the appliance's supervisor drains its workers itself, in order.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            print(f"pid {proc.pid} did not stop in {grace:.0f} s: SIGKILL", file=sys.stderr)
    # Kill stragglers of the group even if the leader has exited (orphaned workers).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def appliance_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "appliance")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "appliance.cli"]


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
BENCH_USER, BENCH_PASSWORD = "bench", "bench-secret"


def make_certificates(workdir: str) -> dict[str, str]:
    """A throw-away CA and a broker certificate for 127.0.0.1 (PEM files in ``workdir``)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def cert(subject, public, ca: bool) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(name("bench CA"))
             .public_key(public).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(ca_key, hashes.SHA256())
    out = {}
    for label, data in (
            ("ca", cert(name("bench CA"), ca_key.public_key(), True).public_bytes(serialization.Encoding.PEM)),
            ("cert", cert(name("broker"), key.public_key(), False).public_bytes(serialization.Encoding.PEM)),
            ("key", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))):
        out[label] = os.path.join(workdir, f"{label}.pem")
        with open(out[label], "wb") as f:
            f.write(data)
    return out


def client_security(protocol: str, certs: dict[str, str] | None) -> dict[str, Any]:
    """librdkafka settings for one listener's protocol."""
    out: dict[str, Any] = {"security.protocol": protocol.lower()}
    if protocol in ("SSL", "SASL_SSL"):
        out["ssl.ca.location"] = certs["ca"]
    if protocol.startswith("SASL"):
        out.update({"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": BENCH_USER,
                    "sasl.password": BENCH_PASSWORD})
    return out


@contextlib.contextmanager
def appliance(workdir: str, flush_policy: str, partitions: int,
              ready_timeout: float, extra_toml: str = "", protocols: tuple[str, ...] = ("PLAINTEXT",),
              per_writer: int = 1,
              ) -> Iterator[tuple[str, str, dict[str, str], dict[str, str] | None]]:
    """Run the appliance for the block; yields (PLAINTEXT bootstrap, log path, protocol ->
    bootstrap, certificate paths or None). ``extra_toml``: more config sections, appended to the
    file. With protocols other than PLAINTEXT: one listener each, a certificate and a user.
    ``per_writer``: topics.partitions_per_writer."""
    with appliance_process(workdir, flush_policy, partitions, ready_timeout, extra_toml,
                           protocols, per_writer) as started:
        yield started[:4]


@contextlib.contextmanager
def appliance_process(workdir: str, flush_policy: str, partitions: int, ready_timeout: float,
                      extra_toml: str = "", protocols: tuple[str, ...] = ("PLAINTEXT",),
                      per_writer: int = 1,
                      ) -> Iterator[tuple[str, str, dict[str, str], dict[str, str] | None,
                                          subprocess.Popen]]:
    """``appliance``, yielding the supervisor's process too (PLAINTEXT bootstrap, log path,
    protocol -> bootstrap, certificate paths or None, process)."""
    port = free_port()
    os.makedirs(workdir, exist_ok=True)
    data_dir = os.path.join(workdir, "data")
    conf = os.path.join(workdir, "appliance.toml")
    log_path = os.path.join(workdir, "appliance.log")
    bootstraps = {"PLAINTEXT": f"127.0.0.1:{port}"}
    certs = None
    security = ""
    if set(protocols) - {"PLAINTEXT"}:
        certs = make_certificates(workdir)
        for proto in protocols:
            if proto != "PLAINTEXT":
                bootstraps[proto] = f"127.0.0.1:{free_port()}"
        security = ("[server]\nlisteners = \"" + ",".join(f"{p}://{b}" for p, b in bootstraps.items())
                    + f'"\n[tls]\ncert_file = "{certs["cert"]}"\nkey_file = "{certs["key"]}"\n'
                    '[sasl]\nmechanisms = ["SCRAM-SHA-512"]\n')
        r = subprocess.run(appliance_command() + ["users", "add", BENCH_USER, "--mechanism",
                                                  "SCRAM-SHA-512", "--password-stdin",
                                                  "--data-dir", data_dir],
                           input=BENCH_PASSWORD + "\n", capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"appliance users add failed: {r.stderr}")
    with open(conf, "w") as f:
        f.write("# written by loadtests/bench_produce.py\n"
                "[log.flush]\n"
                f'policy = "{flush_policy}"\n'
                "[topics]\n"
                "auto_create = true\n"
                f"default_partitions = {partitions}\n"
                f"partitions_per_writer = {per_writer}\n"
                "[supervisor]\n"
                "shutdown_timeout_ms = 10000\n" + security + extra_toml)
    listen = [] if security else ["--listen", bootstraps["PLAINTEXT"]]
    cmd = appliance_command() + ["run", *listen, "--data-dir", data_dir, "--config", conf]
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=workdir, env=env, start_new_session=True)
    bootstrap = bootstraps["PLAINTEXT"]
    try:
        wait_metadata(bootstrap, proc, ready_timeout, "the appliance", log_path)
        yield bootstrap, log_path, bootstraps, certs, proc
    finally:
        stop_group(proc, grace=15)
        if proc.returncode not in (0, -signal.SIGTERM, None):
            print(f"the appliance exited with status {proc.returncode}" + _log_tail(log_path, 15),
                  file=sys.stderr)


@contextlib.contextmanager
def sink(partitions: int, workdir: str) -> Iterator[str]:
    """Run loadtests/sink.py for the block; yields its bootstrap address."""
    with sink_process(partitions, workdir) as (bootstrap, _):
        yield bootstrap


@contextlib.contextmanager
def sink_process(partitions: int, workdir: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``sink``, yielding its process too (bootstrap, process)."""
    log_path = os.path.join(workdir, "sink.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "sink.py"), "--listen", "127.0.0.1:0",
             "--partitions", str(partitions)],
            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()  # "listening on HOST:PORT"
        if not line.startswith("listening on "):
            proc.wait(5)
            raise SystemExit(f"the sink did not start: {line!r}" + _log_tail(log_path))
        bootstrap = line.removeprefix("listening on ")
        wait_metadata(bootstrap, proc, 30, "the sink", log_path)
        yield bootstrap, proc
    finally:
        stop_group(proc, grace=5)


# ---------------------------------------------------------------------------------------------
# One measurement
# ---------------------------------------------------------------------------------------------

def create_topic(bootstrap: str, name: str, partitions: int,
                 security: dict[str, Any] | None = None,
                 configs: dict[str, str] | None = None) -> str | None:
    """CreateTopics through the AdminClient; returns None, or the error it failed with.

    A failure is not fatal: the appliance's temporary config has auto-creation on with
    ``--partitions`` partitions, so the producer's first Metadata request creates the topic; the
    failure is shown under the table so that it gets fixed rather than forgotten.
    """
    admin = AdminClient({**_quiet(bootstrap), **(security or {})})
    try:
        for fut in admin.create_topics([NewTopic(name, partitions, 1, config=configs or {})],
                                       operation_timeout=30, request_timeout=60).values():
            fut.result(timeout=90)
    except KafkaException as e:
        return str(e.args[0] if e.args else e)
    return None


def delete_topic(bootstrap: str, name: str, security: dict[str, Any] | None = None,
                 timeout: float = 90) -> None:
    """DeleteTopics through the AdminClient, waiting up to ``timeout`` seconds for the answer;
    raises KafkaException or TimeoutError."""
    admin = AdminClient({**_quiet(bootstrap), **(security or {})})
    for fut in admin.delete_topics([name], operation_timeout=timeout,
                                   request_timeout=timeout).values():
        fut.result(timeout=timeout)
