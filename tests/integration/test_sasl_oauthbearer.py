"""SASL/OAUTHBEARER (KIP-255, KIP-768) and re-authentication (KIP-368) with real clients over
SASL_SSL, on one appliance for the module: the authorizer on, the JWKS a file the test writes
(its own RSA keys), ``connections_max_reauth_ms`` short so every client re-authenticates while
it works.

- confluent-kafka's ``oauth_cb`` with tokens the test signs: ACLs apply to the token's subject;
  an expired token, one of a key the JWKS does not hold, or of another issuer is refused with
  Kafka's ``invalid_token``; a token that a refresh replaces by an expired one loses its
  connection at the re-authentication; a rotated JWKS is read on reload.
- SCRAM: a user removed while connected fails the next re-authentication, and the connection
  is closed.
- The Java 4.3 client's OAuthBearerLoginCallbackHandler, its token from a file: URL.
"""

from __future__ import annotations

import json
import re
import time

import confluent_kafka as ck
import jwt
import pytest
from confluent_kafka.admin import (AdminClient, NewTopic, ScramCredentialInfo, ScramMechanism,
                                   UserScramCredentialDeletion, UserScramCredentialUpsertion)
from cryptography.hazmat.primitives.asymmetric import rsa

from appliance_harness import Appliance, free_port, watching
from java_programs import java4_program  # noqa: F401  (fixture)
from security_setup import ADMIN, ADMIN_PASSWORD, Secured, grant, make_pki, users_add

ISSUER, AUDIENCE = "https://idp.test", "kafka"
REAUTH_MS = 3000
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ROTATED = rsa.generate_private_key(public_exponent=65537, key_size=2048)
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwks(*keys: tuple[str, rsa.RSAPrivateKey]) -> str:
    out = []
    for kid, key in keys:
        d = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        d.update(kid=kid, use="sig", alg="RS256")
        out.append(d)
    return json.dumps({"keys": out})


def sign(sub: str, lifetime: float = 600, key=KEY, kid: str = "k1", iss: str = ISSUER) -> str:
    now = int(time.time())
    return jwt.encode({"sub": sub, "iat": now, "exp": int(now + lifetime), "iss": iss,
                       "aud": AUDIENCE, "scope": "kafka"}, key, algorithm="RS256",
                      headers={"kid": kid})


@pytest.fixture(scope="module")
def oauth(tmp_path_factory):
    d = tmp_path_factory.mktemp("oauthbearer")
    pki = make_pki(str(d / "pki"))
    data_dir = str(d / "data")
    r = users_add(data_dir, ADMIN, ADMIN_PASSWORD, "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    jwks_file = d / "jwks.json"
    jwks_file.write_text(jwks(("k1", KEY)))
    port = free_port()
    a = Appliance(data_dir=data_dir, log_path=str(d / "appliance.log"), config={
        "server": {"listeners": f"SASL_SSL://127.0.0.1:{port}"},
        "tls": {"cert_file": pki.broker_cert, "key_file": pki.broker_key, "ca_file": pki.ca},
        "sasl": {"mechanisms": ["OAUTHBEARER", "SCRAM-SHA-512"],
                 "connections_max_reauth_ms": REAUTH_MS,
                 "oauthbearer_jwks_endpoint_url": f"file://{jwks_file}",
                 "oauthbearer_expected_issuer": ISSUER,
                 "oauthbearer_expected_audience": [AUDIENCE]},
        "authorizer": {"enable": True, "super_users": [f"User:{ADMIN}"]},
        "groups": {"initial_rebalance_delay_ms": 0}})
    a.use_listeners({"SASL_SSL": port}, pki.client_context())
    a.start()
    s = Secured(a, {"SASL_SSL": port}, pki)
    admin = AdminClient(_scram(s))
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in ("oa-t", "oa-closed", "java-t")],
                                 request_timeout=30).values():
        f.result()
    for user, topic in (("alice", "oa-"), ("svc-java", "java-"), ("bob", "oa-")):
        grant(s, user, [("TOPIC", topic, "PREFIXED", "ALL"), ("GROUP", topic, "PREFIXED", "ALL")])
    s.jwks_file = jwks_file
    yield s
    a.terminate()


@pytest.fixture(autouse=True)
def _watch(request, oauth):
    with watching(request, oauth.app):
        yield


def _scram(s: Secured, user: str = ADMIN, password: str = ADMIN_PASSWORD, **extra) -> dict:
    return {"bootstrap.servers": s.bootstrap("SASL_SSL"), "security.protocol": "sasl_ssl",
            "ssl.ca.location": s.pki.ca, "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": password, **extra}


class Tokens:
    """confluent-kafka's oauth_cb: each call takes the next token of ``tokens`` (the last one
    repeats). librdkafka is told ``told_lifetime`` (it refuses a token it knows has expired, so
    an expired JWT is passed as a live one: the broker must be the one to refuse it)."""

    def __init__(self, *tokens: str, told_lifetime: float = 600) -> None:
        self.tokens = list(tokens)
        self.told = told_lifetime
        self.calls = 0

    def __call__(self, _config: str):
        tok = self.tokens[min(self.calls, len(self.tokens) - 1)]
        self.calls += 1
        return tok, time.time() + self.told


def _oauth(s: Secured, tokens: Tokens, **extra) -> dict:
    return {"bootstrap.servers": s.bootstrap("SASL_SSL"), "security.protocol": "sasl_ssl",
            "ssl.ca.location": s.pki.ca, "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": tokens,
            **extra}


def _auth_error(client, errors: list, seconds: float = 20):
    """Poll until librdkafka reports an authentication failure (its error callback)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        client.poll(0.2)
        for e in errors:
            if e.code() == ck.KafkaError._AUTHENTICATION:
                return e
    return None


def _deliver(p: ck.Producer, topic: str, value: bytes = b"v") -> int:
    got = []
    p.produce(topic, value, on_delivery=lambda err, msg: got.append(err))
    p.flush(30)
    assert got, "no delivery report"
    return 0 if got[0] is None else got[0].code()


def test_oauth_cb_token_acls_apply_to_its_subject(oauth):
    errors = []
    p = ck.Producer(_oauth(oauth, Tokens(sign("alice")), error_cb=errors.append,
                           **{"message.timeout.ms": 15000}))
    assert _deliver(p, "oa-t", b"from-alice") == 0
    # User:alice has no ACL on java-t.
    assert _deliver(p, "java-t") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    c = ck.Consumer(_oauth(oauth, Tokens(sign("alice")), **{
        "group.id": "oa-g", "auto.offset.reset": "earliest"}))
    c.subscribe(["oa-t"])
    got = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert b"from-alice" in got
    assert not [e for e in errors if e.code() == ck.KafkaError._AUTHENTICATION]


@pytest.mark.parametrize("bad", [
    lambda: sign("alice", lifetime=-120),                 # expired (beyond the 30 s of skew)
    lambda: sign("alice", key=STRANGER),                  # a key the JWKS does not hold
    lambda: sign("alice", iss="https://elsewhere"),       # another issuer
], ids=["expired", "unknown-key", "issuer"])
def test_tokens_kafka_refuses_are_refused(oauth, bad):
    errors = []
    admin = AdminClient(_oauth(oauth, Tokens(bad()), error_cb=errors.append))
    e = _auth_error(admin, errors)
    assert e is not None and "invalid_token" in e.str(), [x.str() for x in errors]


def test_a_refreshed_expired_token_loses_the_connection_at_reauthentication(oauth):
    # The first token is good; the refresh (librdkafka asks at 80 % of what it was told)
    # brings an expired one, which the re-authentication within the session presents.
    errors = []
    tokens = Tokens(sign("alice"), sign("alice", lifetime=-120), told_lifetime=2)
    p = ck.Producer(_oauth(oauth, tokens, error_cb=errors.append,
                           **{"message.timeout.ms": 15000}))
    assert _deliver(p, "oa-t") == 0
    e = _auth_error(p, errors, seconds=REAUTH_MS / 1000 * 5)
    assert e is not None and "invalid_token" in e.str(), [x.str() for x in errors]
    assert tokens.calls >= 2


def test_a_removed_scram_user_loses_the_connection_at_reauthentication(oauth):
    admin = AdminClient(_scram(oauth))
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"bob-secret")]
    )["bob"].result(30)
    errors = []
    p = ck.Producer(_scram(oauth, "bob", "bob-secret", error_cb=errors.append,
                           **{"message.timeout.ms": 15000}))
    assert _deliver(p, "oa-t") == 0
    admin.alter_user_scram_credentials([UserScramCredentialDeletion(
        "bob", ScramMechanism.SCRAM_SHA_512)])["bob"].result(30)
    e = _auth_error(p, errors, seconds=REAUTH_MS / 1000 * 5)
    assert e is not None and "re-authentication" in e.str(), [x.str() for x in errors]


def _reload_jwks(s: Secured, text: str) -> None:
    """Write the JWKS file, SIGHUP, and wait for every frontend to say it read it."""
    s.jwks_file.write_text(text)
    with open(s.app.log_path, "rb") as f:
        log = f.read()
    frontends = set(re.findall(rb"\[(fe\d+) \d+\]", log))
    assert frontends
    s.app.reload()
    deadline = time.monotonic() + 30
    reloaded: set = set()
    while reloaded != frontends and time.monotonic() < deadline:
        with open(s.app.log_path, "rb") as f:
            f.seek(len(log))
            reloaded = set(re.findall(rb"\[(fe\d+) \d+\] appliance.frontend: OAUTHBEARER: 1 "
                                      rb"signature keys loaded", f.read()))
        time.sleep(0.1)
    assert reloaded == frontends


def test_a_rotated_jwks_is_read_on_reload(oauth):
    _reload_jwks(oauth, jwks(("k2", ROTATED)))
    try:
        errors = []
        new = ck.Producer(_oauth(oauth, Tokens(sign("alice", key=ROTATED, kid="k2")),
                                 error_cb=errors.append, **{"message.timeout.ms": 15000}))
        assert _deliver(new, "oa-t") == 0
        errors = []
        old = AdminClient(_oauth(oauth, Tokens(sign("alice")), error_cb=errors.append))
        e = _auth_error(old, errors)
        assert e is not None and "invalid_token" in e.str()
    finally:
        _reload_jwks(oauth, jwks(("k1", KEY)))


def test_java_oauthbearer_login_with_a_file_token(oauth, java4_program, tmp_path):
    token_file = tmp_path / "token.jwt"
    token_file.write_text(sign("svc-java"))
    out = java4_program("OAuthClients", oauth.bootstrap("SASL_SSL"), oauth.pki.ca,
                        str(token_file), "java-t", "oa-closed", "java-g")
    assert out["produced"] == "10"
    assert out["denied-topic"] == "TopicAuthorizationException"
    assert out["consumed"] == "10"
