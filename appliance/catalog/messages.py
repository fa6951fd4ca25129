"""The catalog's ring messages: CreateTopics, DeleteTopics, CreatePartitions and
AlterConfigs / IncrementalAlterConfigs, frontend -> supervisor -> frontend.

Owns nothing; the frontends' API handlers send them (``appliance/api/``) and the supervisor serves
them against the catalog it owns (``appliance.supervisor.topic_admin``). Like every ring message
module, it is found by the decoder by its name (``appliance.ipc``).
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

__all__ = ["NewTopic", "TopicResult", "TopicsResult", "CreateTopicsRequest", "DeleteTopicsRequest",
           "CreatePartitionsRequest", "RESOURCE_TOPIC", "RESOURCE_BROKER", "ConfigChange",
           "ConfigResult", "AlterConfigsResult", "AlterConfigsRequest"]


class NewTopic(msgspec.Struct, array_like=True, frozen=True):
    name: str
    num_partitions: int
    configs: dict[str, str] = {}


class TopicResult(msgspec.Struct, array_like=True, frozen=True):
    name: str
    error_code: int
    error_message: str | None = None
    topic_id: bytes = b""
    num_partitions: int = -1
    configs: dict[str, str] = {}


class TopicsResult(Message):
    """The answer to CreateTopics and DeleteTopics: one result per topic, in request order."""
    results: list[TopicResult]


class CreateTopicsRequest(Request):
    topics: list[NewTopic]
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(t.name, int(code)) for t in self.topics])


class DeleteTopicsRequest(Request):
    names: list[str]

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(n, int(code)) for n in self.names])


class CreatePartitionsRequest(Request):
    """Grow topics to ``counts`` partitions each (name -> new total)."""
    counts: list[tuple[str, int]]
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> TopicsResult:
        return TopicsResult([TopicResult(n, int(code)) for n, _ in self.counts])


# Config resource types (Kafka's ConfigResource.Type ids). The ops of a change are
# IncrementalAlterConfigs' (``appliance.topic_config.OP_SET`` ...); the legacy AlterConfigs
# replaces a resource's whole set, which the request says with ``incremental=False`` (every op SET).
# Kafka's ConfigResource types
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP = 2, 4, 16, 32


class ConfigChange(msgspec.Struct, array_like=True, frozen=True):
    resource_type: int
    resource_name: str
    ops: list[tuple[int, str, str | None]]     # (op, config name, value)


class ConfigResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    error_message: str | None = None


class AlterConfigsResult(Message):
    results: list[ConfigResult]


class AlterConfigsRequest(Request):
    """AlterConfigs and IncrementalAlterConfigs of topic and broker resources: validated and
    applied by the supervisor against the catalog it owns (all or nothing per resource)."""
    changes: list[ConfigChange]
    incremental: bool
    validate_only: bool = False

    def error_reply(self, code: ErrorCode) -> AlterConfigsResult:
        return AlterConfigsResult([ConfigResult(int(code))] * len(self.changes))
