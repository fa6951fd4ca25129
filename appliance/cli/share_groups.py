"""``appliance share-groups``: Kafka's kafka-share-groups.sh (KIP-932) over the Kafka protocol:
list, describe (start offset and lag per share partition, members, state), reset-offsets,
delete-offsets, delete. Works against a Kafka 4.x cluster too.

Runs in the user's shell; owns nothing but its admin client (``appliance.client.admin``). As
Kafka's tool: resetting is a dry run unless ``--execute``, and resetting or deleting offsets, like
deleting the group, needs a group without members (the broker answers NON_EMPTY_GROUP otherwise).
"""

from __future__ import annotations

import click

from appliance.cli.groups import _parse_datetime, _parse_scope
from appliance.cli.tool import (admin_client, connection_options, error_text, fail, names, output,
                                tool_group)

SHARE = ("share",)


@tool_group("share-groups", "List, describe, delete share groups and reset their offsets "
                            "(Kafka's kafka-share-groups.sh).")
def share_groups() -> None:
    pass


@share_groups.command("list")
@click.option("--state", "states", multiple=True,
              help="Only groups in this state (Stable, Empty; repeatable or comma-separated).")
@connection_options
def share_list(bootstrap, as_json, states) -> None:
    """List the share groups and their states."""
    with admin_client(bootstrap) as a:
        found = a.list_groups(names(states), SHARE)
    output(found, [("group", "GROUP"), ("state", "STATE")], as_json)


def _described(a, group: str) -> dict:
    d = a.describe_share_group(group)
    if d["error"][0]:
        fail(f"Error: share group {group!r}: {error_text(*d['error'])}")
    return d


@share_groups.command("describe")
@click.option("--group", "group_names", multiple=True, metavar="GROUP",
              help="Groups to describe (repeatable or comma-separated).")
@click.option("--all-groups", is_flag=True, help="Describe every share group.")
@click.option("--members", "view", flag_value="members", help="The members and their partitions.")
@click.option("--state", "view", flag_value="state", help="Coordinator, state, epochs, member count.")
@click.option("--offsets", "view", flag_value="offsets", default=True,
              help="Start offset and lag per share partition (the default).")
@click.option("--verbose", is_flag=True, help="With --members: each member's partitions.")
@connection_options
def share_describe(bootstrap, as_json, group_names, all_groups, view, verbose) -> None:
    """Describe share groups: start offset and lag per partition (default), members or state."""
    with admin_client(bootstrap) as a:
        wanted = ([g["group"] for g in a.list_groups((), SHARE)] if all_groups
                  else names(group_names))
        if not wanted:
            raise click.UsageError("give --group or --all-groups")
        rows = []
        for group in wanted:
            d = _described(a, group)
            if view == "state":
                rows.append({"group": group, "coordinator": d["coordinator"], "state": d["state"],
                             "group_epoch": d["group_epoch"],
                             "assignment_epoch": d["assignment_epoch"],
                             "members": len(d["members"])})
            elif view == "members":
                if not d["members"] and not as_json:
                    click.echo(f"Share group {group!r} has no active members.", err=True)
                for m in d["members"]:
                    rows.append({"group": group, "consumer_id": m["member_id"], "host": m["host"],
                                 "client_id": m["client_id"], "member_epoch": m["member_epoch"],
                                 "partitions": len(m["assignment"]),
                                 "assignment": [f"{t}-{p}" for t, p in m["assignment"]]})
            else:
                if not d["members"] and not as_json:
                    click.echo(f"Share group {group!r} has no active members.", err=True)
                for (t, p), (start, lag) in sorted(a.share_offsets(group).items()):
                    rows.append({"group": group, "topic": t, "partition": p,
                                 "start_offset": start, "lag": lag})
    if view == "state":
        cols = [("group", "GROUP"), ("coordinator", "COORDINATOR (ID)"), ("state", "STATE"),
                ("group_epoch", "GROUP-EPOCH"), ("assignment_epoch", "ASSIGNMENT-EPOCH"),
                ("members", "#MEMBERS")]
    elif view == "members":
        cols = [("group", "GROUP"), ("consumer_id", "CONSUMER-ID"), ("host", "HOST"),
                ("client_id", "CLIENT-ID"), ("member_epoch", "MEMBER-EPOCH"),
                ("partitions", "#PARTITIONS")]
        if verbose:
            cols.append(("assignment", "ASSIGNMENT"))
    else:
        cols = [("group", "GROUP"), ("topic", "TOPIC"), ("partition", "PARTITION"),
                ("start_offset", "START-OFFSET"), ("lag", "LAG")]
    output(rows, cols, as_json)


@share_groups.command("reset-offsets")
@click.option("--group", required=True)
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P...]",
              help="A topic, or some of its partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every topic the group has share state for.")
@click.option("--to-earliest", "to", flag_value="earliest", help="To the log start offset.")
@click.option("--to-latest", "to", flag_value="latest", help="To the log end offset.")
@click.option("--to-offset", type=int, default=None, help="To this offset (kept within the log).")
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS.sss",
              help="To the first offset whose timestamp is at or after this time.")
@click.option("--execute", is_flag=True, help="Set the new start offsets (default: a dry run).")
@click.option("--dry-run", is_flag=True, help="Only show the new start offsets (the default).")
@connection_options
def share_reset_offsets(bootstrap, as_json, group, topics, all_topics, to, to_offset, to_datetime,
                        execute, dry_run) -> None:
    """Reset a share group's start offsets (a dry run unless --execute; the group must have no
    members)."""
    from appliance.client.admin import EARLIEST, LATEST
    chosen = [x for x in (to, to_offset is not None and "offset",
                          to_datetime is not None and "datetime") if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                               "--to-datetime")
    if bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    if execute and dry_run:
        raise click.UsageError("--execute and --dry-run exclude each other")
    how = chosen[0]
    with admin_client(bootstrap) as a:
        d = _described(a, group)
        if execute and d["members"]:
            fail(f"Error: Share group '{group}' is not empty.")
        if all_topics:
            tps = sorted(a.share_offsets(group))
        else:
            tps = []
            for topic, parts in _parse_scope(topics):
                tps += [(topic, p) for p in (parts if parts is not None else a.partitions_of(topic))]
        if not tps:
            fail(f"Error: no partitions to reset for share group {group!r}")
        earliest = a.list_offsets({tp: EARLIEST for tp in tps})
        latest = a.list_offsets({tp: LATEST for tp in tps})
        for tp in tps:
            for spec in (earliest, latest):
                if spec[tp][0]:
                    fail(f"Error: {tp[0]}-{tp[1]}: {error_text(spec[tp][0], None)}")
        at = a.list_offsets({tp: _parse_datetime(to_datetime) for tp in tps}) \
            if how == "datetime" else {}
        new = {}
        for tp in tps:
            if how == "earliest":
                new[tp] = earliest[tp][1]
            elif how == "latest":
                new[tp] = latest[tp][1]
            elif how == "offset":
                new[tp] = max(earliest[tp][1], min(latest[tp][1], to_offset))
            else:
                code, off, _ = at[tp]
                if code:
                    fail(f"Error: {tp[0]}-{tp[1]}: {error_text(code, None)}")
                new[tp] = off if off >= 0 else latest[tp][1]
        if execute:
            bad = {tp: r for tp, r in a.alter_share_offsets(group, new).items() if r[0]}
            if bad:
                fail("\n".join(f"Error: {t}-{p}: {error_text(*r)}" for (t, p), r in sorted(bad.items())))
    if not execute and not as_json:
        click.echo("Dry run: nothing changed (add --execute to set these offsets).", err=True)
    rows = [{"group": group, "topic": t, "partition": p, "new_offset": off}
            for (t, p), off in sorted(new.items())]
    output(rows, [("group", "GROUP"), ("topic", "TOPIC"), ("partition", "PARTITION"),
                  ("new_offset", "NEW-OFFSET")], as_json,
           json_value={"executed": execute, "offsets": rows})


@share_groups.command("delete-offsets")
@click.option("--group", required=True)
@click.option("--topic", "topics", multiple=True, required=True,
              help="Topics whose share state goes (repeatable or comma-separated).")
@connection_options
def share_delete_offsets(bootstrap, as_json, group, topics) -> None:
    """Delete a share group's state for topics (the group must have no members)."""
    wanted = names(topics)
    with admin_client(bootstrap) as a:
        results = a.delete_share_offsets(group, wanted)
    rows = [{"group": group, "topic": t,
             "result": "deleted" if results.get(t, (0, None))[0] == 0 else error_text(*results[t])}
            for t in wanted]
    output(rows, [("group", "GROUP"), ("topic", "TOPIC"), ("result", "STATUS")], as_json)
    failed = [r for r in rows if r["result"] != "deleted"]
    if failed:
        fail("\n".join(f"Error: {r['topic']}: {r['result']}" for r in failed))


@share_groups.command("delete")
@click.option("--group", "group_names", multiple=True, required=True, metavar="GROUP",
              help="Share groups to delete (repeatable or comma-separated); they must have no members.")
@connection_options
def share_delete(bootstrap, as_json, group_names) -> None:
    """Delete share groups and their share state."""
    wanted = names(group_names)
    with admin_client(bootstrap) as a:
        results = a.delete_groups(wanted)
    rows = [{"group": g, "result": "deleted" if results[g][0] == 0 else error_text(*results[g])}
            for g in wanted]
    failed = [r for r in rows if r["result"] != "deleted"]
    if as_json:
        output(rows, [], True)
    elif not failed:
        click.echo("Deletion of requested share groups (" + ", ".join(f"'{g}'" for g in wanted)
                   + ") was successful.")
    if failed:
        fail("\n".join(f"Error: share group {r['group']!r} could not be deleted: {r['result']}"
                       for r in failed))
