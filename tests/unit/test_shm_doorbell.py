"""shm.doorbell: wake-ups over Unix datagram sockets."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from shm.doorbell import MAX_PATH, BellSender, Doorbell


def test_ring_wakes_wait_and_pending_rings_are_drained(tmp_path):
    path = str(tmp_path / "bell.a")
    bell = Doorbell(path)
    sender = BellSender()
    assert sender.ring(path)
    assert sender.ring(path)
    assert sender.ring(path)
    assert bell.wait(5.0) is True
    assert bell.wait(0) is False          # all three were consumed by one wake-up
    bell.close()
    sender.close()


def test_wait_times_out_when_not_rung(tmp_path):
    bell = Doorbell(str(tmp_path / "bell.a"))
    assert bell.wait(0) is False
    assert bell.wait(0.02) is False
    bell.close()


def test_ring_from_another_thread_wakes_a_sleeping_wait(tmp_path):
    path = str(tmp_path / "bell.a")
    bell = Doorbell(path)
    sender = BellSender()
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(bell.wait(30.0)))
    waiter.start()
    sender.ring(path)
    waiter.join(timeout=30.0)
    assert result == [True]
    bell.close()
    sender.close()


def test_ring_to_a_missing_or_dead_bell_is_silent(tmp_path):
    sender = BellSender()
    assert sender.ring(str(tmp_path / "bell.nobody")) is False          # ENOENT
    assert sender.ring(str(tmp_path / "no-such-dir" / "bell.x")) is False
    dead = str(tmp_path / "bell.dead")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(dead)
    s.close()                                                           # file stays, nobody bound
    assert os.path.exists(dead)
    assert sender.ring(dead) is False                                   # ECONNREFUSED
    sender.close()


def test_ringing_a_full_queue_is_silent(tmp_path):
    path = str(tmp_path / "bell.a")
    bell = Doorbell(path)
    sender = BellSender()
    sent = [sender.ring(path) for _ in range(5000)]
    assert sent[0] is True and sent[-1] is False                       # EAGAIN once full
    assert bell.drain() == sum(sent)
    bell.close()
    sender.close()


def test_stale_socket_file_is_replaced_and_close_spares_a_successor(tmp_path):
    path = str(tmp_path / "bell.a")
    old = Doorbell(path)
    new = Doorbell(path)                # a restarted consumer binding over its predecessor's file
    old.close()                         # the predecessor's late close must not unlink new's file
    assert os.path.exists(path)
    with BellSender() as sender:
        sender.ring(path)
    assert new.wait(5.0) is True
    new.close()
    assert not os.path.exists(path)


def test_close_without_unlink_keeps_the_file(tmp_path):
    path = str(tmp_path / "bell.a")
    bell = Doorbell(path)
    bell.close(unlink=False)
    assert os.path.exists(path)
    bell.close()                        # idempotent


def test_fileno_is_pollable(tmp_path):
    import selectors
    path = str(tmp_path / "bell.a")
    bell = Doorbell(path)
    sel = selectors.DefaultSelector()
    sel.register(bell, selectors.EVENT_READ)
    assert sel.select(0) == []
    with BellSender() as sender:
        sender.ring(path)
    assert len(sel.select(5.0)) == 1
    assert bell.drain() == 1
    sel.close()
    bell.close()


def test_too_long_path_is_refused():
    with pytest.raises(ValueError):
        Doorbell("/tmp/" + "x" * MAX_PATH)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_consumer_that_restarted_is_rung_through_a_new_connection(tmp_path):
    """The sender keeps a socket connected to each bell; the consumer's death closes the other
    end, and the next ring connects again to whatever is bound at the path now."""
    path = str(tmp_path / "bell.w")
    old = Doorbell(path)
    with BellSender() as sender:
        assert sender.ring(path) is True and old.drain() == 1
        old.close()
        assert sender.ring(path) is False               # dead, nobody bound: ENOENT
        new = Doorbell(path)                            # the restarted consumer
        assert sender.ring(path) is True
        assert new.wait(5.0) is True
        new.close(unlink=False)                         # died again, its file left behind
        assert sender.ring(path) is False               # ECONNREFUSED, then nothing to connect
        again = Doorbell(path)
        assert sender.ring(path) is True and again.drain() == 1
        again.close()


def test_connect_takes_the_descriptor_once_and_forget_gives_it_back(tmp_path):
    paths = [str(tmp_path / f"bell.{i}") for i in range(3)]
    bells = [Doorbell(p) for p in paths]
    sender = BellSender()
    before = _fds()
    for p in paths:
        sender.connect(p)
        sender.connect(p)
    assert _fds() == before + 3
    assert all(sender.ring(p) for p in paths) and _fds() == before + 3
    sender.forget(paths[0])
    assert _fds() == before + 2
    sender.connect(str(tmp_path / "bell.nobody"))      # absent: connected at a later ring
    assert _fds() == before + 2
    sender.close()
    assert _fds() == before
    for b in bells:
        b.close()


def test_marks_are_ored_over_the_drained_rings_and_a_full_queue_is_every_mark(tmp_path):
    from shm.doorbell import MARK_STATE
    path = str(tmp_path / "bell.m")
    bell = Doorbell(path)
    sender = BellSender()
    assert sender.ring(path) and sender.ring(path, MARK_STATE)
    assert bell.wait(5.0) is True
    assert bell.take_marks() == MARK_STATE and bell.take_marks() == 0
    assert sender.ring(path)
    assert bell.take_marks() == 0                 # a plain wake-up says nothing of pages
    # A full queue: a sender's marked ring may have been refused (EAGAIN), so a drain that
    # finds the queue full counts every mark.
    while sender.ring(path):
        pass
    assert bell.take_marks() & MARK_STATE
    bell.close()
    sender.close()
