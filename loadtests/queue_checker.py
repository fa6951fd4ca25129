"""The checker of the chaos suite: Jepsen's Kafka "queue" analysis over a recorded history.

Pure Python, no broker, no clients: ``check(history)`` takes the operations the workload of
``loadtests/chaos.py`` recorded and returns every anomaly it can prove, by class. Run in the
chaos tool's process after the run (and by ``chaos.py --check-history FILE`` on a saved history).

The model is Jepsen's (jepsen.tests.kafka): each topic-partition is a *key*, a totally ordered log;
every value sent is unique. A history is a list of completed operations, in the order each client
completed them (one client = one *process*; a process's operations are sequential):

    {"process": "p0",                 # the client
     "type": "ok" | "fail" | "info",  # committed / certainly not committed / unknown outcome
     "f": "txn" | "send" | "poll" | "reset",
     "value": [["send", key, [offset or None, value]],   # micro-ops, in the order done
               ["poll", {key: [[offset, value], ...]}]],
     "rebalance": [key, ...],         # optional: keys whose assignment changed during the op
     "group": "g"}                    # optional: the consumer group whose offsets the txn commits

``reset`` (value: a list of keys, or None for all) says the process moved its read position by
hand (a rewind after a transaction of unknown outcome), so its next read of those keys starts
anywhere. A ``txn`` whose type is ``fail`` never committed (aborted, or never asked to commit);
``info`` asked to commit and did not learn the outcome.

Analysis (Jepsen's, with the names of its anomaly classes):

* version order: per key, offset -> values, from every poll (of any operation: read_committed
  polls must only ever return committed data) and from the sends of operations that must have
  committed (``ok``, or ``info`` with one of its values read). Offsets are sparse (markers and
  aborted records take offsets); the *index* of a value is its rank among the known offsets.
* ``inconsistent-offsets``: two values at one offset of a key.
* ``duplicate``: one value at two offsets of a key.
* ``lost-write``: a value that must have committed, ranked at or below the highest value some
  process read in that key, that no process ever read.
* ``G1a`` (aborted read): a poll returned a value of a transaction that did not commit.
* ``G1b`` (intermediate read): a process read some of a committed transaction's values in a key,
  and read that key over the transaction's whole offset span without a reset, yet missed others
  of them: the transaction was not visible atomically (read_committed makes it so).
* ``G1c`` (cyclic information flow), in the simplified form of Jepsen's Kafka checker: a cycle of
  write->read dependencies between transactions (T1 read what T2 wrote and T2 read what T1
  wrote). Write->write edges are left out: without write isolation Kafka's transactions interleave
  their writes, and such cycles (G0) are normal.
* ``nonmonotonic-send``: two successive sends of one process to a key (within a transaction or
  across its committed transactions) whose values are not in increasing order in the log.
* ``nonmonotonic-poll`` / ``poll-skip``: two successive reads of one process in a key (within an
  operation, or the last read of its previous ``ok`` operation and the first of the next) that go
  backwards or stay, or that jump over values of the version order. A rebalance of the key during
  the operation, or a ``reset``, clears what the process last read there: a new owner of a
  partition starts from the group's committed offset, which is not the previous reader's position.
* ``unseen``: an acknowledged, committed value that no poll ever returned (after the final reads).

And three more that the workload makes checkable:

* ``precommitted-read``: a transaction read a value it wrote itself (uncommitted at the time).
* ``duplicate-consume``: one value consumed by two committed transactions of one consumer group
  (KIP-447 exactly-once: the offsets commit with the transaction, fenced by the group generation).
* ``garbage-read``: a poll returned a value no client ever sent.

And one for the storage faults (issue 34): a ``damage`` entry of the history (``value``: key,
first, last, at; the chaos nemesis's bit flip: that batch of the log fails its CRC from time
``at`` on) gives up the batch's values (never ``lost-write`` or ``unseen``), and

* ``corrupt-read``: a poll returned an offset of a damaged batch after the damage, with a value
  other than the one sent there, or completing more than ``DAMAGE_SLACK_S`` after it (a consumer
  may still hand out what it fetched before; later, the appliance served a batch whose CRC fails).

And the power cut (issue 34): ``power-cut`` entries (the cut's time, the flush policy, each
partition's recovered log end) let ``queue_power_cuts`` rewrite the history first, as the policy's
promise allows: under ``batch`` and ``interval`` nothing changes (nothing acknowledged may be
lost); under ``os`` what a cut took is moved aside and what survived must be a gapless prefix
(that module's docstring has the rules). The stats report the acknowledged values each cut took.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import queue_power_cuts

ANOMALIES = (
    "lost-write", "duplicate", "G1a", "G1b", "G1c", "nonmonotonic-send", "nonmonotonic-poll",
    "poll-skip", "inconsistent-offsets", "unseen",
    "precommitted-read", "duplicate-consume", "garbage-read", "corrupt-read",
)
DAMAGE_SLACK_S = 35.0    # the fetchers' 30 s trust of a checked range, and a consumer's prefetch
DESCRIPTIONS = {
    "lost-write": "lost write: committed value never read, though a reader read past it",
    "duplicate": "duplicate: one value at two offsets",
    "G1a": "aborted read (G1a): value of an aborted transaction read",
    "G1b": "intermediate read (G1b): part of a committed transaction read past its span",
    "G1c": "cyclic information flow (G1c): write->read cycle between transactions",
    "nonmonotonic-send": "nonmonotonic send: a process's sends to a key out of log order",
    "nonmonotonic-poll": "nonmonotonic poll: a process's reads of a key went backwards",
    "poll-skip": "poll skip: a process's reads of a key jumped over values",
    "inconsistent-offsets": "inconsistent offsets: two values at one offset",
    "unseen": "unseen: committed value never polled by the end",
    "precommitted-read": "precommitted read: a transaction read its own uncommitted write",
    "duplicate-consume": "duplicate consume: a value consumed by two committed transactions of a group",
    "garbage-read": "garbage read: a value no client sent",
    "corrupt-read": "corrupt read: a record of a damaged batch delivered after the damage",
}

Op = dict[str, Any]


# -- micro-op access --------------------------------------------------------------------------
def op_writes(op: Op) -> dict[str, list[tuple[int | None, Any]]]:
    """key -> [(offset or None, value)] sent by the operation, in order."""
    out: dict[str, list[tuple[int | None, Any]]] = {}
    if op.get("f") not in ("txn", "send"):
        return out
    for mop in op.get("value") or ():
        if mop[0] == "send":
            _, k, (offset, v) = mop
            out.setdefault(k, []).append((offset, v))
    return out


def op_reads(op: Op) -> dict[str, list[tuple[int, Any]]]:
    """key -> [(offset, value)] polled by the operation, in order."""
    out: dict[str, list[tuple[int, Any]]] = {}
    if op.get("f") not in ("txn", "poll"):
        return out
    for mop in op.get("value") or ():
        if mop[0] == "poll":
            for k, pairs in mop[1].items():
                out.setdefault(k, []).extend((o, v) for o, v in pairs)
    return out


@dataclass
class VersionOrder:
    """One key's log as observed: offset -> values, and the dense index of each value."""

    log: dict[int, set] = field(default_factory=dict)
    by_index: list = field(default_factory=list)
    first_index: dict = field(default_factory=dict)
    last_index: dict = field(default_factory=dict)
    offsets_of: dict = field(default_factory=dict)

    def finish(self) -> None:
        for i, offset in enumerate(sorted(self.log)):
            values = sorted(self.log[offset], key=repr)
            self.by_index.append(values[0])
            for v in values:
                self.first_index.setdefault(v, i)
                self.last_index[v] = i
                self.offsets_of.setdefault(v, []).append(offset)


@dataclass
class Result:
    cases: dict[str, list[dict]] = field(default_factory=lambda: {a: [] for a in ANOMALIES})
    stats: dict[str, int] = field(default_factory=dict)
    power_cuts: list[str] = field(default_factory=list)     # queue_power_cuts.summary_lines

    @property
    def counts(self) -> dict[str, int]:
        return {a: len(self.cases[a]) for a in ANOMALIES}

    @property
    def valid(self) -> bool:
        return not any(self.cases.values())

    def add(self, kind: str, **case: Any) -> None:
        self.cases[kind].append(case)


class Analysis:
    applied: "queue_power_cuts.Applied"

    def __init__(self, history: Iterable[Op]) -> None:
        history = list(history)
        self.applied = queue_power_cuts.Applied(history, [], [], {})
        self.damage: dict[str, list[dict]] = defaultdict(list)
        for op in history:
            if op.get("f") == "damage":
                self.damage[op["value"]["key"]].append(op["value"])
        self.history = [op for op in history if op.get("f") in ("txn", "send", "poll", "reset")]
        self.ops = [op for op in self.history if op["f"] != "reset"]
        self.writes = [op_writes(op) for op in self.ops]
        self.reads = [op_reads(op) for op in self.ops]
        self.index_of = {id(op): i for i, op in enumerate(self.ops)}
        # key -> value -> position of the writing op in self.ops
        self.writer_of: dict[str, dict[Any, int]] = defaultdict(dict)
        for i, w in enumerate(self.writes):
            for k, pairs in w.items():
                for _, v in pairs:
                    self.writer_of[k][v] = i
        # key -> every value any operation read
        self.read_values: dict[str, set] = defaultdict(set)
        for r in self.reads:
            for k, pairs in r.items():
                self.read_values[k].update(v for _, v in pairs)
        self.committed = [self._must_have_committed(i) for i in range(len(self.ops))]
        self.orders: dict[str, VersionOrder] = defaultdict(VersionOrder)
        for i, op in enumerate(self.ops):
            if self.committed[i]:
                for k, pairs in self.writes[i].items():
                    for offset, v in pairs:
                        if offset is not None and offset >= 0:
                            self.orders[k].log.setdefault(offset, set()).add(v)
            for k, pairs in self.reads[i].items():
                for offset, v in pairs:
                    self.orders[k].log.setdefault(offset, set()).add(v)
        for vo in self.orders.values():
            vo.finish()

    def _must_have_committed(self, i: int) -> bool:
        """ok, or info with a value that some poll returned (Jepsen's must-have-committed?)."""
        t = self.ops[i]["type"]
        if t == "ok":
            return True
        if t != "info":
            return False
        return any(v in self.read_values.get(k, ()) for k, pairs in self.writes[i].items() for _, v in pairs)

    def damaged(self, k: str, offset: int | None) -> dict | None:
        """The damage entry whose batch holds ``offset`` of key ``k``, if any."""
        if offset is None:
            return None
        return next((d for d in self.damage.get(k, ()) if d["first"] <= offset <= d["last"]), None)

    def index(self, k: str, v: Any) -> int | None:
        vo = self.orders.get(k)
        return None if vo is None else vo.first_index.get(v)


def _brief(op: Op) -> dict:
    return {"process": op.get("process"), "type": op.get("type"), "f": op.get("f"),
            "time": op.get("time")}


def check(history: Iterable[Op]) -> Result:
    applied = queue_power_cuts.apply(list(history))
    a = Analysis(applied.history)
    a.applied = applied
    res = Result()
    _version_order_errors(a, res)
    _aborted_and_garbage_reads(a, res)
    _lost_writes(a, res)
    _unseen(a, res)
    _intermediate_reads(a, res)
    _cycles(a, res)
    _precommitted_reads(a, res)
    _nonmonotonic_sends(a, res)
    _poll_order(a, res)
    _duplicate_consumes(a, res)
    _corrupt_reads(a, res)
    res.power_cuts = queue_power_cuts.summary_lines(applied)
    res.stats = {
        "operations": len(a.ops),
        "committed": sum(1 for op, w in zip(a.ops, a.writes) if w and op["type"] == "ok"),
        "aborted": sum(1 for op, w in zip(a.ops, a.writes) if w and op["type"] == "fail"),
        "unknown": sum(1 for op, w in zip(a.ops, a.writes) if w and op["type"] == "info"),
        "values sent": sum(len(p) for w in a.writes for p in w.values()),
        "values read": sum(len(p) for r in a.reads for p in r.values()),
        "keys": len(a.orders),
    }
    if a.damage:
        res.stats["damaged batches"] = sum(len(d) for d in a.damage.values())
        res.stats["values given up (damaged)"] = sum(
            1 for w in a.writes for k, pairs in w.items() for o, _ in pairs if a.damaged(k, o))
    return res


def _version_order_errors(a: Analysis, res: Result) -> None:
    for k, vo in sorted(a.orders.items()):
        for offset in sorted(vo.log):
            if len(vo.log[offset]) > 1:
                res.add("inconsistent-offsets", key=k, offset=offset, values=sorted(vo.log[offset], key=repr))
        for v, offsets in vo.offsets_of.items():
            if len(offsets) > 1:
                res.add("duplicate", key=k, value=v, offsets=sorted(offsets))


def _aborted_and_garbage_reads(a: Analysis, res: Result) -> None:
    for i, op in enumerate(a.ops):
        for k, pairs in a.reads[i].items():
            for offset, v in pairs:
                w = a.writer_of.get(k, {}).get(v)
                if w is None:
                    res.add("garbage-read", key=k, offset=offset, value=v, reader=_brief(op))
                elif a.ops[w]["type"] == "fail":
                    res.add("G1a", key=k, offset=offset, value=v, reader=_brief(op),
                            writer=_brief(a.ops[w]))


def _given_up_by_a_cut(k: str) -> bool:
    """A key that holds what an ``os`` power cut took (``queue_power_cuts``)."""
    return "~cut" in k


def _lost_writes(a: Analysis, res: Result) -> None:
    for k, vo in sorted(a.orders.items()):
        read = a.read_values.get(k, set())
        bound = max((vo.first_index[v] for v in read if v in vo.first_index), default=-1)
        if bound < 0:
            continue
        for v, last in vo.last_index.items():
            if last > bound or v in read or any(a.damaged(k, o) for o in vo.offsets_of[v]):
                continue
            w = a.writer_of.get(k, {}).get(v)
            if w is not None and a.committed[w] and not _given_up_by_a_cut(k):
                res.add("lost-write", key=k, value=v, index=vo.first_index[v], offsets=vo.offsets_of[v],
                        max_read_index=bound, writer=_brief(a.ops[w]))


def _unseen(a: Analysis, res: Result) -> None:
    for i, op in enumerate(a.ops):
        if op["type"] != "ok":
            continue
        for k, pairs in a.writes[i].items():
            for offset, v in pairs:
                if v not in a.read_values.get(k, ()) and not a.damaged(k, offset) \
                        and not _given_up_by_a_cut(k):
                    res.add("unseen", key=k, value=v, offset=offset, writer=_brief(op))


def _read_segments(a: Analysis):
    """Per process and key, the maximal runs of reads not broken by a rebalance of the key or a
    reset: yields (process, key, [(offset, value)])."""
    current: dict[tuple[str, str], list] = {}
    done: list[tuple[str, str, list]] = []

    def close(p: str, keys: Iterable[str] | None) -> None:
        for pk in [pk for pk in current if pk[0] == p and (keys is None or pk[1] in keys)]:
            done.append((pk[0], pk[1], current.pop(pk)))

    for op in a.history:
        p = op.get("process")
        if op["f"] == "reset":
            close(p, None if op.get("value") is None else set(op["value"]))
            continue
        if op.get("rebalance"):
            close(p, set(op["rebalance"]))
        for k, pairs in a.reads[a.index_of[id(op)]].items():
            current.setdefault((p, k), []).extend(pairs)
    close_all = list(current)
    for pk in close_all:
        done.append((pk[0], pk[1], current.pop(pk)))
    return done


def _intermediate_reads(a: Analysis, res: Result) -> None:
    # A committed transaction's writes per key, with known offsets, when it wrote 2+ values there.
    spans: dict[str, list[tuple[int, int, set, int]]] = defaultdict(list)
    for i, op in enumerate(a.ops):
        if not a.committed[i]:
            continue
        for k, pairs in a.writes[i].items():
            offsets = [o for o, _ in pairs if o is not None and o >= 0]
            if len(pairs) >= 2 and len(offsets) == len(pairs):
                spans[k].append((min(offsets), max(offsets), {v for _, v in pairs}, i))
    for p, k, seg in _read_segments(a):
        if not seg or k not in spans:
            continue
        lo, hi = min(o for o, _ in seg), max(o for o, _ in seg)
        seen = {v for _, v in seg}
        for first, last, values, w in spans[k]:
            if lo <= first and last <= hi:
                got = values & seen
                if got and got != values:
                    res.add("G1b", key=k, process=p, read=sorted(got, key=repr),
                            missed=sorted(values - got, key=repr), writer=_brief(a.ops[w]))


def _cycles(a: Analysis, res: Result) -> None:
    """Strongly connected components of the write->read graph between committed operations."""
    edges: dict[int, set[int]] = defaultdict(set)
    for i, r in enumerate(a.reads):
        if not a.committed[i]:
            continue
        for k, pairs in r.items():
            for _, v in pairs:
                w = a.writer_of.get(k, {}).get(v)
                if w is not None and w != i and a.committed[w]:
                    edges[w].add(i)
    for comp in _sccs(edges):
        if len(comp) > 1:
            res.add("G1c", operations=[_brief(a.ops[i]) for i in sorted(comp)])


def _sccs(edges: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative (histories are long)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in list(edges):
        if root in index:
            continue
        work = [(root, iter(edges.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, ()))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                out.append(comp)
    return out


def _precommitted_reads(a: Analysis, res: Result) -> None:
    for i, op in enumerate(a.ops):
        for k, pairs in a.reads[i].items():
            mine = {v for _, v in a.writes[i].get(k, ())}
            for offset, v in pairs:
                if v in mine:
                    res.add("precommitted-read", key=k, value=v, offset=offset, op=_brief(op))


def _nonmonotonic_sends(a: Analysis, res: Result) -> None:
    last: dict[tuple[str, str], Any] = {}
    for i, op in enumerate(a.ops):
        if not a.committed[i]:
            continue
        p = op.get("process")
        for k, pairs in a.writes[i].items():
            for _, v in pairs:
                prev = last.get((p, k))
                last[(p, k)] = v
                if prev is None:
                    continue
                i1, i2 = a.index(k, prev), a.index(k, v)
                if i1 is not None and i2 is not None and i2 <= i1:
                    res.add("nonmonotonic-send", key=k, process=p, values=[prev, v], delta=i2 - i1,
                            op=_brief(op))


def _poll_order(a: Analysis, res: Result) -> None:
    last: dict[tuple[str, str], Any] = {}
    for op in a.history:
        p = op.get("process")
        if op["f"] == "reset":
            keys = op.get("value")
            for pk in [pk for pk in last if pk[0] == p and (keys is None or pk[1] in keys)]:
                del last[pk]
            continue
        rebalanced = set(op.get("rebalance") or ())
        for k in rebalanced:
            last.pop((p, k), None)
        reads = a.reads[a.index_of[id(op)]]
        for k, pairs in reads.items():
            prev = last.get((p, k))
            for _, v in pairs:
                if prev is not None and k not in rebalanced:
                    _compare_reads(a, res, p, k, prev, v, op)
                prev = v
            if op["type"] == "ok" and pairs:
                last[(p, k)] = pairs[-1][1]


def _compare_reads(a: Analysis, res: Result, p: str, k: str, v1: Any, v2: Any, op: Op) -> None:
    i1, i2 = a.index(k, v1), a.index(k, v2)
    if i1 is None or i2 is None:
        return
    delta = i2 - i1
    if delta > 1:
        vo = a.orders[k]
        res.add("poll-skip", key=k, process=p, values=[v1, v2], delta=delta,
                skipped=vo.by_index[i1 + 1:i2][:8], op=_brief(op))
    elif delta < 1:
        res.add("nonmonotonic-poll", key=k, process=p, values=[v1, v2], delta=delta, op=_brief(op))


def _duplicate_consumes(a: Analysis, res: Result) -> None:
    consumed: dict[tuple[str, str, Any], list[int]] = defaultdict(list)
    for i, op in enumerate(a.ops):
        if op["f"] != "txn" or op["type"] != "ok" or not op.get("group"):
            continue
        for k, pairs in a.reads[i].items():
            for _, v in pairs:
                consumed[(op["group"], k, v)].append(i)
    for (g, k, v), readers in consumed.items():
        if len(readers) > 1:
            case = dict(group=g, key=k, value=v, readers=[_brief(a.ops[i]) for i in readers])
            if not a.applied.exempt_duplicate_consume(case):
                res.add("duplicate-consume", **case)


def _corrupt_reads(a: Analysis, res: Result) -> None:
    if not a.damage:
        return
    sent_at: dict[tuple[str, Any], int] = {}
    for i, w in enumerate(a.writes):
        for k, pairs in w.items():
            for offset, v in pairs:
                if offset is not None:
                    sent_at[(k, v)] = offset
    for i, op in enumerate(a.ops):
        t = op.get("time", 0.0)
        for k, pairs in a.reads[i].items():
            for offset, v in pairs:
                d = a.damaged(k, offset)
                if d is None or t < d["at"]:
                    continue
                known = sent_at.get((k, v))
                bad_value = a.writer_of.get(k, {}).get(v) is None or (known is not None and known != offset)
                if bad_value or t > d["at"] + DAMAGE_SLACK_S:
                    res.add("corrupt-read", key=k, offset=offset, value=v, damage=d, reader=_brief(op))


def summary(res: Result) -> str:
    width = max(len(a) for a in ANOMALIES)
    lines = [f"  {a:<{width}}  {len(res.cases[a]):>6}   {DESCRIPTIONS[a].split(':', 1)[1].strip()}"
             for a in ANOMALIES]
    lines += [f"  {line}" for line in res.power_cuts]
    return "\n".join(lines)
