"""``appliance run``, ``check-config`` and ``metrics``: the broker itself and what it publishes.

Runs in the user's shell; ``run`` becomes the supervisor process.
"""

from __future__ import annotations

import os
import sys

import click

from appliance.cli import _load, _read_config, main
from appliance.config_print import dumps_toml
from appliance.runtime import LOG_FORMATS


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
    the configuration (the file, the environment, these flags) and the TLS certificate files,
    and applies what can change while running."""
    from appliance.supervisor import Supervisor
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
        from appliance.metrics.collector import NotRunning, render
        from appliance.runtime import RUNTIME_POINTER, run_dir_of
        cfg = _load(config, None, data_dir)
        pointer = os.path.join(cfg.server.data_dir, RUNTIME_POINTER)
        try:
            text = render(run_dir_of(cfg.server.data_dir)).decode()
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
