"""``appliance client-metrics``: Kafka's kafka-client-metrics.sh (KIP-714) over the Kafka
protocol: list, describe, alter and delete the CLIENT_METRICS config resources, the telemetry
subscriptions clients are handed (ListConfigResources, DescribeConfigs, IncrementalAlterConfigs),
so it works against a Kafka 4.x cluster too.

Runs in the user's shell; owns nothing but its admin client. Kafka's options: ``--name`` (or
``--generate-name`` for a new subscription), ``--metrics`` (metric name prefixes, comma
separated; ``*`` for all), ``--interval`` (the push interval in ms), ``--match``
(``selector=regex``, comma separated: client_instance_id, client_id, client_software_name,
client_software_version, client_source_address, client_source_port); Kafka's messages.
"""

from __future__ import annotations

import uuid

import click

from appliance.cli.tool import (admin_client, connection_options, error_text, fail, names, output,
                                tool_group)

CONFIGS = ("metrics", "interval.ms", "match")


@tool_group("client-metrics", "Client telemetry subscriptions, CLIENT_METRICS resources "
                              "(Kafka's kafka-client-metrics.sh).")
def client_metrics() -> None:
    pass


def _names(a) -> list[str]:
    from appliance.client.admin import CLIENT_METRICS
    return sorted(n for n, t in a.list_config_resources([CLIENT_METRICS]) if t == CLIENT_METRICS)


@client_metrics.command("list")
@connection_options
def list_cmd(bootstrap, as_json) -> None:
    """The names of the client metrics subscriptions."""
    with admin_client(bootstrap) as a:
        got = _names(a)
    if as_json:
        output([], [], True, got)
    else:
        for n in got:
            click.echo(n)


@client_metrics.command("describe")
@click.option("--name", default=None, help="One subscription (default: every one).")
@connection_options
def describe_cmd(bootstrap, as_json, name) -> None:
    """The configs of one or every subscription."""
    from appliance.client.admin import CLIENT_METRICS
    with admin_client(bootstrap) as a:
        wanted = [name] if name else _names(a)
        results = a.describe_configs([(CLIENT_METRICS, n) for n in wanted]) if wanted else []
    out = {}
    for res in results:
        if res["error"][0]:
            fail(f"Error: client metrics {res['name']}: {error_text(*res['error'])}")
        out[res["name"]] = {c["name"]: c["value"] for c in res["configs"]}
    if as_json:
        output([], [], True, out)
        return
    for n in wanted:
        configs = out.get(n)
        if not configs:
            click.echo(f"The client metric resource {n} doesn't exist and doesn't have dynamic config.")
            continue
        click.echo(f"Client metrics configs for {n} are:")
        for k in CONFIGS:
            if k in configs:
                click.echo(f"  {k}={configs[k]}")


@client_metrics.command("alter")
@click.option("--name", default=None, help="The subscription to create or change.")
@click.option("--generate-name", is_flag=True, help="A new subscription with a generated name.")
@click.option("--metrics", "metrics", multiple=True, metavar="PREFIX[,PREFIX...]",
              help="Metric name prefixes to push ('*' = all); repeatable.")
@click.option("--interval", type=click.IntRange(100, 3600000), default=None,
              help="Push interval in ms.")
@click.option("--match", "match", multiple=True, metavar="SELECTOR=REGEX[,...]",
              help="Client selectors, all of which must match; repeatable.")
@connection_options
def alter_cmd(bootstrap, as_json, name, generate_name, metrics, interval, match) -> None:
    """Create or change a subscription (IncrementalAlterConfigs SET)."""
    from appliance.client.admin import CLIENT_METRICS, OP_SET
    if bool(name) == generate_name:
        raise click.UsageError("give exactly one of --name and --generate-name")
    name = name or str(uuid.uuid4())
    ops = []
    if metrics:
        ops.append((OP_SET, "metrics", ",".join(names(metrics))))
    if interval is not None:
        ops.append((OP_SET, "interval.ms", str(interval)))
    if match:
        ops.append((OP_SET, "match", ",".join(m.strip() for item in match
                                              for m in item.split(",") if m.strip())))
    if not ops:
        raise click.UsageError("give --metrics, --interval or --match")
    with admin_client(bootstrap) as a:
        (code, msg), = a.incremental_alter_configs([(CLIENT_METRICS, name, ops)])
    if code:
        fail(f"Error: client metrics {name}: {error_text(code, msg)}")
    if as_json:
        output([], [], True, {"name": name, "result": "ok"})
    else:
        click.echo(f"Altered client metrics config for {name}.")


@client_metrics.command("delete")
@click.option("--name", required=True, help="The subscription to delete.")
@connection_options
def delete_cmd(bootstrap, as_json, name) -> None:
    """Delete a subscription (IncrementalAlterConfigs DELETE of its configs)."""
    from appliance.client.admin import CLIENT_METRICS, OP_DELETE
    with admin_client(bootstrap) as a:
        (code, msg), = a.incremental_alter_configs(
            [(CLIENT_METRICS, name, [(OP_DELETE, k, None) for k in CONFIGS])])
    if code:
        fail(f"Error: client metrics {name}: {error_text(code, msg)}")
    if as_json:
        output([], [], True, {"name": name, "result": "ok"})
    else:
        click.echo(f"Deleted client metrics config for {name}.")
