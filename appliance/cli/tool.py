"""What the Kafka-tool commands share: the ``--bootstrap-server`` / ``--config`` / ``--json``
options, the admin client, table and JSON output, and errors that name their cause and exit 1.

Runs in the user's shell. ``--bootstrap-server`` may be given to the tool's group (``appliance
topics --bootstrap-server H:P list``, as ``appliance transactions`` takes it) or to the command
(``appliance topics list --bootstrap-server H:P``, as Kafka's tools take it); without it, the
``server.listen`` of the configuration (the group's ``--config FILE``, else the defaults and
``APPLIANCE_*``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from typing import Any, Iterable, Sequence

import click

from appliance.cli import _load, main

EXIT_ERROR = 1


def fail(message: str, code: int = EXIT_ERROR):
    """Print ``message`` on stderr and exit (1: the request failed; 2 is click's usage error)."""
    click.echo(message, err=True)
    sys.exit(code)


def tool_group(name: str, help_text: str):
    """A command group for one Kafka tool, taking ``--bootstrap-server`` and ``--config``."""
    def deco(fn):
        @main.group(name, help=help_text)
        @click.option("--bootstrap-server", "bootstrap_server", default=None, metavar="HOST:PORT",
                      help="The broker to ask (default: server.listen of the configuration).")
        @click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                      help="The appliance's TOML file, for the default bootstrap server.")
        @click.pass_context
        @functools.wraps(fn)
        def group(ctx: click.Context, bootstrap_server: str | None, config: str | None) -> None:
            ctx.ensure_object(dict)
            ctx.obj.update(bootstrap_server=bootstrap_server, config=config)
        return group
    return deco


def connection_options(fn):
    """``--bootstrap-server`` and ``--json`` on a command; the command receives ``bootstrap``
    (resolved: the command's, else the group's, else ``server.listen`` of the group's
    ``--config``) and ``as_json``. (``--config`` on a command is Kafka's: a topic config.)"""
    @click.option("--bootstrap-server", "bootstrap_server", default=None, metavar="HOST:PORT",
                  help="The broker to ask (default: server.listen of the configuration).")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    @click.pass_context
    @functools.wraps(fn)
    def wrapper(ctx: click.Context, bootstrap_server: str | None, as_json: bool, **kw):
        parent = ctx.find_object(dict) or {}
        bootstrap = bootstrap_server or parent.get("bootstrap_server")
        if bootstrap is None:
            bootstrap = _load(parent.get("config")).server.listen
        return fn(bootstrap=bootstrap, as_json=as_json, **kw)
    return wrapper


@contextlib.contextmanager
def admin_client(bootstrap: str):
    """An ``AdminClient`` for the command; a Kafka error inside the block ends the command
    with its name and message (exit 1)."""
    from appliance.client.admin import AdminClient
    from appliance.client.errors import KafkaError
    try:
        client = AdminClient(bootstrap)
    except (KafkaError, ValueError) as e:
        fail(f"Error: cannot use bootstrap server {bootstrap}: {e}")
    try:
        with kafka_errors(bootstrap):
            yield client
    finally:
        client.close()


@contextlib.contextmanager
def kafka_errors(bootstrap: str):
    from appliance.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
    try:
        yield
    except KafkaConnectionError as e:
        fail(f"Error: cannot reach {bootstrap}: {e}")
    except KafkaTimeoutError as e:
        fail(f"Error: no answer in time from {bootstrap}: {e}")
    except KafkaError as e:
        fail(f"Error: {e}")


def error_text(code: int, message: str | None) -> str:
    from appliance.client.errors import error_code
    name = error_code(code).name.upper()
    return f"{name}: {message}" if message and message != name else name


def output(rows: Sequence[dict], columns: Sequence[tuple[str, str]], as_json: bool,
           json_value: Any = None) -> None:
    """``rows`` as an aligned table (``columns``: (key, header)) or, with ``--json``, as JSON
    (``json_value`` when given, else the rows)."""
    if as_json:
        click.echo(json.dumps(rows if json_value is None else json_value, indent=1, default=str))
        return
    table(rows, columns)


def table(rows: Sequence[dict], columns: Sequence[tuple[str, str]]) -> None:
    cells = [[h for _, h in columns]] + [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def parse_configs(items: Iterable[str], what: str = "--config") -> dict[str, str]:
    """``k=v`` items (a comma list inside one item also works, with ``[a,b]`` for a list value,
    as kafka-configs.sh's --add-config takes them)."""
    out: dict[str, str] = {}
    for item in items:
        for part in split_outside_brackets(item):
            k, sep, v = part.partition("=")
            if not sep or not k.strip():
                raise click.BadParameter(f"{part!r} is not KEY=VALUE", param_hint=what)
            v = v.strip()
            if v.startswith("[") and v.endswith("]"):
                v = v[1:-1]
            out[k.strip()] = v
    return out


def split_outside_brackets(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return [p for p in (x.strip() for x in parts) if p]


def names(items: Iterable[str]) -> list[str]:
    """Repeatable and comma-separated names, in order, without duplicates."""
    out: list[str] = []
    for item in items:
        for n in item.split(","):
            n = n.strip()
            if n and n not in out:
                out.append(n)
    return out
