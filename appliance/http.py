"""HTTP/1.1 for the appliance's two web workers: the metrics server (``workers/metrics_server.py``,
Prometheus' scrapes) and the console (``workers/console_server.py``, browsers). Sans-IO parsing
(a request head and body in, a ``Request`` out; a ``Response`` out as bytes) and the one
keep-alive connection loop both serve with (``serve_connection``).

Owned by neither worker and owning nothing: no state, no socket of its own. Only what a scraper
or a browser sends to these two servers is understood: GET, HEAD and POST, a body of at most a
worker's ``max_body`` bytes (POST bodies parsed only as ``application/x-www-form-urlencoded``
forms), keep-alive (HTTP/1.1's default, HTTP/1.0's ``Connection: keep-alive``), cookies. A head
that cannot be read is answered 400 (413 for a body too large) and the connection closed; a
method the worker does not serve is answered 405 with its ``Allow`` list, the connection kept.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import urllib.parse
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from typing import Callable, Iterable

MAX_HEAD_BYTES = 16384
MAX_BODY_BYTES = 65536
IDLE_S = 60.0
REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 413: "Content Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


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


def parse_head(head: bytes, max_body: int = MAX_BODY_BYTES) -> tuple[Request, int]:
    """The request of a head (up to and with its blank line) and its body's length."""
    lines = head.decode("latin-1").split("\r\n")      # latin-1 decodes every byte
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
    if int(length) > max_body:
        raise BadRequest("request body too large", 413)
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


def not_allowed(req: Request, methods: Iterable[str]) -> Response | None:
    """405 with the ``Allow`` list when the worker does not serve ``req.method`` (RFC 9110
    15.5.6: a 405 says which methods are allowed)."""
    methods = tuple(methods)
    if req.method in methods:
        return None
    said = " and ".join([", ".join(methods[:-1]), methods[-1]] if len(methods) > 1 else methods)
    return Response(405, f"only {said}\n".encode(), "text/plain; charset=utf-8",
                    headers=[("Allow", ", ".join(methods))])


def encode(resp: Response, keep_alive: bool, head_only: bool = False,
           fixed: Iterable[tuple[str, str]] = ()) -> bytes:
    """The answer's bytes: its head (``fixed``: the worker's headers on every answer) and, but to
    a HEAD, its body (Content-Length is the body's either way)."""
    hdrs = [("Content-Type", resp.content_type), ("Content-Length", str(len(resp.body))),
            ("Connection", "keep-alive" if keep_alive else "close"), *fixed, *resp.headers]
    head = f"HTTP/1.1 {resp.status} {REASONS.get(resp.status, '')}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in hdrs) + "\r\n"
    return head.encode("latin-1") + (b"" if head_only else resp.body)


async def serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           handle: Callable[[Request], Response], *, methods: Iterable[str],
                           stopping: Callable[[], bool], log: logging.Logger,
                           max_body: int = MAX_BODY_BYTES, idle_s: float = IDLE_S,
                           fixed: Iterable[tuple[str, str]] = (),
                           failed_text: str = "this page failed (see the log)\n") -> None:
    """One client's connection: requests one after another (keep-alive) until the client closes,
    is idle ``idle_s``, asks to close, sends what cannot be read, or the worker is ``stopping``.
    ``handle`` answers a request (sync: both workers' pages are quick, and one at a time on the
    worker's loop); a bug in it costs that request a 500 (logged), never the worker. The stream's
    limit (``asyncio.start_server(limit=MAX_HEAD_BYTES)``) bounds a head."""
    fixed = tuple(fixed)
    methods = tuple(methods)
    try:
        while not stopping():
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), idle_s)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                    ConnectionError, ssl.SSLError):
                return
            try:
                req, length = parse_head(head, max_body)
                body = await reader.readexactly(length) if length else b""
                refused = not_allowed(req, methods)
                if refused is None:
                    add_body(req, body)
            except BadRequest as e:
                writer.write(encode(Response.text(e.status, f"{e}\n"), False, fixed=fixed))
                await writer.drain()
                return
            if refused is not None:
                resp = refused
            else:
                try:
                    resp = handle(req)
                except Exception:
                    log.exception("%s %s failed", req.method, req.path)
                    resp = Response.text(500, failed_text)
            writer.write(encode(resp, req.keep_alive, req.method == "HEAD", fixed))
            await writer.drain()
            if not req.keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        return
    except Exception:
        log.exception("an HTTP connection failed")
    finally:
        writer.close()
