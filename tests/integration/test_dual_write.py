"""The dual-write example (``examples/dual_write.py``, KIP-939's recipe with SQLite) killed -9 at
each step of the recipe and restarted: the database and the read_committed view of the topic
always agree, with nothing lost and nothing twice.

After the crash (before the restart) the test also checks the in-between state each step must
leave: before or after prepare, neither side has the round; after the database commit the
database has it and read_committed does not yet (the Kafka transaction is prepared, in doubt);
after the Kafka commit both have it. The restart's recovery then commits the in-doubt
transaction exactly when the database holds its state.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest

from appliance_harness import ROOT
from appliance_harness import shared_appliance, watch_shared_appliance  # noqa: F401 (fixtures)
from client_drivers import create, read_all, uid

APPLIANCE_CONFIG = {"transactions": {"two_phase_commit_enable": True}}
EXAMPLE = os.path.join(ROOT, "examples", "dual_write.py")
STEPS = ("before_prepare", "after_prepare", "after_db_commit", "after_kafka_commit")
PER_ROUND = 5


def run(bootstrap: str, topic: str, tid: str, db: str, until: int, crash: str | None = None,
        crash_round: int = 3, linger_ms: float = 5) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUAL_WRITE_")}
    if crash:
        env["DUAL_WRITE_CRASH_AT"] = crash
        env["DUAL_WRITE_CRASH_ROUND"] = str(crash_round)
    return subprocess.run([sys.executable, EXAMPLE, "--bootstrap", bootstrap, "--topic", topic,
                           "--transactional-id", tid, "--db", db, "--until", str(until),
                           "--per-round", str(PER_ROUND), "--linger-ms", str(linger_ms)],
                          env=env, capture_output=True, text=True, timeout=300)


def db_rows(db: str) -> dict[int, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT id, payload FROM orders ORDER BY id"))


def topic_rows(bootstrap: str, topic: str, level: str = "read_committed", *,
               settled: bool = True) -> dict[int, str]:
    """order id -> payload as a consumer of ``level`` reads the topic; fails on a duplicate id
    and on ids out of order within a partition. ``settled``: wait for no open transaction."""
    out: dict[int, str] = {}
    for part, recs in read_all(bootstrap, topic, 2, level, settled=settled).items():
        ids = [int(r.key) for r in recs]
        assert ids == sorted(ids), f"partition {part} out of order: {ids}"
        for r in recs:
            key = int(r.key)
            if level == "read_committed":
                assert key not in out, f"order {key} twice in the topic"
            out.setdefault(key, r.value.decode())
    return out


def assert_agree(bootstrap: str, topic: str, db: str, count: int) -> None:
    rows = db_rows(db)
    assert sorted(rows) == list(range(1, count + 1))
    assert topic_rows(bootstrap, topic) == rows


# (step, linger.ms, what the restart's recovery does). Crashing before prepare with linger 0 leaves
# the round's records sent without waiting for their answers (as any Kafka producer sends): those
# that reached the log are in an open transaction (aborted by the recovery), and if none did,
# Kafka never saw the transaction ("either"); with the default linger they were still buffered.
CASES = [("before_prepare", 0, "either"), ("before_prepare", 5, "nothing to do"),
         ("after_prepare", 5, "aborted"), ("after_db_commit", 5, "committed"),
         ("after_kafka_commit", 5, "nothing to do")]


@pytest.mark.parametrize("step,linger_ms,recovery", CASES,
                         ids=[f"{s}-linger{lg}" for s, lg, _ in CASES])
def test_crash_at_each_step_then_restart(shared_appliance, tmp_path, step, linger_ms, recovery):
    b = shared_appliance.bootstrap
    topic, tid, db = uid("orders", step), uid("orders-writer"), str(tmp_path / "orders.sqlite")
    create(b, {topic: 2})

    crashed = run(b, topic, tid, db, until=40, crash=step, crash_round=3, linger_ms=linger_ms)
    assert crashed.returncode == -9, crashed.stderr            # killed at the step, not finished
    in_db = 15 if step in ("after_db_commit", "after_kafka_commit") else 10
    visible = 15 if step == "after_kafka_commit" else 10
    in_log = 10 if recovery == "nothing to do" and step == "before_prepare" else 15
    if recovery == "either":
        logged = topic_rows(b, topic, "read_uncommitted", settled=False)
        in_log = 15 if any(k > 10 for k in logged) else 10
        recovery = "aborted" if in_log == 15 else "nothing to do"
    in_doubt = in_log > visible             # the crashed round's transaction is still open
    assert sorted(db_rows(db)) == list(range(1, in_db + 1))
    assert sorted(topic_rows(b, topic, settled=not in_doubt)) == list(range(1, visible + 1))
    # What the log holds (read_uncommitted): the open round too when it was sent (all of it or,
    # with linger 0, what reached the log before the crash).
    logged = sorted(topic_rows(b, topic, "read_uncommitted", settled=not in_doubt))
    assert logged[:10] == list(range(1, 11)) and set(logged[10:]) <= set(range(11, in_log + 1))
    assert len(logged) == in_log or step == "before_prepare"

    finished = run(b, topic, tid, db, until=40, linger_ms=linger_ms)
    assert finished.returncode == 0, finished.stderr
    assert "done: 40 orders" in finished.stdout
    assert f"-> {recovery}" in finished.stderr, finished.stderr
    assert_agree(b, topic, db, 40)
    # The orders of the crashed round: the database decided; the topic followed.
    rows = db_rows(db)
    first_run_nonce = rows[1].split("(")[1]
    survived = all(first_run_nonce in rows[r] for r in range(11, 16))
    assert survived == (step in ("after_db_commit", "after_kafka_commit"))


def test_crash_at_every_step_in_turn(shared_appliance, tmp_path):
    b = shared_appliance.bootstrap
    topic, tid, db = uid("orders-turns"), uid("turns-writer"), str(tmp_path / "turns.sqlite")
    create(b, {topic: 2})
    for i, step in enumerate(STEPS + STEPS):
        r = run(b, topic, tid, db, until=100, crash=step, crash_round=1 + i % 2)
        assert r.returncode == -9, r.stderr
        # Between a crash and the next recovery the topic never shows what the database lacks
        # (the database may be one round ahead: a prepared transaction it committed).
        rows, visible = db_rows(db), topic_rows(b, topic, settled=False)
        assert visible == {k: rows[k] for k in visible}
        assert len(rows) - len(visible) in (0, PER_ROUND)
    r = run(b, topic, tid, db, until=100)
    assert r.returncode == 0, r.stderr
    assert_agree(b, topic, db, 100)
