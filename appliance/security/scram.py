"""SCRAM credentials (RFC 5802, RFC 7677) as Kafka stores them: salt, stored key, server key and
iteration count, never the password.

Owns nothing; pure functions, used by the supervisor (turning AlterUserScramCredentials' salted
passwords into credentials), the frontends (checking a PLAIN password), and the clients of
``appliance users`` (making a credential from a password).

Passwords are taken as their UTF-8 bytes without SASLprep, as Kafka's ScramFormatter and
librdkafka do, so that a credential made by any of them verifies logins from all of them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import msgspec

# Kafka's ScramMechanism: name -> (type id on the wire, hash). 0 is UNKNOWN.
MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
BY_TYPE = {t: name for name, (t, _) in MECHANISMS.items()}
# Kafka's bounds on a credential's iteration count (ScramMechanism.minIterations, the
# controller's MAX_ITERATIONS); 4096 is also what kafka-configs.sh uses by default.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
SALT_BYTES = 32


class ScramCredential(msgspec.Struct, array_like=True, frozen=True):
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def hash_name(mechanism: str) -> str:
    return MECHANISMS[mechanism][1]


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    return hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def from_salted_password(mechanism: str, salt: bytes, salted: bytes,
                         iterations: int) -> ScramCredential:
    """What a server keeps: StoredKey = H(HMAC(SaltedPassword, "Client Key")), ServerKey =
    HMAC(SaltedPassword, "Server Key")."""
    h = hash_name(mechanism)
    client_key = hmac.digest(salted, b"Client Key", h)
    return ScramCredential(salt=salt, stored_key=hashlib.new(h, client_key).digest(),
                           server_key=hmac.digest(salted, b"Server Key", h),
                           iterations=iterations)


def new_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                   salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    return from_salted_password(mechanism, salt,
                                salted_password(mechanism, password, salt, iterations), iterations)


def check_password(mechanism: str, credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (PLAIN logins)."""
    again = from_salted_password(mechanism, credential.salt,
                                 salted_password(mechanism, password, credential.salt,
                                                 credential.iterations),
                                 credential.iterations)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


# -- the client side (appliance.client, appliance users, tests) ---------------------------------

def _saslname(user: str) -> str:
    return user.replace("=", "=3D").replace(",", "=2C")


class ScramClientError(Exception):
    pass


class ScramClient:
    """RFC 5802 client: ``first()``, ``final(server_first)``, ``verify(server_final)``."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self.user = user
        self.password = password
        self.nonce = nonce or base64.b64encode(os.urandom(24)).decode()
        self.bare = f"n={_saslname(user)},r={self.nonce}"
        self._salted = b""
        self._auth_message = b""

    def first(self) -> bytes:
        return ("n,," + self.bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if "e" in attrs:
            raise ScramClientError(f"server error: {attrs['e']}")
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), int(attrs.get("i", "0"))
        if not nonce.startswith(self.nonce) or salt is None:
            raise ScramClientError("invalid server-first message")
        if iterations < MIN_ITERATIONS:
            raise ScramClientError(f"the server asks for {iterations} iterations, fewer than "
                                   f"{MIN_ITERATIONS}")
        h = hash_name(self.mechanism)
        self._salted = salted_password(self.mechanism, self.password, base64.b64decode(salt),
                                       iterations)
        without_proof = f"c=biws,r={nonce}"
        self._auth_message = f"{self.bare},{text},{without_proof}".encode()
        client_key = hmac.digest(self._salted, b"Client Key", h)
        signature = hmac.digest(hashlib.new(h, client_key).digest(), self._auth_message, h)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        text = server_final.decode()
        attrs = dict(p.split("=", 1) for p in text.split(",") if "=" in p)
        if "e" in attrs:
            raise ScramClientError(f"server error: {attrs['e']}")
        h = hash_name(self.mechanism)
        expected = hmac.digest(hmac.digest(self._salted, b"Server Key", h), self._auth_message, h)
        if not hmac.compare_digest(base64.b64decode(attrs.get("v", "")), expected):
            raise ScramClientError("the server's signature does not match: not the server that "
                                   "holds our credential")
