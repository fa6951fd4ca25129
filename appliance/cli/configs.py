"""``appliance configs``: Kafka's kafka-configs.sh for topics and brokers (describe, alter with
--add-config / --delete-config) over the Kafka protocol (DescribeConfigs and
IncrementalAlterConfigs), so it works against a Kafka cluster too; for client quotas (users,
clients, ips) through ``appliance.cli.client_quotas``.

Runs in the user's shell; owns nothing but its admin client. On the appliance, topic configs are
kept per topic and broker configs changed here are its dynamic broker configs (this node's, or
with ``--entity-default`` the cluster-wide default), which win over its TOML file.
"""

from __future__ import annotations

import click

from appliance.cli import client_quotas
from appliance.cli.tool import (admin_client, connection_options, error_text, fail, names, output,
                                parse_configs, tool_group)

ENTITY_TYPES = {"topics": 2, "brokers": 4}
SINGULAR = {"topics": "topic", "brokers": "broker"}
DYNAMIC_SOURCES = {"topics": ("DYNAMIC_TOPIC_CONFIG",),
                   "brokers": ("DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG")}


@tool_group("configs", "Describe and alter topic and broker configs (Kafka's kafka-configs.sh).")
def configs() -> None:
    pass


def _entity(entity_type, entity_name, entity_default, topic, broker, broker_defaults, *, need_name: bool):
    """(type name, resource names) from Kafka's --entity-type/--entity-name/--entity-default or the
    shorthands --topic, --broker, --broker-defaults."""
    if topic:
        entity_type, entity_name = "topics", topic
    elif broker is not None:
        entity_type, entity_name = "brokers", broker
    elif broker_defaults:
        entity_type, entity_default = "brokers", True
    if entity_type is None:
        raise click.UsageError("give --entity-type (topics or brokers), or --topic / --broker / --broker-defaults")
    if entity_default:
        if entity_type != "brokers":
            raise click.UsageError("--entity-default is for brokers (the cluster-wide default)")
        return entity_type, [""]
    if entity_name:
        return entity_type, names([entity_name])
    if need_name:
        raise click.UsageError("give --entity-name (or --entity-default for brokers)")
    return entity_type, None


def _entity_options(fn):
    for opt in reversed([
        click.option("--entity-type", type=click.Choice(sorted(ENTITY_TYPES) + sorted(client_quotas.TYPE_OF)),
                     default=None),
        click.option("--entity-name", default=None, help="The topic name or broker id."),
        click.option("--entity-default", is_flag=True, help="Brokers: the cluster-wide default."),
        click.option("--topic", default=None, help="Short for --entity-type topics --entity-name NAME."),
        click.option("--broker", default=None, help="Short for --entity-type brokers --entity-name ID."),
        click.option("--broker-defaults", is_flag=True, help="Short for --entity-type brokers --entity-default."),
    ]):
        fn = opt(fn)
    return client_quotas.quota_options(fn)



def _label(entity_type: str, name: str) -> str:
    if entity_type == "brokers" and name == "":
        return "the cluster-wide default of brokers"
    return f"{SINGULAR[entity_type]} {name}"


@configs.command("describe")
@_entity_options
@click.option("--all", "show_all", is_flag=True,
              help="Every config with its value and source (default: the dynamic ones only).")
@connection_options
def configs_describe(bootstrap, as_json, entity_type, entity_name, entity_default, topic, broker,
                     broker_defaults, show_all, user, user_defaults, client, client_defaults, ip,
                     ip_defaults) -> None:
    """Show the configs of topics or brokers (the dynamic ones, or --all), or client quotas."""
    quota = client_quotas.quota_entity(entity_type, entity_name, entity_default, user, user_defaults,
                                       client, client_defaults, ip, ip_defaults)
    if quota is not None:
        client_quotas.describe(bootstrap, as_json, quota)
        return
    from appliance.client.admin import BROKER, TOPIC
    entity_type, wanted = _entity(entity_type, entity_name, entity_default, topic, broker, broker_defaults,
                                  need_name=False)
    with admin_client(bootstrap) as a:
        if wanted is None:
            if entity_type == "topics":
                wanted = a.list_topics(include_internal=False)
            else:
                a.cluster.refresh(())
                wanted = [str(n) for n in sorted(a.cluster.brokers)]
        rtype = TOPIC if entity_type == "topics" else BROKER
        results = a.describe_configs([(rtype, n) for n in wanted], include_synonyms=True) if wanted else []
    rows = []
    for res in results:
        if res["error"][0]:
            fail(f"Error: {_label(entity_type, res['name'])}: {error_text(*res['error'])}")
        for c in sorted(res["configs"], key=lambda c: c["name"]):
            # Kafka's default view: what was set dynamically on this very entity (a topic's own
            # overrides; a broker's dynamic configs, its own or the cluster-wide default)
            if show_all or c["source"] in DYNAMIC_SOURCES[entity_type]:
                rows.append({"entity": res["name"] if res["name"] else "<default>", "name": c["name"],
                             "value": c["value"], "source": c["source"], "read_only": c["read_only"],
                             "synonyms": [f"{s['source']}:{s['name']}={s['value']}" for s in c["synonyms"]]})
    cols = [("entity", SINGULAR[entity_type].upper()), ("name", "NAME"), ("value", "VALUE"), ("source", "SOURCE")]
    if show_all:
        cols.append(("read_only", "READ-ONLY"))
    if not rows and not as_json:
        click.echo(f"No {'' if show_all else 'dynamic '}configs for "
                   + ", ".join(_label(entity_type, n) for n in wanted) + ".", err=True)
        return
    output(rows, cols, as_json)


@configs.command("alter")
@_entity_options
@click.option("--add-config", "add", multiple=True, metavar="K=V[,K=V...]",
              help="Set configs (a list value in brackets: k=[a,b]); repeatable.")
@click.option("--delete-config", "delete", multiple=True, metavar="K[,K...]",
              help="Remove configs (back to their default); repeatable.")
@click.option("--validate-only", is_flag=True, help="Check the change; apply nothing.")
@connection_options
def configs_alter(bootstrap, as_json, entity_type, entity_name, entity_default, topic, broker,
                  broker_defaults, add, delete, validate_only, user, user_defaults, client,
                  client_defaults, ip, ip_defaults) -> None:
    """Set or remove configs of topics or brokers (IncrementalAlterConfigs), or client quotas
    (AlterClientQuotas)."""
    quota = client_quotas.quota_entity(entity_type, entity_name, entity_default, user, user_defaults,
                                       client, client_defaults, ip, ip_defaults)
    if quota is not None:
        client_quotas.alter(bootstrap, as_json, quota, add, delete, validate_only)
        return
    from appliance.client.admin import BROKER, OP_DELETE, OP_SET, TOPIC
    entity_type, wanted = _entity(entity_type, entity_name, entity_default, topic, broker, broker_defaults,
                                  need_name=True)
    sets = parse_configs(add, "--add-config")
    dels = names(delete)
    if not sets and not dels:
        raise click.UsageError("give --add-config or --delete-config")
    both = set(sets) & set(dels)
    if both:
        raise click.UsageError(f"{', '.join(sorted(both))} both added and deleted")
    ops = [(OP_SET, k, v) for k, v in sets.items()] + [(OP_DELETE, k, None) for k in dels]
    rtype = TOPIC if entity_type == "topics" else BROKER
    with admin_client(bootstrap) as a:
        results = a.incremental_alter_configs([(rtype, n, ops) for n in wanted], validate_only=validate_only)
    rows, failed = [], []
    for n, (code, msg) in zip(wanted, results):
        rows.append({"entity": n, "result": "ok" if code == 0 else error_text(code, msg)})
        if code:
            failed.append(f"Error: {_label(entity_type, n)}: {error_text(code, msg)}")
        elif not as_json:
            verb = "validating" if validate_only else "updating"
            click.echo(f"Completed {verb} default config for brokers in the cluster." if n == ""
                       else f"Completed {verb} config for {_label(entity_type, n)}.")
    if as_json:
        output(rows, [], True)
    if failed:
        fail("\n".join(failed))
