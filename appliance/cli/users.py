"""``appliance users``: SCRAM users (SASL SCRAM-SHA-256/512 and PLAIN logins), as Kafka's
``kafka-storage format --add-scram`` (offline, before the first start) and ``kafka-configs
--alter --add-config SCRAM-...`` (online) manage them.

Runs in the user's shell. Without ``--bootstrap-server`` it works offline on a data dir (the
``--data-dir``, else ``server.data_dir`` of ``--config``), refused while an appliance runs there;
with it, online over the Kafka protocol (AlterUserScramCredentials, DescribeUserScramCredentials),
with ``--command-config`` for a secured listener. What it does: ``appliance.cli.user_admin``.
"""

from __future__ import annotations

import sys

import click

from appliance.cli import _load, main

MECHANISMS = click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"])


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
    from appliance.cli import user_admin as u
    from appliance.client.errors import KafkaError
    from appliance.security.credentials import DamagedStore, DataDirInUse
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
    except (DataDirInUse, DamagedStore) as e:
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
@click.option("--mechanism", required=True, type=MECHANISMS)
@click.option("--iterations", type=click.IntRange(4096, 16384), default=4096, show_default=True)
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (else prompt).")
@_where
def users_add(name, mechanism, iterations, password_stdin, config, data_dir, bootstrap_server,
              command_config) -> None:
    """Add NAME, or replace its credential for this mechanism."""
    from appliance.cli import user_admin as u
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
    from appliance.cli import user_admin as u
    rows = _users_run(config, data_dir, bootstrap_server, command_config, u.list_offline,
                      u.list_online)
    click.echo("USER\tMECHANISM\tITERATIONS")
    for name in sorted(rows):
        for mech, iterations in sorted(rows[name].items()):
            click.echo(f"{name}\t{mech}\t{iterations}")


@users.command("delete")
@click.argument("name")
@click.option("--mechanism", default=None, type=MECHANISMS,
              help="Only this mechanism's credential (default: every one).")
@_where
def users_delete(name, mechanism, config, data_dir, bootstrap_server, command_config) -> None:
    """Delete NAME's credentials; its open connections stay until they close."""
    from appliance.cli import user_admin as u
    mechs = _users_run(config, data_dir, bootstrap_server, command_config,
                       lambda d: u.delete_offline(d, name, mechanism),
                       lambda c: u.delete_online(c, name, mechanism))
    click.echo(f"user {name}: deleted {', '.join(mechs)}")
