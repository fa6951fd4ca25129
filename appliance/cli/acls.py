"""``appliance acls``: Kafka's kafka-acls.sh (add, list, remove) over the Kafka protocol
(CreateAcls, DescribeAcls, DeleteAcls), so it works against a Kafka cluster too.

Runs in the user's shell; owns nothing but its connection. ``--bootstrap-server``,
``--command-config`` (a secured listener) and ``--config`` come before the command, as the other
tools take them (``appliance.cli.tool``). What it sends and prints: ``appliance.client.acl_admin``.
"""

from __future__ import annotations

import click

from appliance.cli.tool import protocol_connection, run_or_exit as _run, tool_group


@tool_group("acls", "Add, list and remove ACLs (Kafka's kafka-acls.sh, over the Kafka protocol).")
def acls() -> None:
    """Add, list and remove ACLs (Kafka's kafka-acls.sh, over the Kafka protocol)."""


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
    from appliance.client import acl_admin
    from appliance.acl import model
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
    from appliance.client import acl_admin
    from appliance.acl.model import AclBinding, AclFilter
    _, planned = _acl_plan(pattern, kw, specific=True)
    if any(not entries for entries in planned.values()):
        raise click.UsageError("You must specify one of: --allow-principal, --deny-principal when "
                               "trying to add ACLs.")
    conn = protocol_connection(ctx, "appliance-acls")
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
    from appliance.client import acl_admin
    from appliance.acl import model
    try:
        pt = model.parse_pattern_type(pattern)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    res = acl_admin.resources(kw["topics"], kw["groups"], kw["transactional_ids"], kw["cluster"], pt)
    conn = protocol_connection(ctx, "appliance-acls")
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
    from appliance.client import acl_admin
    from appliance.acl.model import AclFilter
    _, planned = _acl_plan(pattern, kw, specific=False)
    conn = protocol_connection(ctx, "appliance-acls")
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
