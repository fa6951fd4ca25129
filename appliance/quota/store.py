"""The client quota configs: which quota entities have which quota values.

Owned (read-write) by the supervisor alone while the appliance runs, as the SCRAM credentials
are (``appliance.security.credentials``): durable as ``<data_dir>/client_quotas.json``
(replaced atomically, with a checksum), published to the runtime dir as
``client_quotas.msgpack`` for the frontends, whose ``QuotasView`` reloads it when the
``quotas_version`` of the supervisor's state page moves. Frontends change it by sending
``AlterClientQuotasRequest`` (AlterClientQuotas, key 49) to the supervisor
(``appliance.quota.supervisor``); Kafka keeps them in its metadata log as ClientQuotaRecords,
which this file stands for on one node.
"""

from __future__ import annotations

import errno
import json
import os

import msgspec

from appliance.durable import atomic_write, verify_checksum, with_checksum
from appliance.errors import ErrorCode
from appliance.quota import model
from appliance.quota.model import Quotas

QUOTAS_FILE = "client_quotas.json"
PUBLISHED_FILE = "client_quotas.msgpack"

# The published form: [[[type, name|None], ...], {key: value}] per entity.
_Published = list[tuple[list[tuple[str, "str | None"]], dict[str, float]]]


def _to_list(quotas: Quotas) -> list:
    return [[[list(p) for p in entity], dict(sorted(values.items()))]
            for entity, values in sorted(quotas.items(), key=lambda kv: repr(kv[0]))]


def _from_list(raw) -> Quotas:
    return {model.entity_of((str(t), None if n is None else str(n)) for t, n in entity):
            {str(k): float(v) for k, v in values.items()} for entity, values in raw}


class QuotaStore:
    """``<data_dir>/client_quotas.json``; the supervisor's. Single-threaded."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, QUOTAS_FILE)
        self.version = 0
        self.quotas: Quotas = {}

    def load(self) -> Quotas:
        try:
            with open(self.path, "rb") as f:
                raw = verify_checksum(json.load(f))
        except FileNotFoundError:
            return self.quotas
        self.version = int(raw.get("version", 0))
        self.quotas = _from_list(raw.get("entities", []))
        return self.quotas

    def save(self, quotas: Quotas) -> None:
        """Commit ``quotas`` (the commit point of an alteration); OSError leaves the old file."""
        raw = {"version": self.version + 1, "entities": _to_list(quotas)}
        atomic_write(self.path, json.dumps(with_checksum(raw), indent=1).encode())
        self.version += 1
        self.quotas = quotas

    def alter(self, alterations: list[model.Alteration], validate_only: bool
              ) -> list[tuple[int, str | None]]:
        new, results = model.alter(self.quotas, alterations)
        if validate_only or new == self.quotas:
            return results
        try:
            self.save(new)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            return [(int(ErrorCode.kafka_storage_error), "the data dir's file system is full")
                    if code == 0 else (code, msg) for code, msg in results]
        return results


def publish(quotas: Quotas, path: str) -> None:
    """Write the quotas for the frontends (runtime dir, tmpfs)."""
    atomic_write(path, msgspec.msgpack.encode(_to_list(quotas)), sync=False)


def read_published(path: str) -> Quotas:
    with open(path, "rb") as f:
        return _from_list(msgspec.msgpack.decode(f.read()))


class QuotasView:
    """A frontend's read-only view; reloads when the supervisor's page shows a new version.
    ``changed()`` says whether the last ``get`` read a new table."""

    def __init__(self, path: str, version_source) -> None:
        self.path = path
        self._version_source = version_source
        self.quotas: Quotas = {}
        self._seen = -1

    @property
    def version(self) -> int:
        """The published version of the table held (-1: none read yet)."""
        return self._seen

    def get(self) -> tuple[Quotas, bool]:
        v = self._version_source()
        if v != self._seen:
            try:
                self.quotas = read_published(self.path)
            except FileNotFoundError:
                return self.quotas, False
            self._seen = v
            return self.quotas, True
        return self.quotas, False
