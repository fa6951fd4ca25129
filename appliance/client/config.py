"""Client configuration: the keys the producer and the consumer take, their defaults, and checks.

Owns nothing but the tables. Keys may be given as Python keyword arguments (``linger_ms=5``) or
in a mapping, with Kafka's dotted names too (``{"linger.ms": 5}``); a few Kafka names that differ
from ours are mapped (``enable.idempotence``, ``transaction.two.phase.commit.enable``,
``isolation.level``, ``auto.offset.reset`` ...). An unknown key or a bad value is a ValueError
that names the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from appliance.client import security

__all__ = ["PRODUCER_DEFAULTS", "CONSUMER_DEFAULTS", "ALIASES", "producer_config", "consumer_config"]

_COMMON = {
    "bootstrap_servers": None,          # "host:port[,host:port...]" or a list (required)
    "client_id": "appliance-client",
    "request_timeout_ms": 30000,        # one request's answer
    "retry_backoff_ms": 100,            # first pause between retries (doubles up to 1 s)
    "allow_auto_create_topics": True,   # Metadata may create a topic (if the broker allows it)
    "max_versions": None,               # {api key: highest version to use}, for tests and pinning
    **security.DEFAULTS,                # TLS and SASL (appliance.client.security)
}

PRODUCER_DEFAULTS: dict[str, Any] = {
    **_COMMON,
    "acks": "all",                      # 0, 1, -1 / "all"
    "enable_idempotence": None,         # None: on, unless acks is not "all" (then off)
    "transactional_id": None,
    "transaction_timeout_ms": None,     # default 60000; not with enable_two_phase_commit (KIP-939)
    "enable_two_phase_commit": False,   # KIP-939: transactions that never time out
    "transaction_version": None,        # None: 2 if the broker finalizes it, else 1; or 1 / 2
    "compression_type": "none",         # none, gzip, snappy, lz4, zstd
    "batch_size": 16384,                # bytes per partition batch
    "linger_ms": 5,                     # how long a record may wait for its batch to fill
    "delivery_timeout_ms": 120000,      # retries of one batch give up after this
    "max_block_ms": 60000,              # budget of metadata and coordinator calls
}

CONSUMER_DEFAULTS: dict[str, Any] = {
    **_COMMON,
    "isolation_level": "read_committed",     # or read_uncommitted
    "auto_offset_reset": "earliest",         # earliest, latest, none (position of a new assignment)
    "fetch_max_wait_ms": 500,
    "fetch_min_bytes": 1,
    "fetch_max_bytes": 52428800,
    "max_partition_fetch_bytes": 1048576,
    "metadata_timeout_ms": 60000,
}

# Kafka names (dots made underscores) that are not ours.
ALIASES = {
    "transaction_two_phase_commit_enable": "enable_two_phase_commit",
    "two_phase_commit_enable": "enable_two_phase_commit",
    **security.ALIASES,
}


def _normalise(raw: Mapping[str, Any] | None, kwargs: Mapping[str, Any], table: Mapping[str, Any],
               kind: str) -> dict[str, Any]:
    out = dict(table)
    for source in (raw or {}), kwargs:
        for key, value in source.items():
            name = key.replace(".", "_").replace("-", "_")
            name = ALIASES.get(name, name)
            if name not in table:
                raise ValueError(f"unknown {kind} config key {key!r}")
            out[name] = value
            if name == "transaction_timeout_ms":
                out["_timeout_set"] = True
    if not out["bootstrap_servers"]:
        raise ValueError(f"{kind} config: bootstrap_servers is required")
    for key in ("request_timeout_ms", "retry_backoff_ms"):
        if not isinstance(out[key], int) or out[key] <= 0:
            raise ValueError(f"{kind} config: {key} must be a positive integer, not {out[key]!r}")
    try:
        out["security"] = security.Security.from_config(out)
    except ValueError as e:
        raise ValueError(f"{kind} config: {e}") from None
    return out


def producer_config(raw: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    cfg = _normalise(raw, kwargs, PRODUCER_DEFAULTS, "producer")
    acks = cfg["acks"]
    acks = -1 if acks in ("all", "-1", -1) else acks
    try:
        acks = int(acks)
    except (TypeError, ValueError):
        raise ValueError(f"producer config: acks must be 0, 1 or 'all', not {cfg['acks']!r}") from None
    if acks not in (0, 1, -1):
        raise ValueError(f"producer config: acks must be 0, 1 or 'all', not {cfg['acks']!r}")
    cfg["acks"] = acks
    transactional = cfg["transactional_id"] is not None
    idem = cfg["enable_idempotence"]
    if idem is None:
        idem = acks == -1 or transactional
    if (idem or transactional) and acks != -1:
        raise ValueError("producer config: enable_idempotence and transactional_id need acks='all'")
    if transactional and not idem:
        raise ValueError("producer config: a transactional producer is idempotent "
                         "(enable_idempotence=False conflicts with transactional_id)")
    cfg["enable_idempotence"] = bool(idem)
    if cfg["enable_two_phase_commit"]:
        if not transactional:
            raise ValueError("producer config: enable_two_phase_commit needs a transactional_id")
        if cfg.pop("_timeout_set", False):
            raise ValueError("producer config: transaction_timeout_ms cannot be set with "
                             "enable_two_phase_commit (KIP-939: such transactions never time out)")
    cfg.pop("_timeout_set", None)
    if cfg["transaction_timeout_ms"] is None:
        cfg["transaction_timeout_ms"] = 60000
    if cfg["transaction_version"] not in (None, 1, 2):
        raise ValueError(f"producer config: transaction_version must be 1 or 2, not "
                         f"{cfg['transaction_version']!r}")
    if cfg["compression_type"] in (None, ""):
        cfg["compression_type"] = "none"
    if cfg["compression_type"] not in ("none", "gzip", "snappy", "lz4", "zstd"):
        raise ValueError(f"producer config: unknown compression_type {cfg['compression_type']!r}")
    for key in ("batch_size", "delivery_timeout_ms", "max_block_ms"):
        if not isinstance(cfg[key], int) or cfg[key] <= 0:
            raise ValueError(f"producer config: {key} must be a positive integer, not {cfg[key]!r}")
    if not isinstance(cfg["linger_ms"], (int, float)) or cfg["linger_ms"] < 0:
        raise ValueError(f"producer config: linger_ms must be >= 0, not {cfg['linger_ms']!r}")
    return cfg


def consumer_config(raw: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    cfg = _normalise(raw, kwargs, CONSUMER_DEFAULTS, "consumer")
    cfg.pop("_timeout_set", None)
    level = cfg["isolation_level"]
    if level not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"consumer config: isolation_level must be read_committed or "
                         f"read_uncommitted, not {level!r}")
    if cfg["auto_offset_reset"] not in ("earliest", "latest", "none"):
        raise ValueError(f"consumer config: auto_offset_reset must be earliest, latest or none, "
                         f"not {cfg['auto_offset_reset']!r}")
    return cfg
