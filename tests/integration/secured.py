"""Appliances with the authorizer on, and the principals tests act as.

A test names the ACLs it needs (``Acl`` rows, in Kafka's words) and gets back the appliance and
the ``Principal`` it acts as: that principal's client configuration for confluent-kafka,
kafka-python and ``appliance.client``. ``secure()`` starts the appliance with
``[authorizer] enable = true``, creates the topics and the ACLs through confluent-kafka's
AdminClient (CreateAcls, the real API) as a super user, and hands over.

Until the appliance authenticates clients (SASL), every client is ``User:ANONYMOUS``: the setup
then runs while ANONYMOUS is a super user, and the appliance restarts with the super users the
test asked for (the ACLs are durable, so every such test also proves that they survive a
restart). Once SASL exists, ``secure()`` creates an admin (a super user) and the users, and
``Principal`` carries the credentials; the tests themselves do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)

from appliance.acl import admin as acl_admin
from appliance.acl import model
from appliance.client.transaction_admin import connect
from harness import Appliance

ANONYMOUS = "User:ANONYMOUS"
TIMEOUT = 30


@dataclass(frozen=True)
class Acl:
    """One ACL as kafka-acls.sh would take it: ``Acl("Topic", "orders", "Read")``."""
    resource_type: str                  # Topic, Group, Cluster, TransactionalId
    name: str
    operation: str                      # Read, Write, All, TwoPhaseCommit...
    principal: str = ANONYMOUS
    permission: str = "Allow"
    pattern: str = "LITERAL"            # or PREFIXED
    host: str = "*"

    def binding(self) -> model.AclBinding:
        return model.AclBinding(
            int(model.parse_resource_type(self.resource_type)), self.name,
            int(model.parse_pattern_type(self.pattern)), self.principal, self.host,
            int(model.parse_operation(self.operation)), int(model.parse_permission(self.permission)))

    def confluent(self) -> AclBinding | None:
        """As confluent-kafka's AclBinding (None for TwoPhaseCommit, which it does not know)."""
        b = self.binding()
        try:
            op = AclOperation(b.operation)
        except ValueError:
            return None
        return AclBinding(ResourceType(b.resource_type), b.resource_name,
                          ResourcePatternType(b.pattern_type), b.principal, b.host, op,
                          AclPermissionType(b.permission_type))


@dataclass(frozen=True)
class Principal:
    """Who a test acts as, and how each client library connects as them."""
    name: str
    bootstrap: str
    extra: dict = field(default_factory=dict)     # security settings, once there are any

    def confluent(self, **conf) -> dict:
        return {"bootstrap.servers": self.bootstrap, **self.extra, **conf}

    def kafka_python(self, **kw) -> dict:
        return {"bootstrap_servers": self.bootstrap, **kw}

    def appliance_client(self, **kw) -> dict:
        return {"bootstrap_servers": self.bootstrap, **kw}

    def admin(self) -> AdminClient:
        return AdminClient(self.confluent())


def secure(appliance: Appliance, acls: list[Acl], topics: dict[str, int] | None = None, *,
           super_users: list[str] | None = None,
           allow_everyone_if_no_acl_found: bool = False) -> Principal:
    """Start ``appliance`` (not started yet) with the authorizer on, ``topics`` and ``acls`` in
    place; return the principal the test acts as (``User:ANONYMOUS`` until SASL)."""
    auth = appliance.config.setdefault("authorizer", {})
    auth.update(enable=True, super_users=[ANONYMOUS], allow_everyone_if_no_acl_found=False)
    appliance.start()
    admin = AdminClient({"bootstrap.servers": appliance.bootstrap})
    if topics:
        for f in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()],
                                     request_timeout=TIMEOUT).values():
            f.result()
    known = [a.confluent() for a in acls if a.confluent() is not None]
    if known:
        for f in admin.create_acls(known, request_timeout=TIMEOUT).values():
            assert f.result() is None
    others = [a.binding() for a in acls if a.confluent() is None]
    if others:       # through the appliance's own admin client (appliance acls)
        conn = connect(appliance.bootstrap)
        try:
            acl_admin.create_acls(conn, others)
        finally:
            conn.close()
    appliance.terminate()
    auth.update(super_users=list(super_users or []),
                allow_everyone_if_no_acl_found=allow_everyone_if_no_acl_found)
    appliance.start()
    return Principal(ANONYMOUS, appliance.bootstrap)
