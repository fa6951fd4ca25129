"""The console's pages and actions: what each URL reads or changes, through the session's
``Backend`` (``appliance.console.kafka``), and which template shows it.

Runs in the console worker, called by ``Console.get`` / ``Console.post``
(``appliance.console.app``); owns nothing. A GET that fails shows the page with the error in
words (a refused Describe, a connection that failed); a POST returns the sentence the next page
flashes, or raises what refused it (flashed as an error).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from appliance.acl import model as acl
from appliance.http import Request, Response

from .kafka import error_text
from .sessions import Session

if TYPE_CHECKING:
    from .app import Console

FORMATS = ("text", "json", "hex")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def get(c: "Console", req: Request, s: Session, parts: list[str]) -> Response:
    b = c.backend(s)
    if not parts:
        return c.render(s, "overview.html", page="/", **c.overview_values())
    head = parts[0]
    if head == "api" and parts[1:] == ["history"]:
        return c.history_json()
    if head == "topics" and len(parts) == 1:
        return _read(c, s, "topics.html", "/topics", lambda: {"topics": b.call(b.topics)})
    if head == "topics" and len(parts) == 2:
        return _read(c, s, "topic.html", "/topics", lambda: {"topic": b.call(b.topic, parts[1])})
    if head == "topics" and len(parts) == 3 and parts[2] == "records":
        return _records(c, req, s, parts[1])
    if head == "groups" and len(parts) == 1:
        return _read(c, s, "groups.html", "/groups", lambda: {"groups": b.call(b.groups)})
    if head == "api" and len(parts) == 4 and parts[1] == "groups" and parts[3] == "lag":
        # the lag chart's refresh: read the lag now (as this session's principal), then the hour
        try:
            c.note_lag(b.call(b.group, parts[2]))
        except Exception as e:
            return Response.text(502, error_text(e))
        return c.lag_json(parts[2])
    if head == "groups" and len(parts) == 2:
        return _read(c, s, "group.html", "/groups", lambda: _group(c, b, parts[1]))
    if head == "share-groups" and len(parts) == 2:
        return _read(c, s, "share_group.html", "/groups",
                     lambda: {"group": b.call(b.share_group, parts[1]), "plan": None,
                              "form": {}})
    if head == "transactions" and len(parts) == 1:
        return _read(c, s, "transactions.html", "/transactions",
                     lambda: {"transactions": b.call(b.transactions)})
    if head == "security" and len(parts) == 1:
        return _security(c, s)
    if head == "spark" and len(parts) == 1:
        return _read(c, s, "spark.html", "/spark", lambda: {"jobs": b.call(b.spark_jobs)})
    raise LookupError(req.path)


def _read(c: "Console", s: Session, template: str, page: str, read) -> Response:
    try:
        values = read()
    except Exception as e:
        return c.render(s, "error.html", page=page, message=error_text(e))
    return c.render(s, template, page=page, **values)


def _group(c: "Console", b, name: str) -> dict:
    d = b.call(b.group, name)
    c.note_lag(d)
    return {"group": d, "plan": None}


def _security(c: "Console", s: Session) -> Response:
    b = c.backend(s)
    values: dict = {"users": None, "acls": None, "users_error": None, "acls_error": None}
    try:
        values["users"] = b.call(b.users)
    except Exception as e:
        values["users_error"] = error_text(e)
    try:
        values["acls"] = b.call(b.acls)
    except Exception as e:
        values["acls_error"] = error_text(e)
    return c.render(s, "security.html", page="/security", **values)


def _records(c: "Console", req: Request, s: Session, topic: str) -> Response:
    b = c.backend(s)
    fmt = req.arg("format", "text")
    fmt = fmt if fmt in FORMATS else "text"
    read_committed = req.arg("isolation", "read_uncommitted") == "read_committed"
    form = {"partition": req.arg("partition", "0"), "offset": req.arg("offset", ""),
            "time": req.arg("time", ""), "format": fmt,
            "isolation": "read_committed" if read_committed else "read_uncommitted"}
    try:
        partition = int(form["partition"] or 0)
        offset = int(form["offset"]) if form["offset"].strip() else None
        ts = _parse_time(form["time"]) if form["time"].strip() else None
        got = b.call(b.browse, topic, partition, offset=offset, timestamp_ms=ts,
                     read_committed=read_committed)
    except Exception as e:
        return c.render(s, "records.html", page="/topics", topic=topic, form=form, got=None,
                        error=error_text(e), formats=FORMATS)
    return c.render(s, "records.html", page="/topics", topic=topic, form=form, got=got,
                    error=None, formats=FORMATS)


def _parse_time(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it says)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    t = datetime.datetime.fromisoformat(text)
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return int(t.timestamp() * 1000)


def _int(req: Request, name: str) -> int:
    try:
        return int(req.form.get(name, ""))
    except ValueError:
        raise ValueError(f"{name} must be a number") from None


def _confirmed(req: Request, what: str) -> None:
    if req.form.get("confirm") != "yes":
        raise ValueError(f"not done: tick the box to confirm {what}")


def post(c: "Console", req: Request, s: Session, parts: list[str]) -> str | Response | None:
    b = c.backend(s)
    f = req.form
    if parts == ["topics", "create"]:
        name = f.get("name", "").strip()
        configs = {}
        for line in f.get("configs", "").splitlines():
            if line.strip():
                k, sep, v = line.partition("=")
                if not sep:
                    raise ValueError(f"configs are key=value lines, not {line!r}")
                configs[k.strip()] = v.strip()
        b.call(b.create_topic, name, _int(req, "partitions"), configs)
        return f"created topic {name}"
    if len(parts) == 3 and parts[0] == "topics":
        topic, action = parts[1], parts[2]
        if action == "delete":
            _confirmed(req, f"deleting {topic}")
            b.call(b.delete_topic, topic)
            s.flash.append(("ok", f"deleted topic {topic}"))
            return Response.redirect("/topics")
        if action == "partitions":
            count = _int(req, "count")
            b.call(b.add_partitions, topic, count)
            return f"{topic} now has {count} partitions"
        if action == "config":
            key = f.get("key", "").strip()
            value = None if f.get("delete") == "yes" else f.get("value", "")
            b.call(b.alter_config, topic, key, value)
            return f"{key} of {topic} {'reset to its default' if value is None else 'set'}"
    if len(parts) == 3 and parts[:1] == ["groups"] and parts[2] == "reset":
        group = parts[1]
        dry = f.get("execute") != "yes"
        plan = b.call(b.reset_offsets, group, f.get("topic", ""), f.get("to", "earliest"), dry)
        if dry:
            d = b.call(b.group, group)
            return c.render(s, "group.html", page="/groups", group=d, plan=plan)
        return f"reset the offsets of {group} on {f.get('topic')} to the {f.get('to')}"
    if len(parts) == 3 and parts[:1] == ["share-groups"] and parts[2] == "reset":
        group, topic, to = parts[1], f.get("topic", "").strip(), f.get("to", "earliest")
        dry = f.get("execute") != "yes"
        offset = _int(req, "offset") if to == "offset" else None
        plan = b.call(b.share_reset_offsets, group, topic, to, offset, dry)
        if dry:
            return c.render(s, "share_group.html", page="/groups",
                            group=b.call(b.share_group, group), plan=plan, form=dict(f))
        where = f"on {topic}" if topic else "on every share partition"
        at = f"offset {offset}" if to == "offset" else f"the {to}"
        return f"reset the start offsets of share group {group} {where} to {at}"
    if len(parts) == 3 and parts[0] == "transactions" and parts[2] == "terminate":
        tid = parts[1]
        _confirmed(req, f"terminating {tid}")
        pid, epoch = b.call(b.force_terminate, tid)
        return f"terminated {tid}: it is now producer {pid} epoch {epoch}"
    if parts == ["transactions", "abort"]:
        _confirmed(req, "the abort")
        topic, partition = f.get("topic", ""), _int(req, "partition")
        found = b.call(b.abort, topic, partition, _int(req, "start_offset"))
        return f"aborted the transaction of producer {found['producer_id']} on {topic}-{partition}"
    if parts == ["spark", "recover"]:
        _confirmed(req, "the recovery")
        lines = b.call(b.spark_recover)
        for line in lines:
            s.flash.append(("ok", line))
        return None if lines else "nothing to recover"
    if parts == ["security", "users", "add"]:
        name, mech = f.get("name", "").strip(), f.get("mechanism", "")
        password = f.get("password", "")
        if not name:
            raise ValueError("name the user")
        if mech not in SCRAM_MECHANISMS:
            raise ValueError(f"the mechanism is one of {', '.join(SCRAM_MECHANISMS)}")
        if not password:
            raise ValueError("the password is empty")
        if password != f.get("password2", ""):
            raise ValueError("the two passwords differ")
        b.call(b.add_user, name, mech, password)
        return f"user {name}: {mech} credential set"
    if parts == ["security", "users", "delete"]:
        name = f.get("name", "").strip()
        mech = f.get("mechanism") or None
        if mech is not None and mech not in SCRAM_MECHANISMS:
            raise ValueError(f"the mechanism is one of {', '.join(SCRAM_MECHANISMS)}")
        _confirmed(req, f"deleting {name}")
        mechs = b.call(b.delete_user, name, mech)
        return f"user {name}: deleted {', '.join(mechs)}"
    if parts == ["security", "acls", "add"]:
        from .app import parse_acl
        binding = parse_acl(dict(f))
        b.call(b.add_acl, binding)
        return f"added {binding}"
    if parts == ["security", "acls", "remove"]:
        from .app import parse_acl
        binding = parse_acl(dict(f))
        removed = b.call(b.remove_acl, acl.AclFilter(
            binding.resource_type, binding.resource_name, binding.pattern_type, binding.principal,
            binding.host, binding.operation, binding.permission_type))
        return f"removed {len(removed)} ACL{'s' if len(removed) != 1 else ''}"
    raise LookupError(req.path)
