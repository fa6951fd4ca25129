"""AlterUserScramCredentials (key 51) as ring messages, frontend -> supervisor -> frontend.

Owns nothing; the frontends' handler sends them (``appliance/api/alter_user_scram_credentials.py``)
and the supervisor serves them against the credential store it owns
(``appliance.security.credentials``, through ``appliance.security.supervisor``). Found by the
decoder by its name, as every ring message module is (``appliance.ipc``).
"""

from __future__ import annotations

import msgspec

from appliance.errors import ErrorCode
from appliance.ipc import Message, Request

__all__ = ["Deletion", "Upsertion", "UserResult", "AlterScramCredentialsResult",
           "AlterScramCredentialsRequest"]


class Deletion(msgspec.Struct, array_like=True, frozen=True):
    name: str
    mechanism: int


class Upsertion(msgspec.Struct, array_like=True, frozen=True):
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


class UserResult(msgspec.Struct, array_like=True, frozen=True):
    user: str
    error_code: int
    error_message: str | None = None


class AlterScramCredentialsResult(Message):
    results: list[UserResult]


class AlterScramCredentialsRequest(Request):
    deletions: list[Deletion]
    upsertions: list[Upsertion]

    def error_reply(self, code: ErrorCode) -> AlterScramCredentialsResult:
        users = dict.fromkeys([d.name for d in self.deletions] + [u.name for u in self.upsertions])
        return AlterScramCredentialsResult([UserResult(u, int(code)) for u in users])
