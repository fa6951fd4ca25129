"""What a power cut may lose under each flush policy, applied to a chaos history before the queue
check (issue 34). Pure Python; called by ``queue_checker.check`` in the chaos tool's process.

A ``power-cut`` entry of the history (the chaos nemesis's, one per cut) says when the power went
(``at``), when the appliance served again (``ready``), the flush policy, and each partition's log
end after recovery (``ends``, from the writers' "ready: log start S, log end E" lines):

    {"process": "nemesis", "type": "ok", "f": "power-cut", "time": at,
     "value": {"at": 12.3, "ready": 15.9, "policy": "os", "ends": {"chaos-0": 1059, ...}}}

The promises (README "Durability"; the chaos workload's producers are transactional, so acks=all):

* ``batch`` and ``interval``: acks=all is answered after an fdatasync that covers the batch (and
  the coordinator's logs are synced), so nothing acknowledged may be lost: the history is checked
  unchanged, every class as without cuts. The measured loss (below) must be zero.
* ``os`` (Kafka's default): no fsync at all; a cut loses what the kernel had not written back,
  and what survives must be a consistent prefix per partition. So, per cut and key, every value
  sent before the cut at an offset at or past the recovered log end is *lost by the cut*: it is
  moved to a key of its own (``<key>~cut<n>``), which keeps the checks among what was read before
  the cut (no value of two offsets, no aborted read, ...) but is not held to lost-write or unseen,
  and which keeps the offsets the log hands out again after the restart from looking like two
  values at one offset. What stays in the key (below the recovered end) is checked as usual: a
  value missing there is a gap (lost-write or unseen). Every client's read position is anyone's
  after the cut (a position past the recovered end is reset; a group's committed offsets may be
  lost): a ``reset`` of every process at the cut, and the operations that complete while the
  appliance comes back (``RECOVERY_WINDOW_S`` after ``ready``) count as rebalances of their keys.
  A value consumed by a committed transaction before the cut and again after it is not a
  duplicate-consume (the group's offset commit may be lost with the cut); nor is a committed value
  of the cut's era that the final read_committed reader did not get but that the final
  read_uncommitted read found in the log (``log`` entries): its commit marker was lost, and the
  transaction aborted after the restart (readers before the cut may have read it committed). A committed value missing from the log below the recovered end is a gap. A value whose sending transaction spans the cut, at or past the
  end, may be either the lost one or a new one at a reused offset: given up, like a damaged batch.

``measure`` reports, per policy, the acknowledged (committed) values lost by cuts and the worst
loss in milliseconds of acks (the cut's time minus the completion of the oldest operation whose
value was lost: a lower bound of the ack's age).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Op = dict[str, Any]

LOSSY_POLICIES = {"os"}
RECOVERY_WINDOW_S = 10.0      # after ``ready``: reads may still come from before the cut
START_UNKNOWN_S = 30.0        # an operation without "start": it may have begun this long before


@dataclass
class Cut:
    n: int
    at: float
    ready: float
    policy: str
    ends: dict[str, int]


def cuts_of(history: list[Op]) -> list[Cut]:
    raw = sorted((op["value"] for op in history if op.get("f") == "power-cut"), key=lambda v: v["at"])
    return [Cut(i, v["at"], v.get("ready", v["at"]), v.get("policy", "batch"), dict(v.get("ends") or {}))
            for i, v in enumerate(raw)]


def _writes(op: Op):
    if op.get("f") not in ("txn", "send"):
        return
    for j, mop in enumerate(op.get("value") or ()):
        if mop[0] == "send":
            yield j, mop[1], mop[2][0], mop[2][1]


def _fate(op: Op, key: str, offset: int | None, cuts: list[Cut]) -> tuple[Cut, str] | None:
    """(cut, "lost" | "ambiguous") when a cut took this value, else None."""
    if offset is None or offset < 0:
        return None
    end_t = op.get("time", 0.0)
    start_t = op.get("start", end_t - START_UNKNOWN_S)
    for c in cuts:
        if start_t > c.at:
            continue                     # begun after this cut: the next one decides
        end = c.ends.get(key)
        if end is None or offset < end:
            return None                  # below the recovered end: it survived (durable since)
        return (c, "lost") if end_t < c.at else (c, "ambiguous")
    return None


@dataclass
class Applied:
    history: list[Op]
    cuts: list[Cut]
    lost: list[dict]              # acknowledged values the cuts took, with their age
    moved: dict[tuple[str, Any], str]   # (key, value) -> the key it was moved to

    def exempt_duplicate_consume(self, case: dict) -> bool:
        """A value re-consumed across an ``os`` cut (its group's offset commit may be lost)."""
        times = sorted(r.get("time") or 0.0 for r in case.get("readers") or ())
        return any(any(t1 < c.at < t2 for c in self.cuts if c.policy in LOSSY_POLICIES)
                   for t1, t2 in zip(times, times[1:]))


def apply(history: list[Op]) -> Applied:
    cuts = cuts_of(history)
    if not cuts:
        return Applied(history, [], [], {})
    lossy = [c for c in cuts if c.policy in LOSSY_POLICIES]
    if not lossy:
        return Applied(history, cuts, measure_lost(history, cuts), {})
    in_log = _pairs(history, ("log",))
    final = _pairs([op for op in history if op.get("process") == "final"], ("poll",))
    moved: dict[tuple[str, Any], str] = {}
    for op in history:
        for _, k, offset, v in _writes(op):
            fate = _fate(op, k, offset, lossy)
            if fate is not None:
                moved[(k, v)] = f"{k}~cut{fate[0].n}"
            elif op.get("type") in ("ok", "info") and (k, v) in in_log and (k, v) not in final:
                # In the log, but not returned to the final read_committed reader: a cut took
                # its commit marker and the transaction was aborted after the restart (by the
                # hanging-transaction watch, or never committed: info). Readers before the cut
                # may have read it committed. Out of the key's order: skipping it is legal.
                c = _era(op, lossy)
                if c is not None:
                    moved[(k, v)] = f"{k}~cut{c.n}-aborted"
    out: list[Op] = []
    processes = sorted({op.get("process") for op in history if op.get("f") in ("txn", "send", "poll")} - {None})
    pending = list(lossy)
    for op in history:
        while pending and op.get("time", 0.0) >= pending[0].at:
            c = pending.pop(0)
            out.extend({"process": p, "type": "ok", "f": "reset", "value": None, "time": c.at, "cut": c.n}
                       for p in processes)
        out.append(_moved_op(op, moved, lossy))
    for c in pending:
        out.extend({"process": p, "type": "ok", "f": "reset", "value": None, "time": c.at, "cut": c.n}
                   for p in processes)
    return Applied(out, cuts, measure_lost(history, cuts), moved)


def _pairs(history: list[Op], fs: tuple[str, ...]) -> set:
    return {(k, pair[1]) for op in history if op.get("f") in fs
            for mop in op.get("value") or () if mop[0] == "poll" for k, pairs in mop[1].items() for pair in pairs}


def _era(op: Op, cuts: list[Cut]) -> Cut | None:
    """The cut that ended the era the operation completed in (after the previous one's ready)."""
    t = op.get("time", 0.0)
    prev = 0.0
    for c in cuts:
        if prev <= t < c.at:
            return c
        prev = c.ready
    return None


def _moved_op(op: Op, moved: dict, cuts: list[Cut]) -> Op:
    if op.get("f") not in ("txn", "send", "poll"):
        return op
    value = []
    changed = False
    keys: set[str] = set()
    for mop in op.get("value") or ():
        if mop[0] == "send":
            k2 = moved.get((mop[1], mop[2][1]))
            if k2 is not None:
                changed = True
                value.append(["send", k2, mop[2]])
                continue
            value.append(mop)
        elif mop[0] == "poll":
            reads: dict[str, list] = {}
            for k, pairs in mop[1].items():
                keys.add(k)
                for pair in pairs:
                    k2 = moved.get((k, pair[1]), k)
                    changed = changed or k2 != k
                    reads.setdefault(k2, []).append(pair)
            value.append(["poll", reads])
        else:
            value.append(mop)
    t = op.get("time", 0.0)
    recovering = any(c.at <= t <= c.ready + RECOVERY_WINDOW_S for c in cuts)
    if not changed and not recovering:
        return op
    new = dict(op, value=value)
    if recovering:
        new["rebalance"] = sorted(set(op.get("rebalance") or ()) | keys | {k for r in value if r[0] == "poll" for k in r[1]})
    return new


def measure_lost(history: list[Op], cuts: list[Cut]) -> list[dict]:
    """The committed (``ok``) values each cut took: sent before it, at or past its recovered end."""
    lost = []
    for op in history:
        if op.get("type") != "ok":
            continue
        for _, k, offset, v in _writes(op):
            fate = _fate(op, k, offset, cuts)
            if fate is not None and fate[1] == "lost":
                c = fate[0]
                lost.append({"cut": c.n, "policy": c.policy, "key": k, "offset": offset, "value": v,
                             "age_ms": round((c.at - op.get("time", 0.0)) * 1000)})
    return lost


def summary_lines(applied: Applied) -> list[str]:
    if not applied.cuts:
        return []
    by_policy: dict[str, list[dict]] = {}
    for x in applied.lost:
        by_policy.setdefault(x["policy"], []).append(x)
    lines = []
    for policy in sorted({c.policy for c in applied.cuts}):
        n = sum(1 for c in applied.cuts if c.policy == policy)
        xs = by_policy.get(policy, [])
        per_cut: dict[int, int] = {}
        for x in xs:
            per_cut[x["cut"]] = per_cut.get(x["cut"], 0) + 1
        worst = max((x["age_ms"] for x in xs), default=0)
        lines.append(f"power cuts ({policy}) {n}: acknowledged committed values lost {len(xs)} "
                     f"(worst cut {max(per_cut.values(), default=0)}), oldest lost ack >= {worst} ms before its cut")
    return lines
