"""The ``appliance`` command line.

Runs in the user's shell (or under systemd). ``appliance run`` becomes the supervisor process.
"""

from __future__ import annotations

import os
import sys

import click

from .config import ConfigError, dumps_toml, load
from .runtime import EXIT_CONFIG, LOG_FORMATS


def _load(config: str | None, listen: str | None = None, data_dir: str | None = None):
    try:
        return _read_config(config, listen, data_dir)
    except ConfigError as e:
        click.echo(str(e), err=True)
        sys.exit(EXIT_CONFIG)


def _read_config(config: str | None, listen: str | None, data_dir: str | None):
    """The file, the environment, then the flags (also what a SIGHUP reload re-reads)."""
    server: dict[str, str] = {}
    if listen:
        server["listen"] = listen
    if data_dir:
        server["data_dir"] = data_dir
    return load(config, overrides={"server": server} if server else None)


@click.group()
@click.version_option(package_name="appliance", prog_name="appliance", message="%(prog)s %(version)s")
def main() -> None:
    """A single-node broker appliance that speaks the Kafka protocol."""


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="TOML configuration file (defaults apply to every key it leaves out).")
@click.option("--listen", default=None, metavar="HOST:PORT", help="Overrides server.listen.")
@click.option("--data-dir", default=None, metavar="DIR", help="Overrides server.data_dir.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              help="json: one JSON object per line (time, level, role, process, pid, logger, "
                   "message), for log shippers.")
def run(config: str | None, listen: str | None, data_dir: str | None, log_format: str) -> None:
    """Start the appliance (the supervisor and its workers) in the foreground. SIGHUP re-reads
    the configuration (the file, the environment, these flags) and applies what can change
    while running."""
    from .supervisor import Supervisor
    cfg = _load(config, listen, data_dir)
    sys.exit(Supervisor(cfg, source=lambda: _read_config(config, listen, data_dir),
                        log_format=log_format).run())


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
@click.option("--url", default=None, metavar="URL",
              help="Scrape this endpoint (e.g. http://127.0.0.1:9404/metrics) instead of reading "
                   "the running appliance's runtime directory.")
@click.argument("patterns", nargs=-1)
def metrics_cmd(config: str | None, data_dir: str | None, url: str | None, patterns) -> None:
    """Print what a Prometheus scrape of the running appliance shows (its text format): only
    the lines that contain one of PATTERNS, when given."""
    if url:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError) as e:
            click.echo(f"cannot scrape {url}: {e}", err=True)
            sys.exit(1)
    else:
        from .metrics.collector import NotRunning, render
        from .runtime import RUNTIME_POINTER
        cfg = _load(config, None, data_dir)
        pointer = os.path.join(cfg.server.data_dir, RUNTIME_POINTER)
        try:
            with open(pointer) as f:
                run_dir = f.read().strip()
            text = render(run_dir).decode()
        except FileNotFoundError:
            click.echo(f"no appliance runs on {cfg.server.data_dir} ({pointer} is missing)",
                       err=True)
            sys.exit(1)
        except NotRunning as e:
            click.echo(f"stale: {e}; is the appliance running?", err=True)
            sys.exit(1)
    for line in text.splitlines():
        if not patterns or any(p in line for p in patterns):
            click.echo(line)


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
