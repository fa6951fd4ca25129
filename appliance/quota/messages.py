"""AlterClientQuotas (key 49) as ring messages, frontend -> supervisor -> frontend.

Owns nothing; the frontends' handler sends them (``appliance/api/alter_client_quotas.py``) and
the supervisor serves them against the quota store it owns (``appliance.quota.store``, through
``appliance.quota.supervisor``). Found by the decoder by its name, as every ring message module
is (``appliance.ipc``).
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

__all__ = ["QuotaEntry", "QuotaOp", "EntryResult", "AlterClientQuotasResult",
           "AlterClientQuotasRequest"]


class QuotaOp(msgspec.Struct, array_like=True, frozen=True):
    key: str
    value: float
    remove: bool


class QuotaEntry(msgspec.Struct, array_like=True, frozen=True):
    entity: list[tuple[str, str | None]]
    ops: list[QuotaOp]


class EntryResult(msgspec.Struct, array_like=True, frozen=True):
    error_code: int
    error_message: str | None = None


class AlterClientQuotasResult(Message):
    results: list[EntryResult]


class AlterClientQuotasRequest(Request):
    entries: list[QuotaEntry]
    validate_only: bool

    def error_reply(self, code: ErrorCode) -> AlterClientQuotasResult:
        return AlterClientQuotasResult([EntryResult(int(code)) for _ in self.entries])
