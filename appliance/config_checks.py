"""The configuration's cross-key checks: what no single key's type can say.

Owns nothing; runs wherever a configuration is loaded or reloaded (the CLI, the supervisor's
start and SIGHUP, ``appliance.reload``). ``appliance.config`` holds the schema and the loading,
and re-exports ``ConfigError``, ``parse_hostport`` and ``check_consistency`` from here.
"""

from __future__ import annotations

import ipaddress
import os
import re
from .listeners import ListenerError, parse_listeners, parse_protocol_map

__all__ = ["ConfigError", "parse_hostport", "check_consistency"]


class ConfigError(Exception):
    """A configuration problem; the message names the offending key."""


def parse_hostport(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ConfigError(f"config: {key}: expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


# ``cfg`` is an ``appliance.config.Config`` (not imported: this module sits below it).

def _check_listeners(cfg) -> None:
    s = cfg.server
    if s.listen and s.listeners:
        raise ConfigError("config: server.listen, server.listeners: set one of them (listen is "
                          "the shorthand for listeners = \"PLAINTEXT://HOST:PORT\")")
    if s.listen:
        parse_hostport(s.listen, "server.listen")
    try:
        protocol_map = parse_protocol_map(s.listener_security_protocol_map)
    except ListenerError as e:
        raise ConfigError(f"config: server.listener_security_protocol_map: {e}") from None
    try:
        listeners = (parse_listeners(s.listeners, protocol_map) if s.listeners
                     else cfg.listeners)
    except ListenerError as e:
        raise ConfigError(f"config: server.listeners: {e}") from None
    if s.advertised_listener:
        if s.advertised_listeners:
            raise ConfigError("config: server.advertised_listener, server.advertised_listeners: "
                              "set one of them")
        if len(listeners) > 1:
            raise ConfigError("config: server.advertised_listener: one address for several "
                              "listeners; use server.advertised_listeners")
        parse_hostport(s.advertised_listener, "server.advertised_listener")
    if s.advertised_listeners:
        try:
            advertised = parse_listeners(s.advertised_listeners, protocol_map)
        except ListenerError as e:
            raise ConfigError(f"config: server.advertised_listeners: {e}") from None
        names = {x.name for x in listeners}
        for adv in advertised:
            if adv.name not in names:
                raise ConfigError(f"config: server.advertised_listeners: {adv.name} is not a "
                                  f"listener of server.listeners")
            if not adv.host or adv.host in ("0.0.0.0", "::") or adv.port == 0:
                raise ConfigError(f"config: server.advertised_listeners: {adv}: advertise a host "
                                  f"and port clients can connect to")
    tls = cfg.tls
    for lst in listeners:
        if lst.tls:
            for key in ("cert_file", "key_file"):
                if not getattr(tls, key):
                    raise ConfigError(f"config: tls.{key}: required by the {lst.protocol} "
                                      f"listener {lst}")
        if lst.sasl and not cfg.sasl.mechanisms:
            raise ConfigError(f"config: sasl.mechanisms: empty, but {lst} needs at least one")
    if tls.client_auth != "none" and not tls.ca_file:
        raise ConfigError(f"config: tls.ca_file: required when tls.client_auth is "
                          f"{tls.client_auth!r} (the CAs client certificates must chain to)")
    if len(set(cfg.sasl.mechanisms)) != len(cfg.sasl.mechanisms):
        raise ConfigError("config: sasl.mechanisms: a mechanism is listed twice")
    sasl = cfg.sasl
    if sasl.oauthbearer_jwks_endpoint_url:
        url = sasl.oauthbearer_jwks_endpoint_url
        if not url.startswith("file:") or len(url) <= len("file:"):
            raise ConfigError(f"config: sasl.oauthbearer_jwks_endpoint_url: {url!r}: only file: "
                              f"URLs are supported (file:///path/jwks.json)")
    if ("OAUTHBEARER" in sasl.mechanisms and not sasl.oauthbearer_jwks_endpoint_url
            and not sasl.oauthbearer_unsecured_validator):
        raise ConfigError("config: sasl.oauthbearer_jwks_endpoint_url: required by the "
                          "OAUTHBEARER mechanism (or oauthbearer_unsecured_validator, for "
                          "development only)")
    from .principal_rules import MappingRuleError, parse_mapping_rules
    try:
        parse_mapping_rules(tls.principal_mapping_rules)
    except MappingRuleError as e:
        raise ConfigError(f"config: tls.principal_mapping_rules: {e}") from None
    if s.connection_failed_authentication_delay_ms >= s.connections_max_idle_ms:
        raise ConfigError("config: server.connection_failed_authentication_delay_ms: must be "
                          "below server.connections_max_idle_ms")
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOST_NAME.fullmatch(host))


# The listener the console's Kafka connections use, best first: a SASL listener when there is
# one (logins then mean something), plaintext before TLS (the connection stays on this machine).
CONSOLE_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL", "PLAINTEXT", "SSL")


def console_listener(listeners):
    """The listener of ``listeners`` the console connects to (``appliance.console.app``)."""
    order = CONSOLE_PROTOCOLS
    return min(listeners, key=lambda lst: order.index(lst.protocol)
               if lst.protocol in order else len(order))


def _check_console_client(cfg) -> None:
    """The console's client certificate: both files or neither, and one when its listener is
    TLS with tls.client_auth = "required" (else every page would fail its handshake)."""
    c = cfg.console
    if bool(c.ssl_certfile) != bool(c.ssl_keyfile):
        raise ConfigError("config: console.ssl_certfile, console.ssl_keyfile: give both or neither")
    target = console_listener(cfg.listeners) if cfg.listeners else None
    if target is not None and target.tls and cfg.tls.client_auth == "required" and not c.ssl_certfile:
        raise ConfigError(f"config: console.ssl_certfile: required: the console connects to the "
                          f"{target.protocol} listener {target}, which requires client "
                          f"certificates (tls.client_auth = \"required\")")


def check_consistency(cfg) -> None:
    """What no single key's type can say (also applied to the result of a reload)."""
    _check_listeners(cfg)
    if cfg.metrics.listen:
        host, port = parse_hostport(cfg.metrics.listen, "metrics.listen")
        for lst in cfg.listeners:
            if port and (lst.host, lst.port) == (host, port):
                raise ConfigError(f"config: metrics.listen: must differ from the listener {lst}")
    if cfg.console.listen:
        host, port = parse_hostport(cfg.console.listen, "console.listen")
        taken = [(lst.host, lst.port, str(lst)) for lst in cfg.listeners]
        if cfg.metrics.listen:
            taken.append((*parse_hostport(cfg.metrics.listen, "metrics.listen"), "metrics.listen"))
        for h, p, what in taken:
            if port and (h, p) == (host, port):
                raise ConfigError(f"config: console.listen: must differ from {what}")
        if cfg.console.tls and not (cfg.tls.cert_file and cfg.tls.key_file):
            raise ConfigError("config: console.tls: needs tls.cert_file and tls.key_file")
        _check_console_client(cfg)
    if cfg.shm.produce_ring_bytes & (cfg.shm.produce_ring_bytes - 1):
        raise ConfigError("config: shm.produce_ring_bytes: must be a power of two")
    for key in ("small_ring_bytes", "partition_ring_bytes"):
        size = getattr(cfg.shm, key)
        if size & (size - 1):
            raise ConfigError(f"config: shm.{key}: must be a power of two")
    # A ring record must fit in half the ring (see shm.ring); leave 64 KiB for headers.
    if cfg.log.message_max_bytes + 65536 > cfg.shm.produce_ring_bytes // 2:
        need = 2 * (cfg.log.message_max_bytes + 65536)
        raise ConfigError(
            "config: shm.produce_ring_bytes: must be a power of two of at least "
            f"2 * (log.message_max_bytes + 65536) = {need}: {1 << (need - 1).bit_length()} will do")
    cl = cfg.log.cleaner
    if cl.min_compaction_lag_ms > cl.max_compaction_lag_ms:
        # Kafka's LogConfig refuses the same conflict for the topic configs.
        raise ConfigError(
            f"config: log.cleaner.min_compaction_lag_ms: must be <= log.cleaner.max_compaction_lag_ms "
            f"({cl.min_compaction_lag_ms} > {cl.max_compaction_lag_ms})")
    # Kafka's KafkaConfig refuses the same: with a limit of 0 and no exception nobody could connect.
    if cfg.server.max_connections_per_ip == 0 and not cfg.server.max_connections_per_ip_overrides:
        raise ConfigError("config: server.max_connections_per_ip: can be 0 only if "
                          "server.max_connections_per_ip_overrides is set")
    for host in cfg.server.max_connections_per_ip_overrides:
        if not _valid_host(host):
            raise ConfigError(f"config: server.max_connections_per_ip_overrides: {host!r} is "
                              f"neither an IP address nor a host name")
    if cfg.supervisor.restart_backoff_max_ms < cfg.supervisor.restart_backoff_initial_ms:
        raise ConfigError("config: supervisor.restart_backoff_max_ms: must be >= restart_backoff_initial_ms")
    # Kafka's GroupCoordinatorConfig: an empty assignor list leaves no default, and the interval
    # must be below the session timeout (a member would time out between two heartbeats).
    if not cfg.groups.consumer_assignors:
        raise ConfigError("config: groups.consumer_assignors: must name at least one assignor")
    if cfg.groups.consumer_heartbeat_interval_ms >= cfg.groups.consumer_session_timeout_ms:
        raise ConfigError(
            "config: groups.consumer_heartbeat_interval_ms: must be < groups.consumer_session_timeout_ms")
    # Kafka refuses group.min.session.timeout.ms > group.max.session.timeout.ms the same way:
    # no session timeout could ever be accepted.
    if cfg.groups.min_session_timeout_ms > cfg.groups.max_session_timeout_ms:
        raise ConfigError(
            f"config: groups.min_session_timeout_ms: must be <= groups.max_session_timeout_ms "
            f"({cfg.groups.min_session_timeout_ms} > {cfg.groups.max_session_timeout_ms})")
    for principal in cfg.authorizer.super_users:
        # Kafka compares super.users with the principal's "Type:Name" form.
        ptype, sep, _ = principal.partition(":")
        if not sep or not ptype:
            raise ConfigError(f"config: authorizer.super_users: {principal!r} is not a principal "
                              "(Type:Name, e.g. \"User:admin\")")
    if cfg.server.runtime_dir:
        run = os.path.abspath(cfg.server.runtime_dir)
        data = os.path.abspath(cfg.server.data_dir)
        # The runtime dir is removed on exit: it must not hold the data dir.
        if data == run or data.startswith(run.rstrip(os.sep) + os.sep):
            raise ConfigError(
                f"config: server.runtime_dir: must not be server.data_dir or a parent of it "
                f"({cfg.server.runtime_dir!r})")
