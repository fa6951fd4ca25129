"""Test helpers for TLS and SASL: a throw-away PKI made with ``cryptography`` (no key is ever
committed), an appliance with one listener per security protocol and users made offline with
``appliance users add``, and the client settings of each client library for each protocol."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness import APPLIANCE, free_port

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"


def _name(**attrs) -> x509.Name:
    oids = {"C": NameOID.COUNTRY_NAME, "O": NameOID.ORGANIZATION_NAME,
            "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in attrs.items()])


@dataclass
class Pki:
    dir: str
    ca: str = ""                 # CA certificate (PEM)
    broker_cert: str = ""
    broker_key: str = ""
    client_cert: str = ""        # subject C=US, O=Acme, OU=eng, CN=client
    client_key: str = ""
    other_ca: str = ""           # a CA nobody trusts
    rogue_cert: str = ""         # a client certificate signed by other_ca
    rogue_key: str = ""
    _keys: dict = field(default_factory=dict)

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        if with_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key)
        return ctx


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path


def _cert(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
          server: bool = False, client: bool = False, days: int = 30) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                          crl_sign=True, content_commitment=False,
                                          key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            issuer_key.public_key()), False)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
             ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    if usages:
        b = b.add_extension(x509.ExtendedKeyUsage(usages), False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key, password: bytes | None = None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def make_pki(directory: str, broker_cn: str = "broker", key_password: bytes | None = None) -> Pki:
    os.makedirs(directory, exist_ok=True)
    pki = Pki(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(O="Appliance Test", CN="Test CA")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    pki._keys["ca"] = (ca, ca_key)
    pki.ca = _write(os.path.join(directory, "ca.pem"), _pem(ca))
    pki.broker_cert, pki.broker_key = issue_broker_cert(pki, broker_cn, key_password)
    ck = ec.generate_private_key(ec.SECP256R1())
    client = _cert(_name(C="US", O="Acme", OU="eng", CN="client"), ck, ca_name, ca_key,
                   client=True)
    pki.client_cert = _write(os.path.join(directory, "client.pem"), _pem(client))
    pki.client_key = _write(os.path.join(directory, "client.key"), _key_pem(ck))
    ok = ec.generate_private_key(ec.SECP256R1())
    other_name = _name(CN="Other CA")
    other = _cert(other_name, ok, other_name, ok, ca=True)
    pki.other_ca = _write(os.path.join(directory, "other-ca.pem"), _pem(other))
    rk = ec.generate_private_key(ec.SECP256R1())
    rogue = _cert(_name(CN="rogue"), rk, other_name, ok, client=True)
    pki.rogue_cert = _write(os.path.join(directory, "rogue.pem"), _pem(rogue))
    pki.rogue_key = _write(os.path.join(directory, "rogue.key"), _key_pem(rk))
    return pki


def issue_broker_cert(pki: Pki, cn: str, key_password: bytes | None = None,
                      suffix: str = "") -> tuple[str, str]:
    """A broker certificate (SAN localhost and 127.0.0.1) signed by the test CA, written to
    broker{suffix}.pem / .key; returns the two paths."""
    ca, ca_key = pki._keys["ca"]
    bk = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(_name(O="Appliance Test", CN=cn), bk, ca.subject, ca_key, server=True)
    return (_write(os.path.join(pki.dir, f"broker{suffix}.pem"), _pem(cert)),
            _write(os.path.join(pki.dir, f"broker{suffix}.key"), _key_pem(bk, key_password)))


def users_add(data_dir: str, name: str, password: str, mechanism: str = "SCRAM-SHA-512",
              *extra: str) -> subprocess.CompletedProcess:
    """``appliance users add`` offline, the password on stdin."""
    return subprocess.run([APPLIANCE, "users", "add", name, "--mechanism", mechanism,
                           "--password-stdin", "--data-dir", data_dir, *extra],
                          input=password + "\n", capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})


@dataclass
class Secured:
    """A started appliance with a listener per protocol in ``ports``."""
    app: object
    ports: dict
    pki: Pki

    def bootstrap(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"


def secure_appliance(appliance_factory, tmp_path, protocols=PROTOCOLS,
                     users: dict | None = None, mechanisms=("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"),
                     tls: dict | None = None, start: bool = True, **config) -> Secured:
    """An appliance with a listener per protocol on free ports, its certificates from a fresh
    test PKI, and ``users`` (name -> password; default: the admin) added offline with both SCRAM
    mechanisms before the start."""
    pki = make_pki(str(tmp_path / "pki"))
    ports = {p: free_port() for p in protocols}
    data_dir = str(tmp_path / "data")
    for name, password in (users if users is not None else {ADMIN: ADMIN_PASSWORD}).items():
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            r = users_add(data_dir, name, password, mech)
            assert r.returncode == 0, r.stderr
    server = dict(config.pop("server", {}))
    server["listeners"] = ",".join(f"{p}://127.0.0.1:{port}" for p, port in ports.items())
    tls_cfg = {"cert_file": pki.broker_cert, "key_file": pki.broker_key, "ca_file": pki.ca}
    tls_cfg.update(tls or {})
    app = appliance_factory(data_dir=data_dir, start=False, server=server, tls=tls_cfg,
                            sasl={"mechanisms": list(mechanisms)}, **config)
    app.use_listeners(ports, pki.client_context(with_cert=True))
    if start:
        app.start()
    return Secured(app, ports, pki)


# -- client settings per library ----------------------------------------------------------------

def confluent_config(s: Secured, protocol: str, user: str = ADMIN, password: str = ADMIN_PASSWORD,
                     mechanism: str = "SCRAM-SHA-512", **extra) -> dict:
    conf = {"bootstrap.servers": s.bootstrap(protocol), "security.protocol": protocol.lower()}
    if protocol in ("SSL", "SASL_SSL"):
        conf["ssl.ca.location"] = s.pki.ca
    if protocol.startswith("SASL"):
        conf.update({"sasl.mechanisms": mechanism, "sasl.username": user,
                     "sasl.password": password})
    conf.update(extra)
    return conf


def kafka_python_config(s: Secured, protocol: str, user: str = ADMIN,
                        password: str = ADMIN_PASSWORD, mechanism: str = "SCRAM-SHA-512") -> dict:
    conf = {"bootstrap_servers": s.bootstrap(protocol), "security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        conf["ssl_cafile"] = s.pki.ca
    if protocol.startswith("SASL"):
        conf.update({"sasl_mechanism": mechanism, "sasl_plain_username": user,
                     "sasl_plain_password": password})
    return conf


def aiokafka_config(s: Secured, protocol: str, user: str = ADMIN, password: str = ADMIN_PASSWORD,
                    mechanism: str = "SCRAM-SHA-512") -> dict:
    conf = {"bootstrap_servers": s.bootstrap(protocol), "security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        conf["ssl_context"] = s.pki.client_context()
    if protocol.startswith("SASL"):
        conf.update({"sasl_mechanism": mechanism, "sasl_plain_username": user,
                     "sasl_plain_password": password})
    return conf


def appliance_client_config(s: Secured, protocol: str, user: str = ADMIN,
                            password: str = ADMIN_PASSWORD, mechanism: str = "SCRAM-SHA-512") -> dict:
    conf = {"bootstrap_servers": s.bootstrap(protocol), "security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        conf["ssl_cafile"] = s.pki.ca
    if protocol.startswith("SASL"):
        conf.update({"sasl_mechanism": mechanism, "sasl_username": user, "sasl_password": password})
    return conf


def grant(s: Secured, user: str, acls: list[tuple[str, str, str, str]]) -> None:
    """The admin (a super user) allows ``User:<user>`` each (resource type, name, pattern,
    operation) of ``acls`` (the names of ``appliance.acl.model``'s enums, e.g. ("TOPIC", "t-",
    "PREFIXED", "ALL")), over SASL_SSL with the appliance's own admin client (confluent-kafka's
    AclOperation has no TwoPhaseCommit, KIP-939's)."""
    from appliance.client import transaction_admin as admin
    from appliance.acl import admin as acl_admin
    from appliance.acl.model import (AclBinding, AclOperation, AclPermissionType, PatternType,
                                     ResourceType)
    from appliance.client.security import DEFAULTS, Security
    conf = appliance_client_config(s, "SASL_SSL")
    security = Security.from_config({**DEFAULTS, **{k: v for k, v in conf.items()
                                                    if k != "bootstrap_servers"}})
    conn = admin.connect(conf["bootstrap_servers"], security=security)
    try:
        acl_admin.create_acls(conn, [
            AclBinding(int(ResourceType[rtype]), name, int(PatternType[pattern]), f"User:{user}",
                       "*", int(AclOperation[op]), int(AclPermissionType.ALLOW))
            for rtype, name, pattern, op in acls])
    finally:
        conn.close()
