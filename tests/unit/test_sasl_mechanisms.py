"""SASL on a connection (workers.frontend.connection with the real SaslHandshake, SaslAuthenticate
and ApiVersions handlers, a recording transport in place of the socket; no fork, no broker):
Kafka's SaslServerAuthenticator states, its error codes and messages, the raw-token flow of
SaslHandshake v0, the pre-authentication frame limit and the delayed close of a failure."""

from __future__ import annotations

import asyncio
import io
import struct

import msgspec
import pytest
from kio.serial import entity_reader, entity_writer

from appliance.api import load_handlers
from appliance.config import Config, ServerConfig
from appliance.listeners import Listener
from appliance.protocol import frames, messages
from appliance.runtime import BoundListener
from appliance.security.sasl import MAX_RECEIVE_SIZE, SaslServerAuthenticator
from appliance.security.scram import ScramClient, new_credential
from test_connection import Server, Transport

SASL = BoundListener(Listener("SASL_PLAINTEXT", "SASL_PLAINTEXT", "127.0.0.1", 9093), -1, 9093)
USERS = {"alice": {"SCRAM-SHA-256": new_credential("SCRAM-SHA-256", "wonderland"),
                   "SCRAM-SHA-512": new_credential("SCRAM-SHA-512", "wonderland")}}
ALL = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


def _server(delay_ms: int = 0) -> Server:
    load_handlers()
    server = Server()
    server.broker.cfg = msgspec.structs.replace(
        Config(), server=ServerConfig(connection_failed_authentication_delay_ms=delay_ms),
        sasl=msgspec.structs.replace(Config().sasl, mechanisms=ALL))
    server.broker.users = USERS
    return server


def feed(conn, data: bytes) -> None:
    """What asyncio's transport does for a BufferedProtocol: the socket reads into the
    protocol's buffer, then buffer_updated."""
    while data:
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        conn.buffer_updated(n)


class Client:
    """Frames in, decoded answers out, over one KafkaConnection on a SASL listener."""

    def __init__(self, delay_ms: int = 0) -> None:
        from workers.frontend.connection import KafkaConnection
        self.conn = KafkaConnection(_server(delay_ms), SASL)
        self.t = Transport()
        self.conn.connection_made(self.t)
        self.corr = 0
        self.read = 0

    def send(self, api_key: int, version: int, body: dict) -> int:
        self.corr += 1
        cls = messages.request_class(api_key, version)
        out = io.BytesIO()
        hv = frames.request_header_version(api_key, version)
        out.write(struct.pack(">hhih", api_key, version, self.corr, 1) + b"t")
        if hv >= 2:
            out.write(b"\0")
        entity_writer(cls)(out, messages.build(cls, body))
        payload = out.getvalue()
        feed(self.conn, struct.pack(">i", len(payload)) + payload)
        return self.corr

    def answer(self, api_key: int, version: int):
        pos = self.read
        if pos + 4 > len(self.t.written):
            return None
        (size,) = struct.unpack_from(">i", self.t.written, pos)
        frame = bytes(self.t.written[pos + 4:pos + 4 + size])
        self.read = pos + 4 + size
        hpos = 4 + (1 if frames.response_header_version(api_key, version) >= 1 else 0)
        return entity_reader(messages.response_class(api_key, version))(frame, hpos)[0]

    def call(self, api_key: int, version: int, body: dict):
        self.send(api_key, version, body)
        return self.answer(api_key, version)

    def raw_token(self, token: bytes) -> bytes | None:
        feed(self.conn, struct.pack(">i", len(token)) + token)
        if self.read + 4 > len(self.t.written):
            return None
        (size,) = struct.unpack_from(">i", self.t.written, self.read)
        out = bytes(self.t.written[self.read + 4:self.read + 4 + size])
        self.read += 4 + size
        return out


def _scram(c: Client, mechanism: str, password: str, version: int = 2):
    sc = ScramClient(mechanism, "alice", password)
    r1 = c.call(36, version, {"auth_bytes": sc.first()})
    assert r1.error_code == 0
    return sc, r1, c.call(36, version, {"auth_bytes": sc.final(r1.auth_bytes)})


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_after_api_versions_then_every_api(mechanism):
    c = Client()
    assert c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0
    hs = c.call(17, 1, {"mechanism": mechanism})
    assert hs.error_code == 0 and list(hs.mechanisms) == ALL
    sc, _, r2 = _scram(c, mechanism, "wonderland")
    assert r2.error_code == 0
    sc.verify(r2.auth_bytes)                       # the server proved it holds the credential
    assert c.conn.principal == "User:alice"
    assert (c.conn.listener, c.conn.security_protocol) == ("SASL_PLAINTEXT", "SASL_PLAINTEXT")
    assert c.conn.decoder.max_frame_bytes == Config().server.socket_request_max_bytes
    # Authenticated: SaslHandshake and SaslAuthenticate are Kafka's ILLEGAL_SASL_STATE now.
    assert c.call(17, 1, {"mechanism": mechanism}).error_code == 34
    assert c.call(36, 2, {"auth_bytes": b"x"}).error_code == 34
    assert not c.t.closed


def test_wrong_password_is_refused_with_kafkas_message_then_closed():
    c = Client()
    assert c.call(17, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == 0
    _, _, r2 = _scram(c, "SCRAM-SHA-256", "looking-glass")
    assert r2.error_code == 58       # SASL_AUTHENTICATION_FAILED
    assert r2.error_message == ("Authentication failed during authentication due to invalid "
                                "credentials with SASL mechanism SCRAM-SHA-256")
    assert c.t.closed and c.conn.principal == "User:ANONYMOUS"


def test_unknown_user_gets_the_same_message_as_a_wrong_password():
    c = Client()
    c.call(17, 1, {"mechanism": "SCRAM-SHA-512"})
    r = c.call(36, 2, {"auth_bytes": ScramClient("SCRAM-SHA-512", "mallory", "x").first()})
    assert r.error_code == 58 and r.error_message.endswith("with SASL mechanism SCRAM-SHA-512")
    assert c.t.closed


def test_wrong_nonce_and_replayed_proof_are_refused():
    # A client-final whose nonce is not the server's combined nonce.
    c = Client()
    c.call(17, 1, {"mechanism": "SCRAM-SHA-256"})
    sc = ScramClient("SCRAM-SHA-256", "alice", "wonderland")
    r1 = c.call(36, 2, {"auth_bytes": sc.first()})
    final = sc.final(r1.auth_bytes).decode()
    forged = final.replace(",r=", ",r=X", 1).encode()
    assert c.call(36, 2, {"auth_bytes": forged}).error_code == 58 and c.t.closed
    # A proof recorded from a successful exchange, replayed on a new connection: the server's
    # nonce differs, so the recorded message is for another exchange.
    good = Client()
    good.call(17, 1, {"mechanism": "SCRAM-SHA-256"})
    sc = ScramClient("SCRAM-SHA-256", "alice", "wonderland", nonce="fixed-client-nonce")
    recorded_first = sc.first()
    recorded_final = sc.final(good.call(36, 2, {"auth_bytes": recorded_first}).auth_bytes)
    assert good.call(36, 2, {"auth_bytes": recorded_final}).error_code == 0
    replay = Client()
    replay.call(17, 1, {"mechanism": "SCRAM-SHA-256"})
    assert replay.call(36, 2, {"auth_bytes": recorded_first}).error_code == 0
    r = replay.call(36, 2, {"auth_bytes": recorded_final})
    assert r.error_code == 58 and replay.t.closed and replay.conn.principal == "User:ANONYMOUS"


@pytest.mark.parametrize("token, message", [
    (b"\0alice\0wonderland\0extra", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"alice\0wonderland", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
    (b"\0\0wonderland", "Authentication failed: username not specified"),
    (b"\0alice\0", "Authentication failed: password not specified"),
    (b"\0alice\0wonder\0land", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
    (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
    (b"bob\0alice\0wonderland", "Authentication failed: Client requested an authorization id "
                                "that is different from username"),
])
def test_plain_refusals_carry_kafkas_messages(token, message):
    c = Client()
    c.call(17, 1, {"mechanism": "PLAIN"})
    r = c.call(36, 1, {"auth_bytes": token})
    assert (r.error_code, r.error_message) == (58, message)
    assert c.t.closed


def test_plain_login_checks_the_scram_credential():
    c = Client()
    c.call(17, 1, {"mechanism": "PLAIN"})
    r = c.call(36, 0, {"auth_bytes": b"alice\0alice\0wonderland"})
    assert r.error_code == 0 and c.conn.principal == "User:alice"


def test_unknown_mechanism_lists_the_enabled_ones_and_closes():
    c = Client()
    r = c.call(17, 1, {"mechanism": "GSSAPI"})
    assert r.error_code == 33 and list(r.mechanisms) == ALL    # UNSUPPORTED_SASL_MECHANISM
    assert c.t.closed


def test_requests_before_authentication_close_the_connection_unanswered():
    c = Client()
    c.send(0, 9, {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": []})
    assert c.t.written == b"" and c.t.closed
    # After the handshake, anything but SaslAuthenticate is refused the same way.
    c = Client()
    c.call(17, 1, {"mechanism": "PLAIN"})
    c.send(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert c.answer(18, 3) is None and c.t.closed


def test_frames_over_512_kib_before_authentication_close_the_connection():
    c = Client()
    feed(c.conn, struct.pack(">i", MAX_RECEIVE_SIZE + 1) + b"\0" * 100)
    assert c.t.closed and c.t.written == b""
    c = Client()
    feed(c.conn, struct.pack(">i", 100 << 20))
    assert c.t.closed


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_handshake_v0_takes_raw_tokens(mechanism):
    c = Client()
    hs = c.call(17, 0, {"mechanism": mechanism})
    assert hs.error_code == 0
    if mechanism == "PLAIN":
        assert c.raw_token(b"\0alice\0wonderland") == b""
    else:
        sc = ScramClient(mechanism, "alice", "wonderland")
        server_first = c.raw_token(sc.first())
        sc.verify(c.raw_token(sc.final(server_first)))
    assert c.conn.principal == "User:alice"
    # Authenticated: requests with headers again.
    assert c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0


def test_handshake_v0_takes_tokens_shorter_than_a_request_header():
    c = Client()
    c.conn.broker.users = {**USERS, "u": {"SCRAM-SHA-256": new_credential("SCRAM-SHA-256", "p")}}
    c.call(17, 0, {"mechanism": "PLAIN"})
    assert c.raw_token(b"\0u\0p") == b""
    assert c.conn.principal == "User:u"


def test_handshake_v0_failure_closes_without_an_answer():
    c = Client()
    c.call(17, 0, {"mechanism": "PLAIN"})
    assert c.raw_token(b"\0alice\0nope") is None
    assert c.t.closed


def test_a_failure_is_answered_after_the_delay_then_closed():
    async def run():
        c = Client(delay_ms=50)
        c.call(17, 1, {"mechanism": "PLAIN"})
        c.send(36, 2, {"auth_bytes": b"\0alice\0nope"})
        assert c.t.written[c.read:] == b"" and not c.t.closed and not c.t.reading
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not c.t.closed:
            await asyncio.sleep(0.005)
        assert loop.time() - start >= 0.04
        assert c.answer(36, 2).error_code == 58
    asyncio.run(run())


def test_a_short_salt_works():
    """Kafka takes any salt AlterUserScramCredentials is given (confluent-kafka's AdminClient
    passes the caller's)."""
    users = {"bob": {"SCRAM-SHA-256": new_credential("SCRAM-SHA-256", "pw", 4096, salt=b"s")}}
    a = SaslServerAuthenticator(["SCRAM-SHA-256"], users.get)
    a.handshake("SCRAM-SHA-256", 1)
    sc = ScramClient("SCRAM-SHA-256", "bob", "pw")
    sc.verify(a.evaluate(sc.final(a.evaluate(sc.first()))))
    assert a.complete


def test_authenticator_states():
    a = SaslServerAuthenticator(ALL, USERS.get)
    assert not a.refuses(18) and not a.refuses(17) and a.refuses(0) and a.refuses(36)
    a.api_versions_answered()
    assert a.refuses(18) and not a.refuses(17)
    assert a.handshake("PLAIN", 1) and a.refuses(17) and not a.refuses(36)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_independent_scram_client_logs_in(mechanism):
    """scramp's client (another implementation of RFC 5802) against our server, with a user name
    that needs SCRAM's escaping."""
    import scramp
    users = {"b,=b": {mechanism: new_credential(mechanism, "pw", 4096)}}
    a = SaslServerAuthenticator([mechanism], users.get)
    assert a.handshake(mechanism, 1)
    client = scramp.ScramClient([mechanism], "b,=b", "pw")
    client.set_server_first(a.evaluate(client.get_client_first().encode()).decode())
    client.set_server_final(a.evaluate(client.get_client_final().encode()).decode())
    assert a.complete and a.principal == "User:b,=b"
