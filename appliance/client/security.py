"""The client's security settings: TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), with the
names Kafka's clients use.

Owns nothing but the settings of one client; ``BrokerConnection`` wraps its socket in TLS
(``ssl_context``) and authenticates (``authenticate``) right after ApiVersions, on every
connection it opens. Runs in the client's process.

Keys (our names; Kafka's dotted names are accepted by the config tables, ``appliance.client.config``):
``security_protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL), ``sasl_mechanism``,
``sasl_username``, ``sasl_password`` (or ``sasl_jaas_config``: a PlainLoginModule or
ScramLoginModule line, as Java clients and Spark's Kafka connector take them), ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``, ``ssl_check_hostname`` (Kafka's
``ssl.endpoint.identification.algorithm=https``, on by default).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Any, Mapping

from appliance.security.scram import MECHANISMS, ScramClient, ScramClientError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", *MECHANISMS)
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36

DEFAULTS: dict[str, Any] = {
    "security_protocol": "PLAINTEXT",
    "sasl_mechanism": None,
    "sasl_username": None,
    "sasl_password": None,
    "sasl_jaas_config": None,         # Java's "...LoginModule required username=.. password=..;"
    "ssl_cafile": None,               # CA certificates (PEM) the broker's certificate must chain to
    "ssl_certfile": None,             # client certificate (PEM), for brokers that ask for one
    "ssl_keyfile": None,
    "ssl_password": None,             # of an encrypted ssl_keyfile
    "ssl_check_hostname": True,
    # Java names with no direct equivalent: PEM stores only.
    "ssl_truststore_type": None,
    "ssl_keystore_type": None,
    "ssl_keystore_location": None,    # a PEM keystore: key and certificate in one file
    "ssl_endpoint_identification_algorithm": None,
}

# Kafka's and the other clients' names (dots made underscores) for ours.
ALIASES = {
    "sasl_mechanisms": "sasl_mechanism",              # librdkafka
    "sasl_plain_username": "sasl_username",           # kafka-python, aiokafka
    "sasl_plain_password": "sasl_password",
    "ssl_ca_location": "ssl_cafile",                  # librdkafka
    "ssl_certificate_location": "ssl_certfile",
    "ssl_key_location": "ssl_keyfile",
    "ssl_key_password": "ssl_password",
    "ssl_truststore_location": "ssl_cafile",          # Java, with ssl.truststore.type=PEM
}

_JAAS = re.compile(r'^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;?\s*$',
                   re.S)
_OPTION = re.compile(r'\s*([\w.]+)\s*=\s*(?:"((?:\\.|[^"\\])*)"|\'((?:\\.|[^\'\\])*)\'|([^\s;]+))')
_LOGIN_MODULES = {"PlainLoginModule": ("PLAIN",), "ScramLoginModule": tuple(MECHANISMS)}


def parse_jaas_config(text: str) -> tuple[str, dict[str, str]]:
    """(login module's class name, its options) of a ``sasl.jaas.config`` value."""
    m = _JAAS.match(text)
    if m is None:
        raise ValueError("sasl_jaas_config: expected '<LoginModule class> required "
                         "username=\"...\" password=\"...\";'")
    module, rest = m.group(1), m.group(3)
    options = {}
    pos = 0
    while pos < len(rest):
        om = _OPTION.match(rest, pos)
        if om is None:
            if rest[pos:].strip():
                raise ValueError(f"sasl_jaas_config: cannot read {rest[pos:].strip()!r}")
            break
        quoted = om.group(2) if om.group(2) is not None else om.group(3)
        options[om.group(1)] = (re.sub(r"\\(.)", r"\1", quoted) if quoted is not None
                                else om.group(4))
        pos = om.end()
    return module, options


@dataclass(frozen=True)
class Security:
    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Security":
        """From a normalised client config (our key names); ValueError names a bad key."""
        proto = str(cfg.get("security_protocol") or "PLAINTEXT").upper()
        if proto not in PROTOCOLS:
            raise ValueError(f"security_protocol must be one of {', '.join(PROTOCOLS)}, "
                             f"not {cfg.get('security_protocol')!r}")
        mech = cfg.get("sasl_mechanism")
        user, password = cfg.get("sasl_username"), cfg.get("sasl_password")
        if cfg.get("sasl_jaas_config"):
            module, options = parse_jaas_config(cfg["sasl_jaas_config"])
            short = module.rsplit(".", 1)[-1]
            if short not in _LOGIN_MODULES:
                raise ValueError(f"sasl_jaas_config: {module} is not supported (PlainLoginModule "
                                 f"or ScramLoginModule)")
            if mech and mech.upper() not in _LOGIN_MODULES[short]:
                raise ValueError(f"sasl_jaas_config: {short} does not do sasl_mechanism {mech}")
            user = user or options.get("username")
            password = password or options.get("password")
        if proto.startswith("SASL"):
            if not mech:
                raise ValueError(f"sasl_mechanism is required with security_protocol {proto} "
                                 f"(one of {', '.join(SASL_MECHANISMS)})")
            mech = str(mech).upper()
            if mech not in SASL_MECHANISMS:
                raise ValueError(f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, "
                                 f"not {cfg.get('sasl_mechanism')!r}")
            if not user or password is None:
                raise ValueError(f"sasl_username and sasl_password (or sasl_jaas_config) are "
                                 f"required with security_protocol {proto}")
        for key in ("ssl_truststore_type", "ssl_keystore_type"):
            if cfg.get(key) and str(cfg[key]).upper() != "PEM":
                raise ValueError(f"{key}: only PEM stores can be read here, not {cfg[key]!r}")
        certfile, keyfile = cfg.get("ssl_certfile"), cfg.get("ssl_keyfile")
        if cfg.get("ssl_keystore_location"):
            certfile = certfile or cfg["ssl_keystore_location"]
            keyfile = keyfile or cfg["ssl_keystore_location"]
        check = cfg.get("ssl_check_hostname", True)
        algo = cfg.get("ssl_endpoint_identification_algorithm")
        if algo is not None:
            check = str(algo).lower() == "https"
        return cls(proto, mech if proto.startswith("SASL") else None, user, password,
                   cfg.get("ssl_cafile"), certfile, keyfile, cfg.get("ssl_password"), bool(check))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ssl_cafile)
        ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certfile:
            ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_password)
        return ctx


def properties_settings(path: str) -> dict[str, Any]:
    """The TLS and SASL settings of a Kafka client properties file (``key=value`` lines, ``#`` and
    ``!`` comments: what the ``--command-config`` of Kafka's tools reads), under our key names;
    its other keys (client.id, request.timeout.ms ...) are left out. OSError when it cannot be
    read."""
    out: dict[str, Any] = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                key, _, value = line.partition(":")
            name = key.strip().replace(".", "_").replace("-", "_")
            name = ALIASES.get(name, name)
            if name in DEFAULTS:
                out[name] = value.strip()
    if "ssl_check_hostname" in out:
        out["ssl_check_hostname"] = str(out["ssl_check_hostname"]).lower() == "true"
    return out


class SaslError(Exception):
    """The broker refused the SASL exchange; ``code`` and ``message`` are its answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def authenticate(security: Security, roundtrip, handshake_version: int,
                 authenticate_version: int) -> None:
    """KIP-152: SaslHandshake (v1) with the mechanism, then SaslAuthenticate until done.
    ``roundtrip(api_key, version, body)`` sends one request and returns the decoded answer."""
    mech = security.sasl_mechanism
    r = roundtrip(SASL_HANDSHAKE, handshake_version, {"mechanism": mech})
    if int(r.error_code):
        raise SaslError(int(r.error_code), f"SASL mechanism {mech} refused; the broker enables "
                                           f"{list(r.mechanisms)}")

    def step(token: bytes) -> bytes:
        a = roundtrip(SASL_AUTHENTICATE, authenticate_version, {"auth_bytes": token})
        if int(a.error_code):
            raise SaslError(int(a.error_code), a.error_message or "authentication failed")
        return bytes(a.auth_bytes)

    if mech == "PLAIN":
        step(f"\0{security.sasl_username}\0{security.sasl_password}".encode())
        return
    client = ScramClient(mech, security.sasl_username, security.sasl_password)
    try:
        server_final = step(client.final(step(client.first())))
        client.verify(server_final)
    except ScramClientError as e:
        raise SaslError(58, f"{mech}: {e}") from None   # SASL_AUTHENTICATION_FAILED
