"""What ``appliance users`` does (its commands: ``appliance.cli.users``): SCRAM users, offline in
a data dir or online over the Kafka protocol.

Runs in the operator's shell. Offline (no ``--bootstrap-server``) it owns the data dir's
credential store for the time of the command, under the data dir's lock, and refuses when an
appliance is running there (``appliance.security.credentials.offline_store``), as
``kafka-storage format --add-scram`` prepares a node before its first start. Online it is a
Kafka admin client: AlterUserScramCredentials and DescribeUserScramCredentials over one
connection (TLS and SASL from a ``--command-config`` properties file, as Kafka's tools take
them), so it works against a Kafka cluster too. The password never leaves this process: the
store (or the broker) gets a salt and Hi(password, salt, i) only.
"""

from __future__ import annotations

import os

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
from appliance.client.security import DEFAULTS, Security, properties_settings
from appliance.security.credentials import offline_store
from appliance.security.messages import AlterScramCredentialsRequest, Deletion, Upsertion
from appliance.security.scram import BY_TYPE, MECHANISMS, SALT_BYTES, salted_password

DESCRIBE, ALTER = 50, 51


def _upsertion(name: str, mechanism: str, password: str, iterations: int) -> Upsertion:
    salt = os.urandom(SALT_BYTES)
    return Upsertion(name, MECHANISMS[mechanism][0], iterations, salt,
                     salted_password(mechanism, password, salt, iterations))


def _raise_failed(results) -> None:
    for r in results:
        if r.error_code:
            raise KafkaError(ErrorCode(r.error_code), f"{r.user}: {r.error_message}")


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


def _alter(conn: BrokerConnection, deletions=(), upsertions=()) -> None:
    r = conn.request(ALTER, {
        "deletions": [{"name": d.name, "mechanism": d.mechanism} for d in deletions],
        "upsertions": [{"name": u.name, "mechanism": u.mechanism, "iterations": u.iterations,
                        "salt": u.salt, "salted_password": u.salted_password}
                       for u in upsertions]})
    _raise_failed(r.results)


def add_online(conn: BrokerConnection, name: str, mechanism: str, password: str,
               iterations: int) -> None:
    _alter(conn, upsertions=[_upsertion(name, mechanism, password, iterations)])


def list_online(conn: BrokerConnection, names: list[str] | None = None) -> dict[str, dict[str, int]]:
    r = conn.request(DESCRIBE, {"users": [{"name": n} for n in names] if names else None})
    if int(r.error_code):
        raise KafkaError(ErrorCode(int(r.error_code)), r.error_message)
    out = {}
    for res in r.results:
        if int(res.error_code) == ErrorCode.resource_not_found and names:
            continue
        if int(res.error_code):
            raise KafkaError(ErrorCode(int(res.error_code)), res.error_message)
        out[res.user] = {BY_TYPE.get(int(c.mechanism), str(c.mechanism)): int(c.iterations)
                         for c in res.credential_infos}
    return out


def delete_online(conn: BrokerConnection, name: str, mechanism: str | None) -> list[str]:
    mechs = [mechanism] if mechanism else sorted(list_online(conn, [name]).get(name, {}))
    if not mechs:
        raise KafkaError(ErrorCode.resource_not_found,
                         f"{name}: Attempt to delete a user credential that does not exist")
    # One request per mechanism: Kafka refuses a user named twice in one request.
    for mech in mechs:
        _alter(conn, deletions=[Deletion(name, MECHANISMS[mech][0])])
    return mechs
