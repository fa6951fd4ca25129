"""GroupCommit (appliance/log/group_commit.py): when a writer's answers leave (after the publish,
after the fdatasync) and when a flush starts, under each flush policy; the flusher is a stand-in
with its two fields. No fork, no thread."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from appliance.config import FlushPolicy
from appliance.log.group_commit import GroupCommit

T = 500.0


def commit(policy: FlushPolicy, durable: int = 0, interval_s: float = 1.0) -> GroupCommit:
    c = GroupCommit(policy, interval_s, T)
    c.flusher = SimpleNamespace(durable=durable, busy=False)
    return c


@pytest.mark.parametrize("policy", list(FlushPolicy))
def test_an_appended_batchs_ack_leaves_after_the_publish(policy):
    c = commit(policy)
    c.appended("fe0", 1, 10, b"a1")
    c.appended("fe1", 0, 20, b"a0")                   # acks=0: no answer, but a publish
    assert c.publish_due and c.held == [("fe0", b"a1")] and c.waiting == []
    c.appended("fe0", -1, 30, b"all")
    if policy.ack_waits_for_sync:
        assert c.waiting == [(30, "fe0", b"all")] and len(c.held) == 1
    else:
        assert c.waiting == [] and c.held[-1] == ("fe0", b"all")


def test_an_answer_that_appended_nothing_keeps_the_order_of_the_held_acks():
    c = commit(FlushPolicy.BATCH, durable=50)
    assert c.reply("fe0", 1, 0, b"err") is True        # nothing held: post it now
    assert c.reply("fe0", 0, 0, b"err") is False       # acks=0: never
    c.appended("fe0", 1, 60, b"ok")
    assert c.reply("fe0", -1, 0, b"err2") is False     # behind the held ack
    assert c.held == [("fe0", b"ok"), ("fe0", b"err2")]
    # A duplicate whose original is not durable yet waits for the disk.
    assert c.reply("fe0", -1, 55, b"dup") is False and c.waiting == [(55, "fe0", b"dup")]


def test_the_group_commit_starts_a_flush_when_answers_wait_and_releases_them_when_durable():
    c = commit(FlushPolicy.BATCH)
    assert not c.flush_due(T, 10)                      # nobody waits
    c.appended("fe0", -1, 10, b"a")
    assert c.flush_due(T + 1, 10) and c.last_flush == T + 1
    c.flusher.busy = True
    c.appended("fe1", -1, 20, b"b")
    assert not c.flush_due(T + 2, 20)                  # one flush at a time
    c.flusher.busy, c.flusher.durable = False, 10
    assert c.durable_answers() == [("fe0", b"a")] and c.waiting == [(20, "fe1", b"b")]
    assert c.flush_due(T + 3, 20)                      # the next group
    c.flusher.durable = 20
    assert not c.flush_due(T + 4, 20)                  # nothing left to make durable
    assert c.durable_answers() == [("fe1", b"b")] and c.waiting == []
    assert c.flush_wait(T, 20) is None


def test_the_interval_policy_flushes_every_interval_and_says_when():
    c = commit(FlushPolicy.INTERVAL, interval_s=0.5)
    assert c.flush_wait(T + 0.2, 10) == pytest.approx(0.3)
    assert not c.flush_due(T + 0.2, 10)
    assert c.flush_due(T + 0.5, 10)                    # no answer waits: flushed anyway
    assert c.flush_wait(T + 0.6, 10) == pytest.approx(0.4)
    c.flusher.durable = 10
    assert c.flush_wait(T + 0.6, 10) is None           # all durable: no timer


def test_the_os_policy_never_flushes_nor_waits():
    c = commit(FlushPolicy.OS)
    c.appended("fe0", -1, 10, b"a")
    assert not c.flush_due(T + 100, 10) and c.flush_wait(T, 10) is None
    assert not c.must_wait(10)


def test_a_marker_answer_waits_for_the_disk_under_a_syncing_policy():
    c = commit(FlushPolicy.INTERVAL, durable=5)
    assert not c.must_wait(5) and c.must_wait(6)
    c.wait(6, "co", b"m")
    c.flusher.durable = 6
    assert c.durable_answers() == [("co", b"m")]


def test_a_reload_that_stops_syncing_flushes_what_was_promised_once():
    c = commit(FlushPolicy.BATCH)
    assert c.configure(FlushPolicy.INTERVAL, 2.0) is False      # still syncing
    assert c.interval_s == 2.0
    c.appended("fe0", -1, 10, b"a")
    assert c.configure(FlushPolicy.OS, 2.0) is True             # answers promised a sync
    assert c.configure(FlushPolicy.OS, 2.0) is False


def _settings(**kw):
    from appliance.topic_config import LogSettings
    return LogSettings(**kw)


def test_a_topics_flush_configs_choose_its_policy():
    from appliance.log.group_commit import NEVER, policy_of
    assert policy_of(_settings()) == (FlushPolicy.OS, 1.0, NEVER)
    assert policy_of(_settings(flush_messages=1))[0] is FlushPolicy.BATCH
    assert policy_of(_settings(flush_ms=0))[0] is FlushPolicy.BATCH
    assert policy_of(_settings(flush_ms=250)) == (FlushPolicy.INTERVAL, 0.25, NEVER)
    assert policy_of(_settings(flush_messages=100)) == (FlushPolicy.OS, 1.0, 100)


def test_flush_messages_starts_a_flush_once_that_many_records_wait_without_holding_acks():
    c = GroupCommit(FlushPolicy.OS, 1.0, T, messages=100)
    c.flusher = SimpleNamespace(durable=0, busy=False)
    c.appended("fe0", -1, 99, b"a")
    assert c.waiting == [] and c.held == [("fe0", b"a")]      # acks=-1 does not wait for it
    assert not c.flush_due(T, 99) and c.flush_wait(T, 99) is None
    assert c.flush_wait(T, 100) == 0.0 and c.flush_due(T, 100)
    c.flusher.busy = True
    assert not c.flush_due(T, 250)                            # one flush at a time


def test_a_changed_policy_flushes_what_was_promised_an_fdatasync():
    c = commit(FlushPolicy.BATCH)
    c.appended("fe0", -1, 10, b"all")
    assert c.configure(FlushPolicy.OS, 1.0) is True
    c = commit(FlushPolicy.OS)
    assert c.configure(FlushPolicy.BATCH, 1.0, 5) is False and c.messages == 5
