"""``appliance topics``: Kafka's kafka-topics.sh (create, list, describe, delete, alter) over the
Kafka protocol, so it works against a Kafka cluster too.

Runs in the user's shell; owns nothing but its admin client (``appliance.client.admin``).
"""

from __future__ import annotations

import click

from appliance.cli.tool import (admin_client, connection_options, error_text, fail, names, output,
                                parse_configs, table, tool_group)

SINGLE_NODE_FILTERS = {
    "under_replicated": "under-replicated",
    "under_min_isr": "under min ISR",
    "at_min_isr": "at min ISR",
    "unavailable": "unavailable",
}


@tool_group("topics", "Create, list, describe, delete and alter topics (Kafka's kafka-topics.sh).")
def topics() -> None:
    pass


@topics.command("list")
@click.option("--exclude-internal", is_flag=True, help="Leave out internal topics.")
@connection_options
def topics_list(bootstrap, as_json, exclude_internal) -> None:
    """List the topics' names."""
    with admin_client(bootstrap) as a:
        found = a.list_topics(include_internal=not exclude_internal)
    if as_json:
        output([], [], True, json_value=found)
    else:
        for n in found:
            click.echo(n)


@topics.command("describe")
@click.option("--topic", "topic_names", multiple=True, metavar="NAME",
              help="Topics to describe (repeatable or comma-separated; default: all).")
@click.option("--exclude-internal", is_flag=True)
@click.option("--under-replicated-partitions", "--under-replicated", "under_replicated", is_flag=True,
              help="Only partitions whose ISR is smaller than their replica set: never, on one node.")
@click.option("--under-min-isr-partitions", "under_min_isr", is_flag=True,
              help="Only partitions whose ISR is below min.insync.replicas: never, on one node.")
@click.option("--at-min-isr-partitions", "at_min_isr", is_flag=True,
              help="Only partitions whose ISR equals min.insync.replicas (1): every one, on one node.")
@click.option("--unavailable-partitions", "unavailable", is_flag=True,
              help="Only partitions without a leader.")
@connection_options
def topics_describe(bootstrap, as_json, topic_names, exclude_internal, under_replicated, under_min_isr,
                    at_min_isr, unavailable) -> None:
    """Describe topics: id, partition count, replication, configs set on the topic, and each
    partition's leader, replicas and ISR."""
    from appliance.client.admin import TOPIC
    wanted = names(topic_names) or None
    with admin_client(bootstrap) as a:
        found = a.describe_topics(wanted)
        for t in found:
            if t["error"][0] != 0:
                fail(f"Error: topic {t['name']!r}: {error_text(*t['error'])}")
        found = [t for t in found if not (exclude_internal and t["internal"])]
        configs = {}
        if found:
            for res in a.describe_configs([(TOPIC, t["name"]) for t in found]):
                configs[res["name"]] = {c["name"]: c["value"] for c in res["configs"]
                                        if c["source"] == "DYNAMIC_TOPIC_CONFIG"}
    filters = [flag for flag, on in (("under_replicated", under_replicated), ("under_min_isr", under_min_isr),
                                     ("at_min_isr", at_min_isr), ("unavailable", unavailable)) if on]

    def keep(p) -> bool:
        if not filters:
            return True
        isr, replicas = len(p["isr"]), len(p["replicas"])
        return (("under_replicated" in filters and isr < replicas)
                or ("under_min_isr" in filters and isr < 1)
                or ("at_min_isr" in filters and isr == 1)
                or ("unavailable" in filters and p["leader"] < 0))
    for f in filters:
        if f in ("under_replicated", "under_min_isr"):
            click.echo(f"note: --{f.replace('_', '-')}-partitions is accepted, but on a single node no "
                       f"partition is ever {SINGLE_NODE_FILTERS[f]} (one replica, always in the ISR)",
                       err=True)
    rows_t, rows_p, out = [], [], []
    for t in found:
        parts = [p for p in t["partitions"] if keep(p)]
        rf = len(t["partitions"][0]["replicas"]) if t["partitions"] else 0
        cfg = configs.get(t["name"], {})
        out.append({**t, "replication_factor": rf, "configs": cfg, "partitions": parts,
                    "error": None})
        if filters and not parts:
            continue
        rows_t.append({"topic": t["name"], "id": t["topic_id"], "n": len(t["partitions"]), "rf": rf,
                       "configs": ",".join(f"{k}={v}" for k, v in sorted(cfg.items())) or "-"})
        rows_p += [{"topic": t["name"], **p} for p in parts]
    if as_json:
        output([], [], True, json_value=out)
        return
    if not filters:
        table(rows_t, [("topic", "TOPIC"), ("id", "TOPIC-ID"), ("n", "PARTITIONS"),
                       ("rf", "REPLICATION-FACTOR"), ("configs", "CONFIGS")])
        click.echo()
    if rows_p or not filters:
        table(rows_p, [("topic", "TOPIC"), ("partition", "PARTITION"), ("leader", "LEADER"),
                       ("replicas", "REPLICAS"), ("isr", "ISR")])


@topics.command("create")
@click.option("--topic", required=True, help="The topic to create.")
@click.option("--partitions", type=int, default=-1, help="Partition count (default: the broker's).")
@click.option("--replication-factor", type=int, default=-1,
              help="Replicas per partition (default: the broker's; the appliance has one node, so 1).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="A topic config (repeatable).")
@click.option("--if-not-exists", is_flag=True, help="No error if the topic exists.")
@click.option("--validate-only", is_flag=True, help="Check the request; create nothing.")
@connection_options
def topics_create(bootstrap, as_json, topic, partitions, replication_factor, configs, if_not_exists,
                  validate_only) -> None:
    """Create a topic."""
    cfg = parse_configs(configs)
    with admin_client(bootstrap) as a:
        code, msg = a.create_topics([{"name": topic, "partitions": partitions,
                                      "replication_factor": replication_factor, "configs": cfg}],
                                    validate_only=validate_only)[topic]
    if code == 36 and if_not_exists:                 # TOPIC_ALREADY_EXISTS
        code, msg = 0, None
    _done(as_json, topic, code, msg, "validated" if validate_only else "created",
          f"{'Validated' if validate_only else 'Created'} topic {topic}.")


@topics.command("delete")
@click.option("--topic", "topic_names", multiple=True, required=True, metavar="NAME",
              help="Topics to delete (repeatable or comma-separated).")
@click.option("--if-exists", is_flag=True, help="No error for a topic that does not exist.")
@connection_options
def topics_delete(bootstrap, as_json, topic_names, if_exists) -> None:
    """Delete topics and their data."""
    wanted = names(topic_names)
    with admin_client(bootstrap) as a:
        results = a.delete_topics(wanted)
    rows, failed = [], []
    for name in wanted:
        code, msg = results.get(name, (0, None))
        if code == 3 and if_exists:                  # UNKNOWN_TOPIC_OR_PARTITION
            rows.append({"topic": name, "result": "absent"})
            continue
        rows.append({"topic": name, "result": "deleted" if code == 0 else error_text(code, msg)})
        if code:
            failed.append(f"Error: topic {name!r}: {error_text(code, msg)}")
    if as_json:
        output(rows, [], True)
    else:
        for r in rows:
            if r["result"] == "deleted":
                click.echo(f"Deleted topic {r['topic']}.")
    if failed:
        fail("\n".join(failed))


@topics.command("alter")
@click.option("--topic", required=True)
@click.option("--partitions", type=int, default=None, help="The new partition count (only grows).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE",
              help="Set a topic config (repeatable); kafka-configs.sh's job in Kafka 4, kept here "
                   "for convenience.")
@click.option("--delete-config", "delete_configs", multiple=True, metavar="KEY",
              help="Remove a topic config override (repeatable).")
@click.option("--validate-only", is_flag=True)
@connection_options
def topics_alter(bootstrap, as_json, topic, partitions, configs, delete_configs, validate_only) -> None:
    """Grow a topic's partitions (CreatePartitions) and change its configs
    (IncrementalAlterConfigs)."""
    from appliance.client.admin import OP_DELETE, OP_SET, TOPIC
    if partitions is None and not configs and not delete_configs:
        raise click.UsageError("give --partitions, --config or --delete-config")
    cfg = parse_configs(configs)
    done = []
    with admin_client(bootstrap) as a:
        if partitions is not None:
            code, msg = a.create_partitions({topic: partitions}, validate_only=validate_only)[topic]
            if code:
                fail(f"Error: topic {topic!r}: {error_text(code, msg)}")
            done.append(f"partitions={partitions}")
        ops = [(OP_SET, k, v) for k, v in cfg.items()] + [(OP_DELETE, k, None) for k in names(delete_configs)]
        if ops:
            (code, msg), = a.incremental_alter_configs([(TOPIC, topic, ops)], validate_only=validate_only)
            if code:
                fail(f"Error: topic {topic!r}: {error_text(code, msg)}")
            done.append("configs")
    _done(as_json, topic, 0, None, "validated" if validate_only else "altered",
          f"{'Validated' if validate_only else 'Altered'} topic {topic}: {', '.join(done)}.")


def _done(as_json: bool, topic: str, code: int, msg: str | None, what: str, text: str) -> None:
    if code:
        if as_json:
            output([], [], True, json_value={"topic": topic, "error": error_text(code, msg)})
        fail(f"Error: topic {topic!r}: {error_text(code, msg)}")
    if as_json:
        output([], [], True, json_value={"topic": topic, "result": what})
    else:
        click.echo(text)
