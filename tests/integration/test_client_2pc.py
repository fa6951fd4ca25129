"""KIP-939 two-phase commit with the appliance's own client, against the real appliance.

- A transaction prepared by a producer process that is then killed -9, with the whole appliance
  killed -9 and restarted afterwards, stays in doubt (read_committed withholds it, its LSO stays
  pinned) past the point where an ordinary transaction of the same age is aborted by its timeout;
  a new process then does ``init_transactions(keep_prepared_txn=True)`` and
  ``complete_transaction(state)``: with the prepared transaction's state the data appears exactly
  once, with a stale state (the previous transaction's, as a database that did not commit would
  hold) it is aborted and never appears;
- in one process: prepare then complete (matching: commit, other: abort), and the producer goes on;
- with the broker switch off, ``enable_two_phase_commit`` is refused with
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), while ``keep_prepared_txn`` alone still works (the
  KIP allows it without 2PC).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from appliance.client import (Consumer, FatalProducerError, KafkaError, PreparedTxnState,
                              Producer)
from client_drivers import create, read_all, uid, values_of

TWO_PC = {"transactions": {"two_phase_commit_enable": True, "abort_timed_out_interval_ms": 200}}

# A producer process: commits one transaction, prepares a second, prints both states, then waits
# to be killed.
_PREPARER = textwrap.dedent("""
    import sys, time
    from appliance.client import Producer
    bootstrap, tid, topic = sys.argv[1:4]
    p = Producer(bootstrap_servers=bootstrap, transactional_id=tid, enable_two_phase_commit=True)
    p.init_transactions()
    p.begin_transaction()
    for i in range(10):
        p.send(topic, b"first-%d" % i, partition=i % 2)
    s1 = p.prepare_transaction()
    p.commit_transaction()
    p.begin_transaction()
    for i in range(20):
        p.send(topic, b"second-%d" % i, partition=i % 2)
    s2 = p.prepare_transaction()
    print(s1, s2, flush=True)
    time.sleep(3600)
""")

# An ordinary transaction (1 s timeout) left open by a killed process: the control.
_ABANDONER = textwrap.dedent("""
    import sys, time
    from appliance.client import Producer
    bootstrap, tid, topic = sys.argv[1:4]
    p = Producer(bootstrap_servers=bootstrap, transactional_id=tid, transaction_timeout_ms=1000)
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"abandoned", partition=0)
    p.flush()
    print("sent", flush=True)
    time.sleep(3600)
""")

# The recovery: keep the prepared transaction and complete it with the state given.
_COMPLETER = textwrap.dedent("""
    import sys
    from appliance.client import Producer, PreparedTxnState
    bootstrap, tid, state = sys.argv[1:4]
    p = Producer(bootstrap_servers=bootstrap, transactional_id=tid, enable_two_phase_commit=True)
    p.init_transactions(keep_prepared_txn=True)
    kept = p.prepared_state
    result = p.complete_transaction(PreparedTxnState(state))
    print(kept, result, flush=True)
    p.close()
""")


def run_until_line(script: str, *args: str) -> tuple[subprocess.Popen, str]:
    """Start ``script`` and return (the process, its first line of output)."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise AssertionError(f"child died: {proc.wait()} {proc.stderr.read()}")
    return proc, line


def kill9(proc: subprocess.Popen) -> None:
    proc.kill()                       # SIGKILL
    assert proc.wait(30) == -9
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def offsets(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of one partition."""
    ends = []
    for level in ("read_committed", "read_uncommitted"):
        with Consumer(bootstrap_servers=bootstrap, isolation_level=level) as c:
            c.assign([(topic, partition)])
            ends.append(c.end_offsets([(topic, partition)])[(topic, partition)])
    return ends[0], ends[1]


@pytest.mark.parametrize("decision", ["matching", "stale"])
def test_prepared_transaction_survives_kill9_of_client_and_appliance(appliance_factory, decision):
    a = appliance_factory(**TWO_PC)
    b = a.bootstrap
    topic, control, tid = uid("2pc"), uid("2pc-control"), uid("2pc-tid")
    create(b, {topic: 2, control: 1})

    child, line = run_until_line(_PREPARER, b, tid, topic)
    s1, s2 = (PreparedTxnState(x) for x in line.split())
    assert s1.producer_id == s2.producer_id and s2.epoch == s1.epoch + 1     # TV2: one epoch each
    kill9(child)
    assert offsets(b, topic, 0) == (6, 16)          # 5 + marker committed; 10 prepared withheld

    a.kill9_all()
    a.restart()

    # An ordinary transaction abandoned now is aborted by its 1 s timeout; once that happened,
    # the prepared one (no timeout: KIP-939) must still be in doubt.
    zombie, _ = run_until_line(_ABANDONER, b, uid("control-tid"), control)
    kill9(zombie)
    a.wait_for(lambda: offsets(b, control, 0) == (2, 2), 60, "the control transaction's abort")
    assert offsets(b, topic, 0) == (6, 16) and offsets(b, topic, 1) == (6, 16)
    assert values_of(read_all(b, topic, 2, settled=False)) == {
        p: [b"first-%d" % i for i in range(p, 10, 2)] for p in (0, 1)}

    state = s2 if decision == "matching" else s1
    proc = subprocess.run([sys.executable, "-c", _COMPLETER, b, tid, str(state)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    kept, result = proc.stdout.split()
    assert PreparedTxnState(kept) == s2
    assert result == ("True" if decision == "matching" else "False")

    want_second = decision == "matching"
    expected = {p: [b"first-%d" % i for i in range(p, 10, 2)]
                + ([b"second-%d" % i for i in range(p, 20, 2)] if want_second else [])
                for p in (0, 1)}
    assert values_of(read_all(b, topic, 2)) == expected           # exactly once, or never
    assert offsets(b, topic, 0) == (17, 17)                       # decided: nothing pinned

    # The transactional id is usable again by a fresh producer.
    with Producer(bootstrap_servers=b, transactional_id=tid, enable_two_phase_commit=True) as p:
        p.init_transactions(keep_prepared_txn=True)
        assert p.prepared_state is None and p.complete_transaction(s2) is None
        p.begin_transaction()
        p.send(topic, b"after", partition=0)
        p.commit_transaction()
    assert values_of(read_all(b, topic, 2))[0][-1] == b"after"


def test_prepare_and_complete_in_one_process(appliance_factory):
    a = appliance_factory(**TWO_PC)
    b = a.bootstrap
    topic = uid("2pc-local")
    create(b, {topic: 1})
    with Producer(bootstrap_servers=b, transactional_id=uid("local-tid"), enable_two_phase_commit=True) as p:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"one", partition=0)
        s1 = p.prepare_transaction()
        assert p.prepared_state == s1 and PreparedTxnState(str(s1)) == s1
        with pytest.raises(KafkaError):
            p.send(topic, b"not now", partition=0)
        assert p.complete_transaction(str(s1)) is True

        p.begin_transaction()
        p.send(topic, b"two", partition=0)
        s2 = p.prepare_transaction()
        assert s2 != s1
        assert p.complete_transaction(s1) is False              # not this transaction: abort

        p.begin_transaction()
        p.send(topic, b"three", partition=0)
        assert p.complete_transaction(PreparedTxnState()) is False   # open, unprepared: abort
        assert p.complete_transaction(s2) is None               # nothing open

        p.begin_transaction()
        p.send(topic, b"four", partition=0)
        p.prepare_transaction()
        p.commit_transaction()
    assert values_of(read_all(b, topic, 1)) == {0: [b"one", b"four"]}


def test_two_phase_commit_refused_when_the_broker_switch_is_off(appliance_factory):
    a = appliance_factory()
    b = a.bootstrap
    topic = uid("no2pc")
    create(b, {topic: 1})
    p = Producer(bootstrap_servers=b, transactional_id=uid("no2pc-tid"), enable_two_phase_commit=True)
    try:
        with pytest.raises(FatalProducerError) as e:
            p.init_transactions()
        assert e.value.code == 53                               # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        with pytest.raises(FatalProducerError):
            p.begin_transaction()
    finally:
        p.close()

    # keep_prepared_txn without 2PC (the KIP allows it): an abandoned open transaction is kept
    # and completed by the next instance.
    tid = uid("keep-tid")
    first = Producer(bootstrap_servers=b, transactional_id=tid)
    second = Producer(bootstrap_servers=b, transactional_id=tid)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send(topic, b"kept", partition=0)
        first.flush()
        ongoing = PreparedTxnState(first.producer_id, first.producer_epoch)
        second.init_transactions(keep_prepared_txn=True)
        assert second.prepared_state == ongoing
        assert second.complete_transaction(ongoing) is True
    finally:
        first.close()
        second.close()
    assert values_of(read_all(b, topic, 1)) == {0: [b"kept"]}
