"""The ``appliance`` command line: the ``main`` group and what every command shares.

Runs in the user's shell (or under systemd). ``appliance run`` becomes the supervisor process.
One module per tool registers its commands on ``main`` (imported at the bottom of this file):
``serve`` (run, check-config, metrics), ``transactions`` (Kafka's kafka-transactions.sh),
``topics`` (kafka-topics.sh), ``groups`` (kafka-consumer-groups.sh), ``share_groups``
(kafka-share-groups.sh), ``configs``
(kafka-configs.sh), ``offsets`` (kafka-get-offsets.sh), ``dump_log`` (kafka-dump-log.sh) and
``console`` (the console producer and consumer), ``users`` (SCRAM users, offline or online),
``acls`` (kafka-acls.sh), ``client_metrics`` (kafka-client-metrics.sh), ``spark`` (recovery of
the Spark sink's dead jobs);
``tool`` holds what the Kafka tools share; ``user_admin`` is what ``users`` does (imported when
one of its commands runs; ``transactions``' is ``appliance.client.transaction_admin``, which the
Spark sink shares). A new tool is a new module here, with its import added below.
"""

from __future__ import annotations

import sys

import click

from appliance.config import ConfigError, load
from appliance.runtime import EXIT_CONFIG


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


# The tools: each module registers its commands on ``main``.
from appliance.cli import (acls, client_metrics, configs, console, dump_log, groups,  # noqa: E402,F401
                           offsets, serve, share_groups, spark, topics, transactions, users)
