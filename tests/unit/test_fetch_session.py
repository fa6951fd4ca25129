"""appliance.fetch_session: KIP-227's session cache, as Kafka's FetchManager decides."""

from __future__ import annotations

import random
import uuid
from types import SimpleNamespace as NS

from appliance.errors import ErrorCode
from appliance.fetch_session import (EVICTION_MS, FetchSessionCache, answer_incremental,
                                     next_epoch)

T = uuid.UUID(int=7)


def part(p, offset=0, max_bytes=1 << 20):
    return NS(partition=p, fetch_offset=offset, partition_max_bytes=max_bytes)


def answer(p, records=(), hw=10, lso=0, error=0):
    return NS(partition_index=p, records=list(records), high_watermark=hw, log_start_offset=lso,
              error_code=error)


def full(cache, n, now=0.0, version=17):
    fetch = {(T, p): part(p) for p in range(n)}
    ctx = cache.context(0, 0, version, fetch, [], now)
    assert ctx.create and ctx.session is None and not ctx.error
    sid = cache.create(version, [(k, fetch[k], answer(k[1])) for k in fetch], now)
    return sid


def test_a_full_fetch_at_epoch_0_gets_a_session_and_its_first_incremental_reads_every_partition():
    cache = FetchSessionCache(10, rng=random.Random(1))
    sid = full(cache, 3)
    assert sid > 0 and cache.sessions[sid].epoch == 1
    ctx = cache.context(sid, 1, 17, {}, [], 1.0)
    assert not ctx.error and ctx.session is cache.sessions[sid]
    assert list(ctx.partitions) == [(T, 0), (T, 1), (T, 2)]
    assert cache.sessions[sid].epoch == 2


def test_an_incremental_answer_carries_only_partitions_with_records_or_changes_and_rotates_them():
    cache = FetchSessionCache(10)
    sid = full(cache, 4)
    ctx = cache.context(sid, 1, 17, {}, [], 1.0)
    answered = [((T, 0), answer(0)), ((T, 1), answer(1, records=[b"x"])),
                ((T, 2), answer(2, hw=11)), ((T, 3), answer(3, lso=5))]
    assert answer_incremental(ctx, answered) == {(T, 1), (T, 2), (T, 3)}
    # Sent partitions go to the end, in the order they were sent: unsent ones are read first.
    assert list(cache.sessions[sid].partitions) == [(T, 0), (T, 1), (T, 2), (T, 3)]
    ctx = cache.context(sid, 2, 17, {}, [], 2.0)
    assert answer_incremental(ctx, [((T, p), answer(p, hw=11 if p == 2 else 10,
                                                      lso=5 if p == 3 else 0))
                                    for p in range(4)]) == set()
    ctx = cache.context(sid, 3, 17, {}, [], 3.0)
    assert answer_incremental(ctx, [((T, 0), answer(0, records=[b"y"]))]) == {(T, 0)}
    assert list(cache.sessions[sid].partitions) == [(T, 1), (T, 2), (T, 3), (T, 0)]


def test_an_error_is_always_answered_and_its_partition_answered_again_when_it_goes_away():
    cache = FetchSessionCache(10)
    sid = full(cache, 1)
    for epoch, a, sent in ((1, answer(0, hw=-1, error=6), True), (2, answer(0, hw=-1, error=6), True),
                           (3, answer(0), True), (4, answer(0), False)):
        ctx = cache.context(sid, epoch, 17, {}, [], float(epoch))
        assert bool(answer_incremental(ctx, [((T, 0), a)])) is sent, epoch


def test_a_peek_for_a_throttled_answer_changes_nothing():
    cache = FetchSessionCache(10)
    sid = full(cache, 2)
    ctx = cache.context(sid, 1, 17, {}, [], 1.0)
    answered = [((T, 0), answer(0, hw=12)), ((T, 1), answer(1))]
    assert answer_incremental(ctx, answered, update=False) == {(T, 0)}
    assert answer_incremental(ctx, answered, update=False) == {(T, 0)}
    assert list(cache.sessions[sid].partitions) == [(T, 0), (T, 1)]


def test_incremental_fetches_add_update_and_forget_partitions():
    cache = FetchSessionCache(10)
    sid = full(cache, 2)
    ctx = cache.context(sid, 1, 17, {(T, 1): part(1, offset=40), (T, 5): part(5, offset=3)},
                        [(T, 0)], 1.0)
    s = cache.sessions[sid]
    assert list(ctx.partitions) == [(T, 1), (T, 5)]
    assert (s.partitions[(T, 1)].fetch_offset, s.partitions[(T, 5)].fetch_offset) == (40, 3)
    # A new partition has told the client nothing yet: its first answer carries it.
    assert s.partitions[(T, 5)].high_watermark == -1
    # Forgetting every partition ends the session (Kafka: a sessionless answer of the request).
    ctx = cache.context(sid, 2, 17, {}, [(T, 1), (T, 5)], 2.0)
    assert ctx.session is None and not ctx.create and sid not in cache.sessions


def test_unknown_sessions_wrong_epochs_and_mixed_topic_keys_are_kafkas_errors():
    cache = FetchSessionCache(10)
    sid = full(cache, 1)
    assert cache.context(sid + 1, 1, 17, {}, [], 1.0).error == ErrorCode.fetch_session_id_not_found
    assert cache.context(0, 3, 17, {}, [], 1.0).error == ErrorCode.fetch_session_id_not_found
    assert cache.context(sid, 2, 17, {}, [], 1.0).error == ErrorCode.invalid_fetch_session_epoch
    assert cache.context(sid, 1, 12, {}, [], 1.0).error == ErrorCode.fetch_session_topic_id_error
    # None of these moved the session's epoch.
    assert not cache.context(sid, 1, 17, {}, [], 1.0).error


def test_a_full_fetch_closes_the_session_it_names_and_epoch_minus_1_asks_for_none():
    cache = FetchSessionCache(10)
    sid = full(cache, 1)
    ctx = cache.context(sid, -1, 17, {(T, 0): part(0)}, [], 1.0)
    assert not ctx.create and ctx.session is None and sid not in cache.sessions
    sid = full(cache, 1)
    ctx = cache.context(sid, 0, 17, {(T, 0): part(0)}, [], 1.0)
    assert ctx.create and sid not in cache.sessions
    # Before v7 there are no sessions; nor with no slots.
    assert not cache.context(0, 0, 6, {(T, 0): part(0)}, [], 1.0).create
    assert not FetchSessionCache(0).context(0, 0, 17, {(T, 0): part(0)}, [], 1.0).create


def test_a_full_cache_evicts_a_stale_session_or_a_smaller_one_else_answers_no_session():
    cache = FetchSessionCache(2)
    small, big = full(cache, 1, now=0.0), full(cache, 5, now=1000.0)
    assert full(cache, 1, now=2000.0) == 0                   # not larger than the smallest
    assert set(cache.sessions) == {small, big} and cache.evictions == 0
    third = full(cache, 3, now=3000.0)                       # larger than the smallest: evicts it
    assert third and set(cache.sessions) == {big, third} and cache.evictions == 1
    fourth = full(cache, 1, now=1000.0 + EVICTION_MS + 1)    # big unused too long: stale
    assert fourth and set(cache.sessions) == {third, fourth} and cache.evictions == 2
    assert cache.partitions_cached() == 4


def test_session_ids_are_positive_unique_and_carry_the_frontends_index():
    caches = [FetchSessionCache(100, index=i, frontends=3, rng=random.Random(5)) for i in range(3)]
    ids = [full(c, 1) for c in caches for _ in range(50)]
    assert len(set(ids)) == 150 and all(0 < i <= 0x7FFFFFFF for i in ids)
    assert all(i % 3 == n // 50 for n, i in enumerate(ids))


def test_epochs_wrap_from_max_int_to_1():
    assert (next_epoch(0), next_epoch(5), next_epoch(0x7FFFFFFF), next_epoch(-1)) == (1, 6, 1, -1)
