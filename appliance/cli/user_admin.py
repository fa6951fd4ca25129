"""What ``appliance users`` does (its commands: ``appliance.cli.users``): SCRAM users, offline in
a data dir or online over the Kafka protocol.

Runs in the operator's shell. Offline (no ``--bootstrap-server``) it owns the data dir's
credential store for the time of the command, under the data dir's lock, and refuses when an
appliance is running there (``appliance.security.credentials.offline_store``), as
``kafka-storage format --add-scram`` prepares a node before its first start. Online it is a
Kafka admin client (``appliance.client.scram_admin``): AlterUserScramCredentials and
DescribeUserScramCredentials over one connection (TLS and SASL from a ``--command-config`` properties file, as Kafka's tools take
them), so it works against a Kafka cluster too. The password never leaves this process: the
store (or the broker) gets a salt and Hi(password, salt, i) only.
"""

from __future__ import annotations

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
# online: the Kafka protocol's calls (shared with the console's Security page)
from appliance.client.scram_admin import (_raise_failed, _upsertion, add_online,  # noqa: F401
                                          delete_online, list_online)
from appliance.client.security import DEFAULTS, Security, properties_settings
from appliance.security.credentials import offline_store
from appliance.security.messages import AlterScramCredentialsRequest, Deletion
from appliance.security.scram import MECHANISMS


# -- offline ----------------------------------------------------------------------------------

def add_offline(data_dir: str, name: str, mechanism: str, password: str, iterations: int) -> None:
    with offline_store(data_dir) as store:
        _raise_failed(store.alter(AlterScramCredentialsRequest(
            deletions=[], upsertions=[_upsertion(name, mechanism, password, iterations)])))


def delete_offline(data_dir: str, name: str, mechanism: str | None) -> list[str]:
    with offline_store(data_dir) as store:
        mechs = [mechanism] if mechanism else sorted(store.users.get(name, {}))
        if not mechs:
            raise KafkaError(ErrorCode.resource_not_found,
                             f"{name}: Attempt to delete a user credential that does not exist")
        for mech in mechs:
            _raise_failed(store.alter(AlterScramCredentialsRequest(
                deletions=[Deletion(name, MECHANISMS[mech][0])], upsertions=[])))
        return mechs


def list_offline(data_dir: str) -> dict[str, dict[str, int]]:
    with offline_store(data_dir) as store:
        return {name: {m: c.iterations for m, c in creds.items()}
                for name, creds in store.users.items()}


# -- online -------------------------------------------------------------------------------------

def security_from(command_config: str | None) -> Security:
    """The TLS and SASL settings of a ``--command-config`` properties file (none: PLAINTEXT);
    OSError or ValueError when it cannot be read or used."""
    if not command_config:
        return Security()
    return Security.from_config({**DEFAULTS, **properties_settings(command_config)})


def connect(bootstrap: str, security: Security, timeout_ms: int = 30000) -> BrokerConnection:
    host, _, port = bootstrap.rpartition(":")
    return BrokerConnection(host.strip("[]"), int(port), client_id="appliance-users",
                            request_timeout_ms=timeout_ms, security=security)
