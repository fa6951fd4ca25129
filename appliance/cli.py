"""The ``appliance`` command line.

Runs in the user's shell (or under systemd). ``appliance run`` becomes the supervisor process.
"""

from __future__ import annotations

import sys

import click

from .config import ConfigError, dumps_toml, load
from .runtime import EXIT_CONFIG


def _load(config: str | None, listen: str | None = None, data_dir: str | None = None):
    server: dict[str, str] = {}
    if listen:
        server["listen"] = listen
    if data_dir:
        server["data_dir"] = data_dir
    try:
        return load(config, overrides={"server": server} if server else None)
    except ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(EXIT_CONFIG)


@click.group()
def main() -> None:
    """A single-node broker appliance that speaks the Kafka protocol."""


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="TOML configuration file (defaults apply to every key it leaves out).")
@click.option("--listen", default=None, metavar="HOST:PORT", help="Overrides server.listen.")
@click.option("--data-dir", default=None, metavar="DIR", help="Overrides server.data_dir.")
def run(config: str | None, listen: str | None, data_dir: str | None) -> None:
    """Start the appliance (the supervisor and its workers) in the foreground."""
    from .supervisor import Supervisor
    cfg = _load(config, listen, data_dir)
    sys.exit(Supervisor(cfg).run())


@main.command("check-config")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None)
@click.option("--listen", default=None, metavar="HOST:PORT")
@click.option("--data-dir", default=None, metavar="DIR")
def check_config(config: str | None, listen: str | None, data_dir: str | None) -> None:
    """Print the effective configuration, or the error that makes it invalid."""
    cfg = _load(config, listen, data_dir)
    click.echo(dumps_toml(cfg), nl=False)


@main.command("metrics")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None)
@click.option("--data-dir", default=None, metavar="DIR")
def metrics_cmd(config: str | None, data_dir: str | None) -> None:
    """Print the metrics the running appliance's workers publish (<data_dir>/metrics/)."""
    from . import metrics
    cfg = _load(config, None, data_dir)
    found = metrics.read_all(cfg.server.data_dir)
    if not found:
        click.echo(f"no metrics published in {cfg.server.data_dir} (is the appliance running?)", err=True)
        sys.exit(1)
    for source, values in found.items():
        for name, value in sorted(values.items()):
            click.echo(f"{source}\t{name}\t{value}")


@main.group()
@click.option("--bootstrap-server", default=None, metavar="HOST:PORT",
              help="The broker to ask (default: server.listen of the configuration).")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None)
@click.pass_context
def transactions(ctx: click.Context, bootstrap_server: str | None, config: str | None) -> None:
    """Inspect and resolve transactions (Kafka's kafka-transactions.sh, plus KIP-939's
    force-terminate)."""
    if bootstrap_server is None:
        bootstrap_server = _load(config).server.listen
    ctx.obj = bootstrap_server


def _admin(ctx: click.Context):
    from . import admin
    from .client.errors import KafkaError
    try:
        return admin, admin.connect(ctx.obj)
    except KafkaError as e:
        click.echo(f"cannot reach {ctx.obj}: {e}", err=True)
        sys.exit(1)


def _run(fn):
    from .client.errors import KafkaError
    try:
        return fn()
    except KafkaError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


@transactions.command("list")
@click.option("--state", "states", multiple=True, help="Only transactions in this state (repeatable).")
@click.option("--producer-id", "producer_ids", multiple=True, type=int)
@click.option("--duration-ms", type=int, default=-1, help="Only transactions open longer than this.")
@click.option("--pattern", default=None, help="Regular expression the transactional id must match.")
@click.pass_context
def transactions_list(ctx, states, producer_ids, duration_ms, pattern) -> None:
    """List transactional ids and the state of their transactions."""
    admin, conn = _admin(ctx)
    rows = _run(lambda: admin.list_transactions(conn, list(states), list(producer_ids), duration_ms, pattern))
    click.echo("TransactionalId\tProducerId\tTransactionState")
    for r in sorted(rows, key=lambda r: r["transactional_id"]):
        click.echo(f"{r['transactional_id']}\t{r['producer_id']}\t{r['state']}")


@transactions.command("describe")
@click.option("--transactional-id", required=True)
@click.pass_context
def transactions_describe(ctx, transactional_id) -> None:
    """Describe one transactional id: producer, epoch, state, timeout, partitions."""
    admin, conn = _admin(ctx)
    d = _run(lambda: admin.describe_transaction(conn, transactional_id))
    parts = ",".join(f"{t}-{p}" for t, p in d["partitions"])
    click.echo("TransactionalId\tProducerId\tProducerEpoch\tTransactionState\tTransactionTimeoutMs\t"
               "CurrentTransactionStartTimeMs\tTopicPartitions")
    click.echo(f"{d['transactional_id']}\t{d['producer_id']}\t{d['producer_epoch']}\t{d['state']}\t"
               f"{d['timeout_ms']}\t{d['start_time_ms']}\t{parts}")


@transactions.command("abort")
@click.option("--topic", required=True)
@click.option("--partition", required=True, type=int)
@click.option("--start-offset", type=int, default=None,
              help="Find the producer by the first offset of its open transaction.")
@click.option("--producer-id", type=int, default=None)
@click.option("--producer-epoch", type=int, default=None)
@click.option("--coordinator-epoch", type=int, default=None)
@click.pass_context
def transactions_abort(ctx, topic, partition, start_offset, producer_id, producer_epoch, coordinator_epoch) -> None:
    """Abort a hanging transaction on one partition (writes an ABORT marker)."""
    admin, conn = _admin(ctx)
    if start_offset is not None:
        found = _run(lambda: admin.find_hanging(conn, topic, partition, start_offset))
        producer_id, producer_epoch = found["producer_id"], found["producer_epoch"]
        coordinator_epoch = max(found["coordinator_epoch"], 0)
    elif None in (producer_id, producer_epoch, coordinator_epoch):
        raise click.UsageError("give --start-offset, or all of --producer-id, --producer-epoch "
                               "and --coordinator-epoch")
    _run(lambda: admin.abort_transaction(conn, topic, partition, producer_id, producer_epoch, coordinator_epoch))
    click.echo(f"aborted the transaction of producer {producer_id} on {topic}-{partition}")


@transactions.command("force-terminate")
@click.option("--transactional-id", required=True)
@click.pass_context
def transactions_force_terminate(ctx, transactional_id) -> None:
    """Abort the open (even prepared, KIP-939) transaction of a transactional id and fence
    every producer using it."""
    admin, conn = _admin(ctx)
    pid, epoch = _run(lambda: admin.force_terminate(conn, transactional_id))
    click.echo(f"terminated: transactional id {transactional_id} is now producer {pid} epoch {epoch}")


# -- acls: kafka-acls.sh ------------------------------------------------------------------------------

@main.group()
@click.option("--bootstrap-server", default=None, metavar="HOST:PORT",
              help="The broker to ask (default: server.listen of the configuration).")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None)
@click.pass_context
def acls(ctx: click.Context, bootstrap_server: str | None, config: str | None) -> None:
    """Add, list and remove ACLs (Kafka's kafka-acls.sh, over the Kafka protocol)."""
    if bootstrap_server is None:
        bootstrap_server = _load(config).server.listen
    ctx.obj = bootstrap_server


def _resource_options(fn):
    for opt in reversed([
        click.option("--topic", "topics", multiple=True, help="Topic (repeatable; '*' is every topic)."),
        click.option("--group", "groups", multiple=True, help="Consumer group (repeatable)."),
        click.option("--transactional-id", "transactional_ids", multiple=True,
                     help="Transactional id (repeatable)."),
        click.option("--cluster", is_flag=True, help="The cluster resource."),
        click.option("--resource-pattern-type", "pattern", default="LITERAL", show_default=True,
                     help="LITERAL or PREFIXED; to list or remove also ANY or MATCH."),
    ]):
        fn = opt(fn)
    return fn


def _principal_options(fn):
    for opt in reversed([
        click.option("--allow-principal", "allow_principals", multiple=True, metavar="TYPE:NAME"),
        click.option("--deny-principal", "deny_principals", multiple=True, metavar="TYPE:NAME"),
        click.option("--allow-host", "allow_hosts", multiple=True,
                     help="Host the allowed principals may come from (default '*')."),
        click.option("--deny-host", "deny_hosts", multiple=True,
                     help="Host the denied principals are denied from (default '*')."),
        click.option("--operation", "operations", multiple=True,
                     help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                          "DescribeConfigs, AlterConfigs, IdempotentWrite, TwoPhaseCommit, All "
                          "(repeatable; default All)."),
        click.option("--producer", is_flag=True,
                     help="Write, Describe and Create on the topics (Write, Describe on the "
                          "transactional ids)."),
        click.option("--consumer", is_flag=True,
                     help="Read and Describe on the topics, Read on the groups."),
        click.option("--idempotent", is_flag=True, help="With --producer: IdempotentWrite on the cluster."),
    ]):
        fn = opt(fn)
    return fn


def _acl_plan(pattern: str, kw: dict, *, specific: bool):
    from .acl import admin as acl_admin
    from .acl import model
    try:
        pt = model.parse_pattern_type(pattern)
        if specific and pt not in (model.PatternType.LITERAL, model.PatternType.PREFIXED):
            raise acl_admin.UsageError(
                f"A '--resource-pattern-type' value of '{pattern}' is not valid when adding acls.")
        res = acl_admin.resources(kw["topics"], kw["groups"], kw["transactional_ids"],
                                  kw["cluster"], pt)
        ops = [model.parse_operation(o) for o in kw["operations"]] or [model.AclOperation.ALL]
        if (kw["producer"] or kw["consumer"]) and (kw["operations"] or kw["deny_principals"]):
            raise acl_admin.UsageError("--producer and --consumer take neither --operation nor "
                                       "--deny-principal")
        return res, acl_admin.plan(
            res, allow_principals=kw["allow_principals"], deny_principals=kw["deny_principals"],
            allow_hosts=kw["allow_hosts"], deny_hosts=kw["deny_hosts"], operations=ops,
            producer=kw["producer"], consumer=kw["consumer"], idempotent=kw["idempotent"])
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _print_acls(acl_admin, found) -> None:
    for (rtype, name, pattern), entries in acl_admin.grouped(found).items():
        click.echo(f"Current ACLs for resource `{acl_admin.resource_str(rtype, name, pattern)}`: ")
        for e in entries:
            click.echo(f" \t{acl_admin.entry_str(*e)} ")
        click.echo("")


@acls.command("add")
@_resource_options
@_principal_options
@click.pass_context
def acls_add(ctx, pattern, **kw) -> None:
    """Add ACLs: every principal x host x operation, on every resource named."""
    from .acl import admin as acl_admin
    from .acl.model import AclBinding, AclFilter
    _, planned = _acl_plan(pattern, kw, specific=True)
    if any(not entries for entries in planned.values()):
        raise click.UsageError("You must specify one of: --allow-principal, --deny-principal when "
                               "trying to add ACLs.")
    _, conn = _admin(ctx)
    for (rtype, name, pt), entries in planned.items():
        click.echo(f"Adding ACLs for resource `{acl_admin.resource_str(rtype, name, pt)}`: ")
        for e in sorted(entries):
            click.echo(f" \t{acl_admin.entry_str(*e)} ")
        click.echo("")
        bindings = [AclBinding(int(rtype), name, int(pt), p, h, op, perm)
                    for p, h, op, perm in sorted(entries)]
        _run(lambda: acl_admin.create_acls(conn, bindings))
    found = []
    for rtype, name, pt in planned:
        found += _run(lambda: acl_admin.describe_acls(conn, AclFilter(int(rtype), name, int(pt))))
    _print_acls(acl_admin, found)


@acls.command("list")
@_resource_options
@click.option("--principal", "principals", multiple=True, metavar="TYPE:NAME",
              help="Only the ACLs of this principal (repeatable).")
@click.pass_context
def acls_list(ctx, pattern, principals, **kw) -> None:
    """List ACLs: of the resources named, or all of them."""
    from .acl import admin as acl_admin
    from .acl import model
    try:
        pt = model.parse_pattern_type(pattern)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    res = acl_admin.resources(kw["topics"], kw["groups"], kw["transactional_ids"], kw["cluster"], pt)
    _, conn = _admin(ctx)
    filters = [model.AclFilter(int(t), n, int(p)) for t, n, p in res] or [model.AclFilter()]
    found = []
    for f in filters:
        found += _run(lambda: acl_admin.describe_acls(conn, f))
    if not principals:
        _print_acls(acl_admin, found)
        return
    for principal in principals:
        click.echo(f"ACLs for principal `{principal}`")
        _print_acls(acl_admin, [a for a in found if a.principal == principal])


@acls.command("remove")
@_resource_options
@_principal_options
@click.option("--force", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def acls_remove(ctx, pattern, force, **kw) -> None:
    """Remove ACLs: the ones given, or every ACL of the resources named when no principal is."""
    from .acl import admin as acl_admin
    from .acl.model import AclFilter
    _, planned = _acl_plan(pattern, kw, specific=False)
    _, conn = _admin(ctx)
    for (rtype, name, pt), entries in planned.items():
        where = acl_admin.resource_str(rtype, name, pt).replace("ResourcePattern", "ResourcePatternFilter")
        if entries:
            question = ("Are you sure you want to remove ACLs: \n"
                        + "\n".join(f" \t{acl_admin.entry_str(*e)} " for e in sorted(entries))
                        + f" \n from resource filter `{where}`?")
            filters = [AclFilter(int(rtype), name, int(pt), p, h, op, perm)
                       for p, h, op, perm in sorted(entries)]
        else:
            question = f"Are you sure you want to delete all ACLs for resource filter `{where}`?"
            filters = [AclFilter(int(rtype), name, int(pt))]
        if not force and not click.confirm(question):
            continue
        gone = _run(lambda: acl_admin.delete_acls(conn, filters))
        click.echo(f"Removed {len(gone)} ACLs from `{where}`")


if __name__ == "__main__":
    main()
