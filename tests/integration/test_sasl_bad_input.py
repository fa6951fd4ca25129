"""Bad input and attacks on SASL listeners, at the wire of a real appliance: every refusal is
Kafka's (SASL_AUTHENTICATION_FAILED with Kafka's message, UNSUPPORTED_SASL_MECHANISM with the
enabled list, or a closed connection where Kafka closes it), nothing crashes a worker, and the
broker keeps serving everyone else, also through a thousand failed logins in a row."""

from __future__ import annotations

import asyncio
import ssl
import struct
import threading

import confluent_kafka as ck
import psutil
import pytest

from appliance.security.scram import ScramClient
from appliance_harness import Appliance
from raw_wire import RawClient
from security_setup import ADMIN, ADMIN_PASSWORD, confluent_config, secure_appliance

GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism "


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("sasl-bad-input")
    made = []

    def factory(data_dir=None, start=True, **config):
        a = Appliance(data_dir=data_dir, log_path=str(d / "appliance.log"), config=config)
        made.append(a)
        return a.start() if start else a
    s = secure_appliance(factory, d, protocols=("PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"))
    s.frontend_pids = {w["pid"] for w in s.app.workers("frontend")}
    yield s
    for a in made:
        a.terminate()


@pytest.fixture(autouse=True)
def _nothing_crashed(secured):
    yield
    assert secured.app.proc.poll() is None
    assert {w["pid"] for w in secured.app.workers("frontend")} == secured.frontend_pids
    assert "Traceback" not in secured.app.log_text()


def _raw(s, proto: str = "SASL_SSL") -> RawClient:
    return RawClient(s.bootstrap(proto), ssl_context=s.pki.client_context() if proto == "SASL_SSL" else None)


def _handshake(raw: RawClient, mechanism: str, version: int = 1):
    return raw.request(17, version, {"mechanism": mechanism})


def _auth(raw: RawClient, token: bytes, version: int = 2):
    return raw.request(36, version, {"auth_bytes": token})


def _scram_login(raw: RawClient, mechanism: str, user: str, password: str):
    assert _handshake(raw, mechanism).error_code == 0
    sc = ScramClient(mechanism, user, password)
    r1 = _auth(raw, sc.first())
    if r1.error_code:
        return r1
    return _auth(raw, sc.final(r1.auth_bytes))


@pytest.mark.parametrize("proto", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password(secured, proto, mechanism):
    with _raw(secured, proto) as raw:
        r = _scram_login(raw, mechanism, ADMIN, "not-the-password")
        assert (r.error_code, r.error_message) == (58, GENERIC + mechanism)
        assert raw.closed_by_peer()


def test_unknown_user(secured):
    with _raw(secured) as raw:
        r = _scram_login(raw, "SCRAM-SHA-512", "nobody", ADMIN_PASSWORD)
        # The same answer as a wrong password: nothing tells whether the user exists.
        assert (r.error_code, r.error_message) == (58, GENERIC + "SCRAM-SHA-512")
        assert raw.closed_by_peer()
    with _raw(secured) as raw:
        assert _handshake(raw, "PLAIN").error_code == 0
        r = _auth(raw, b"\0nobody\0" + ADMIN_PASSWORD.encode())
        assert (r.error_code, r.error_message) == (58, "Authentication failed: Invalid username or password")


def test_scram_with_a_wrong_nonce(secured):
    with _raw(secured) as raw:
        assert _handshake(raw, "SCRAM-SHA-256").error_code == 0
        sc = ScramClient("SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD)
        r1 = _auth(raw, sc.first())
        final = sc.final(r1.auth_bytes).decode()
        r = _auth(raw, final.replace(",r=", ",r=tampered", 1).encode())
        assert (r.error_code, r.error_message) == (58, GENERIC + "SCRAM-SHA-256")
        assert raw.closed_by_peer()


def test_scram_with_a_replayed_proof(secured):
    # Record a successful exchange, then replay its client messages on a new connection.
    sc = ScramClient("SCRAM-SHA-512", ADMIN, ADMIN_PASSWORD)
    with _raw(secured) as raw:
        assert _handshake(raw, "SCRAM-SHA-512").error_code == 0
        first = sc.first()
        final = sc.final(_auth(raw, first).auth_bytes)
        assert _auth(raw, final).error_code == 0
    with _raw(secured) as raw:
        assert _handshake(raw, "SCRAM-SHA-512").error_code == 0
        assert _auth(raw, first).error_code == 0          # a new server nonce
        r = _auth(raw, final)
        assert (r.error_code, r.error_message) == (58, GENERIC + "SCRAM-SHA-512")
        assert raw.closed_by_peer()


@pytest.mark.parametrize("token, message", [
    (b"\0admin\0admin-secret\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\0adm\0in\0admin-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\0\0\0\0", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\0admin", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\0admin\0admin-\0secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
])
def test_plain_with_embedded_nuls(secured, token, message):
    with _raw(secured) as raw:
        assert _handshake(raw, "PLAIN").error_code == 0
        r = _auth(raw, token)
        assert (r.error_code, r.error_message) == (58, message)
        assert raw.closed_by_peer()


def test_unsupported_mechanism_lists_the_enabled_ones(secured):
    with _raw(secured) as raw:
        r = _handshake(raw, "OAUTHBEARER")
        assert r.error_code == 33
        assert list(r.mechanisms) == ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
        assert raw.closed_by_peer()


def test_produce_before_authenticating(secured):
    from appliance.protocol.records import Record, build_batch
    produce = {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
               "topic_data": [{"name": "sneaky", "partition_data": [
                   {"index": 0, "records": build_batch([Record(key=None, value=b"x")])}]}]}
    for proto in ("SASL_PLAINTEXT", "SASL_SSL"):
        with _raw(secured, proto) as raw:
            raw.request(0, 9, produce, expect_response=False)
            assert raw.closed_by_peer()
        # After ApiVersions, and after the handshake too.
        with _raw(secured, proto) as raw:
            raw.request(18, 3, {"client_software_name": "t", "client_software_version": "1"})
            assert _handshake(raw, "SCRAM-SHA-256").error_code == 0
            raw.request(0, 9, produce, expect_response=False)
            assert raw.closed_by_peer()
    with RawClient(secured.bootstrap("PLAINTEXT")) as raw:
        md = raw.request(3, 12, {"topics": [{"name": "sneaky", "topic_id": None}],
                                 "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
        assert md.topics[0].error_code == 3          # never created, nothing written


def test_a_100_mb_frame_before_authentication(secured):
    rss_before = sum(psutil.Process(p).memory_info().rss for p in secured.frontend_pids)
    for proto in ("SASL_PLAINTEXT", "SASL_SSL"):
        with _raw(secured, proto) as raw:
            raw.send_bytes(struct.pack(">i", 100 << 20))
            sent = 0
            chunk = b"\0" * (1 << 20)
            with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                while sent < 100 << 20:
                    raw.send_bytes(chunk)
                    sent += len(chunk)
            # Closed on the size prefix (Kafka's 512 KiB limit before authentication): the
            # socket buffers took what was sent before the close arrived, not 100 MB.
            assert sent < 50 << 20
    rss_after = sum(psutil.Process(p).memory_info().rss for p in secured.frontend_pids)
    assert rss_after - rss_before < 32 << 20


def test_handshake_v0_raw_tokens(secured):
    """The pre-KIP-152 flow: SaslHandshake v0, then size-prefixed tokens with no header."""
    with _raw(secured) as raw:
        assert _handshake(raw, "SCRAM-SHA-256", version=0).error_code == 0
        sc = ScramClient("SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD)
        raw.send_frame(sc.first())
        raw.send_frame(sc.final(raw.recv_frame()))
        sc.verify(raw.recv_frame())
        assert raw.request(18, 3, {"client_software_name": "t",
                                   "client_software_version": "1"}).error_code == 0
    with _raw(secured) as raw:
        assert _handshake(raw, "PLAIN", version=0).error_code == 0
        raw.send_frame(b"\0admin\0wrong")
        assert raw.closed_by_peer()


async def _failed_login(s, i: int) -> tuple[int, str]:
    """One failed login over SASL_PLAINTEXT (wrong password, unknown user or PLAIN), asyncio."""
    reader, writer = await asyncio.open_connection("127.0.0.1", s.ports["SASL_PLAINTEXT"])
    corr = 0

    async def call(api_key, version, body):
        nonlocal corr
        corr += 1
        raw = RawClient.__new__(RawClient)
        raw.client_id = "storm"
        payload = raw.header(api_key, version, corr) + raw.encode(api_key, version, body)
        writer.write(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        frame = await reader.readexactly(size)
        from appliance.protocol import frames, messages
        from kio.serial import entity_reader
        pos = 4 + (1 if frames.response_header_version(api_key, version) >= 1 else 0)
        return entity_reader(messages.response_class(api_key, version))(frame, pos)[0]
    try:
        kind = i % 3
        mech = "PLAIN" if kind == 2 else "SCRAM-SHA-256"
        assert (await call(17, 1, {"mechanism": mech})).error_code == 0
        if kind == 2:
            r = await call(36, 2, {"auth_bytes": f"\0{ADMIN}\0guess-{i}".encode()})
        else:
            sc = ScramClient(mech, ADMIN if kind == 0 else f"ghost-{i}", f"guess-{i}")
            r = await call(36, 2, {"auth_bytes": sc.first()})
            if r.error_code == 0:
                r = await call(36, 2, {"auth_bytes": sc.final(r.auth_bytes)})
        closed = await reader.read(1) == b""
        return r.error_code, "closed" if closed else "open"
    finally:
        writer.close()


def test_a_thousand_failed_logins_while_another_client_keeps_working(secured):
    stop = threading.Event()
    delivered: list[int] = []
    failures: list = []

    def produce():
        p = ck.Producer(confluent_config(secured, "SASL_SSL", **{"linger.ms": 0}))
        i = 0
        while not stop.is_set():
            p.produce("storm", str(i).encode(),
                      on_delivery=lambda err, msg: failures.append(err) if err else
                      delivered.append(msg.offset()))
            p.flush(30)
            i += 1
        assert p.flush(30) == 0

    t = threading.Thread(target=produce)
    t.start()
    try:
        secured.app.wait_for(lambda: len(delivered) >= 5, what="the producer's first records")
        before = len(delivered)

        async def storm():
            sem = asyncio.Semaphore(50)

            async def one(i):
                async with sem:
                    return await _failed_login(secured, i)
            return await asyncio.gather(*(one(i) for i in range(1000)))
        results = asyncio.run(storm())
        during = len(delivered) - before
    finally:
        stop.set()
        t.join(60)
    assert results == [(58, "closed")] * 1000
    assert not failures and during > 0
    # The producer kept its connection and its records are all there, in order.
    assert delivered == list(range(len(delivered)))
