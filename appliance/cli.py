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


def _default_bootstrap(cfg) -> str:
    """The first listener's advertised address (where a tool on this machine can connect)."""
    host, port = next(iter(cfg.advertised_endpoints().values()))
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@main.group()
@click.option("--bootstrap-server", default=None, metavar="HOST:PORT",
              help="The broker to ask (default: the first listener of the configuration).")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None)
@click.option("--command-config", default=None, type=click.Path(dir_okay=False),
              help="Kafka client properties for a secured listener (security.protocol, "
                   "sasl.mechanism, sasl.jaas.config, ssl.truststore.location ...).")
@click.pass_context
def transactions(ctx: click.Context, bootstrap_server: str | None, config: str | None,
                 command_config: str | None) -> None:
    """Inspect and resolve transactions (Kafka's kafka-transactions.sh, plus KIP-939's
    force-terminate)."""
    from .users import security_from
    if bootstrap_server is None:
        bootstrap_server = _default_bootstrap(_load(config))
    try:
        security = security_from(command_config)
    except (OSError, ValueError) as e:
        raise click.UsageError(f"--command-config: {e}") from None
    ctx.obj = (bootstrap_server, security)


def _admin(ctx: click.Context):
    from . import admin
    from .client.errors import KafkaError
    bootstrap, security = ctx.obj
    try:
        return admin, admin.connect(bootstrap, security=security)
    except KafkaError as e:
        click.echo(f"cannot reach {bootstrap}: {e}", err=True)
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


# -- users ------------------------------------------------------------------------------------------

def _where(fn):
    """Where the users live: a data dir (offline) or a broker (online)."""
    fn = click.option("--command-config", default=None, type=click.Path(dir_okay=False),
                      help="Online: Kafka client properties (security.protocol, sasl.mechanism, "
                           "sasl.jaas.config, ssl.truststore.location ...), as Kafka's tools.")(fn)
    fn = click.option("--bootstrap-server", default=None, metavar="HOST:PORT",
                      help="Online: change the users of this running broker over the Kafka "
                           "protocol (AlterUserScramCredentials).")(fn)
    fn = click.option("--data-dir", default=None, metavar="DIR",
                      help="Offline: the data dir (default: server.data_dir of --config).")(fn)
    fn = click.option("--config", "config", type=click.Path(dir_okay=False), default=None)(fn)
    return fn


def _users_run(config, data_dir, bootstrap_server, command_config, offline, online):
    """Run ``online(conn)`` with --bootstrap-server, else ``offline(data_dir)``; errors exit 1."""
    from . import users as u
    from .client.errors import KafkaError
    from .security.credentials import DataDirInUse
    try:
        if bootstrap_server:
            if data_dir:
                raise click.UsageError("--data-dir is for offline use; not with --bootstrap-server")
            try:
                security = u.security_from(command_config)
            except (OSError, ValueError) as e:
                raise click.UsageError(f"--command-config: {e}") from None
            conn = u.connect(bootstrap_server, security)
            try:
                return online(conn)
            finally:
                conn.close()
        if command_config:
            raise click.UsageError("--command-config needs --bootstrap-server")
        return offline(data_dir or _load(config).server.data_dir)
    except DataDirInUse as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KafkaError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


@main.group()
def users() -> None:
    """SCRAM users (SASL SCRAM-SHA-256/512 and PLAIN logins): offline in a data dir before the
    first start, or online with --bootstrap-server (Kafka's kafka-configs --alter
    --add-config SCRAM-...)."""


@users.command("add")
@click.argument("name")
@click.option("--mechanism", required=True, type=click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
@click.option("--iterations", type=click.IntRange(4096, 16384), default=4096, show_default=True)
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (else prompt).")
@_where
def users_add(name, mechanism, iterations, password_stdin, config, data_dir, bootstrap_server,
              command_config) -> None:
    """Add NAME, or replace its credential for this mechanism."""
    from . import users as u
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")
    _users_run(config, data_dir, bootstrap_server, command_config,
               lambda d: u.add_offline(d, name, mechanism, password, iterations),
               lambda c: u.add_online(c, name, mechanism, password, iterations))
    click.echo(f"user {name}: {mechanism} credential set ({iterations} iterations)")


@users.command("list")
@_where
def users_list(config, data_dir, bootstrap_server, command_config) -> None:
    """List users and their mechanisms (never a credential)."""
    from . import users as u
    rows = _users_run(config, data_dir, bootstrap_server, command_config, u.list_offline,
                      u.list_online)
    click.echo("USER\tMECHANISM\tITERATIONS")
    for name in sorted(rows):
        for mech, iterations in sorted(rows[name].items()):
            click.echo(f"{name}\t{mech}\t{iterations}")


@users.command("delete")
@click.argument("name")
@click.option("--mechanism", default=None, type=click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"]),
              help="Only this mechanism's credential (default: every one).")
@_where
def users_delete(name, mechanism, config, data_dir, bootstrap_server, command_config) -> None:
    """Delete NAME's credentials; its open connections stay until they close."""
    from . import users as u
    mechs = _users_run(config, data_dir, bootstrap_server, command_config,
                       lambda d: u.delete_offline(d, name, mechanism),
                       lambda c: u.delete_online(c, name, mechanism))
    click.echo(f"user {name}: deleted {', '.join(mechs)}")


if __name__ == "__main__":
    main()
