"""The ``appliance`` command line.

Runs in the user's shell (or under systemd). ``appliance run`` becomes the supervisor process.
"""

from __future__ import annotations

import sys
import time

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
@click.version_option(package_name="appliance", prog_name="appliance", message="%(prog)s %(version)s")
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
    now_ms = time.time() * 1000
    stale = []
    for source, values in found.items():
        age_s = (now_ms - values.get("updated_ms", 0)) / 1000
        if age_s > metrics.STALE_AFTER_S:
            stale.append(f"{source} (last written {age_s:.0f} s ago)")
        for name, value in sorted(values.items()):
            click.echo(f"{source}\t{name}\t{value}")
    if stale:
        # Workers rewrite their file every second: an old one is what a stopped appliance left.
        click.echo(f"stale: {', '.join(stale)}; is the appliance running?", err=True)
        sys.exit(1)


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


if __name__ == "__main__":
    main()
