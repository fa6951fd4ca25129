"""Kafka principals of connections: ``User:ANONYMOUS``, ``User:<sasl name>``, and the principal
of a TLS client certificate (Kafka's DefaultKafkaPrincipalBuilder with SslPrincipalMapper).

Owns nothing; pure functions, run by frontends when a connection authenticates. The mapping rules
are parsed by ``appliance.principal_rules`` (which the configuration uses too, to reject bad ones).

A certificate's principal is its subject in RFC 2253 form, as Java's
``X500Principal.getName()`` writes it (most specific attribute first: ``CN=app,OU=eng,O=Acme,C=US``;
the RFC's keywords CN, L, ST, O, OU, C, STREET, DC, UID, other attributes as ``OID=#<hex DER>``),
then put through ``tls.principal_mapping_rules`` (Kafka's ``ssl.principal.mapping.rules``):
``RULE:pattern/replacement/[LU]``, the first rule whose pattern matches the whole name wins,
``$1`` in the replacement is the first group, L/U lower- or upper-case the result, ``DEFAULT``
keeps the name. No rule matching is a failed authentication (Kafka's NoMatchingRule).
"""

from __future__ import annotations

import ssl

from appliance.principal_rules import MappingRule

ANONYMOUS = "User:ANONYMOUS"
USER = "User:"

# Attribute keywords of RFC 2253 (the ones Java's X500Principal RFC2253 form writes by name).
_KEYWORDS = {"commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST",
             "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
             "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID"}
# Attributes that are IA5String in certificates (the rest are taken as UTF8String) for the
# ``#<hex DER>`` form of attributes without a keyword.
_IA5 = {"emailAddress"}
_SPECIAL = set(',+"\\<>;')


class NoMatchingRule(Exception):
    """No mapping rule applies to a certificate's subject: the connection is refused."""


def map_principal(name: str, rules: list[MappingRule]) -> str:
    for rule in rules:
        got = rule.apply(name)
        if got is not None:
            return USER + got
    raise NoMatchingRule(f"No rules apply to {name}")


def rfc2253(subject) -> str:
    """The RFC 2253 string of a subject as ``SSLObject.getpeercert()`` gives it (a tuple of
    RDNs, each a tuple of (long name, value) pairs, least specific first)."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(_attribute(k, v) for k, v in rdn))
    return ",".join(rdns)


def _attribute(name: str, value: str) -> str:
    kw = _KEYWORDS.get(name)
    if kw is not None:
        return f"{kw}={_escape(value)}"
    try:
        oid = ssl._ASN1Object.fromname(name).oid
    except ValueError:
        oid = name
    raw = value.encode("utf-8")
    tag = 0x16 if name in _IA5 else 0x0C
    return f"{oid}=#{bytes([tag]).hex()}{_der_length(len(raw))}{raw.hex()}"


def _der_length(n: int) -> str:
    if n < 0x80:
        return f"{n:02x}"
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return f"{0x80 | len(body):02x}{body.hex()}"


def _escape(value: str) -> str:
    out = []
    for i, c in enumerate(value):
        if c in _SPECIAL or (c == "#" and i == 0) or (c == " " and i in (0, len(value) - 1)):
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def ssl_principal(ssl_object, rules: list[MappingRule]) -> str:
    """The principal of an SSL connection: its verified client certificate's subject mapped by
    the rules, or ANONYMOUS without one (no client auth asked, or none sent when requested)."""
    cert = ssl_object.getpeercert() if ssl_object is not None else None
    if not cert:
        return ANONYMOUS
    return map_principal(rfc2253(cert.get("subject", ())), rules)
