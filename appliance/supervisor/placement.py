"""Where a partition's writer runs: the placement of partitions on writer processes (issue 32,
docs/architecture.md "Writer processes and their rings").

Runs in the supervisor only; sans-IO: ``place`` takes the processes' partition counts and returns
where each new partition goes, and the supervisor carries that out (rings, pages, forks, the
published assignment).

The policy, with B the process budget (``topics.writer_processes``; 0: four per core, at least
four) and K ``topics.partitions_per_writer``:

- K = 1 (the default): while there are fewer writer processes than B, a new partition gets a
  process of its own (the card's shape, best fault isolation); past B, it joins the process that
  carries the fewest partitions. A catalog laid out from scratch (a start) is thus one partition
  per process up to B partitions, else spread evenly over B processes, partitions of a topic on
  different processes (its traffic over the cores).
- K > 1 (explicit writer hosts): a process carries up to K partitions, a new process is added
  when every process has K; the budget does not apply.
"""

from __future__ import annotations

import os

__all__ = ["process_budget", "place", "NEW"]

NEW = None      # ``place``'s answer for "a new process"


def process_budget(configured: int, cores: int | None = None) -> int:
    """``topics.writer_processes``, 0 meaning four per core, at least four."""
    if configured > 0:
        return configured
    return max(4, 4 * (cores or os.cpu_count() or 1))


def place(counts: dict[str, int], n: int, budget: int, per_writer: int = 1) -> list[str | None]:
    """Where each of ``n`` new partitions goes, given the partitions each existing process
    carries (``counts``, updated in place, new processes under the keys ``new0``, ``new1`` ...,
    which the caller names). Returns, in order, the process of each: an existing name, or one of
    the ``newN`` keys."""
    out: list[str | None] = []
    fresh = 0
    for _ in range(n):
        if per_writer > 1:
            open_ = [p for p, c in counts.items() if c < per_writer]
            if open_:
                target = min(open_, key=lambda p: (counts[p], p))
            else:
                target = f"new{fresh}"
                fresh += 1
        elif len(counts) < budget:
            target = f"new{fresh}"
            fresh += 1
        else:
            target = min(counts, key=lambda p: (counts[p], p))
        counts[target] = counts.get(target, 0) + 1
        out.append(target)
    return out
