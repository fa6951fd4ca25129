"""The console's site: routes, login, who may change what, and the pages rendered server-side
(Jinja2 templates in ``templates/``, the charts library and our script in ``static/``).

Runs in the console worker (``workers/console_server.py``), one request at a time; owns the
sessions (``appliance.console.sessions``), the Overview's hour of samples and the watched
groups' lag points (``appliance.console.history``) and each session's Kafka connections
(``appliance.console.kafka.Backend``). ``handle`` takes a parsed ``Request`` and returns a
``Response``: no socket here.

Who may do what:
- SASL on some listener: every page needs a login, checked by a SASL authentication of the
  given user and password against the appliance's own SCRAM credentials (the console's Kafka
  connection to a SASL listener; no second user store). Every read and every change is then a
  Kafka request of that user, so the ACL authorizer decides it as for the user's own client.
- No SASL listener: everyone is User:ANONYMOUS; the pages only show, unless
  ``[console] allow_changes`` (then the authorizer, if on, still judges ANONYMOUS).
- Every POST carries the session's CSRF token; the session cookie is HttpOnly, SameSite=Strict,
  and Secure on HTTPS.
"""

from __future__ import annotations

import datetime
import json
import logging
import mimetypes
import os
import re
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

import jinja2

from appliance.acl import model as acl
from appliance.client.security import Security
from appliance.config import Config
from appliance.config_checks import console_listener
from appliance.http import Request, Response
from appliance.listeners import Listener, advertised_host

from . import records as rec
from .history import GroupLags, History
from .kafka import Backend, error_text
from .overview import Overview, problems
from .sessions import COOKIE, Session, Sessions, csrf_ok

log = logging.getLogger("appliance.console")
HERE = os.path.dirname(os.path.abspath(__file__))
STATIC = os.path.join(HERE, "static")
NAV = [("/", "Overview"), ("/topics", "Topics"), ("/groups", "Groups"),
       ("/transactions", "Transactions"), ("/spark", "Spark jobs"), ("/security", "Security")]
# What the site serves (appliance.http.serve_connection refuses the rest with 405).
METHODS = ("GET", "HEAD", "POST")
# On every answer: no page of the console may be framed (clickjacking), run a script or style
# from elsewhere, or be kept by a shared cache.
HEADERS = (("X-Frame-Options", "DENY"), ("X-Content-Type-Options", "nosniff"),
           ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
           ("Cache-Control", "no-store"))


@dataclass(frozen=True)
class Target:
    """The listener the console's Kafka connections use, and how."""
    bootstrap: str
    listener: Listener

    @property
    def sasl(self) -> bool:
        return self.listener.sasl


def pick_target(cfg: Config, ports: dict[str, int]) -> Target:
    """A SASL listener when there is one (logins then mean something), plaintext before TLS (the
    connection stays on this machine): ``config_checks.console_listener``. ``ports``: listener
    name -> bound port."""
    best = console_listener(cfg.listeners)
    host = advertised_host(best.host)
    port = ports.get(best.name, best.port)
    return Target(f"[{host}]:{port}" if ":" in host else f"{host}:{port}", best)


class Console:
    def __init__(self, cfg: Config, run_dir: str, data_dir: str, target: Target, *,
                 clock: Callable[[], float] = time.time, secure: bool = False) -> None:
        self.cfg = cfg
        self.target = target
        self.clock = clock
        self.sessions = Sessions(cfg.console.session_idle_ms / 1000, secure)
        self.history = History()
        self.lags = GroupLags()
        self.overview = Overview(run_dir, data_dir)
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
                                      autoescape=True, undefined=jinja2.StrictUndefined)
        self.env.filters.update(bytes=_bytes, ms=_ms, when=_when, show=rec.show)
        self._anonymous: Backend | None = None     # one for every session without a login
        self.anonymous_principal = self._anonymous_principal()

    def reload(self, cfg: Config) -> None:
        """A SIGHUP reload: allow_changes and session_idle_ms apply from the next request."""
        self.cfg = cfg
        self.sessions.idle_s = cfg.console.session_idle_ms / 1000

    def close(self) -> None:
        self.sessions.close()
        self.overview.close()
        if self._anonymous is not None:
            self._anonymous.close()

    # -- who ----------------------------------------------------------------------------------------
    @property
    def login_required(self) -> bool:
        return self.target.sasl

    def may_change(self, s: Session) -> bool:
        return self.login_required or self.cfg.console.allow_changes

    def security(self, user: str | None = None, password: str | None = None,
                 mechanism: str | None = None) -> Security:
        """How the console's Kafka connections authenticate: SASL as the logged-in user; on a TLS
        listener, trusting ``[console] ssl_cafile`` (else ``[tls]``'s CA file, else its own
        certificate) and presenting ``[console] ssl_certfile`` when set (a listener with
        ``tls.client_auth`` asks for one). No host name check: the connection is to this
        appliance's own listener, by the address it listens on."""
        tls, c = self.cfg.tls, self.cfg.console
        return Security(self.target.listener.protocol, mechanism if self.target.sasl else None,
                        user, password,
                        ssl_cafile=(c.ssl_cafile or tls.ca_file or tls.cert_file) or None,
                        ssl_certfile=c.ssl_certfile or None, ssl_keyfile=c.ssl_keyfile or None,
                        ssl_password=c.ssl_password or None, ssl_check_hostname=False)

    def _anonymous_principal(self) -> str:
        """Whom the authorizer sees without a login: User:ANONYMOUS, but on an SSL listener with
        the console's client certificate, that certificate's subject mapped by
        tls.principal_mapping_rules (as the frontends map it, ``appliance.security.principal``)."""
        c = self.cfg.console
        if self.target.listener.protocol != "SSL" or not c.ssl_certfile:
            return "User:ANONYMOUS"
        from appliance.principal_rules import parse_mapping_rules
        from appliance.security.principal import map_principal, rfc2253
        try:
            # the subject as getpeercert() gives it to the broker (CPython's own decoder)
            subject = ssl._ssl._test_decode_cert(c.ssl_certfile)["subject"]
            return map_principal(rfc2253(subject),
                                 parse_mapping_rules(self.cfg.tls.principal_mapping_rules))
        except Exception as e:
            log.warning("console: the subject of console.ssl_certfile: %s", e)
            return "the console's certificate"

    def backend(self, s: Session) -> Backend:
        if s.user is None:
            # Without a login every session is User:ANONYMOUS: one set of connections for all.
            if self._anonymous is None:
                self._anonymous = Backend(self.target.bootstrap, self.security(),
                                          client_id="appliance-console")
            return self._anonymous
        if s.backend is None:
            s.backend = Backend(self.target.bootstrap,
                                self.security(s.user, s.password, s.mechanism),
                                client_id="appliance-console")
        return s.backend

    def login(self, user: str, password: str) -> Session | None:
        """A session for ``user`` if one of the SASL mechanisms accepts the password."""
        mechanisms = [m for m in self.cfg.sasl.mechanisms]
        for mech in mechanisms:
            b = Backend(self.target.bootstrap, self.security(user, password, mech),
                        client_id="appliance-console")
            try:
                b.login()
            except Exception as e:
                log.debug("console login of %s with %s refused: %s", user, mech, e)
                b.close()
                continue
            s = self.sessions.new(self.clock(), user, password, mech)
            s.backend = b
            return s
        return None

    # -- dispatch -----------------------------------------------------------------------------------
    def handle(self, req: Request) -> Response:
        if req.path.startswith("/static/"):
            return self.static(req.path[len("/static/"):])
        now = self.clock()
        s = self.sessions.get(req.cookies.get(COOKIE), now)
        if req.path == "/login":
            return self.login_page(req, s)
        new_cookie = None
        if s is None:
            if self.login_required:
                if req.method == "POST" or req.path.startswith("/api/"):
                    return Response.text(403, "log in first")
                return Response.redirect("/login?next=" + urllib.parse.quote(req.path))
            s = self.sessions.new(now)
            new_cookie = self.sessions.cookie(s)
        if req.method == "POST":
            if not csrf_ok(s, req.form.get("csrf", "")):
                return Response.text(403, "the form's CSRF token is missing or wrong: reload the page")
            if req.path == "/logout":
                self.sessions.drop(s.sid)
                return Response(303, headers=[("Location", "/login" if self.login_required else "/"),
                                              ("Set-Cookie", self.sessions.cookie(None))])
            if not self.may_change(s):
                s.flash.append(("error", "changes are off: no SASL listener, and [console] "
                                         "allow_changes is false"))
                resp = Response.redirect(_back(req))
            else:
                resp = self.post(req, s)
        else:
            resp = self.get(req, s)
        if new_cookie:
            resp.headers.append(("Set-Cookie", new_cookie))
        return resp

    def get(self, req: Request, s: Session) -> Response:
        from . import pages
        parts = [urllib.parse.unquote(p) for p in req.path.strip("/").split("/")] if req.path != "/" else []
        try:
            return pages.get(self, req, s, parts)
        except LookupError:
            return self.render(s, "error.html", status=404, message=f"no page {req.path}")

    def post(self, req: Request, s: Session) -> Response:
        from . import pages
        parts = [urllib.parse.unquote(p) for p in req.path.strip("/").split("/")]
        back = _back(req)
        try:
            done = pages.post(self, req, s, parts)
        except LookupError:
            return Response.text(404, f"no action {req.path}")
        except Exception as e:
            if not _is_refusal(e):
                log.warning("console action %s failed: %s", req.path, e)
            s.flash.append(("error", error_text(e)))
            return Response.redirect(back)
        if isinstance(done, Response):
            return done
        if done:
            s.flash.append(("ok", done))
        return Response.redirect(back)

    # -- responses ----------------------------------------------------------------------------------
    def render(self, s: Session | None, template: str, status: int = 200, **values) -> Response:
        flash = list(s.flash) if s is not None else []
        if s is not None:
            s.flash.clear()
        body = self.env.get_template(template).render(
            nav=NAV, session=s, flash=flash, login_required=self.login_required,
            principal=s.principal if s is not None and s.user else self.anonymous_principal,
            may_change=s is not None and self.may_change(s), **values)
        return Response(status, body.encode())

    def static(self, name: str) -> Response:
        if "/" in name or name.startswith("."):
            return Response.text(404, "not found")
        path = os.path.join(STATIC, name)
        try:
            with open(path, "rb") as f:
                body = f.read()
        except OSError:
            return Response.text(404, "not found")
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        return Response(200, body, ctype)

    def login_page(self, req: Request, s: Session | None) -> Response:
        nxt = req.arg("next", "/")
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/"
        if not self.login_required:
            return Response.redirect("/")
        if req.method == "POST":
            user, password = req.form.get("username", ""), req.form.get("password", "")
            new = self.login(user, password) if user and password else None
            if new is None:
                return self.render(None, "login.html", status=403, next=nxt,
                                   error="wrong user name or password")
            log.info("console: %s logged in", new.principal)
            return Response(303, headers=[("Location", nxt),
                                          ("Set-Cookie", self.sessions.cookie(new))])
        return self.render(None, "login.html", next=nxt, error=None)

    # -- the Overview's samples (the worker's tick) ---------------------------------------------------
    def sample(self, families, at: float) -> None:
        from .history import totals
        self.history.add(totals(families, at))

    def overview_values(self) -> dict:
        try:
            procs = self.overview.processes()
        except (OSError, ValueError) as e:
            procs = []
            log.warning("console: processes.json unreadable: %s", e)
        disk = self.overview.disk(self.cfg)
        return {"processes": procs, "listeners": self.overview.listeners(self.cfg), "disk": disk,
                "problems": problems(procs, disk, self.cfg.supervisor.crash_loop_restarts)}

    def history_json(self) -> Response:
        return Response(200, json.dumps(self.history.series()).encode(), "application/json")

    def note_lag(self, group: dict) -> None:
        """A point of ``group``'s lag chart from what its page just read."""
        self.lags.add(group["group"], self.clock(), {
            f"{r['topic']}-{r['partition']}": r["lag"] for r in group["lag"] if r["lag"] is not None})

    def lag_json(self, name: str) -> Response:
        return Response(200, json.dumps(self.lags.series(name)).encode(), "application/json")


def _back(req: Request) -> str:
    """Where a form returns: its ``back`` field when it is a path of this site, else /."""
    back = req.form.get("back") or "/"
    return back if back.startswith("/") and not back.startswith("//") and \
        "\r" not in back and "\n" not in back else "/"


def _is_refusal(e: Exception) -> bool:
    from appliance.client.errors import KafkaError
    return isinstance(e, KafkaError)


def parse_acl(form: dict) -> acl.AclBinding:
    """An ACL from the Security page's form (Kafka's names: Topic, Read, Allow, Literal ...);
    ValueError says what is wrong."""
    rtype = acl.parse_resource_type(form.get("resource_type", ""))
    if rtype not in (acl.ResourceType.TOPIC, acl.ResourceType.GROUP, acl.ResourceType.CLUSTER,
                     acl.ResourceType.TRANSACTIONAL_ID):
        raise ValueError("the resource type is Topic, Group, Cluster or TransactionalId")
    pattern = acl.parse_pattern_type(form.get("pattern", "Literal") or "Literal")
    name = acl.CLUSTER_NAME if rtype == acl.ResourceType.CLUSTER else \
        form.get("resource_name", "").strip()
    if not name:
        raise ValueError("name the resource")
    principal = form.get("principal", "").strip()
    if not re.fullmatch(r"[A-Za-z]+:.+", principal):
        raise ValueError("the principal is TYPE:NAME (User:alice)")
    return acl.AclBinding(int(rtype), name, int(pattern), principal,
                          form.get("host", "*").strip() or "*",
                          int(acl.parse_operation(form.get("operation", ""))),
                          int(acl.parse_permission(form.get("permission", "Allow") or "Allow")))


# -- template filters ---------------------------------------------------------------------------------
def _bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _ms(ms) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _when(ms) -> str:
    if ms is None or ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"
