"""Transactions while a cleaner round walks a log (Kafka's CleanedTransactionMetadata).

Owned by one cleaning round in a cleaner process. KIP-98, "Compacting Transactional Data": the
cleaner removes the data of aborted transactions, found through the aborted-transaction index the
way a read_committed consumer finds them; aborted data never enters the key map, so it never
makes a committed record look superseded; and a marker goes only once no data of its transaction
is left before it, so that no consumer can see aborted data without its ABORT marker.

The round hands it, in log order, every batch it reads (``on_batch``, ``on_control``) and the
aborted transactions of each segment before its batches (``add_aborted``):

- a data batch of an aborted transaction (one whose first offset has been reached and whose
  marker has not) can be discarded; it is remembered as seen;
- an ABORT marker can be discarded when no batch of its transaction was seen in this round; when
  one was, the marker stays and its entry goes into the cleaned segment's index
  (``cleaned_index``);
- a COMMIT marker can be discarded when no transactional batch of its producer was seen since
  the previous marker in this round (a data batch seen is one that stays, or will be looked at
  again by the next round);
- anything else (another control type, a non-transactional batch) stays as the rest decides.

Whether a discardable marker actually goes is decided by its delete horizon (KIP-534, see
``clean``).
"""

from __future__ import annotations

import heapq
from typing import Callable

from appliance.log.txn_index import AbortedTxn
from appliance.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, BatchHeader

__all__ = ["CleanedTransactionMetadata"]


class _Aborted:
    __slots__ = ("txn", "seen")

    def __init__(self, txn: AbortedTxn) -> None:
        self.txn = txn
        self.seen = False


class CleanedTransactionMetadata:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, AbortedTxn]] = []   # (first offset, tie, txn)
        self._tie = 0
        self._ongoing_aborted: dict[int, _Aborted] = {}
        self._ongoing_committed: set[int] = set()
        # Where the ABORT entries of retained markers go (the cleaned segment's index).
        self.cleaned_index: Callable[[AbortedTxn], None] | None = None

    def add_aborted(self, txns: list[AbortedTxn]) -> None:
        for t in txns:
            self._tie += 1
            heapq.heappush(self._heap, (t.first_offset, self._tie, t))

    def _reach(self, offset: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= offset:
            t = heapq.heappop(heap)[2]
            # The same transaction comes once per segment it spans: the first one counts.
            self._ongoing_aborted.setdefault(t.producer_id, _Aborted(t))

    def on_batch(self, h: BatchHeader) -> bool:
        """A data batch: True if it belongs to an aborted transaction (discard its records)."""
        self._reach(h.base_offset + h.last_offset_delta)
        if not h.is_transactional:
            return False
        a = self._ongoing_aborted.get(h.producer_id)
        if a is not None:
            a.seen = True
            return True
        self._ongoing_committed.add(h.producer_id)
        return False

    def on_control(self, h: BatchHeader, control_type: int | None) -> bool:
        """A control batch (``control_type`` None: its record was removed already): True if it
        may be discarded."""
        self._reach(h.base_offset + h.last_offset_delta)
        if control_type is None:
            return True            # an empty control batch: cleaned before, nothing to keep
        pid = h.producer_id
        if control_type == CONTROL_ABORT:
            a = self._ongoing_aborted.pop(pid, None)
            if a is not None and a.seen:
                if self.cleaned_index is not None:
                    self.cleaned_index(a.txn)
                return False
            return True
        if control_type == CONTROL_COMMIT:
            if pid in self._ongoing_committed:
                self._ongoing_committed.discard(pid)
                return False
            return True
        return False
