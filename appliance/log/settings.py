"""The per-topic log settings a partition writer applies (``LogSettings``): the ``[log]`` and
``[log.cleaner]`` defaults under a topic's effective configs, with Kafka's topic-config semantics.

Owns nothing; built by partition writers (``PartitionLog``) and the cleaner processes from the
running configuration and ``Catalog.overrides``.
"""

from __future__ import annotations

from typing import Literal, Mapping

import msgspec

from appliance.config import LogConfig

__all__ = ["LogSettings"]


# Kafka topic-config names -> LogSettings fields.
_TOPIC_KEYS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.bytes": "retention_bytes",
    "retention.ms": "retention_ms",
    "index.interval.bytes": "index_interval_bytes",
    "segment.index.bytes": "segment_index_bytes",
    "message.timestamp.type": "message_timestamp_type",
    "max.message.bytes": "max_message_bytes",
    "cleanup.policy": "cleanup_policy",
    "min.cleanable.dirty.ratio": "min_cleanable_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
    "delete.retention.ms": "delete_retention_ms",
}
_STRING_KEYS = frozenset({"message_timestamp_type", "cleanup_policy"})
_FLOAT_KEYS = frozenset({"min_cleanable_ratio"})


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The per-topic log settings a partition writer needs (Kafka topic-config semantics)."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    retention_bytes: int = -1
    retention_ms: int = 604800000
    index_interval_bytes: int = 4096
    segment_index_bytes: int = 10485760
    message_timestamp_type: Literal["CreateTime", "LogAppendTime"] = "CreateTime"
    max_message_bytes: int = 1048588
    decompressed_batch_max_factor: int = 64
    cleanup_policy: str = "delete"
    min_cleanable_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 86400000

    @classmethod
    def from_config(cls, cfg: LogConfig, overrides: Mapping[str, str] | None = None) -> "LogSettings":
        """Broker defaults from ``log.*`` overlaid with a topic's configs (Kafka names, string
        values). Unknown names are ignored here; the caller validates topic configs."""
        values: dict[str, object] = {
            "segment_bytes": cfg.segment_bytes, "segment_ms": cfg.segment_ms,
            "retention_bytes": cfg.retention_bytes, "retention_ms": cfg.retention_ms,
            "index_interval_bytes": cfg.index_interval_bytes,
            "segment_index_bytes": cfg.segment_index_bytes,
            "message_timestamp_type": cfg.message_timestamp_type,
            "max_message_bytes": cfg.message_max_bytes,
            "decompressed_batch_max_factor": cfg.decompressed_batch_max_factor,
            "cleanup_policy": cfg.cleanup_policy,
            "min_cleanable_ratio": cfg.cleaner.min_cleanable_ratio,
            "min_compaction_lag_ms": cfg.cleaner.min_compaction_lag_ms,
            "max_compaction_lag_ms": cfg.cleaner.max_compaction_lag_ms,
            "delete_retention_ms": cfg.cleaner.delete_retention_ms,
        }
        for name, raw in (overrides or {}).items():
            field = _TOPIC_KEYS.get(name)
            if field is None:
                continue
            values[field] = (raw if field in _STRING_KEYS else
                             float(raw) if field in _FLOAT_KEYS else int(raw))
        return msgspec.convert(values, cls)

    @property
    def compact(self) -> bool:
        """cleanup.policy has "compact": the log cleaner keeps the last record of each key."""
        return "compact" in _policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """cleanup.policy has "delete": retention.ms and retention.bytes delete old segments
        (Kafka's LogConfig.delete; a "compact" topic keeps every segment)."""
        return "delete" in _policies(self.cleanup_policy)

    @property
    def roll_ms(self) -> int:
        """Kafka's LogConfig.maxSegmentMs: a compacted topic also rolls by max.compaction.lag.ms,
        so that a record does not wait in the active segment, which is never cleaned, for longer
        than that."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def max_decompressed_bytes(self) -> int:
        """What one compressed batch may inflate to (recovery's bound, as produce's)."""
        return self.max_message_bytes * self.decompressed_batch_max_factor

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


def _policies(value: str) -> set[str]:
    return {p.strip() for p in value.split(",")}
