"""CreateAcls and DeleteAcls as ring messages: frontend -> supervisor -> frontend.

Owns nothing; the supervisor serves them (``appliance.acl.store.AclService``), the frontends'
CreateAcls (30) and DeleteAcls (31) handlers send them. DescribeAcls needs no message: a frontend
answers it from the snapshot it already holds, as a Kafka broker answers from its authorizer's
cache.
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

from .model import AclBinding, AclFilter


class AclCreateResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int = 0
    error_message: str | None = None


class CreateAclsResult(Message):
    """One result per ACL asked, in request order."""
    results: list[AclCreateResult]


class CreateAclsRequest(Request):
    acls: list[AclBinding]

    def error_reply(self, code: ErrorCode) -> CreateAclsResult:
        return CreateAclsResult([AclCreateResult(int(code))] * len(self.acls))


class AclDeleteResult(msgspec.Struct, array_like=True, frozen=True):
    """One filter's answer: the ACLs it matched (and deleted), or its error."""
    error_code: int = 0
    error_message: str | None = None
    deleted: list[AclBinding] = []


class DeleteAclsResult(Message):
    results: list[AclDeleteResult]


class DeleteAclsRequest(Request):
    filters: list[AclFilter]

    def error_reply(self, code: ErrorCode) -> DeleteAclsResult:
        return DeleteAclsResult([AclDeleteResult(int(code))] * len(self.filters))
