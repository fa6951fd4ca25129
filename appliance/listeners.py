"""Kafka's listeners: ``server.listeners`` / ``server.advertised_listeners`` parsed into endpoints.

Owns nothing at run time (pure parsing; the configuration calls it, the supervisor binds what it
returns, the frontends serve it). The syntax is Kafka's ``listeners``:

    NAME://host:port[,NAME://host:port...]

where NAME is a security protocol (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``) or a
listener name that ``server.listener_security_protocol_map`` maps to one (Kafka's
``listener.security.protocol.map``, ``"CLIENT:SASL_SSL,INTERNAL:PLAINTEXT"``). An empty host
binds every interface (as in Kafka); an IPv6 host is written in brackets. Listener names are
case-insensitive and kept upper case (Kafka's ListenerName.normalised).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = {p: p for p in SECURITY_PROTOCOLS}

_ENDPOINT = re.compile(r"^([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.%]*\]|[^:\[\]/]*):([0-9]+)$")


class ListenerError(ValueError):
    """A listener string that does not parse; the message says what is wrong (the caller adds
    the key)."""


@dataclass(frozen=True)
class Listener:
    name: str          # Kafka's listener name (upper case)
    protocol: str      # its security protocol
    host: str          # as written, brackets removed; "" = every interface
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str) -> dict[str, str]:
    """Kafka's ``listener.security.protocol.map``; the default maps each protocol to itself."""
    out = dict(DEFAULT_PROTOCOL_MAP)
    if not text.strip():
        return out
    for item in text.split(","):
        name, sep, proto = item.strip().partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not re.fullmatch(r"[A-Z0-9_]+", name):
            raise ListenerError(f"expected NAME:PROTOCOL, got {item.strip()!r}")
        if proto not in SECURITY_PROTOCOLS:
            raise ListenerError(f"{name}: unknown security protocol {proto!r} "
                                f"(one of {', '.join(SECURITY_PROTOCOLS)})")
        out[name] = proto
    return out


def parse_listeners(text: str, protocol_map: dict[str, str] | None = None) -> list[Listener]:
    """Every ``NAME://host:port`` of a comma-separated list, in order; names must be unique."""
    protocol_map = protocol_map or DEFAULT_PROTOCOL_MAP
    out: list[Listener] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            raise ListenerError("empty listener in the list")
        m = _ENDPOINT.match(item)
        if m is None:
            raise ListenerError(f"expected NAME://HOST:PORT, got {item!r}")
        name, host, port = m.group(1).upper(), m.group(2), int(m.group(3))
        if port > 65535:
            raise ListenerError(f"{item}: port {port} out of range")
        proto = protocol_map.get(name)
        if proto is None:
            raise ListenerError(f"{item}: listener name {name} is neither a security protocol "
                                f"nor in server.listener_security_protocol_map")
        if any(x.name == name for x in out):
            raise ListenerError(f"listener name {name} appears twice")
        out.append(Listener(name, proto, host.strip("[]"), port))
    ports = [x.port for x in out if x.port]
    if len(ports) != len(set(ports)):
        raise ListenerError("two listeners on the same port")
    return out


def advertised_host(host: str) -> str:
    """What a listener bound to ``host`` tells clients when nothing is advertised for it: an
    all-interfaces bind is advertised as the loopback address (set advertised listeners when
    clients connect from other machines)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
