"""Read-only queries over the transaction coordinator's metadata: ListTransactions,
DescribeTransactions, and the KIP-939 metric ActiveTransactionOpenTimeMaxMs.

Runs in the coordinator worker, called by ``TransactionCoordinator`` with its cache; owns no state.
The answers are the ring result types of ``appliance.txn.messages``.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from appliance.errors import ErrorCode
from appliance.txn.messages import ListTransactionsResult, TxnDescription, TxnListing
from appliance.txn.metadata import TransactionMetadata, TransactionState

E = ErrorCode
S = TransactionState


def list_transactions(txns: Iterable[TransactionMetadata], now: int, state_filters: Iterable[str] = (),
                      producer_id_filters: Iterable[int] = (), duration_filter_ms: int = -1,
                      transactional_id_pattern: str | None = None) -> ListTransactionsResult:
    """ListTransactions v0-2 (Kafka's listTransactionStates). Unknown state names come back
    in unknown_state_filters; Dead is never listed; the duration filter keeps transactions
    running longer than it (now - start > duration). v2's pattern is matched against the
    whole id (Java's Matcher.matches) with Python's re."""
    wanted: set[TransactionState] = set()
    unknown: list[str] = []
    names = list(state_filters)
    for name in names:
        st = TransactionState.from_name(name)
        if st is None:
            unknown.append(name)
        else:
            wanted.add(st)
    pids = set(producer_id_filters)
    pattern = None
    if transactional_id_pattern:
        try:
            pattern = re.compile(transactional_id_pattern)
        except re.error:
            return ListTransactionsResult(E.invalid_regular_expression, [], [])
    out = []
    for md in txns:
        if md.state == S.Dead:
            continue
        if pids and md.producer_id not in pids:
            continue
        if names and md.state not in wanted:
            continue
        if duration_filter_ms >= 0 and now - md.txn_start_ms <= duration_filter_ms:
            continue
        if pattern is not None and not pattern.fullmatch(md.transactional_id):
            continue
        out.append(TxnListing(md.transactional_id, md.producer_id, md.state.name))
    return ListTransactionsResult(E.none, unknown, out)


def describe_transactions(txns: Mapping[str, TransactionMetadata], transactional_ids: Iterable[str],
                          gate: ErrorCode | None) -> list[TxnDescription]:
    """DescribeTransactions v0 (Kafka's handleDescribeTransactions), one entry per id; ``gate``
    is the coordinator's answer to everything while it cannot serve (loading, fenced)."""
    out = []
    for tid in transactional_ids:
        if gate is not None:
            out.append(TxnDescription(gate, tid))
            continue
        if not tid:
            out.append(TxnDescription(E.invalid_request, tid))
            continue
        md = txns.get(tid)
        if md is None or md.state == S.Dead:
            out.append(TxnDescription(E.transactional_id_not_found, tid))
            continue
        out.append(TxnDescription(E.none, tid, md.state.name, md.txn_timeout_ms, md.txn_start_ms,
                                  md.producer_id, md.producer_epoch, sorted(md.partitions)))
    return out


def active_transaction_open_time_max_ms(txns: Iterable[TransactionMetadata], now: int) -> int:
    """KIP-939's ActiveTransactionOpenTimeMaxMs: the longest any currently open transaction
    (Ongoing, or Prepare* with markers still being written) has been open, 0 when none is.
    A walk over every transaction, as the KIP proposes: cheap at this size, and the metric is
    read about once a second."""
    longest = 0
    for md in txns:
        if (md.state == S.Ongoing or md.state.is_prepare) and md.txn_start_ms >= 0:
            longest = max(longest, now - md.txn_start_ms)
    return longest
