"""``appliance configs`` for client quotas: kafka-configs.sh's ``--entity-type users|clients|ips``
(and its ``--user``, ``--client``, ``--ip`` shorthands and their ``-defaults``), over
DescribeClientQuotas and AlterClientQuotas (KIP-546), so it works against a Kafka cluster too.

Runs in the user's shell; owns nothing. ``configs describe`` and ``configs alter`` call in here
when the entity is a quota entity (``quota_entity`` returns None for topics and brokers).
"""

from __future__ import annotations

import click

from appliance.cli.tool import admin_client, error_text, fail, names, output, parse_configs

TYPE_OF = {"users": "user", "clients": "client-id", "ips": "ip"}
EXACT, DEFAULT, ANY = 0, 1, 2


def quota_options(fn):
    for opt in reversed([
        click.option("--user", default=None, help="A user's client quotas (--entity-type users)."),
        click.option("--user-defaults", is_flag=True, help="The default user's quotas."),
        click.option("--client", default=None, help="A client id's quotas (--entity-type clients)."),
        click.option("--client-defaults", is_flag=True, help="The default client id's quotas."),
        click.option("--ip", default=None, help="An address's connection quota (--entity-type ips)."),
        click.option("--ip-defaults", is_flag=True, help="The default address's quota."),
    ]):
        fn = opt(fn)
    return fn


def quota_entity(entity_type, entity_name, entity_default, user, user_defaults, client,
                 client_defaults, ip, ip_defaults) -> dict | None:
    """The quota entity named: type -> (match, name), a name of None meaning the default, or
    ANY for every entity of the type (describe without a name). None: not a quota entity."""
    out: dict[str, tuple[int, str | None]] = {}
    for etype, name, default in (("user", user, user_defaults), ("client-id", client, client_defaults),
                                 ("ip", ip, ip_defaults)):
        if name is not None:
            out[etype] = (EXACT, name)
        elif default:
            out[etype] = (DEFAULT, None)
    if entity_type in TYPE_OF:
        etype = TYPE_OF[entity_type]
        if etype in out:
            raise click.UsageError(f"--entity-type {entity_type} and --{etype.split('-')[0]} both given")
        out[etype] = (EXACT, entity_name) if entity_name else (DEFAULT, None) if entity_default \
            else (ANY, None)
    return out or None


def describe(bootstrap, as_json, entity: dict) -> None:
    from appliance.client.admin import QuotaRequestError
    components = [(t, m, n) for t, (m, n) in entity.items()]
    with admin_client(bootstrap) as a:
        try:
            found = a.describe_client_quotas(components, strict=True)
        except QuotaRequestError as e:
            fail(f"Error: {error_text(e.code, e.message)}")
    rows = [{"entity": _label(ent), "name": k, "value": _value(v)}
            for ent, values in sorted(found, key=lambda x: _label(x[0]))
            for k, v in sorted(values.items())]
    if not rows and not as_json:
        click.echo("No quotas for " + _label({t: n for t, (_, n) in entity.items()}, any_of=entity)
                   + ".", err=True)
        return
    output(rows, [("entity", "ENTITY"), ("name", "NAME"), ("value", "VALUE")], as_json)


def alter(bootstrap, as_json, entity: dict, add, delete, validate_only) -> None:
    if any(m == ANY for m, _ in entity.values()):
        raise click.UsageError("give --entity-name or --entity-default for each quota entity type")
    sets = parse_configs(add, "--add-config")
    dels = names(delete)
    if not sets and not dels:
        raise click.UsageError("give --add-config or --delete-config")
    ops: list[tuple[str, float | None]] = []
    for k, v in sets.items():
        try:
            ops.append((k, float(v)))
        except ValueError:
            raise click.BadParameter(f"{k}={v}: a quota is a number", param_hint="--add-config") from None
    ops += [(k, None) for k in dels]
    ent = {t: n for t, (_, n) in entity.items()}
    with admin_client(bootstrap) as a:
        ((code, msg),) = a.alter_client_quotas([(ent, ops)], validate_only=validate_only)
    if code:
        fail(f"Error: {_label(ent)}: {error_text(code, msg)}")
    if as_json:
        output([{"entity": _label(ent), "result": "ok"}], [], True)
    else:
        verb = "validating" if validate_only else "updating"
        click.echo(f"Completed {verb} config for {_label(ent)}.")


def _label(entity: dict, any_of: dict | None = None) -> str:
    parts = []
    for t in ("user", "client-id", "ip"):
        if t in entity:
            if any_of is not None and any_of[t][0] == ANY:
                parts.append(f"{t}=*")
            else:
                parts.append(f"{t}={'<default>' if entity[t] is None else entity[t]}")
    return ", ".join(parts)


def _value(v: float):
    return int(v) if float(v).is_integer() else v
