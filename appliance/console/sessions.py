"""Console login sessions and CSRF tokens, sans-IO (the clock is handed in).

Runs in the console worker; owns the sessions of the people logged in: a random id (the cookie's
value), the principal's SCRAM user name and password (kept in this process's memory only, so the
console's Kafka connections can authenticate as that user: never written anywhere), the CSRF
token every form of that session carries, and the time of its last request. A console restart
forgets every session (everyone logs in again); there is no second user store: a login is a SASL
authentication against the appliance's own SCRAM credentials, done by the caller.

Cookies: ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
``Secure`` when the console serves HTTPS, ``Path=/``. CSRF: every POST must carry the session's
token (``csrf`` field), compared in constant time; SameSite is the second fence.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

COOKIE = "appliance_console"


@dataclass
class Session:
    sid: str
    user: str | None              # None: no SASL, the console acts as User:ANONYMOUS
    password: str | None
    mechanism: str | None
    csrf: str
    last_seen: float
    flash: list[tuple[str, str]] = field(default_factory=list)   # (kind, text) for the next page
    backend: Any = None            # the principal's Kafka connections (appliance.console.kafka)

    @property
    def principal(self) -> str:
        return f"User:{self.user}" if self.user else "User:ANONYMOUS"


class Sessions:
    def __init__(self, idle_s: float, secure: bool, max_sessions: int = 256) -> None:
        self.idle_s = idle_s
        self.secure = secure
        self.max_sessions = max_sessions
        self.by_id: dict[str, Session] = {}

    def new(self, now: float, user: str | None = None, password: str | None = None,
            mechanism: str | None = None) -> Session:
        self.expire(now)
        while len(self.by_id) >= self.max_sessions:       # the least recently used goes
            oldest = min(self.by_id.values(), key=lambda s: s.last_seen)
            self.drop(oldest.sid)
        s = Session(secrets.token_urlsafe(32), user, password, mechanism,
                    secrets.token_urlsafe(32), now)
        self.by_id[s.sid] = s
        return s

    def get(self, sid: str | None, now: float) -> Session | None:
        s = self.by_id.get(sid or "")
        if s is None:
            return None
        if now - s.last_seen > self.idle_s:
            self.drop(s.sid)
            return None
        s.last_seen = now
        return s

    def drop(self, sid: str) -> None:
        s = self.by_id.pop(sid, None)
        if s is not None and s.backend is not None:
            s.backend.close()

    def expire(self, now: float) -> None:
        for s in [s for s in self.by_id.values() if now - s.last_seen > self.idle_s]:
            self.drop(s.sid)

    def close(self) -> None:
        for sid in list(self.by_id):
            self.drop(sid)

    def cookie(self, s: Session | None) -> str:
        """The Set-Cookie value that hands out ``s`` (None: clears the cookie)."""
        flags = "; HttpOnly; SameSite=Strict; Path=/" + ("; Secure" if self.secure else "")
        if s is None:
            return f"{COOKIE}=; Max-Age=0{flags}"
        return f"{COOKIE}={s.sid}{flags}"


def csrf_ok(s: Session, token: str) -> bool:
    return bool(token) and hmac.compare_digest(s.csrf.encode(), token.encode())
