"""``appliance transactions``: Kafka's kafka-transactions.sh (list, describe, abort a hanging
transaction) plus KIP-939's force-terminate, over the Kafka protocol (``appliance.client.transaction_admin``).

Runs in the user's shell; owns nothing but its connection. ``--bootstrap-server``,
``--command-config`` (a secured listener) and ``--config`` come before the command, as
kafka-transactions.sh takes them (``appliance.cli.tool``).
"""

from __future__ import annotations

import click

from appliance.cli.tool import protocol_connection, run_or_exit as _run, tool_group


@tool_group("transactions", "Inspect and resolve transactions (Kafka's kafka-transactions.sh, "
                            "plus KIP-939's force-terminate).")
def transactions() -> None:
    """Inspect and resolve transactions (Kafka's kafka-transactions.sh, plus KIP-939's
    force-terminate)."""


def _admin(ctx: click.Context):
    from appliance.client import transaction_admin as admin
    return admin, protocol_connection(ctx, "appliance-transactions")


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
