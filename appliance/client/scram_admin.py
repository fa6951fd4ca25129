"""SCRAM users over the Kafka protocol (KIP-554): AlterUserScramCredentials and
DescribeUserScramCredentials on one connection, as ``kafka-configs --alter --add-config
SCRAM-...`` does; the password never leaves this process (the broker gets a salt and
Hi(password, salt, i) only).

Client side (runs in the caller's process: ``appliance users`` online, the console's Security
page); owns nothing but the connection it is handed. Works against a Kafka cluster too.
"""

from __future__ import annotations

import os

from appliance.client.connection import BrokerConnection
from appliance.client.errors import ErrorCode, KafkaError
from appliance.security.messages import Deletion, Upsertion
from appliance.security.scram import BY_TYPE, MECHANISMS, SALT_BYTES, salted_password

DESCRIBE, ALTER = 50, 51


def _upsertion(name: str, mechanism: str, password: str, iterations: int) -> Upsertion:
    salt = os.urandom(SALT_BYTES)
    return Upsertion(name, MECHANISMS[mechanism][0], iterations, salt,
                     salted_password(mechanism, password, salt, iterations))


def _raise_failed(results) -> None:
    for r in results:
        if r.error_code:
            raise KafkaError(ErrorCode(r.error_code),
                             f"{r.user}: {r.error_message}" if r.error_message else f"user {r.user}")


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
