"""Security for integration tests: certificates, SASL users, listeners per security protocol, each
client library's settings for them, and ACLs.

- A throw-away PKI made with ``cryptography`` (``make_pki``, ``issue_broker_cert``; no key is ever
  committed): a test CA, a broker and a client certificate, and a rogue one from a CA nobody
  trusts.
- ``secure_appliance``: an appliance with one listener per security protocol, its certificates
  from a fresh PKI and users made offline with ``appliance users add`` (``users_add``) before it
  starts; ``confluent_config`` / ``kafka_python_config`` / ``aiokafka_config`` /
  ``appliance_client_config``: how each client library connects to one of its listeners as a
  user; ``grant``: the admin (a super user) gives a user ACLs over SASL_SSL.
- ``secure``: an appliance with the authorizer on and nothing but PLAINTEXT, where every client
  is ``User:ANONYMOUS``. A test names the ACLs it needs (``Acl`` rows, in Kafka's words) and gets
  back the ``Principal`` it acts as: that principal's client configuration for confluent-kafka,
  kafka-python and ``appliance.client``. The topics and ACLs are made through confluent-kafka's
  AdminClient (CreateAcls, the real API) while ANONYMOUS is a super user; then the appliance
  restarts with the super users the test asked for (the ACLs are durable, so every such test
  also proves that they survive a restart). ``produce_one`` and ``any_filter`` are what the ACL
  tests ask with.

Runs in the pytest process; ``appliance users add`` runs as a subprocess.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import subprocess
from dataclasses import dataclass, field

from confluent_kafka import Producer
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   AdminClient, NewTopic, ResourcePatternType, ResourceType)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from appliance.client import acl_admin
from appliance.acl import model
from appliance.client.transaction_admin import connect
from appliance.client.security import DEFAULTS, Security
from appliance_harness import APPLIANCE, Appliance, free_port

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
ANONYMOUS = "User:ANONYMOUS"
TIMEOUT = 30


# -- certificates ---------------------------------------------------------------------------------

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


# -- SASL users, listeners per protocol -----------------------------------------------------------

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


# -- ACLs -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Acl:
    """One ACL as kafka-acls.sh would take it: ``Acl("Topic", "orders", "Read")``."""
    resource_type: str                  # Topic, Group, Cluster, TransactionalId
    name: str
    operation: str                      # Read, Write, All, TwoPhaseCommit...
    principal: str = ANONYMOUS
    permission: str = "Allow"
    pattern: str = "LITERAL"            # or PREFIXED
    host: str = "*"

    def binding(self) -> model.AclBinding:
        return model.AclBinding(
            int(model.parse_resource_type(self.resource_type)), self.name,
            int(model.parse_pattern_type(self.pattern)), self.principal, self.host,
            int(model.parse_operation(self.operation)), int(model.parse_permission(self.permission)))

    def confluent(self) -> AclBinding | None:
        """As confluent-kafka's AclBinding (None for TwoPhaseCommit, which it does not know)."""
        b = self.binding()
        try:
            op = AclOperation(b.operation)
        except ValueError:
            return None
        return AclBinding(ResourceType(b.resource_type), b.resource_name,
                          ResourcePatternType(b.pattern_type), b.principal, b.host, op,
                          AclPermissionType(b.permission_type))


@dataclass(frozen=True)
class Principal:
    """Who a test acts as, and how each client library connects as them."""
    name: str
    bootstrap: str
    extra: dict = field(default_factory=dict)     # more confluent-kafka settings

    def confluent(self, **conf) -> dict:
        return {"bootstrap.servers": self.bootstrap, **self.extra, **conf}

    def kafka_python(self, **kw) -> dict:
        return {"bootstrap_servers": self.bootstrap, **kw}

    def appliance_client(self, **kw) -> dict:
        return {"bootstrap_servers": self.bootstrap, **kw}

    def admin(self) -> AdminClient:
        return AdminClient(self.confluent())


def create_acls(bootstrap: str, bindings: list[model.AclBinding], security: Security | None = None) -> None:
    """CreateAcls through the appliance's own admin client (``appliance acls``), which knows
    every operation (confluent-kafka's AclOperation has no TwoPhaseCommit, KIP-939's)."""
    conn = connect(bootstrap, security=security)
    try:
        acl_admin.create_acls(conn, bindings)
    finally:
        conn.close()


def grant(s: Secured, user: str, acls: list[tuple[str, str, str, str]]) -> None:
    """The admin (a super user) allows ``User:<user>`` each (resource type, name, pattern,
    operation) of ``acls`` (the names of ``appliance.acl.model``'s enums, e.g. ("TOPIC", "t-",
    "PREFIXED", "ALL")), over SASL_SSL with the appliance's own admin client."""
    conf = appliance_client_config(s, "SASL_SSL")
    security = Security.from_config({**DEFAULTS, **{k: v for k, v in conf.items()
                                                    if k != "bootstrap_servers"}})
    create_acls(conf["bootstrap_servers"],
                [Acl(rtype, name, op, principal=f"User:{user}", pattern=pattern).binding()
                 for rtype, name, pattern, op in acls], security)


def secure(appliance: Appliance, acls: list[Acl], topics: dict[str, int] | None = None, *,
           super_users: list[str] | None = None,
           allow_everyone_if_no_acl_found: bool = False) -> Principal:
    """Start ``appliance`` (not started yet) with the authorizer on, ``topics`` and ``acls`` in
    place; return the principal the test acts as (``User:ANONYMOUS``: PLAINTEXT authenticates
    nobody)."""
    auth = appliance.config.setdefault("authorizer", {})
    auth.update(enable=True, super_users=[ANONYMOUS], allow_everyone_if_no_acl_found=False)
    appliance.start()
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    if topics:
        for f in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()],
                                     request_timeout=TIMEOUT).values():
            f.result()
    known = [a.confluent() for a in acls if a.confluent() is not None]
    if known:
        for f in admin.create_acls(known, request_timeout=TIMEOUT).values():
            assert f.result() is None
    others = [a.binding() for a in acls if a.confluent() is None]
    if others:       # through the appliance's own admin client (appliance acls)
        create_acls(appliance.bootstrap, others)
    appliance.terminate()
    auth.update(super_users=list(super_users or []),
                allow_everyone_if_no_acl_found=allow_everyone_if_no_acl_found)
    appliance.start()
    return Principal(ANONYMOUS, appliance.bootstrap)


def produce_one(p: Principal, topic: str, **conf) -> int:
    """The error code confluent-kafka's producer reports for one record (0: delivered)."""
    got = []
    prod = Producer(p.confluent(**{"message.timeout.ms": 10000, **conf}))
    prod.produce(topic, b"v", on_delivery=lambda err, msg: got.append(err))
    prod.flush(20)
    assert got, "no delivery report"
    return 0 if got[0] is None else got[0].code()


def any_filter() -> AclBindingFilter:
    """confluent-kafka's filter that matches every ACL."""
    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                            AclOperation.ANY, AclPermissionType.ANY)
