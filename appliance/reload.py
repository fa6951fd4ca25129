"""Live reload of the configuration (SIGHUP, ``systemctl reload``): which keys may change while
the appliance runs, and how the workers learn the new values.

Runs in the supervisor (``plan``, ``publish``) and in every worker (``read_published``). The
supervisor owns the running configuration: on SIGHUP it re-reads the file (and the environment
and flags it started with), applies the keys listed in ``LIVE``, keeps the running value of every
other key and says so naming the key, writes the result to ``config.msgpack`` in the runtime
directory and only then bumps ``config_version`` on its state page. Every worker compares that
version with its own once per loop turn (a load of the page's seqlock counter) and, when it
moved, reads the file and calls its ``reload(old, new)`` hook: the worker base's one entry point
per worker, as ``Supervisor.reload`` is the supervisor's. Parts that read files of their own
(the TLS certificates: ``appliance.security.supervisor`` re-reads them in a supervisor hook, which
runs before the version moves, and the frontends' ``reload`` builds their SSL context from the
copy it published) hook in there: the version moves on every SIGHUP whose file parses, changed
keys or not, so a rotated certificate file is read again.

Broker defaults apply to every topic that does not override them (as Kafka's dynamic broker
defaults do): a partition writer recomputes its settings from the new ``[log]`` section and its
topic's configs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from .config import Config, ConfigError, check_consistency
from .config_print import HIDDEN, SECRET_KEYS, to_toml_dict
from appliance.durable import atomic_write

log = logging.getLogger("appliance.supervisor")

# Keys a reload applies, each with where it takes effect. Every other key keeps its running value
# (a reload that changes one logs that it needs a restart). A whole section is named by "x.*".
LIVE: dict[str, str] = {
    "server.socket_request_max_bytes": "frontends, for connections accepted after the reload",
    "server.fetch_max_bytes": "frontends, from their next Fetch",
    "server.connections_max_idle_ms": "frontends",
    "server.connection_failed_authentication_delay_ms": "frontends",
    "server.internal_request_timeout_ms": "frontends and partition writers, for new requests",
    "log.*": "partition writers (topics without an override of the key), frontends' validation, "
             "fetchers",
    "log.flush.*": "partition writers and the coordinator's logs",
    "log.cleaner.*": "cleaner processes, from their next round (the topic defaults also partition "
                     "writers: retention and rolls of compacted topics)",
    "log.scrub.*": "cleaner processes (the scrub's rate and pauses) and fetchers (verify_fetches)",
    "topics.*": "supervisor (CreateTopics) and frontends (auto-creation)",
    "supervisor.*": "supervisor",
    "transactions.max_timeout_ms": "coordinator",
    "transactions.id_expiration_ms": "coordinator",
    "transactions.abort_timed_out_interval_ms": "coordinator, from its next scan",
    "transactions.producer_id_expiration_ms": "partition writers",
    "transactions.two_phase_commit_enable": "coordinator",
    "transactions.partition_verification_enable": "partition writers",
    "transactions.add_partitions_retry_backoff_ms": "partition writers",
    "transactions.add_partitions_retry_backoff_max_ms": "partition writers and the coordinator",
    "groups.*": "coordinator",
    "tls.*": "supervisor (re-reads the certificate files on every reload; a renewal that does not "
             "load keeps the ones in use) and frontends, for connections accepted after the reload",
    "sasl.*": "frontends, for connections accepted after the reload",
    "telemetry.*": "frontends, from each client's next GetTelemetrySubscriptions",
    "quotas.*": "frontends, from their next request (samples already taken are kept)",
    "console.allow_changes": "the console, from its next request",
    "console.session_idle_ms": "the console, from its next request",
}

# Why the others need a restart, for the refusal message.
RESTART_REASONS: dict[str, str] = {
    "server.listen": "the listening socket is bound at start",
    "server.listeners": "the listening sockets are bound at start",
    "server.listener_security_protocol_map": "the listening sockets are bound at start",
    "server.advertised_listener": "clients cache the broker address from Metadata",
    "server.advertised_listeners": "clients cache the broker address from Metadata",
    "server.node_id": "it is recorded in the data dir",
    "server.data_dir": "the data dir is locked and open",
    "server.runtime_dir": "every shared-memory file lives there",
    "server.disk_reserve_bytes": "the reserve is made at start",
    "server.frontends": "the rings between processes are made at start",
    "server.fetchers": "the rings between processes are made at start",
    "server.max_incremental_fetch_session_cache_slots":
        "each frontend sizes its fetch-session cache once, at start (as Kafka's is static)",
    "server.max_connections": "each frontend reads its connection quotas once, at start",
    "server.max_connections_per_ip": "each frontend reads its connection quotas once, at start "
                                     "(and the shared per-address tables are made only then)",
    "server.max_connections_per_ip_overrides": "each frontend resolves the overrides once, at start",
    "shm.*": "rings keep the size they were made with",
    "transactions.transaction_version":
        "clients learn the finalized feature once, from ApiVersions",
    "metrics.*": "the metrics listener is bound at start",
    "console.listen": "the console's listener is bound at start",
    "console.tls": "the console's listener is set up at start",
    "console.ssl_cafile": "the console's Kafka connections are set up at start",
    "console.ssl_certfile": "the console's Kafka connections are set up at start",
    "console.ssl_keyfile": "the console's Kafka connections are set up at start",
    "console.ssl_password": "the console's Kafka connections are set up at start",
    "log.cleaner.processes": "each partition's rings to its cleaner are made when its writer starts",
    "authorizer.*": "each frontend builds its authorizer once, at start (as Kafka's "
                    "authorizer.class.name and super.users are static)",
}


def is_live(key: str) -> bool:
    if key in LIVE:
        return True
    if key in RESTART_REASONS:
        return False            # a key named for a restart inside a live section
    parts = key.split(".")
    return any(".".join(parts[:i]) + ".*" in LIVE for i in range(1, len(parts)))


def _reason(key: str) -> str:
    if key in RESTART_REASONS:
        return RESTART_REASONS[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        r = RESTART_REASONS.get(".".join(parts[:i]) + ".*")
        if r:
            return r
    return "it is read once, at start"


def diff(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(dotted key, old, new) of every key whose value differs, in file order."""
    out: list[tuple[str, Any, Any]] = []

    def walk(prefix: str, a: dict, b: dict) -> None:
        for k in b:
            dotted = f"{prefix}.{k}" if prefix else k
            if isinstance(b[k], dict):
                walk(dotted, a.get(k, {}), b[k])
            elif a.get(k) != b[k]:
                out.append((dotted, a.get(k), b[k]))
    walk("", to_toml_dict(old), to_toml_dict(new))
    return out


@dataclass
class ReloadPlan:
    config: Config                                   # the running configuration after the reload
    applied: list[tuple[str, Any, Any]] = field(default_factory=list)
    refused: list[tuple[str, Any, Any]] = field(default_factory=list)


def plan(old: Config, new: Config) -> ReloadPlan:
    """What a reload from ``old`` to ``new`` does: the live keys take their new values, every
    other key keeps its old one. Raises ConfigError when the result is inconsistent."""
    changes = diff(old, new)
    applied = [c for c in changes if is_live(c[0])]
    refused = [c for c in changes if not is_live(c[0])]
    tree = to_toml_dict(old)
    for dotted, _, value in applied:
        node = tree
        *path, last = dotted.split(".")
        for part in path:
            node = node[part]
        node[last] = value
    merged = msgspec.convert(tree, Config)
    check_consistency(merged)
    return ReloadPlan(merged, applied, refused)


def reload_config(running: Config, source: Callable[[], Config]) -> ReloadPlan | None:
    """Re-read the configuration through ``source`` and plan the reload, logging each change and
    each refusal (naming the key). None when the file does not load: nothing changes."""
    try:
        p = plan(running, source())
    except ConfigError as e:
        log.error("reload refused, the running configuration stays: %s", e)
        return None
    for dotted, was, now in _shown(p.refused):
        log.warning("reload: %s cannot change while the appliance runs (%s): keeping %r, "
                    "restart to apply %r", dotted, _reason(dotted), was, now)
    for dotted, was, now in _shown(p.applied):
        log.info("reload: %s: %r -> %r", dotted, was, now)
    if not p.applied:
        log.info("reload: no live setting changed")
    return p


_SECRETS = {f"{section}.{key}" for section, key in SECRET_KEYS}


def _shown(changes: list[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
    """Changes as the log may show them: a secret's values hidden (logs land in tickets)."""
    return [(k, HIDDEN, HIDDEN) if k in _SECRETS else (k, a, b) for k, a, b in changes]


def publish(cfg: Config, path: str) -> None:
    """Write the running configuration for the workers (runtime dir, tmpfs: no fsync)."""
    atomic_write(path, msgspec.msgpack.encode(cfg), sync=False)


def read_published(path: str) -> Config:
    with open(path, "rb") as f:
        return msgspec.msgpack.decode(f.read(), type=Config)


def file_path(run_dir: str) -> str:
    from .runtime import CONFIG_FILE
    return os.path.join(run_dir, CONFIG_FILE)
