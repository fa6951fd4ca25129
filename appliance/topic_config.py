"""Topic-level configuration: which Kafka topic configs the appliance knows, their defaults, checks.

Owns nothing; used by the supervisor (CreateTopics validation), the frontends (DescribeConfigs) and
the writers (effective LogSettings). Defaults come from the broker's ``[log]`` config section, as
Kafka's topic configs default to the broker's ``log.*`` settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import Config
from .errors import ErrorCode, KafkaError


@dataclass(frozen=True)
class TopicConfigDef:
    name: str
    type: str                       # Kafka ConfigEntry type name: LONG, INT, STRING, BOOLEAN, LIST
    default: Callable[[Config], str]
    check: Callable[[str], str | None]   # returns an error text or None
    doc: str


def _int_check(lo: int, hi: int = 2**63 - 1) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            n = int(v)
        except ValueError:
            return f"value {v!r} is not a number"
        if not lo <= n <= hi:
            return f"value {n} out of range [{lo}, {hi}]"
        return None
    return check


def _ratio_check(v: str) -> str | None:
    try:
        x = float(v)
    except ValueError:
        return f"value {v!r} is not a number"
    if not 0.0 <= x <= 1.0:
        return f"value {x} out of range [0.0, 1.0]"
    return None


CLEANUP_POLICIES = ("compact", "delete")


def cleanup_policy_set(value: str) -> frozenset[str]:
    """The policies a cleanup.policy value names (a Kafka LIST: comma-separated)."""
    return frozenset(p.strip() for p in value.split(",") if p.strip())


def _policy_check(v: str) -> str | None:
    items = [p.strip() for p in v.split(",")]
    bad = [p for p in items if p not in CLEANUP_POLICIES]
    if bad or not v.strip():
        return f"value {v!r}: every item must be one of {list(CLEANUP_POLICIES)}"
    return None


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in allowed else f"value {v!r} not in {list(allowed)}"
    return check


TOPIC_CONFIGS: dict[str, TopicConfigDef] = {d.name: d for d in [
    TopicConfigDef("retention.ms", "LONG", lambda c: str(c.log.retention_ms), _int_check(-1),
                   "Delete segments whose newest record is older than this; -1 keeps forever."),
    TopicConfigDef("retention.bytes", "LONG", lambda c: str(c.log.retention_bytes), _int_check(-1),
                   "Delete the oldest segments beyond this many bytes per partition; -1 no limit."),
    TopicConfigDef("segment.bytes", "INT", lambda c: str(c.log.segment_bytes), _int_check(14, 2**31 - 1),
                   "Roll a new segment at this size."),
    TopicConfigDef("segment.ms", "LONG", lambda c: str(c.log.segment_ms), _int_check(1),
                   "Roll a new segment this long after the segment's first batch."),
    TopicConfigDef("max.message.bytes", "INT", lambda c: str(c.log.message_max_bytes),
                   _int_check(0, 2**31 - 1), "Largest record batch accepted."),
    TopicConfigDef("message.timestamp.type", "STRING", lambda c: c.log.message_timestamp_type,
                   _choice("CreateTime", "LogAppendTime"), "CreateTime or LogAppendTime."),
    TopicConfigDef("cleanup.policy", "LIST", lambda c: c.log.cleanup_policy, _policy_check,
                   "delete: segments go by retention.ms and retention.bytes; compact: the log "
                   "cleaner keeps the last record of every key (no retention); both: compact,delete."),
    TopicConfigDef("min.cleanable.dirty.ratio", "DOUBLE",
                   lambda c: str(c.log.cleaner.min_cleanable_ratio), _ratio_check,
                   "Clean once the not yet cleaned bytes are more than this share of the log."),
    TopicConfigDef("min.compaction.lag.ms", "LONG", lambda c: str(c.log.cleaner.min_compaction_lag_ms),
                   _int_check(0), "A record stays uncompacted at least this long."),
    TopicConfigDef("max.compaction.lag.ms", "LONG", lambda c: str(c.log.cleaner.max_compaction_lag_ms),
                   _int_check(1), "A record is compacted at the latest this long after it was written."),
    TopicConfigDef("delete.retention.ms", "LONG", lambda c: str(c.log.cleaner.delete_retention_ms),
                   _int_check(0), "Tombstones and transaction markers stay this long once cleaned."),
    TopicConfigDef("min.insync.replicas", "INT", lambda c: "1", _int_check(1, 1),
                   "Single node: always 1."),
    TopicConfigDef("compression.type", "STRING", lambda c: "producer", _choice("producer"),
                   "Batches are stored as the producer compressed them."),
]}


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str]:
    """Check CreateTopics configs; raise KafkaError(INVALID_CONFIG) naming the first bad one."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        if value is None:
            continue
        err = d.check(value)
        if err:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Invalid value {value} for configuration {name}: {err}")
        out[name] = value
    lo, hi = out.get("min.compaction.lag.ms"), out.get("max.compaction.lag.ms")
    if lo is not None and hi is not None and int(lo) > int(hi):
        # Kafka's LogConfig.validateValues: the same conflict, as INVALID_CONFIG.
        raise KafkaError(ErrorCode.invalid_config,
                         f"conflict topic config setting min.compaction.lag.ms ({lo}) > "
                         f"max.compaction.lag.ms ({hi})")
    return out


def effective_topic_configs(cfg: Config, overrides: dict[str, str]) -> dict[str, tuple[str, bool]]:
    """name -> (value, is_default) for every known topic config."""
    return {name: ((overrides[name], False) if name in overrides else (d.default(cfg), True))
            for name, d in TOPIC_CONFIGS.items()}
