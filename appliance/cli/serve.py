"""``appliance run``, ``check-config`` and ``metrics``: the broker itself and what it publishes.

Runs in the user's shell; ``run`` becomes the supervisor process.
"""

from __future__ import annotations

import sys
import time

import click

from appliance.cli import _load, main
from appliance.config import dumps_toml


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="TOML configuration file (defaults apply to every key it leaves out).")
@click.option("--listen", default=None, metavar="HOST:PORT", help="Overrides server.listen.")
@click.option("--data-dir", default=None, metavar="DIR", help="Overrides server.data_dir.")
def run(config: str | None, listen: str | None, data_dir: str | None) -> None:
    """Start the appliance (the supervisor and its workers) in the foreground."""
    from appliance.supervisor import Supervisor
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
    from appliance import metrics
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
