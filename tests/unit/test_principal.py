"""Principals of TLS connections: the client certificate's subject in RFC 2253 form (as Kafka's
default principal builder writes it) and Kafka's ssl.principal.mapping.rules, on a real TLS
handshake between two in-memory SSL objects (no socket, no fork)."""

from __future__ import annotations

import os
import ssl
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from security_setup import make_pki  # noqa: E402

from appliance.config import TlsConfig
from appliance.principal_rules import MappingRuleError, parse_mapping_rules
from appliance.security.principal import ANONYMOUS, NoMatchingRule, map_principal, rfc2253, ssl_principal
from appliance.security.tls import TlsError, server_context


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> ssl.SSLObject:
    """Run a TLS handshake between two SSLObjects over memory BIOs; the server's object."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {client: False, server: False}
    for _ in range(20):
        for obj in (client, server):
            if not done[obj]:
                try:
                    obj.do_handshake()
                    done[obj] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return server
    raise AssertionError("handshake did not finish")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def _server(pki, client_auth="required", rules=("DEFAULT",)) -> tuple[ssl.SSLContext, list]:
    cfg = TlsConfig(cert_file=pki.broker_cert, key_file=pki.broker_key, ca_file=pki.ca,
                    client_auth=client_auth, principal_mapping_rules=list(rules))
    return server_context(cfg, pki.broker_cert, pki.broker_key, pki.ca), \
        parse_mapping_rules(cfg.principal_mapping_rules)


def test_client_certificate_subject_is_the_principal_in_rfc2253_order(pki):
    ctx, rules = _server(pki)
    server = _handshake(ctx, pki.client_context(with_cert=True))
    assert ssl_principal(server, rules) == "User:CN=client,OU=eng,O=Acme,C=US"


def test_mapping_rules_pick_the_first_match(pki):
    ctx, rules = _server(pki, rules=["RULE:^CN=([^,]+),OU=ops,.*$/ops-$1/",
                                     "RULE:^CN=([^,]+),OU=(eng),.*$/$1@$2/U", "DEFAULT"])
    server = _handshake(ctx, pki.client_context(with_cert=True))
    assert ssl_principal(server, rules) == "User:CLIENT@ENG"


def test_no_rule_matching_refuses_and_no_certificate_is_anonymous(pki):
    ctx, rules = _server(pki, rules=["RULE:^CN=admin,.*$/admin/"])
    server = _handshake(ctx, pki.client_context(with_cert=True))
    with pytest.raises(NoMatchingRule, match="No rules apply to CN=client"):
        ssl_principal(server, rules)
    ctx, rules = _server(pki, client_auth="requested")
    assert ssl_principal(_handshake(ctx, pki.client_context()), rules) == ANONYMOUS


def test_rfc2253_escapes_and_writes_unknown_attributes_as_hex():
    subject = ((("countryName", "US"),), (("organizationName", "A, B+C"),),
               (("commonName", " lead "), ("emailAddress", "a@b")), (("localityName", "#x"),))
    assert rfc2253(subject) == ("L=\\#x,CN=\\ lead\\ +1.2.840.113549.1.9.1=#1603614062,"
                                "O=A\\, B\\+C,C=US")


def test_mapping_rule_syntax():
    assert map_principal("CN=x,O=y", parse_mapping_rules(["RULE:^CN=(.*?),O=(.*)$/$2\\/$1/L"])) \
        == "User:y/x"
    for bad in ("RULE:^x$/y", "rule:a/b/", "RULE:(/x/"):
        with pytest.raises(MappingRuleError):
            parse_mapping_rules([bad])


def test_unloadable_material_names_the_key(pki, tmp_path):
    cfg = TlsConfig(cert_file=pki.broker_cert, key_file=pki.client_key)
    with pytest.raises(TlsError, match=r"^tls\.cert_file / tls\.key_file: cannot load"):
        server_context(cfg, pki.broker_cert, pki.client_key, "")
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(TlsError, match=r"^tls\.ca_file: cannot load"):
        server_context(cfg, pki.broker_cert, pki.broker_key, missing)
