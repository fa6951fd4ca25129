#!/usr/bin/env python3
"""Dual write with KIP-939: keep a database table and a Kafka topic in step, across crashes.

The recipe of KIP-939 ("Motivation"), with the appliance's own client (``appliance.client``) and
a real database: SQLite by default (``--db FILE``), PostgreSQL with ``--dsn`` (needs ``psycopg``).
Each round writes a few "orders": rows in the table ``orders`` and records in the topic (key =
the order id, value = the same payload), atomically in both or in neither.

Normal processing (one round):
  1. begin a database transaction (and take the next order ids from it)
  2. begin a Kafka transaction
  3. send the records
  4. prepare the Kafka transaction -> PreparedTxnState
  5. insert the rows
  6. store transactional id -> PreparedTxnState in ``kafka_transaction_state``
  7. commit the database transaction
  8. commit the Kafka transaction

Recovery, at every start: ``init_transactions(keep_prepared_txn=True)`` keeps whatever Kafka
transaction the last run left open, then ``complete_transaction(state from the database)``
commits it if the database committed the same transaction (the state matches) and aborts it
otherwise. The database is the decision: after a crash at any step, the database and what a
read_committed consumer sees of the topic agree, with nothing lost and nothing twice.

For the tests, ``DUAL_WRITE_CRASH_AT`` = before_prepare | after_prepare | after_db_commit |
after_kafka_commit kills the process (SIGKILL, no clean-up) at that step of round
``DUAL_WRITE_CRASH_ROUND`` (default 1) of this run.

    .venv/bin/python examples/dual_write.py --bootstrap 127.0.0.1:9092 [--topic dual-write-orders] \\
        --transactional-id orders-writer --db orders.sqlite --until 100

The broker must allow two-phase commit (``[transactions] two_phase_commit_enable = true``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sqlite3
import sys
import uuid

from appliance.client import PreparedTxnState, Producer

log = logging.getLogger("dual_write")
STEPS = ("before_prepare", "after_prepare", "after_db_commit", "after_kafka_commit")


class Database:
    """The other participant: SQLite (embedded) or PostgreSQL, one connection, explicit
    transactions. ``q`` is the driver's placeholder (SQLite ``?``, psycopg ``%s``)."""

    def __init__(self, db: str | None, dsn: str | None) -> None:
        if dsn:
            try:
                import psycopg
            except ImportError:
                sys.exit("--dsn needs the psycopg package (pip install psycopg)")
            self.conn = psycopg.connect(dsn, autocommit=True)
            self.q = "%s"
            self.sqlite = False
        else:
            self.conn = sqlite3.connect(db or "dual_write.sqlite", isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.q = "?"
            self.sqlite = True
        self.execute("CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
        self.execute("CREATE TABLE IF NOT EXISTS kafka_transaction_state ("
                     "transactional_id VARCHAR(255) PRIMARY KEY, "
                     "prepared_transaction_state VARCHAR(255) NOT NULL)")

    def execute(self, sql: str, params: tuple = ()):
        cur = self.conn.cursor()
        cur.execute(sql.replace("?", self.q), params)
        return cur

    def begin(self) -> None:
        self.execute("BEGIN IMMEDIATE" if self.sqlite else "BEGIN")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        self.execute("ROLLBACK")

    def prepared_state(self, transactional_id: str) -> str:
        row = self.execute("SELECT prepared_transaction_state FROM kafka_transaction_state "
                           "WHERE transactional_id = ?", (transactional_id,)).fetchone()
        return row[0] if row else ""

    def save_state(self, transactional_id: str, state: str) -> None:
        self.execute("INSERT INTO kafka_transaction_state (transactional_id, prepared_transaction_state) "
                     "VALUES (?, ?) ON CONFLICT (transactional_id) DO UPDATE "
                     "SET prepared_transaction_state = excluded.prepared_transaction_state",
                     (transactional_id, state))

    def count(self) -> int:
        return self.execute("SELECT COUNT(*) FROM orders").fetchone()[0]

    def next_id(self) -> int:
        return self.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM orders").fetchone()[0]

    def insert(self, order_id: int, payload: str) -> None:
        self.execute("INSERT INTO orders (id, payload) VALUES (?, ?)", (order_id, payload))

    def close(self) -> None:
        self.conn.close()


def crash_point(step: str, round_no: int) -> None:
    """The test hook: die here, without any clean-up, if asked to."""
    if os.environ.get("DUAL_WRITE_CRASH_AT") == step and \
            int(os.environ.get("DUAL_WRITE_CRASH_ROUND", "1")) == round_no:
        log.warning("crashing at %s of round %d", step, round_no)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def recover(producer: Producer, db: Database, transactional_id: str) -> bool | None:
    """The recovery recipe: keep the open Kafka transaction, decide it by the database."""
    producer.init_transactions(keep_prepared_txn=True)
    state = PreparedTxnState.from_string(db.prepared_state(transactional_id))
    kept = producer.prepared_state
    outcome = producer.complete_transaction(state)
    log.info("recovery: open Kafka transaction %s, database says %s -> %s", kept or "none",
             state or "none", {True: "committed", False: "aborted", None: "nothing to do"}[outcome])
    return outcome


def write_round(producer: Producer, db: Database, args, round_no: int, nonce: str) -> int:
    """One round of the normal-processing recipe; returns the number of orders written."""
    db.begin()                                                   # 1
    try:
        first = db.next_id()
        orders = [(first + i, f"order {first + i} ({nonce})") for i in range(args.per_round)]
        producer.begin_transaction()                             # 2
        for order_id, payload in orders:                         # 3
            producer.send(args.topic, payload.encode(), str(order_id).encode())
        crash_point("before_prepare", round_no)
        state = producer.prepare_transaction()                   # 4
        crash_point("after_prepare", round_no)
        for order_id, payload in orders:                         # 5
            db.insert(order_id, payload)
        db.save_state(args.transactional_id, str(state))         # 6
    except BaseException:
        db.rollback()
        producer.abort_transaction()
        raise
    try:
        db.commit()                                              # 7
    except BaseException:
        # The database's answer is lost or negative; a remote database may still have
        # committed. Decide as the recovery does: by what the database holds.
        try:
            db.rollback()
        except Exception:
            pass
        producer.complete_transaction(db.prepared_state(args.transactional_id))
        raise
    crash_point("after_db_commit", round_no)
    producer.commit_transaction()                                # 8
    crash_point("after_kafka_commit", round_no)
    return len(orders)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", default="dual-write-orders",
                    help="default dual-write-orders (examples/spark_pipeline.py uses spark-orders)")
    ap.add_argument("--transactional-id", required=True)
    ap.add_argument("--db", help="SQLite file (default dual_write.sqlite)")
    ap.add_argument("--dsn", help="PostgreSQL connection string instead of SQLite (needs psycopg)")
    ap.add_argument("--until", type=int, default=100, help="stop once the table holds this many orders")
    ap.add_argument("--per-round", type=int, default=5, help="orders per round")
    ap.add_argument("--linger-ms", type=float, default=5,
                    help="producer linger.ms (0: every record is sent at once, before prepare)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    db = Database(args.db, args.dsn)
    producer = Producer(bootstrap_servers=args.bootstrap, transactional_id=args.transactional_id,
                        enable_two_phase_commit=True, linger_ms=args.linger_ms)
    nonce = uuid.uuid4().hex[:8]          # tells this run's payloads from an earlier run's
    try:
        recover(producer, db, args.transactional_id)
        round_no = 0
        while db.count() < args.until:
            round_no += 1
            n = write_round(producer, db, args, round_no, nonce)
            log.info("round %d: %d orders in the table and the topic", round_no, n)
        print(f"done: {db.count()} orders", flush=True)
    finally:
        producer.close()
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
