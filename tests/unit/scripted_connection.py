"""The part of ``appliance.client.connection.BrokerConnection`` that the client's unit tests fake:
negotiated versions and the finalized transaction version. Subclasses script ``request``."""

from __future__ import annotations


class ScriptedConnection:
    def __init__(self, versions: dict[int, int], tv: int) -> None:
        self.versions = dict(versions)
        self.finalized_features = {"transaction.version": tv}
        self.connected = True

    def version(self, api_key: int, *, minimum: int | None = None) -> int:
        return self.versions[api_key]

    def supports(self, api_key: int, version: int) -> bool:
        return self.versions.get(api_key, -1) >= version
