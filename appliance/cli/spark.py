"""``appliance spark recover``: resolve what dead Spark write jobs of the appliance sink
(``appliance.spark``) left behind: roll forward the jobs whose commit was decided, roll back the
others, as every write does by itself for its own prefix (``appliance.spark.jobs``).

Runs in the user's shell; owns nothing but its connections (the job log ``__spark_sink_jobs``,
admin connections, the transactional producers that take prepared transactions over).
``--bootstrap-server`` and ``--command-config`` (a secured listener) may be given to the group or
to the command, ``--config`` to the group (``appliance.cli.tool``).
"""

from __future__ import annotations

import click

from appliance.cli.tool import (BOOTSTRAP_HELP, COMMAND_CONFIG_HELP, fail, kafka_errors,
                                resolve_bootstrap, tool_group)


@tool_group("spark", "The Spark sink's jobs (appliance.spark): its job log and the transactions "
                     "it left.")
def spark() -> None:
    """The Spark sink's jobs (appliance.spark): its job log and the transactions it left."""


@spark.command("recover")
@click.option("--bootstrap-server", "bootstrap_server", default=None, metavar="HOST:PORT",
              help=BOOTSTRAP_HELP)
@click.option("--command-config", "command_config", default=None, type=click.Path(dir_okay=False),
              help=COMMAND_CONFIG_HELP)
@click.option("--prefix", default=None,
              help="Only the jobs of this transactionalIdPrefix (default: every prefix the job "
                   "log or an open transaction names).")
@click.option("--include-running", is_flag=True,
              help="Also the jobs heard of within their jobTimeoutMs: use this only when their "
                   "drivers are known to be dead (a live job rolled back fails, writing nothing).")
@click.pass_context
def spark_recover(ctx: click.Context, bootstrap_server: str | None, command_config: str | None,
                  prefix: str | None, include_running: bool) -> None:
    """Roll forward the dead Spark write jobs whose commit was decided, roll back the others,
    and list what was committed, aborted or left alone (exit 1 if a job could not be
    resolved)."""
    from appliance.spark import jobs
    target = resolve_bootstrap(ctx, bootstrap_server, command_config)
    cfg = {"bootstrap_servers": target.servers, "client_id": "appliance-spark-recover",
           **target.settings}
    failed = False
    # A Kafka error ends the command as it ends every tool's (cannot reach, no answer in time,
    # or the error's name and message; exit 1).
    with kafka_errors(target):
        with jobs.JobLog(cfg) as jl:
            entries = jl.read()
            done = 0
            for p in ([prefix] if prefix else jobs.prefixes(jl, entries)):
                for act in jobs.Recovery(jl, p, cfg).run(include_running=include_running,
                                                         entries=entries):
                    click.echo(act.line())
                    done += 1
                    failed = failed or act.outcome == "failed"
            if not done:
                click.echo("nothing to recover")
    if failed:
        fail("some jobs could not be resolved (see above)")
