"""CLIENT_METRICS config resources (KIP-714): the telemetry subscriptions an operator names and
changes with IncrementalAlterConfigs / AlterConfigs (``kafka-client-metrics.sh``, ``appliance
client-metrics``), their checks, their DescribeConfigs entries, and which of them a client
matches.

Owns nothing; used by the supervisor (it validates a change and commits it to the catalog it
owns, ``Catalog.client_metrics``: name -> the configs set on it; a resource whose configs are all
deleted is gone, as in Kafka) and by the frontends (DescribeConfigs, ListConfigResources, and
``client_telemetry.ClientTelemetry``, which hands out what the matching subscriptions ask for).

As Kafka's ClientMetricsConfigs: three configs, ``metrics`` (a list of metric name prefixes; "*"
is every metric; empty: none), ``interval.ms`` (the push interval, 100 to 3,600,000, default
300,000) and ``match`` (a list of ``selector=regex``; empty matches every client), the selectors
``client_instance_id``, ``client_id``, ``client_software_name``, ``client_software_version``,
``client_source_address``, ``client_source_port``; a client matches when every selector's regex
matches its value whole. Kafka's errors: an unknown config is INVALID_REQUEST, an interval out
of range INVALID_REQUEST, a bad pattern INVALID_CONFIG ("Illegal client matching pattern").
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from appliance.errors import ErrorCode, KafkaError

METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
CONFIG_TYPES = {METRICS: "LIST", INTERVAL_MS: "INT", MATCH: "LIST"}
DEFAULT_INTERVAL_MS = 300_000
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
SELECTORS = ("client_instance_id", "client_id", "client_software_name",
             "client_software_version", "client_source_address", "client_source_port")
CLIENT_METRICS_CONFIG = 7          # DescribeConfigs ConfigSource of a client metrics config


def _items(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_match(value: str) -> dict[str, re.Pattern]:
    """The selectors of a ``match`` value; INVALID_CONFIG for a bad one (Kafka's
    parseMatchingPatterns)."""
    out = {}
    for pattern in _items(value):
        parts = pattern.split("=")
        if len(parts) != 2 or parts[0].strip() not in SELECTORS:
            raise KafkaError(ErrorCode.invalid_config, f"Illegal client matching pattern: {pattern}")
        try:
            out[parts[0].strip()] = re.compile(parts[1].strip())
        except re.error:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Illegal client matching pattern: {pattern}") from None
    return out


def validate(name: str, configs: Mapping[str, str]) -> None:
    """Kafka's ClientMetricsConfigs.validate of a resource's whole new config set."""
    if not name:
        raise KafkaError(ErrorCode.invalid_request, "Subscription name can't be empty")
    for key in configs:
        if key not in CONFIG_TYPES:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Unknown client metrics configuration: {key}")
    if INTERVAL_MS in configs:
        try:
            interval = int(configs[INTERVAL_MS])
        except ValueError:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid value {configs[INTERVAL_MS]} for configuration "
                             f"{INTERVAL_MS}: Not a number of type INT") from None
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Invalid value {interval} for {INTERVAL_MS}, interval must be "
                             f"between 100 and 3600000 (1 hour)")
    if MATCH in configs:
        parse_match(configs[MATCH])


def alter(name: str, current: dict[str, str], ops, incremental: bool, apply_ops) -> dict[str, str]:
    """A resource's new config set after ``ops`` (``topic_config.apply_config_ops`` semantics,
    passed in as ``apply_ops``), validated."""
    new = apply_ops(current, ops, incremental, lambda n: n in CONFIG_TYPES, lambda n: "",
                    lambda n: CONFIG_TYPES.get(n) == "LIST",
                    lambda bad: KafkaError(ErrorCode.invalid_request,
                                           f"Unknown client metrics configuration: {bad[0]}"))
    validate(name, new)
    return new


def describe(configs: Mapping[str, str]) -> dict[str, tuple[str, int, str, list]]:
    """name -> (value, source, type, synonyms) of the configs set on a resource (Kafka lists the
    ones set, as CLIENT_METRICS_CONFIG)."""
    return {k: (v, CLIENT_METRICS_CONFIG, CONFIG_TYPES[k], [])
            for k, v in sorted(configs.items()) if k in CONFIG_TYPES}


class Subscription:
    """One resource, parsed once per catalog version."""

    __slots__ = ("name", "metrics", "interval_ms", "match")

    def __init__(self, name: str, configs: Mapping[str, str]) -> None:
        self.name = name
        self.metrics = tuple(_items(configs.get(METRICS, "")))
        self.interval_ms = int(configs.get(INTERVAL_MS, DEFAULT_INTERVAL_MS))
        try:
            self.match = parse_match(configs.get(MATCH, ""))
        except KafkaError:
            # Validated when set; a damaged catalog entry matches no client rather than all.
            self.match = {"client_instance_id": re.compile(r"(?!)")}

    def matches(self, attributes: Mapping[str, str]) -> bool:
        """Kafka's ClientMetricsInstanceMetadata.isMatch: every selector matches its value
        whole (a client without the value does not match)."""
        for key, pattern in self.match.items():
            value = attributes.get(key)
            if value is None or pattern.fullmatch(value) is None:
                return False
        return True


def subscriptions(client_metrics: Mapping[str, Mapping[str, str]]) -> list[Subscription]:
    return [Subscription(n, c) for n, c in sorted(client_metrics.items())]


def combine(subs: list[Subscription], attributes: Mapping[str, str]) -> tuple[tuple[str, ...], int]:
    """Kafka's createClientInstance: the union of the matching subscriptions' metrics ("*" alone
    when one asks for all) and the smallest of their intervals, never above the default."""
    metrics: set[str] = set()
    interval = DEFAULT_INTERVAL_MS
    for s in subs:
        if s.matches(attributes):
            metrics.update(s.metrics)
            interval = min(interval, s.interval_ms)
    if "*" in metrics:
        return ("*",), interval
    return tuple(sorted(metrics)), interval
