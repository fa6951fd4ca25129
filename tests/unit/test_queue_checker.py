"""The chaos suite's checker (loadtests/queue_checker.py) on hand-made histories: each history
holds one anomaly (and what it implies), and the checker must report exactly that; a history of
legal behaviour (aborts leaving offset gaps, a rebalance that makes a new owner re-read, an
abort rewinding a transactional consumer) must give zero of every class."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "loadtests"))

from queue_checker import ANOMALIES, check, summary  # noqa: E402


def send(k, offset, v):
    return ["send", k, [offset, v]]


def poll(**keys):
    return ["poll", {k: [list(p) for p in pairs] for k, pairs in keys.items()}]


def txn(process, type_, *mops, f="txn", **extra):
    return {"process": process, "type": type_, "f": f, "value": list(mops), **extra}


def polled(process, rebalance=None, **keys):
    op = {"process": process, "type": "ok", "f": "poll", "value": [poll(**keys)]}
    if rebalance:
        op["rebalance"] = rebalance
    return op


def counts(history):
    res = check(history)
    return {k: v for k, v in res.counts.items() if v}


def test_legal_history_has_no_anomaly():
    h = [
        # p0 commits a, b to x (offsets 0, 1; the marker takes 2), aborts c (3; marker 4),
        # commits d to x and e to y.
        txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b")),
        txn("p0", "fail", send("x", 3, "c")),
        txn("p1", "ok", send("x", 5, "d"), send("y", 0, "e")),
        # c1 reads x in two polls; offsets jump over the marker and the aborted batch.
        polled("c1", x=[(0, "a")]),
        polled("c1", x=[(1, "b"), (5, "d")]),
        # c2 takes x over in a rebalance and starts again from a committed offset: a re-read.
        polled("c2", rebalance=["x"], x=[(1, "b"), (5, "d")], y=[(0, "e")]),
        # A transactional consumer reads b, aborts, rewinds (no reset needed: its last ok read
        # is still where it resumes), reads b again and commits.
        txn("t0", "ok", poll(x=[(0, "a")]), send("y", 2, "f"), group="g"),
        txn("t0", "fail", poll(x=[(1, "b")]), send("y", 4, "g"), group="g"),
        txn("t0", "ok", poll(x=[(1, "b"), (5, "d")]), send("y", 6, "h"), group="g"),
        # After a commit of unknown outcome it rewinds by hand: a reset of its read position.
        txn("t0", "info", poll(y=[(0, "e"), (2, "f")]), send("y", 8, "i"), group="g"),
        {"process": "t0", "type": "ok", "f": "reset", "value": None},
        txn("t0", "ok", poll(y=[(0, "e"), (2, "f")]), group="g"),
        polled("final", x=[(0, "a"), (1, "b"), (5, "d")], y=[(0, "e"), (2, "f"), (6, "h")]),
    ]
    res = check(h)
    assert res.valid, {k: v for k, v in res.cases.items() if v}
    assert res.stats["committed"] == 4 and res.stats["aborted"] == 2 and res.stats["unknown"] == 1
    assert set(res.counts) == set(ANOMALIES)
    assert "lost-write" in summary(res)


def test_lost_write():
    # b was acknowledged at offset 1 and committed; readers read a and c (past b), never b.
    h = [txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b"), send("x", 2, "c")),
         polled("c1", x=[(0, "a")]),
         polled("c2", x=[(2, "c")])]
    res = check(h)
    assert res.cases["lost-write"][0]["value"] == "b"
    assert counts(h) == {"lost-write": 1, "unseen": 1}


def test_unseen_without_a_read_past_it_is_not_lost():
    h = [txn("p0", "ok", send("x", 0, "a")), txn("p0", "ok", send("x", 2, "b")),
         polled("c1", x=[(0, "a")])]
    assert counts(h) == {"unseen": 1}


def test_duplicate():
    h = [txn("p0", "ok", send("x", 0, "a")),
         polled("c1", x=[(0, "a")]),
         polled("c2", x=[(0, "a"), (3, "a")])]
    res = check(h)
    assert counts(h) == {"duplicate": 1, "nonmonotonic-poll": 1}
    assert res.cases["duplicate"][0]["offsets"] == [0, 3]


def test_aborted_read():
    h = [txn("p0", "fail", send("x", 0, "a")), txn("p0", "ok", send("x", 2, "b")),
         polled("c1", x=[(0, "a"), (2, "b")])]
    assert counts(h) == {"G1a": 1}


def test_intermediate_read():
    # T wrote m and n to x; c1 reads over T's whole span (0..3) and sees m but not n.
    h = [txn("p0", "ok", send("x", 0, "a")),
         txn("p1", "ok", send("x", 1, "m"), send("x", 2, "n")),
         txn("p0", "ok", send("x", 4, "z")),
         polled("c1", x=[(0, "a"), (1, "m")]),
         polled("c1", x=[(4, "z")]),
         polled("c2", x=[(2, "n")])]
    res = check(h)
    assert counts(h) == {"G1b": 1, "poll-skip": 1}
    assert res.cases["G1b"][0]["missed"] == ["n"]


def test_partial_read_that_stops_inside_the_transaction_is_not_intermediate():
    h = [txn("p1", "ok", send("x", 1, "m"), send("x", 2, "n")),
         polled("c1", x=[(1, "m")]),                               # poll ended mid-transaction
         polled("c2", rebalance=["x"], x=[(2, "n")])]               # the next owner reads on
    assert counts(h) == {}


def test_cyclic_information_flow():
    # t1 read what t2 wrote and t2 read what t1 wrote: each saw the other committed first.
    h = [txn("t1", "ok", poll(y=[(0, "v2")]), send("x", 0, "v1")),
         txn("t2", "ok", poll(x=[(0, "v1")]), send("y", 0, "v2"))]
    res = check(h)
    assert counts(h) == {"G1c": 1}
    assert {o["process"] for o in res.cases["G1c"][0]["operations"]} == {"t1", "t2"}


def test_nonmonotonic_send():
    h = [txn("p0", "ok", send("x", 5, "a")), txn("p0", "ok", send("x", 3, "b")),
         polled("c1", x=[(3, "b"), (5, "a")])]
    assert counts(h) == {"nonmonotonic-send": 1}


def test_nonmonotonic_send_within_a_transaction():
    h = [txn("p0", "ok", send("x", 5, "a"), send("x", 3, "b")),
         polled("c1", x=[(3, "b"), (5, "a")])]
    assert counts(h) == {"nonmonotonic-send": 1}


def test_nonmonotonic_poll_and_its_rebalance_excuse():
    h = [txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b")),
         polled("c1", x=[(0, "a"), (1, "b")]),
         polled("c1", x=[(0, "a"), (1, "b")])]
    assert counts(h) == {"nonmonotonic-poll": 1}
    h[2]["rebalance"] = ["x"]
    assert counts(h) == {}


def test_failed_transaction_does_not_move_the_read_position():
    # After an aborted consume-transform-produce transaction the consumer rewinds to its last
    # committed transaction's offsets; resuming anywhere else is an anomaly.
    h = [txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b"), send("x", 2, "c")),
         txn("t0", "ok", poll(x=[(0, "a")]), group="g"),
         txn("t0", "fail", poll(x=[(1, "b")]), group="g"),
         txn("t0", "ok", poll(x=[(2, "c")]), group="g"),                # resumed after b: skip
         polled("final", x=[(0, "a"), (1, "b"), (2, "c")])]
    assert counts(h) == {"poll-skip": 1}


def test_poll_skip():
    h = [txn("p0", "ok", send("x", 0, "a")), txn("p1", "ok", send("x", 1, "b")),
         txn("p0", "ok", send("x", 2, "c")),
         polled("c1", x=[(0, "a")]),
         polled("c1", x=[(2, "c")]),
         polled("c2", x=[(1, "b")])]
    res = check(h)
    assert counts(h) == {"poll-skip": 1}
    assert res.cases["poll-skip"][0]["skipped"] == ["b"]


def test_reset_forgets_the_read_position():
    h = [txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b")),
         polled("c1", x=[(0, "a"), (1, "b")]),
         {"process": "c1", "type": "ok", "f": "reset", "value": ["x"]},
         polled("c1", x=[(0, "a")])]
    assert counts(h) == {}


def test_inconsistent_offsets():
    h = [txn("p0", "ok", send("x", 0, "a")), txn("p1", "ok", send("x", 0, "b")),
         polled("c1", x=[(0, "a")]), polled("c2", x=[(0, "b")])]
    res = check(h)
    assert counts(h) == {"inconsistent-offsets": 1}
    assert res.cases["inconsistent-offsets"][0]["values"] == ["a", "b"]


def test_unknown_outcome_proven_committed_by_a_read():
    # An info transaction wrote a and b; a was read, so it committed, and b (read past) is lost.
    h = [txn("p0", "info", send("x", 0, "a"), send("x", 1, "b")),
         txn("p1", "ok", send("x", 3, "c")),
         polled("c1", x=[(0, "a")]),
         polled("c2", x=[(3, "c")])]
    assert counts(h) == {"lost-write": 1}
    # Unread, it proves nothing: neither lost nor unseen.
    h = [txn("p0", "info", send("x", 0, "a")), txn("p1", "ok", send("x", 2, "c")),
         polled("c2", x=[(2, "c")])]
    assert counts(h) == {}


def test_precommitted_read():
    h = [txn("t0", "ok", send("x", 0, "a"), poll(x=[(0, "a")]))]
    assert counts(h) == {"precommitted-read": 1}


def test_duplicate_consume_in_a_group():
    h = [txn("p0", "ok", send("x", 0, "a")),
         txn("t0", "ok", poll(x=[(0, "a")]), group="g"),
         txn("t1", "ok", poll(x=[(0, "a")]), group="g", rebalance=["x"]),
         txn("t2", "ok", poll(x=[(0, "a")]), group="other")]
    res = check(h)
    assert counts(h) == {"duplicate-consume": 1}
    assert res.cases["duplicate-consume"][0]["group"] == "g"


def test_garbage_read():
    h = [polled("c1", x=[(0, "never-sent")])]
    assert counts(h) == {"garbage-read": 1}


@pytest.mark.parametrize("n", [2000])
def test_long_history_is_checked_without_recursion_limits(n):
    # A chain of n transactions, each reading the previous one's value: one long wr path (no
    # cycle), which a recursive cycle search would not survive.
    h = [txn("t0", "ok", send("x", 0, "v0"))]
    for i in range(1, n):
        h.append(txn(f"t{i}", "ok", poll(x=[(i - 1, f"v{i - 1}")]), send("x", i, f"v{i}")))
    h.append(polled("final", x=[(i, f"v{i}") for i in range(n)]))
    assert counts(h) == {}


def damage(k, first, last, at):
    return {"process": "nemesis", "type": "ok", "f": "damage",
            "value": {"key": k, "first": first, "last": last, "at": at}}


def at(op, t):
    op["time"] = t
    return op


def test_values_of_a_damaged_batch_are_given_up_and_the_reader_that_skips_it_resets():
    # b and c (offsets 1-2) are one batch a bit flip damaged; the final reader read a, was moved
    # past the batch (a reset), read d: neither lost nor unseen, no poll skip.
    h = [at(txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b"), send("x", 2, "c"), send("x", 3, "d")), 1.0),
         damage("x", 1, 2, 5.0),
         at(polled("final", x=[(0, "a")]), 10.0),
         {"process": "final", "type": "ok", "f": "reset", "value": ["x"], "time": 10.5},
         at(polled("final", x=[(3, "d")]), 11.0)]
    res = check(h)
    assert counts(h) == {}, res.cases
    assert res.stats["damaged batches"] == 1 and res.stats["values given up (damaged)"] == 2


def test_without_its_damage_entry_the_same_history_is_a_lost_write():
    h = [txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b"), send("x", 2, "c")),
         polled("final", x=[(0, "a")]),
         {"process": "final", "type": "ok", "f": "reset", "value": ["x"]},
         polled("final", x=[(2, "c")])]
    assert counts(h) == {"lost-write": 1, "unseen": 1}


def test_corrupt_read_of_a_damaged_batch():
    h = [at(txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b")), 1.0),
         damage("x", 1, 1, 5.0),
         at(polled("c0", x=[(0, "a"), (1, "b")]), 4.0),     # before the damage: fine
         at(polled("c1", x=[(0, "a"), (1, "b")]), 8.0),     # a prefetch of the good batch: fine
         at(polled("c2", x=[(0, "a"), (1, "b")]), 60.0),    # served long after: corrupt
         at(polled("c3", x=[(0, "a"), (1, "bX")]), 6.0)]    # a changed value: corrupt at once
    res = check(h)
    assert [c["reader"]["process"] for c in res.cases["corrupt-read"]] == ["c2", "c3"]
    # (c3 read a but not b over the transaction's span: G1b, as the changed value implies)
    assert counts(h) == {"corrupt-read": 2, "garbage-read": 1, "inconsistent-offsets": 1, "G1b": 1}


# -- power cuts (loadtests/queue_power_cuts.py) ------------------------------------------------------
def cut(at_s, ready_s, policy, **ends):
    return {"process": "nemesis", "type": "ok", "f": "power-cut", "time": at_s,
            "value": {"at": at_s, "ready": ready_s, "policy": policy, "ends": ends}}


def _cut_history(policy):
    # p0 commits a, b (offsets 0, 1) and then c (offset 2) before the cut at 10 s; the recovered
    # log of x ends at 2 (c, never synced, is gone); after the restart p1 commits d, which the
    # log gives offset 2 again. c0 read a, b, c before the cut; the final reader reads a, b, d.
    return [at(txn("p0", "ok", send("x", 0, "a"), send("x", 1, "b"), start=0.5), 1.0),
            at(txn("p0", "ok", send("x", 2, "c"), start=8.5), 9.0),
            at(polled("c0", x=[(0, "a"), (1, "b"), (2, "c")]), 9.5),
            cut(10.0, 13.0, policy, x=2),
            at(txn("p1", "ok", send("x", 2, "d"), start=40.0), 40.5),
            at(polled("c0", x=[(2, "d")]), 41.0),
            at(polled("final", x=[(0, "a"), (1, "b"), (2, "d")]), 60.0)]


def test_an_os_power_cut_may_take_what_was_not_synced():
    """Policy ``os``: c, acknowledged then lost with the cut, is neither lost nor a second value
    at offset 2, and c0's read of d after the cut is not a step back; the loss is measured."""
    res = check(_cut_history("os"))
    assert res.valid, {k: v for k, v in res.cases.items() if v}
    assert any("power cuts (os) 1: acknowledged committed values lost 1" in line for line in res.power_cuts), \
        res.power_cuts


def test_the_same_loss_under_policy_batch_is_an_anomaly():
    """``batch`` promises what was acknowledged: the same history is two values at one offset."""
    res = check(_cut_history("batch"))
    assert counts(_cut_history("batch")) == {"inconsistent-offsets": 1, "nonmonotonic-poll": 1}
    assert any("power cuts (batch) 1: acknowledged committed values lost 1" in line for line in res.power_cuts)


def test_an_os_power_cut_keeps_a_gap_below_the_recovered_end_an_anomaly():
    """What survived must be a prefix: b missing below the recovered end (3) is still a loss."""
    h = [at(txn("p0", "ok", send("x", 0, "a"), start=0.5), 1.0),
         at(txn("p1", "ok", send("x", 1, "b"), start=20.5), 21.0),
         at(txn("p0", "ok", send("x", 2, "c"), start=21.5), 22.0),
         cut(10.0, 13.0, "os", x=1),
         cut(30.0, 33.0, "os", x=3),
         at(polled("final", x=[(0, "a"), (2, "c")]), 60.0)]
    h.sort(key=lambda op: op["time"])
    assert counts(h) == {"lost-write": 1, "unseen": 1, "poll-skip": 1}
    # b in the log (the final read_uncommitted read) but never returned to a read_committed
    # reader: its commit marker was lost with the cut and its transaction aborted; no gap.
    h.append(at({"process": "final-log", "type": "ok", "f": "log",
                 "value": [poll(x=[(0, "a"), (1, "b"), (2, "c")])]}, 61.0))
    assert counts(h) == {}


def test_a_value_consumed_again_across_an_os_power_cut_is_no_duplicate_consume():
    h = [at(txn("p0", "ok", send("x", 0, "a"), start=0.5), 1.0),
         at(txn("t0", "ok", poll(x=[(0, "a")]), send("y", 0, "e"), group="g", start=2.0), 2.5),
         cut(10.0, 13.0, "os", x=1, y=1),
         at(txn("t0", "ok", poll(x=[(0, "a")]), send("y", 1, "f"), group="g", start=20.0), 20.5),
         at(polled("final", x=[(0, "a")], y=[(0, "e"), (1, "f")]), 60.0)]
    assert counts(h) == {}
    h[2]["value"]["policy"] = "batch"
    assert counts(h) == {"duplicate-consume": 1, "nonmonotonic-poll": 1}
