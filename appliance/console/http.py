"""HTTP/1.1 for the console, sans-IO: a request head and body in, a ``Request`` out; a
``Response`` out as bytes.

Runs in the console worker (``workers/console_server.py``); owns nothing. Only what a browser
sends to a server-rendered site is understood: GET, HEAD and POST with an
``application/x-www-form-urlencoded`` body, keep-alive, cookies. Anything else is answered 400
or 405 and the connection closed.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie

MAX_HEAD_BYTES = 16384
MAX_BODY_BYTES = 65536
REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 413: "Content Too Large", 500: "Internal Server Error"}


class BadRequest(Exception):
    """The request cannot be read: answer 400 (or ``status``) and close."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    cookies: dict[str, str]
    form: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = True

    def arg(self, name: str, default: str = "") -> str:
        """A form field (POST) or else a query parameter."""
        return self.form.get(name, self.query.get(name, default))


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def redirect(cls, location: str) -> "Response":
        return cls(303, b"", headers=[("Location", location)])

    @classmethod
    def text(cls, status: int, text: str) -> "Response":
        return cls(status, text.encode(), "text/plain; charset=utf-8")


def parse_head(head: bytes) -> tuple[Request, int]:
    """The request of a head (up to and with its blank line) and its body's length."""
    try:
        lines = head.decode("latin-1").split("\r\n")
    except UnicodeDecodeError:                     # latin-1 decodes every byte; kept for clarity
        raise BadRequest("bad request head") from None
    parts = lines[0].split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise BadRequest("bad content-length")
    if int(length) > MAX_BODY_BYTES:
        raise BadRequest("request body too large", 413)
    if method not in ("GET", "HEAD", "POST"):
        raise BadRequest("only GET, HEAD and POST", 405)
    path, _, qs = target.partition("?")
    conn = headers.get("connection", "").lower()
    keep = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    cookies: dict[str, str] = {}
    if "cookie" in headers:
        try:
            jar = SimpleCookie()
            jar.load(headers["cookie"])
            cookies = {k: m.value for k, m in jar.items()}
        except CookieError:
            cookies = {}
    req = Request(method, urllib.parse.unquote(path), _pairs(qs), headers, cookies, keep_alive=keep)
    return req, int(length)


def add_body(req: Request, body: bytes) -> None:
    """A POST's form fields (urlencoded; another content type is refused)."""
    if req.method != "POST":
        return
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise BadRequest("forms only (application/x-www-form-urlencoded)")
    try:
        req.form = _pairs(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("the form is not UTF-8") from None


def _pairs(qs: str) -> dict[str, str]:
    return {k: v for k, v in urllib.parse.parse_qsl(qs, keep_blank_values=True)}


def encode(resp: Response, keep_alive: bool, head_only: bool = False) -> bytes:
    hdrs = [("Content-Type", resp.content_type), ("Content-Length", str(len(resp.body))),
            ("Connection", "keep-alive" if keep_alive else "close"),
            # No page of the console may be framed (clickjacking) or cached by a shared cache.
            ("X-Frame-Options", "DENY"), ("X-Content-Type-Options", "nosniff"),
            ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
            ("Cache-Control", "no-store"), *resp.headers]
    head = f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, '')}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in hdrs) + "\r\n"
    return head.encode("latin-1") + (b"" if head_only else resp.body)
