"""What the Kafka-tool commands share: the ``--bootstrap-server`` / ``--command-config`` /
``--config`` / ``--json`` options, the admin client, table and JSON output, and errors that name
their cause and exit 1.

Runs in the user's shell. ``--bootstrap-server`` and ``--command-config`` may be given to the
tool's group (``appliance topics --bootstrap-server H:P list``, as ``appliance transactions``
takes them) or to the command (``appliance topics list --bootstrap-server H:P``, as Kafka's tools
take them); without ``--bootstrap-server``, the first listener of ``server.listeners`` (or
``server.listen``) of the configuration (the group's ``--config FILE``, else the defaults and
``APPLIANCE_*``). ``--command-config`` is a Kafka client properties file (security.protocol,
sasl.mechanism, sasl.jaas.config, ssl.truststore.location ...), as Kafka's tools take it, for a
secured listener.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import click

from appliance.cli import _load, main

EXIT_ERROR = 1


def fail(message: str, code: int = EXIT_ERROR):
    """Print ``message`` on stderr and exit (1: the request failed; 2 is click's usage error)."""
    click.echo(message, err=True)
    sys.exit(code)


BOOTSTRAP_HELP = "The broker to ask (default: the first listener of the configuration)."
COMMAND_CONFIG_HELP = ("Kafka client properties for a secured listener (security.protocol, "
                       "sasl.mechanism, sasl.jaas.config, ssl.truststore.location ...).")


@dataclass
class Bootstrap:
    """Where a tool connects: the bootstrap servers and the TLS/SASL client settings of
    ``--command-config`` (``appliance.client.security`` key names)."""
    servers: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.servers

    @property
    def security(self):
        from appliance.client.security import DEFAULTS, Security
        return Security.from_config({**DEFAULTS, **self.settings})


def default_bootstrap(cfg) -> str:
    """The first listener's address, where a tool on this machine reaches the appliance (an
    all-interfaces bind is reached through the loopback address)."""
    from appliance.listeners import advertised_host
    lst = cfg.listeners[0]
    host = advertised_host(lst.host)
    return f"[{host}]:{lst.port}" if ":" in host else f"{host}:{lst.port}"


def resolve_bootstrap(ctx: click.Context, bootstrap_server: str | None = None,
                      command_config: str | None = None) -> Bootstrap:
    """The command's options, else its tool group's, else the configuration's first listener;
    a ``--command-config`` that cannot be read or used is a usage error (exit 2)."""
    from appliance.client.security import properties_settings
    parent = ctx.find_object(dict) or {}
    servers = bootstrap_server or parent.get("bootstrap_server")
    if servers is None:
        servers = default_bootstrap(_load(parent.get("config")))
    path = command_config or parent.get("command_config")
    target = Bootstrap(servers)
    if path:
        try:
            target.settings = properties_settings(path)
            target.security                       # noqa: B018 (checked now, not at connect)
        except OSError as e:
            raise click.BadParameter(f"{path}: {e.strerror}", param_hint="--command-config") from None
        except ValueError as e:
            raise click.BadParameter(f"{path}: {e}", param_hint="--command-config") from None
    return target


def tool_group(name: str, help_text: str):
    """A command group for one Kafka tool, taking ``--bootstrap-server``, ``--command-config``
    and ``--config``."""
    def deco(fn):
        @main.group(name, help=help_text)
        @click.option("--bootstrap-server", "bootstrap_server", default=None, metavar="HOST:PORT",
                      help=BOOTSTRAP_HELP)
        @click.option("--command-config", "command_config", default=None,
                      type=click.Path(dir_okay=False), help=COMMAND_CONFIG_HELP)
        @click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                      help="The appliance's TOML file, for the default bootstrap server.")
        @click.pass_context
        @functools.wraps(fn)
        def group(ctx: click.Context, bootstrap_server: str | None, command_config: str | None,
                  config: str | None) -> None:
            ctx.ensure_object(dict)
            ctx.obj.update(bootstrap_server=bootstrap_server, command_config=command_config,
                           config=config)
        return group
    return deco


def connection_options(fn):
    """``--bootstrap-server``, ``--command-config`` and ``--json`` on a command; the command
    receives ``bootstrap`` (a ``Bootstrap``, resolved by ``resolve_bootstrap``) and ``as_json``.
    (``--config`` on a command is Kafka's: a topic config.)"""
    @click.option("--bootstrap-server", "bootstrap_server", default=None, metavar="HOST:PORT",
                  help=BOOTSTRAP_HELP)
    @click.option("--command-config", "command_config", default=None,
                  type=click.Path(dir_okay=False), help=COMMAND_CONFIG_HELP)
    @click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
    @click.pass_context
    @functools.wraps(fn)
    def wrapper(ctx: click.Context, bootstrap_server: str | None, command_config: str | None,
                as_json: bool, **kw):
        bootstrap = resolve_bootstrap(ctx, bootstrap_server, command_config)
        return fn(bootstrap=bootstrap, as_json=as_json, **kw)
    return wrapper


@contextlib.contextmanager
def admin_client(bootstrap: Bootstrap):
    """An ``AdminClient`` for the command; a Kafka error inside the block ends the command
    with its name and message (exit 1)."""
    from appliance.client.admin import AdminClient
    from appliance.client.errors import KafkaError
    try:
        client = AdminClient(bootstrap.servers, security=bootstrap.security)
    except (KafkaError, ValueError) as e:
        fail(f"Error: cannot use bootstrap server {bootstrap}: {e}")
    try:
        with kafka_errors(bootstrap):
            yield client
    finally:
        client.close()


@contextlib.contextmanager
def kafka_errors(bootstrap: Bootstrap | str):
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


def protocol_connection(ctx: click.Context, client_id: str):
    """One connection of ``appliance.client.transaction_admin`` to the command's bootstrap server
    (its security from ``--command-config``); an unreachable server ends the command (exit 1)."""
    from appliance.client import transaction_admin as admin
    from appliance.client.errors import KafkaError
    target = resolve_bootstrap(ctx)
    try:
        return admin.connect(target.servers, security=target.security, client_id=client_id)
    except KafkaError as e:
        click.echo(f"cannot reach {target.servers}: {e}", err=True)
        sys.exit(1)


def run_or_exit(fn):
    """``fn()``, or the Kafka error it raises printed and exit 1."""
    from appliance.client.errors import KafkaError
    try:
        return fn()
    except KafkaError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
