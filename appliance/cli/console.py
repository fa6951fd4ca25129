"""``appliance produce`` and ``appliance consume``: Kafka's console producer and consumer, for the
quick check every operator does, over the Kafka protocol with the appliance's own client
(``appliance.client``), so they work against a Kafka cluster too.

Runs in the user's shell; owns one producer or one consumer. Lines, keys and headers follow
Kafka's console tools and their ``--property`` names (parse.key, key.separator, parse.headers,
headers.delimiter, headers.separator, headers.key.separator, null.marker; print.key,
print.headers, print.partition, print.offset, print.timestamp, print.value). The consumer reads
by assignment (every partition of the topic, or ``--partition``), never as a group member: the
appliance's client has no group membership, so ``--group`` is not offered.
"""

from __future__ import annotations

import json
import time

import click

from appliance.cli import main
from appliance.cli.tool import admin_client, connection_options, fail, kafka_errors

PRODUCER_DEFAULTS = {"parse.key": "false", "key.separator": "\t", "parse.headers": "false",
                     "headers.delimiter": "\t", "headers.separator": ",", "headers.key.separator": ":",
                     "null.marker": None}
CONSUMER_DEFAULTS = {"print.key": "false", "print.value": "true", "print.headers": "false",
                     "print.partition": "false", "print.offset": "false", "print.timestamp": "false",
                     "key.separator": "\t", "headers.separator": ",", "headers.key.separator": ":",
                     "null.literal": "null"}


def _properties(items, defaults: dict) -> dict:
    props = dict(defaults)
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--property")
        if k not in defaults:
            raise click.BadParameter(f"unknown property {k!r} (known: {', '.join(sorted(defaults))})",
                                     param_hint="--property")
        props[k] = v.encode().decode("unicode_escape")    # "\t" on a command line means a tab
    return props


def _flag(props: dict, name: str) -> bool:
    return str(props[name]).lower() == "true"


def parse_line(line: str, props: dict) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """(key, value, headers) of one input line, as Kafka's LineMessageReader splits it."""
    null = props["null.marker"]
    headers: list[tuple[str, bytes | None]] = []
    rest = line
    if _flag(props, "parse.headers"):
        raw, sep, rest = rest.partition(props["headers.delimiter"])
        if not sep:
            raise ValueError(f"no headers delimiter {props['headers.delimiter']!r} in {line!r}")
        for h in raw.split(props["headers.separator"]) if raw else []:
            k, ksep, v = h.partition(props["headers.key.separator"])
            if not ksep:
                raise ValueError(f"header {h!r} has no {props['headers.key.separator']!r}")
            headers.append((k, None if v == null else v.encode()))
    key = None
    if _flag(props, "parse.key"):
        k, sep, rest = rest.partition(props["key.separator"])
        if not sep:
            raise ValueError(f"no key separator {props['key.separator']!r} in {line!r}")
        key = None if k == null else k.encode()
    value = None if rest == null else rest.encode()
    return key, value, headers


@main.command("produce")
@click.option("--topic", required=True)
@click.option("--partition", type=int, default=None, help="Every record to this partition.")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="Kafka's line-reader properties: parse.key, key.separator, parse.headers, "
                   "headers.delimiter, headers.separator, headers.key.separator, null.marker.")
@click.option("--acks", type=click.Choice(["0", "1", "all", "-1"]), default="all", show_default=True)
@click.option("--compression-codec", type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
              default="none", show_default=True)
@click.option("--input", "input_file", type=click.File("r"), default="-",
              help="Read lines from this file (default: standard input).")
@connection_options
def produce(bootstrap, as_json, topic, partition, properties, acks, compression_codec, input_file) -> None:
    """Send each input line as one record (Kafka's console producer)."""
    from appliance.client import Producer
    props = _properties(properties, PRODUCER_DEFAULTS)
    sent = []
    with kafka_errors(bootstrap):
        p = Producer(bootstrap_servers=bootstrap.servers, **bootstrap.settings, acks=acks,
                     compression_type=compression_codec,
                     client_id="appliance-console-producer")
        try:
            for n, line in enumerate(input_file, 1):
                line = line.rstrip("\n")
                try:
                    key, value, headers = parse_line(line, props)
                except ValueError as e:
                    fail(f"Error: line {n}: {e}")
                sent.append(p.send(topic, value, key, partition=partition, headers=headers))
            p.flush()
        finally:
            p.close(flush=False)
    if as_json:
        for d in sent:
            click.echo(json.dumps({"topic": d.topic, "partition": d.partition, "offset": d.offset}))
    else:
        click.echo(f"{len(sent)} records produced to {topic}.", err=True)


def _text(b: bytes | None, null: str) -> str:
    return null if b is None else b.decode("utf-8", "backslashreplace")


@main.command("consume")
@click.option("--topic", required=True)
@click.option("--partition", type=int, default=None, help="Only this partition (default: all).")
@click.option("--offset", default=None, metavar="earliest|latest|N",
              help="With --partition: where to start.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset (default: the end).")
@click.option("--max-messages", type=int, default=None, help="Exit after this many records.")
@click.option("--timeout-ms", type=int, default=None,
              help="Exit when no record came for this long (default: wait forever).")
@click.option("--isolation-level", type=click.Choice(["read_uncommitted", "read_committed"]),
              default="read_uncommitted", show_default=True,
              help="read_committed: only committed transactions, up to the last stable offset.")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="Kafka's formatter properties: print.key, print.value, print.headers, "
                   "print.partition, print.offset, print.timestamp, key.separator, "
                   "headers.separator, headers.key.separator, null.literal.")
@connection_options
def consume(bootstrap, as_json, topic, partition, offset, from_beginning, max_messages, timeout_ms,
            isolation_level, properties) -> None:
    """Print records of a topic (Kafka's console consumer), reading by assignment."""
    from appliance.client import Consumer
    props = _properties(properties, CONSUMER_DEFAULTS)
    if offset is not None and partition is None:
        raise click.UsageError("--offset needs --partition")
    if offset is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning exclude each other")
    count = 0
    with admin_client(bootstrap) as a:
        parts = len(a.partitions_of(topic))      # UNKNOWN_TOPIC_OR_PARTITION at once, no waiting
    with kafka_errors(bootstrap):
        c = Consumer(bootstrap_servers=bootstrap.servers, **bootstrap.settings,
                     isolation_level=isolation_level,
                     allow_auto_create_topics=False, metadata_timeout_ms=15000,
                     client_id="appliance-console-consumer")
        try:
            tps = [(topic, partition)] if partition is not None else [(topic, p) for p in range(parts)]
            if partition is not None and not 0 <= partition < parts:
                fail(f"Error: topic {topic!r} has {parts} partitions, not partition {partition}")
            c.assign(tps)
            if offset not in (None, "earliest", "latest"):
                try:
                    c.seek(tps[0], int(offset))
                except ValueError:
                    raise click.BadParameter(f"{offset!r}", param_hint="--offset") from None
            elif from_beginning or offset == "earliest":
                c.seek_to_beginning()
            else:
                c.seek_to_end()
            last = time.monotonic()
            try:
                while max_messages is None or count < max_messages:
                    left = None if max_messages is None else max_messages - count
                    records = c.poll(500, max_records=left)
                    if records:
                        last = time.monotonic()
                    for r in records:
                        click.echo(_format(r, props, as_json))
                        count += 1
                    if not records and timeout_ms is not None and \
                            (time.monotonic() - last) * 1000 >= timeout_ms:
                        break
            except KeyboardInterrupt:
                pass                     # Ctrl-C ends it, as it ends Kafka's console consumer
        finally:
            c.close()
    click.echo(f"Processed a total of {count} messages", err=True)


def _format(r, props: dict, as_json: bool) -> str:
    null = props["null.literal"]
    if as_json:
        return json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                           "timestamp": r.timestamp,
                           "timestamp_type": "LogAppendTime" if r.timestamp_type else "CreateTime",
                           "key": None if r.key is None else _text(r.key, null),
                           "value": None if r.value is None else _text(r.value, null),
                           "headers": [[k, None if v is None else _text(v, null)] for k, v in r.headers]})
    sep = props["key.separator"]
    parts = []
    if _flag(props, "print.timestamp"):
        parts.append(f"{'LogAppendTime' if r.timestamp_type else 'CreateTime'}:{r.timestamp}")
    if _flag(props, "print.partition"):
        parts.append(f"Partition:{r.partition}")
    if _flag(props, "print.offset"):
        parts.append(f"Offset:{r.offset}")
    if _flag(props, "print.headers"):
        parts.append(props["headers.separator"].join(
            f"{k}{props['headers.key.separator']}{_text(v, null)}" for k, v in r.headers) or "NO_HEADERS")
    if _flag(props, "print.key"):
        parts.append(_text(r.key, null))
    if _flag(props, "print.value"):
        parts.append(_text(r.value, null))
    return sep.join(parts)

