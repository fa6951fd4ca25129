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


if __name__ == "__main__":
    main()
