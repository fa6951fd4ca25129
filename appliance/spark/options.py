"""Options of the ``appliance`` Spark data source, parsed the way Spark's Kafka source and sink
take them, so that a pipeline written for ``format("kafka")`` changes only its format name.

Owns no state; runs wherever Spark calls the data source (the driver's Python planner workers
and the executors' Python workers).

- ``kafka.<key>``: client configuration (``kafka.bootstrap.servers`` is required). Keys our
  client knows are passed on, security included as Spark's Kafka connector passes it:
  ``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config`` (a
  PlainLoginModule or ScramLoginModule line: its username and password are used),
  ``kafka.ssl.truststore.location`` / ``kafka.ssl.keystore.location`` (PEM stores,
  ``kafka.ssl.truststore.type=PEM``), ``kafka.ssl.key.password``,
  ``kafka.ssl.endpoint.identification.algorithm`` (see ``appliance.client.security``). Kafka
  client keys it does not have (``kafka.group.id`` ...) are logged and ignored, as they would
  change nothing here.
- Reader: exactly one of ``subscribe`` (comma list), ``subscribePattern`` (a regex) or
  ``assign`` (JSON ``{"topic": [0, 1]}``); ``startingOffsets`` / ``endingOffsets`` as
  ``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest);
  ``failOnDataLoss`` (default true); ``maxOffsetsPerTrigger``; ``includeHeaders``;
  ``kafka.isolation.level`` (default ``read_committed``, unlike Spark's Kafka source).
- Writer: ``topic`` (overrides a ``topic`` column, as in Spark), ``transactionalIdPrefix``
  (default ``spark``; ours: Spark's Kafka sink is not transactional).

Spark hands options in a case-insensitive mapping; names are compared lower-case here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from appliance.client.config import ALIASES, CONSUMER_DEFAULTS, PRODUCER_DEFAULTS
from appliance.client.security import Security

log = logging.getLogger("appliance.spark")

EARLIEST, LATEST = -2, -1
TopicPartition = tuple[str, int]

# Kafka option names that the client spells differently or that Spark's Kafka source sets itself.
_IGNORED_QUIETLY = {"group.id", "key.deserializer", "value.deserializer", "key.serializer",
                    "value.serializer", "enable.auto.commit", "auto.offset.reset"}


class OptionError(ValueError):
    """A data source option is missing or malformed (raised on the driver, before any task)."""


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in dict(options).items()}


def client_config(options: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The ``kafka.*`` options as a config for the appliance client (``kind``: "producer" or
    "consumer")."""
    table = PRODUCER_DEFAULTS if kind == "producer" else CONSUMER_DEFAULTS
    out: dict[str, Any] = {}
    for key, value in _lower(options).items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        ours = name.replace(".", "_").replace("-", "_")
        ours = ALIASES.get(ours, ours)
        if ours in ("transactional_id", "enable_two_phase_commit", "transaction_two_phase_commit_enable"):
            raise OptionError(f"option {key!r}: the appliance sink sets the transactional id and "
                              "two-phase commit itself (see transactionalIdPrefix)")
        if ours not in table:
            if name not in _IGNORED_QUIETLY:
                log.warning("option %r is not a setting of the appliance client: ignored", key)
            continue
        out[ours] = _typed(value, table[ours])
    if not out.get("bootstrap_servers"):
        raise OptionError("option 'kafka.bootstrap.servers' is required")
    try:
        Security.from_config({**table, **out})      # a bad security option fails on the driver
    except ValueError as e:
        raise OptionError(f"kafka.* security options: {e}") from None
    return out


def _typed(value: Any, default: Any) -> Any:
    """Spark options arrive as strings: give them the type of the client's default."""
    if not isinstance(value, str):
        return value
    if isinstance(default, bool):
        return value.strip().lower() == "true"
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            return value                      # the client names the key and the bad value
    return value


def flag(options: Mapping[str, Any], name: str, default: bool) -> bool:
    value = _lower(options).get(name.lower())
    if value is None:
        return default
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {name!r} must be true or false, not {value!r}")
    return text == "true"


def positive_int(options: Mapping[str, Any], name: str) -> int | None:
    value = _lower(options).get(name.lower())
    if value is None:
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise OptionError(f"option {name!r} must be a positive integer, not {value!r}") from None
    if n <= 0:
        raise OptionError(f"option {name!r} must be a positive integer, not {value!r}")
    return n


def text(options: Mapping[str, Any], name: str, default: str | None = None) -> str | None:
    value = _lower(options).get(name.lower())
    return default if value is None or str(value) == "" else str(value)


class TopicSelector:
    """Which partitions a reader reads: ``subscribe``, ``subscribePattern`` or ``assign``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        opts = _lower(options)
        given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
        if len(given) != 1:
            raise OptionError("exactly one of the options 'subscribe', 'subscribePattern' and "
                              f"'assign' must be given ({len(given)} were)")
        self.kind = given[0]
        raw = str(opts[self.kind])
        self.topics: list[str] = []
        self.pattern: re.Pattern | None = None
        self.assigned: list[TopicPartition] = []
        if self.kind == "subscribe":
            self.topics = [t.strip() for t in raw.split(",") if t.strip()]
            if not self.topics:
                raise OptionError("option 'subscribe' names no topic")
        elif self.kind == "subscribepattern":
            try:
                self.pattern = re.compile(raw)
            except re.error as exc:
                raise OptionError(f"option 'subscribePattern': {exc}") from None
        else:
            try:
                doc = json.loads(raw)
                self.assigned = sorted((str(t), int(p)) for t, ps in doc.items() for p in ps)
            except (ValueError, TypeError, AttributeError):
                raise OptionError('option \'assign\' must be JSON like {"topic": [0, 1]}, '
                                  f"not {raw!r}") from None

    def partitions(self, cluster) -> list[TopicPartition]:
        """The partitions selected now (``cluster``: an ``appliance.client.metadata.Cluster``).
        Topics that do not exist are not created: they have no partitions yet."""
        if self.kind == "assign":
            return list(self.assigned)
        cluster.refresh(None if self.pattern is not None else self.topics)
        out: list[TopicPartition] = []
        for name, info in sorted(cluster.topics.items()):
            if self.pattern is not None:
                if self.pattern.fullmatch(name) is None or name.startswith("__"):
                    continue
            elif name not in self.topics:
                continue
            out.extend((name, p) for p in sorted(info.leaders))
        return out


def offsets_spec(options: Mapping[str, Any], name: str, default: str) -> int | dict[TopicPartition, int]:
    """``earliest`` / ``latest`` (EARLIEST / LATEST), or a JSON map to per-partition offsets."""
    raw = text(options, name, default)
    assert raw is not None
    if raw.strip().lower() == "earliest":
        return EARLIEST
    if raw.strip().lower() == "latest":
        return LATEST
    try:
        doc = json.loads(raw)
        return {(str(t), int(p)): int(off) for t, parts in doc.items() for p, off in parts.items()}
    except (ValueError, TypeError, AttributeError):
        raise OptionError(f"option {name!r} must be earliest, latest or JSON like "
                          f'{{"topic": {{"0": 23, "1": -2}}}}, not {raw!r}') from None


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's checkpoint form: ``{"topic": {"0": 23}}`` (keys must be strings)."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return out


def from_json_offsets(doc: Mapping[str, Mapping[str, int]] | None) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(off) for t, parts in (doc or {}).items() for p, off in parts.items()}
