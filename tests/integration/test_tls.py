"""TLS listeners: real clients through SSL (large fetches too: the fetch path writes slices of
segment maps into the TLS transport), client certificates, wrong-protocol clients, and
certificates renewed by SIGHUP without a restart."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import ssl
import struct
import subprocess
import time
import urllib.request

import confluent_kafka as ck
import pytest

from appliance.runtime import EXIT_CONFIG
from appliance_harness import APPLIANCE, free_port
from raw_wire import RawClient
from security_setup import confluent_config, issue_broker_cert, make_pki, secure_appliance


def _api_versions(raw: RawClient):
    return raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})


def test_ssl_produce_and_consume_large_batches(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SSL",))
    payloads = [os.urandom(4096) for _ in range(2000)]          # 8 MB, many fetch round trips
    p = ck.Producer(confluent_config(s, "SSL", **{"linger.ms": 20, "batch.size": 262144}))
    for v in payloads:
        p.produce("big", v)
    assert p.flush(60) == 0
    c = ck.Consumer(confluent_config(s, "SSL", **{"group.id": "g", "auto.offset.reset": "earliest",
                                                  "fetch.max.bytes": 4 << 20}))
    c.subscribe(["big"])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < len(payloads) and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert hashlib.sha256(b"".join(got)).digest() == hashlib.sha256(b"".join(payloads)).digest()


def test_client_certificates_required(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SSL",),
                         tls={"client_auth": "required"})
    with RawClient(s.bootstrap("SSL"), ssl_context=s.pki.client_context(with_cert=True)) as raw:
        assert _api_versions(raw).error_code == 0
    # No certificate, or one from a CA the broker does not trust: the handshake fails (with TLS
    # 1.3 the client learns it on its first read).
    rogue = ssl.create_default_context(cafile=s.pki.ca)
    rogue.load_cert_chain(s.pki.rogue_cert, s.pki.rogue_key)
    for ctx in (s.pki.client_context(), rogue):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            with RawClient(s.bootstrap("SSL"), ssl_context=ctx) as raw:
                _api_versions(raw)
    with RawClient(s.bootstrap("SSL"), ssl_context=s.pki.client_context(with_cert=True)) as raw:
        assert _api_versions(raw).error_code == 0          # and the broker keeps serving
    assert "TLS handshake with" in s.app.log_text()


def test_the_console_reaches_an_ssl_only_listener_with_its_own_certificate_and_ca(
        appliance_factory, tmp_path):
    """The only listener is SSL, client certificates required, and the broker's certificate
    comes from a CA that tls.ca_file (the clients' CAs) lacks: the console's own connections
    need [console] ssl_cafile and ssl_certfile, and its pages read through them."""
    console_port = free_port()
    s = secure_appliance(appliance_factory, tmp_path, protocols=("SSL",), start=False,
                         tls={"client_auth": "required"})
    pki = s.pki
    # clients' CA: other_ca (the rogue certificate is its client); the broker's: pki.ca
    s.app.config["tls"]["ca_file"] = pki.other_ca
    s.app.config["console"] = {"listen": f"127.0.0.1:{console_port}", "ssl_cafile": pki.ca,
                               "ssl_certfile": pki.rogue_cert, "ssl_keyfile": pki.rogue_key}
    client = ssl.create_default_context(cafile=pki.ca)
    client.load_cert_chain(pki.rogue_cert, pki.rogue_key)
    s.app.use_listeners(s.ports, client)
    s.app.start()
    p = ck.Producer(confluent_config(s, "SSL", **{"ssl.certificate.location": pki.rogue_cert,
                                                  "ssl.key.location": pki.rogue_key}))
    p.produce("seen-by-the-console", b"x")
    assert p.flush(30) == 0

    def topics_page() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{console_port}/topics", timeout=10) as r:
            return r.read().decode()
    page = s.app.wait_for(topics_page, what="the console's Topics page")
    assert "seen-by-the-console" in page and 'id="topics"' in page, page
    # whom the authorizer sees: the console certificate's subject, as the header says
    assert '<span class="who">User:CN=rogue · read-only</span>' in page, page


def test_plaintext_client_on_tls_port_and_tls_client_on_plaintext_port(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("PLAINTEXT", "SSL", "SASL_SSL"))
    pids = {w["pid"] for w in s.app.workers("frontend")}
    # Kafka bytes on a TLS port are not a ClientHello: the handshake fails, the socket closes.
    for proto in ("SSL", "SASL_SSL"):
        with RawClient(s.bootstrap(proto)) as raw:
            body = struct.pack(">hhih", 18, 0, 1, 1) + b"x"
            raw.send_frame(body)
            assert raw.closed_by_peer(15)
    # A ClientHello on a plaintext port reads as a frame of ~370 MB: closed, never buffered.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        with RawClient(s.bootstrap("PLAINTEXT"), ssl_context=s.pki.client_context()) as raw:
            _api_versions(raw)
    for proto in ("PLAINTEXT", "SSL"):
        ctx = s.pki.client_context() if proto == "SSL" else None
        with RawClient(s.bootstrap(proto), ssl_context=ctx) as raw:
            assert _api_versions(raw).error_code == 0
    assert {w["pid"] for w in s.app.workers("frontend")} == pids


def _served_cn(bootstrap: str, ctx: ssl.SSLContext) -> tuple[RawClient, str]:
    raw = RawClient(bootstrap, ssl_context=ctx)
    subject = dict(x[0] for x in raw.sock.getpeercert()["subject"])
    return raw, subject["commonName"]


def test_sighup_renews_the_certificate_for_new_connections(appliance_factory, tmp_path):
    s = secure_appliance(appliance_factory, tmp_path, protocols=("PLAINTEXT", "SSL"),
                         server={"frontends": 1})
    ctx = s.pki.client_context()
    old, cn = _served_cn(s.bootstrap("SSL"), ctx)
    assert cn == "broker"
    try:
        # Renew in place (same paths, as certbot or a secret mount does), then SIGHUP.
        cert, key = issue_broker_cert(s.pki, "broker-renewed", suffix="-new")
        shutil.copy(cert, s.pki.broker_cert)
        shutil.copy(key, s.pki.broker_key)
        s.app.proc.send_signal(signal.SIGHUP)

        def renewed():
            raw, cn = _served_cn(s.bootstrap("SSL"), ctx)
            raw.close()
            return cn == "broker-renewed"
        s.app.wait_for(renewed, what="the renewed certificate on new connections")
        # The connection opened before keeps its session and is still served.
        assert _api_versions(old).error_code == 0
        assert dict(x[0] for x in old.sock.getpeercert()["subject"])["commonName"] == "broker"
        # A renewal that does not load (a key that is not the certificate's) keeps the current one.
        # This SIGHUP goes to the whole process group (as a closed terminal's does): it is the
        # supervisor's, no worker dies of it.
        pids = {w["name"]: w["pid"] for w in s.app.workers()}
        shutil.copy(s.pki.client_key, s.pki.broker_key)
        os.killpg(s.app.proc.pid, signal.SIGHUP)
        s.app.wait_for(lambda: "reload: keeping the certificates in use" in s.app.log_text(),
                       what="the refused renewal")
        raw, cn = _served_cn(s.bootstrap("SSL"), ctx)
        raw.close()
        assert cn == "broker-renewed"
        assert s.app.proc.poll() is None
        assert {w["name"]: w["pid"] for w in s.app.workers()} == pids
    finally:
        old.close()


def test_one_reload_applies_the_file_and_certificates_at_new_paths(appliance_factory, tmp_path):
    """SIGHUP is one reload: the configuration file's live keys and the certificates (here at new
    paths, tls.* being live) change together, through the supervisor's reload hook and the
    frontends' reload."""
    s = secure_appliance(appliance_factory, tmp_path, protocols=("PLAINTEXT", "SSL"),
                         server={"frontends": 2})
    ctx = s.pki.client_context()
    raw, cn = _served_cn(s.bootstrap("SSL"), ctx)
    raw.close()
    assert cn == "broker"
    pids = {w["name"]: w["pid"] for w in s.app.workers()}
    cert, key = issue_broker_cert(s.pki, "broker-moved", suffix="-moved")
    s.app.reload(tls={"cert_file": cert, "key_file": key},
                 server={"connections_max_idle_ms": 300000})
    s.app.wait_for(lambda: "reload done" in s.app.log_text(), what="the reload")
    text = s.app.log_text()
    assert "reload: server.connections_max_idle_ms: 600000 -> 300000" in text
    assert f"reload: tls.cert_file: {s.pki.broker_cert!r} -> {cert!r}" in text
    assert "certificates re-read (version 2)" in text
    # Every frontend follows the reload (the version on the supervisor's page) and serves the new
    # certificate to new connections; no process was restarted. (A frontend still starting when
    # the SIGHUP came begins with version 2 and says so at its start.)
    s.app.wait_for(lambda: s.app.log_text().count(
        "new TLS connections use the certificates of version 2") == 2,
        what="both frontends' new SSL context")
    for _ in range(8):
        raw, cn = _served_cn(s.bootstrap("SSL"), ctx)
        raw.close()
        assert cn == "broker-moved"
    assert {w["name"]: w["pid"] for w in s.app.workers()} == pids


def test_certificate_that_does_not_load_exits_2(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[server]\nlisteners = "SSL://127.0.0.1:{free_port()}"\n'
                   f'[tls]\ncert_file = "{pki.broker_cert}"\nkey_file = "{pki.client_key}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    r = subprocess.run([APPLIANCE, "run", "--config", str(cfg), "--data-dir", str(tmp_path / "d")],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == EXIT_CONFIG, r.stderr
    assert "tls.cert_file / tls.key_file: cannot load the certificate and its key" in r.stderr
