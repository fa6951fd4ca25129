"""``appliance get-offsets``: Kafka's kafka-get-offsets.sh (ListOffsets for every partition of
the topics asked: latest, earliest, max-timestamp or by time), with ``--isolation-level``, over
the Kafka protocol, so it works against a Kafka cluster too.

Runs in the user's shell; owns nothing but its admin client.
"""

from __future__ import annotations

import re

import click

from appliance.cli import main
from appliance.cli.tool import admin_client, connection_options, error_text, fail, output

TIMES = {"latest": -1, "-1": -1, "earliest": -2, "-2": -2, "max-timestamp": -3, "-3": -3}


def _parse_partitions(text: str | None) -> set[int] | None:
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
        except ValueError:
            raise click.BadParameter(f"{part!r}: partitions are numbers or ranges (0,2-4)",
                                     param_hint="--partitions") from None
    return out


@main.command("get-offsets")
@click.option("--topic", default=None, metavar="REGEX",
              help="Topics whose names match this regular expression (default: all).")
@click.option("--topic-partitions", default=None, metavar="T[:P],...",
              help="Comma-separated TOPIC or TOPIC:PARTITION items (exact names).")
@click.option("--partitions", default=None, metavar="0,2-4", help="Only these partitions.")
@click.option("--time", "time_spec", default="latest", show_default=True,
              help="latest (-1), earliest (-2), max-timestamp (-3), or a timestamp in ms: the first "
                   "offset whose timestamp is at or after it.")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True,
              help="read_committed: latest is the last stable offset (no open transaction below).")
@click.option("--exclude-internal-topics", is_flag=True)
@connection_options
def get_offsets(bootstrap, as_json, topic, topic_partitions, partitions, time_spec, isolation_level,
                exclude_internal_topics) -> None:
    """Print the offsets of partitions (Kafka's kafka-get-offsets.sh)."""
    if time_spec in TIMES:
        spec = TIMES[time_spec]
    else:
        try:
            spec = int(time_spec)
        except ValueError:
            raise click.BadParameter(f"{time_spec!r}", param_hint="--time") from None
        if spec < 0:
            raise click.BadParameter(f"{spec}: a timestamp is >= 0 (or -1, -2, -3)", param_hint="--time")
    try:
        pattern = re.compile(topic) if topic else None
    except re.error as e:
        raise click.BadParameter(f"{topic!r}: {e}", param_hint="--topic") from None
    only = _parse_partitions(partitions)
    explicit: dict[str, set[int] | None] = {}
    for item in (topic_partitions or "").split(","):
        if item.strip():
            t, sep, p = item.strip().partition(":")
            explicit.setdefault(t, set())
            if sep:
                explicit[t].add(int(p))
            else:
                explicit[t] = None
    with admin_client(bootstrap) as a:
        found = a.describe_topics(list(explicit) if explicit else None)
        tps = []
        for t in found:
            if t["error"][0]:
                if explicit:
                    fail(f"Error: topic {t['name']!r}: {error_text(*t['error'])}")
                continue
            if exclude_internal_topics and t["internal"]:
                continue
            if pattern is not None and not pattern.fullmatch(t["name"]):
                continue
            for p in t["partitions"]:
                want = explicit.get(t["name"]) if explicit else None
                if (only is None or p["partition"] in only) and (want is None or p["partition"] in want):
                    tps.append((t["name"], p["partition"]))
        if not tps:
            fail("Error: no topic partition matches" + (f" {topic!r}" if topic else ""))
        got = a.list_offsets({tp: spec for tp in tps},
                             isolation_level=1 if isolation_level == "read_committed" else 0)
    rows, failed = [], []
    for tp in sorted(got):
        code, off, ts = got[tp]
        if code:
            failed.append(f"Error: {tp[0]}-{tp[1]}: {error_text(code, None)}")
            continue
        rows.append({"topic": tp[0], "partition": tp[1], "offset": off if off >= 0 else None,
                     "timestamp": ts if spec not in (-1, -2) and ts >= 0 else None})
    cols = [("topic", "TOPIC"), ("partition", "PARTITION"), ("offset", "OFFSET")]
    if spec not in (-1, -2):
        cols.append(("timestamp", "TIMESTAMP"))
    output(rows, cols, as_json)
    if failed:
        fail("\n".join(failed))
