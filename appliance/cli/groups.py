"""``appliance groups``: Kafka's kafka-consumer-groups.sh (list, describe with members and lag
per partition, delete, reset-offsets) over the Kafka protocol, so it works against a Kafka cluster
too.

Runs in the user's shell; owns nothing but its admin client (``appliance.client.admin``).
Resetting offsets is Kafka's: a dry run unless ``--execute``, and only while the group has no
active member (its members would overwrite the new offsets with their next commit).
"""

from __future__ import annotations

import datetime

import click

from appliance.cli.tool import (admin_client, connection_options, error_text, fail, names, output,
                                tool_group)

INACTIVE = ("Empty", "Dead")
# kafka-consumer-groups.sh lists these (ListGroupsOptions.forConsumerGroups); share groups are
# ``appliance share-groups``'.
CONSUMER_TYPES = ("classic", "consumer")


@tool_group("groups", "List, describe, delete consumer groups and reset their offsets "
                      "(Kafka's kafka-consumer-groups.sh).")
def groups() -> None:
    pass


@groups.command("list")
@click.option("--state", "states", multiple=True,
              help="Only groups in this state (Stable, Empty, PreparingRebalance, "
                   "CompletingRebalance, Dead; repeatable or comma-separated).")
@connection_options
def groups_list(bootstrap, as_json, states) -> None:
    """List the consumer groups (with their protocol type, state and group type: classic or
    consumer, KIP-848)."""
    with admin_client(bootstrap) as a:
        found = a.list_groups(names(states), CONSUMER_TYPES)
    output(found, [("group", "GROUP"), ("protocol_type", "TYPE"), ("state", "STATE"),
                   ("group_type", "GROUP-TYPE")], as_json)


def _describe(a, group: str) -> dict:
    d = a.describe_group(group)
    if d["error"][0]:
        fail(f"Error: group {group!r}: {error_text(*d['error'])}")
    return d


def _lag_rows(a, group: str, d: dict) -> list[dict]:
    """One row per partition the group has a committed offset for or a member is assigned:
    committed offset, log end offset, lag, and the member that holds it."""
    from appliance.client.admin import LATEST
    committed = a.committed_offsets(group)
    owner = {}
    for m in d["members"]:
        for tp in m["assignment"]:
            owner[tp] = m
    tps = sorted(set(committed) | set(owner))
    ends = a.list_offsets({tp: LATEST for tp in tps}) if tps else {}
    rows = []
    for tp in tps:
        code, end, _ = ends.get(tp, (0, -1, -1))
        cur = committed.get(tp)
        m = owner.get(tp)
        rows.append({"group": group, "topic": tp[0], "partition": tp[1], "current_offset": cur,
                     "log_end_offset": end if code == 0 else None,
                     "lag": end - cur if cur is not None and code == 0 and end >= 0 else None,
                     "consumer_id": m["member_id"] if m else None, "host": m["host"] if m else None,
                     "client_id": m["client_id"] if m else None})
    return rows


@groups.command("describe")
@click.option("--group", "group_names", multiple=True, metavar="GROUP",
              help="Groups to describe (repeatable or comma-separated).")
@click.option("--all-groups", is_flag=True, help="Describe every group.")
@click.option("--members", "view", flag_value="members", help="The members and their partitions.")
@click.option("--state", "view", flag_value="state", help="Coordinator, strategy, state, member count.")
@click.option("--offsets", "view", flag_value="offsets", default=True,
              help="Committed offset, log end offset and lag per partition (the default).")
@click.option("--verbose", is_flag=True, help="With --members: each member's partitions.")
@connection_options
def groups_describe(bootstrap, as_json, group_names, all_groups, view, verbose) -> None:
    """Describe consumer groups: lag per partition (default), members or state."""
    with admin_client(bootstrap) as a:
        wanted = ([g["group"] for g in a.list_groups((), CONSUMER_TYPES)] if all_groups
                  else names(group_names))
        if not wanted:
            raise click.UsageError("give --group or --all-groups")
        rows = []
        for group in wanted:
            d = _describe(a, group)
            if d["state"] == "Dead":
                fail(f"Error: consumer group {group!r} does not exist.")
            if view == "state":
                # KIP-848 groups: their type and epochs (Kafka's --describe --state shows them)
                rows.append({"group": group, "type": d.get("type"), "coordinator": d["coordinator"],
                             "strategy": d["protocol"] or None, "state": d["state"],
                             "group_epoch": d.get("group_epoch"),
                             "assignment_epoch": d.get("assignment_epoch"),
                             "members": len(d["members"])})
            elif view == "members":
                if not d["members"] and not as_json:
                    click.echo(f"Consumer group {group!r} has no active members.", err=True)
                for m in d["members"]:
                    rows.append({"group": group, "consumer_id": m["member_id"], "instance_id": m["instance_id"],
                                 "host": m["host"], "client_id": m["client_id"],
                                 "member_epoch": m.get("member_epoch"),
                                 "partitions": len(m["assignment"]),
                                 "assignment": [f"{t}-{p}" for t, p in m["assignment"]]})
            else:
                if not d["members"] and not as_json:
                    click.echo(f"Consumer group {group!r} has no active members.", err=True)
                elif d["state"] in ("PreparingRebalance", "CompletingRebalance") and not as_json:
                    click.echo(f"Warning: consumer group {group!r} is rebalancing.", err=True)
                rows += _lag_rows(a, group, d)
    if view == "state":
        cols = [("group", "GROUP"), ("type", "TYPE"), ("coordinator", "COORDINATOR (ID)"),
                ("strategy", "ASSIGNMENT-STRATEGY"), ("state", "STATE"), ("group_epoch", "GROUP-EPOCH"),
                ("assignment_epoch", "TARGET-ASSIGNMENT-EPOCH"), ("members", "#MEMBERS")]
    elif view == "members":
        cols = [("group", "GROUP"), ("consumer_id", "CONSUMER-ID"), ("instance_id", "GROUP-INSTANCE-ID"),
                ("host", "HOST"), ("client_id", "CLIENT-ID"), ("member_epoch", "EPOCH"),
                ("partitions", "#PARTITIONS")]
        if verbose:
            cols.append(("assignment", "ASSIGNMENT"))
    else:
        cols = [("group", "GROUP"), ("topic", "TOPIC"), ("partition", "PARTITION"),
                ("current_offset", "CURRENT-OFFSET"), ("log_end_offset", "LOG-END-OFFSET"), ("lag", "LAG"),
                ("consumer_id", "CONSUMER-ID"), ("host", "HOST"), ("client_id", "CLIENT-ID")]
    output(rows, cols, as_json)


@groups.command("delete")
@click.option("--group", "group_names", multiple=True, required=True, metavar="GROUP",
              help="Groups to delete (repeatable or comma-separated); they must have no members.")
@connection_options
def groups_delete(bootstrap, as_json, group_names) -> None:
    """Delete consumer groups and their committed offsets."""
    wanted = names(group_names)
    with admin_client(bootstrap) as a:
        results = a.delete_groups(wanted)
    rows = [{"group": g, "result": "deleted" if results[g][0] == 0 else error_text(*results[g])}
            for g in wanted]
    failed = [r for r in rows if r["result"] != "deleted"]
    if as_json:
        output(rows, [], True)
    elif not failed:
        click.echo("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in wanted)
                   + ") was successful.")
    if failed:
        fail("\n".join(f"Error: group {r['group']!r} could not be deleted: {r['result']}" for r in failed))


def _parse_datetime(text: str) -> int:
    """Kafka's --to-datetime: YYYY-MM-DDTHH:mm:SS.sss, with an optional zone (Z, +hh:mm);
    without one, local time. Milliseconds since the epoch."""
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not YYYY-MM-DDTHH:mm:SS.sss[zone]",
                                 param_hint="--to-datetime") from None
    if t.tzinfo is None:
        t = t.astimezone()
    return int(t.timestamp() * 1000)


def _parse_scope(topics: tuple[str, ...]) -> list[tuple[str, list[int] | None]]:
    out = []
    for item in topics:
        topic, sep, parts = item.partition(":")
        if not topic:
            raise click.BadParameter(f"{item!r} names no topic", param_hint="--topic")
        try:
            out.append((topic, [int(p) for p in parts.split(",") if p.strip()] if sep else None))
        except ValueError:
            raise click.BadParameter(f"{item!r}: partitions must be numbers (TOPIC:0,1)",
                                     param_hint="--topic") from None
    return out


@groups.command("reset-offsets")
@click.option("--group", required=True)
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P,P...]",
              help="A topic, or some of its partitions (repeatable).")
@click.option("--all-topics", is_flag=True, help="Every topic the group has committed offsets for.")
@click.option("--to-earliest", "to", flag_value="earliest", help="To the log start offset.")
@click.option("--to-latest", "to", flag_value="latest", help="To the log end offset.")
@click.option("--to-current", "to", flag_value="current", help="To the committed offset.")
@click.option("--to-offset", type=int, default=None, help="To this offset (kept within the log).")
@click.option("--shift-by", type=int, default=None, help="Move the committed offset by N (may be negative).")
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:mm:SS.sss",
              help="To the first offset whose timestamp is at or after this time.")
@click.option("--execute", is_flag=True, help="Commit the new offsets (default: a dry run).")
@click.option("--dry-run", is_flag=True, help="Only show the new offsets (the default).")
@connection_options
def groups_reset_offsets(bootstrap, as_json, group, topics, all_topics, to, to_offset, shift_by,
                         to_datetime, execute, dry_run) -> None:
    """Reset a group's committed offsets (a dry run unless --execute; the group must have no
    active members)."""
    from appliance.client.admin import EARLIEST, LATEST
    chosen = [x for x in (to, to_offset is not None and "offset", shift_by is not None and "shift",
                          to_datetime is not None and "datetime") if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-current, "
                               "--to-offset, --shift-by, --to-datetime")
    if bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    if execute and dry_run:
        raise click.UsageError("--execute and --dry-run exclude each other")
    how = chosen[0]
    with admin_client(bootstrap) as a:
        d = _describe(a, group)
        if execute and d["state"] not in INACTIVE:
            fail(f"Error: Assignments can only be reset if the group '{group}' is inactive, but the "
                 f"current state is {d['state']}.")
        committed = a.committed_offsets(group)
        if all_topics:
            tps = sorted(committed)
        else:
            tps = []
            for topic, parts in _parse_scope(topics):
                tps += [(topic, p) for p in (parts if parts is not None else a.partitions_of(topic))]
        if not tps:
            fail(f"Error: no partitions to reset for group {group!r}")
        earliest = a.list_offsets({tp: EARLIEST for tp in tps})
        latest = a.list_offsets({tp: LATEST for tp in tps})
        for tp in tps:
            for spec in (earliest, latest):
                if spec[tp][0]:
                    fail(f"Error: {tp[0]}-{tp[1]}: {error_text(spec[tp][0], None)}")

        def clamp(tp, off):
            return max(earliest[tp][1], min(latest[tp][1], off))
        new = {}
        if how == "datetime":
            at = a.list_offsets({tp: _parse_datetime(to_datetime) for tp in tps})
        for tp in tps:
            if how == "earliest":
                new[tp] = earliest[tp][1]
            elif how == "latest":
                new[tp] = latest[tp][1]
            elif how in ("current", "shift"):
                if tp not in committed:
                    fail(f"Error: group {group!r} has no committed offset for {tp[0]}-{tp[1]}")
                new[tp] = clamp(tp, committed[tp] + (shift_by if how == "shift" else 0))
            elif how == "offset":
                new[tp] = clamp(tp, to_offset)
            else:
                code, off, _ = at[tp]
                if code:
                    fail(f"Error: {tp[0]}-{tp[1]}: {error_text(code, None)}")
                new[tp] = off if off >= 0 else latest[tp][1]
        if execute:
            errors = a.commit_offsets(group, new)
            bad = {tp: c for tp, c in errors.items() if c}
            if bad:
                fail("\n".join(f"Error: {t}-{p}: {error_text(c, None)}" for (t, p), c in sorted(bad.items())))
    if not execute and not as_json:
        click.echo("Dry run: nothing committed (add --execute to commit these offsets).", err=True)
    rows = [{"group": group, "topic": t, "partition": p, "new_offset": off} for (t, p), off in sorted(new.items())]
    output(rows, [("group", "GROUP"), ("topic", "TOPIC"), ("partition", "PARTITION"),
                  ("new_offset", "NEW-OFFSET")], as_json,
           json_value={"executed": execute, "offsets": rows})
