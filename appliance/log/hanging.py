"""HangingWatch: transactions a partition found open when it opened, and never saw end (issue 34).

Sans-IO; used by the partition's writer (``workers/partition_writer.py``: made at the open,
asked at every tick of the writer process, which writes the ABORT markers it names).

Why: a power cut under ``[log.flush] policy = "os"`` (no fsync, Kafka's default) can keep a
transaction's first batches in a partition while it takes the transaction's record from the
coordinator's log (and the marker from the partition): after the restart no coordinator knows the
transaction, nothing ever ends it, and the partition's last stable offset stays below it for ever
(read_committed consumers stop there: seen in the chaos suite, the LSO of a partition pinned at
the first cut's recovered end for the rest of the run). Kafka calls it a hanging transaction and
leaves it to the operator (kafka-transactions.sh find-hanging, then abort: ``appliance
transactions``). Its own rule for "hanging" is an open transaction older than
``transaction.max.timeout.ms`` (FindHangingTransactions): no live transaction lasts longer, the
coordinator aborts every one it knows at its timeout. This watch applies that rule to the
transactions found open at the open, with twice the bound: one open then, that has had neither a
new batch nor a marker for ``2 * max_timeout_ms`` since, is aborted by the writer itself (an
ABORT marker with the producer's epoch and coordinator epoch, as Admin.abortTransaction writes
it), with a warning naming it. A transaction begun after the open is the coordinator's to end.
Not with KIP-939 two-phase commit enabled: a prepared transaction may wait for its external
coordinator longer than any timeout.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["HangingWatch", "Hanging"]


class Hanging(NamedTuple):
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    first_offset: int
    open_s: float


class HangingWatch:
    def __init__(self, psm, now: float, limit_s: float, enabled: bool = True) -> None:
        """``psm``: the partition's ProducerStateManager just loaded; ``now``: monotonic seconds."""
        self.opened = now
        self.limit_s = limit_s
        # pid -> (first offset of its open transaction, its last offset): the transaction as found
        self.found: dict[int, tuple[int, int]] = {}
        if enabled:
            for pid, first in psm.open_transactions().items():
                e = psm.entries.get(pid)
                if e is not None:
                    self.found[pid] = (first, e.last_offset)

    def due(self, psm, now: float) -> list[Hanging]:
        """The transactions found open at the open, untouched since, open longer than the limit;
        each is named once (forgotten here whatever the caller does with it)."""
        if not self.found:
            return []
        out = []
        for pid, (first, last) in list(self.found.items()):
            e = psm.entries.get(pid)
            if e is None or e.txn_first_offset != first or e.last_offset != last:
                del self.found[pid]          # ended, or written to again: live after all
                continue
            if now - self.opened >= self.limit_s:
                del self.found[pid]
                out.append(Hanging(pid, e.epoch, e.coordinator_epoch, first, now - self.opened))
        return out
