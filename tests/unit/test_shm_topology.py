"""shm.topology: channel names, caching, endpoint removal, Outbox/Mailbox wake-up protocol."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest

from shm.doorbell import BellSender
from shm.ring import Ring
from shm.topology import FULL_LOOK_S, Mailbox, Outbox, Topology

PAGE_FIELDS = [("generation", "I"), ("high_watermark", "q")]


@pytest.fixture
def closing():
    """closing(x) -> x, closed when the test ends (bell sockets, mailboxes), pass or fail."""
    with contextlib.ExitStack() as stack:
        yield stack.enter_context


def test_paths(tmp_path):
    topo = Topology(str(tmp_path))
    d = str(tmp_path)
    assert topo.ring_path("fe0", "wab12.3") == f"{d}/ring.fe0-wab12.3"
    assert topo.bell_path("fx1") == f"{d}/bell.fx1"
    assert topo.page_path("sup") == f"{d}/page.sup"
    assert topo.file_path("catalog.msgpack") == f"{d}/catalog.msgpack"
    for bad in ("a-b", "", "x/y"):
        with pytest.raises(ValueError):
            topo.ring_path(bad, "co")


def test_open_ring_is_cached_and_forget_drops_it(tmp_path):
    topo = Topology(str(tmp_path))
    topo.create_ring("fe0", "co", 4096).close()
    topo.create_ring("co", "fe0", 4096).close()
    r1 = topo.open_ring("fe0", "co")
    assert topo.open_ring("fe0", "co") is r1
    back = topo.open_ring("co", "fe0")
    topo.forget("fe0")
    r2 = topo.open_ring("fe0", "co")
    assert r2 is not r1 and topo.open_ring("co", "fe0") is not back
    topo.create_page("w1.0", PAGE_FIELDS).close()
    p1 = topo.open_page("w1.0", PAGE_FIELDS)
    assert topo.open_page("w1.0", PAGE_FIELDS) is p1
    topo.forget("w1.0")
    assert topo.open_page("w1.0", PAGE_FIELDS) is not p1
    topo.close()


def test_create_ring_replaces_file_and_cached_mapping(tmp_path):
    topo = Topology(str(tmp_path))
    topo.create_ring("fe0", "co", 4096).close()
    old = topo.open_ring("fe0", "co")
    assert old.try_put(b"old")
    topo.create_ring("fe0", "co", 8192).close()
    new = topo.open_ring("fe0", "co")
    assert new is not old and new.capacity == 8192 and new.empty()


def test_remove_endpoint_unlinks_its_rings_bell_and_page(tmp_path):
    topo = Topology(str(tmp_path))
    for src, dst in [("fe0", "w1.0"), ("w1.0", "fe0"), ("fe1", "w1.0"), ("fe0", "w1.1"),
                     ("w1.1", "fe0"), ("fe0", "co")]:
        topo.create_ring(src, dst, 4096).close()
    topo.create_page("w1.0", PAGE_FIELDS).close()
    topo.create_page("w1.1", PAGE_FIELDS).close()
    mb = Mailbox(topo, "w1.0")
    mb.doorbell.close(unlink=False)
    topo.open_ring("fe0", "w1.0")
    topo.remove_endpoint("w1.0")
    assert sorted(os.listdir(tmp_path)) == [
        "page.w1.1", "ring.fe0-co", "ring.fe0-w1.1", "ring.w1.1-fe0"]
    with pytest.raises(FileNotFoundError):
        topo.open_ring("fe0", "w1.0")          # the cached mapping was dropped too
    topo.remove_endpoint("w1.0")                # idempotent


def _one_input(tmp_path, src: str, dst: str):
    """A consumer ``dst`` with one input ring from ``src``: (topology, mailbox, ring)."""
    topo = Topology(str(tmp_path))
    topo.create_ring(src, dst, 4096).close()
    mb = Mailbox(topo, dst)
    return topo, mb, mb.add(src)


def test_outbox_rings_the_bell_only_when_the_consumer_waits(tmp_path, closing):
    topo, mb, ring = _one_input(tmp_path, "fe0", "w1.0")
    sender = closing(BellSender())
    out = Outbox(Topology(str(tmp_path)), "fe0", "w1.0", sender)   # the producer's own process
    assert out.send(b"a", b"b")
    assert mb.drain() == 0                      # consumer busy: no wake-up traffic
    mb.arm()
    assert out.send(b"c")
    assert mb.drain() == 1
    mb.disarm()
    assert ring.get() == b"ab" and ring.get() == b"c"
    mb.close()


def test_an_input_added_to_an_armed_mailbox_rings_its_bell(tmp_path, closing):
    # An asyncio worker arms once and never again (no re-arm at each bell): an input it adds
    # later must be armed by add() itself.
    topo = Topology(str(tmp_path))
    for src in ("fe0", "co"):
        topo.create_ring(src, "w1.0", 4096).close()
    mb = Mailbox(topo, "w1.0")
    mb.add("fe0")
    mb.arm()
    late = mb.add("co")
    assert late.consumer_waiting
    out = Outbox(Topology(str(tmp_path)), "co", "w1.0", closing(BellSender()))
    assert out.send(b"x")
    assert mb.drain() == 1
    mb.disarm()
    assert not late.consumer_waiting
    assert not mb.add("co").consumer_waiting     # disarmed: added as it was
    mb.close()


def test_arm_of_an_armed_mailbox_leaves_the_flags_alone(tmp_path):
    topo, mb, ring = _one_input(tmp_path, "fe0", "w1.0")
    mb.arm()
    ring.consumer_waiting = False               # (only to see whether arm() stores again)
    mb.arm()
    assert not ring.consumer_waiting
    mb.disarm()
    mb.arm()
    assert ring.consumer_waiting
    mb.close()


def test_outbox_send_reports_a_full_ring(tmp_path, closing):
    topo = Topology(str(tmp_path))
    topo.create_ring("fe0", "co", 4096).close()
    out = Outbox(topo, "fe0", "co", closing(BellSender()))
    sent = 0
    while out.send(bytes(1000)):
        sent += 1
    assert sent == 4096 // 1008
    assert out.ring.get() == bytes(1000)
    assert out.send(bytes(1000))


def test_mailbox_wait_returns_promptly_when_data_is_already_there(tmp_path):
    """No bell was rung (the producer put while the consumer was not waiting): wait() must see the
    data in its re-check rather than sleep for the timeout."""
    topo = Topology(str(tmp_path))
    topo.create_ring("fe0", "co", 4096).close()
    topo.create_ring("fe1", "co", 4096).close()
    mb = Mailbox(topo, "co")
    mb.add("fe0")
    mb.add("fe1")
    topo.open_ring("fe1", "co").try_put(b"x")
    done = threading.Event()
    t = threading.Thread(target=lambda: (mb.wait(3600.0), done.set()))
    t.daemon = True
    t.start()
    t.join(timeout=60.0)
    assert done.is_set()                        # it did not sleep on the (hour-long) timeout
    assert mb.ready() == ["fe1"]
    assert not any(r.consumer_waiting for r in mb.inputs.values())   # flags cleared
    mb.close()


def test_mailbox_wait_is_woken_by_an_outbox(tmp_path, closing):
    topo, mb, ring = _one_input(tmp_path, "fe0", "co")
    out = Outbox(Topology(str(tmp_path)), "fe0", "co", closing(BellSender()))
    done = threading.Event()

    def consumer() -> None:
        while ring.empty():
            mb.wait(3600.0)
        done.set()

    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    while not ring.consumer_waiting and t.is_alive():   # let it go to sleep first
        t.join(0.001)
    assert out.send(b"wake")
    t.join(timeout=60.0)
    assert done.is_set()
    assert ring.get() == b"wake"
    mb.close()


def test_mailbox_wait_times_out_and_clears_flags(tmp_path):
    topo, mb, ring = _one_input(tmp_path, "fe0", "co")
    mb.wait(0.01)
    assert not ring.consumer_waiting
    assert mb.remove("fe0") is ring and mb.inputs == {}
    mb.wait(0)
    mb.close()
    assert not os.path.exists(topo.bell_path("co"))


def test_ring_survives_producer_restart_through_topology(tmp_path, closing):
    run = str(tmp_path)
    Topology(run).create_ring("fe0", "w1.0", 4096).close()
    consumer = Topology(run).open_ring("fe0", "w1.0")
    first = Topology(run)                       # producer process, then its restart
    assert Outbox(first, "fe0", "w1.0", closing(BellSender())).send(b"1")
    first.close()
    second = Outbox(Topology(run), "fe0", "w1.0", closing(BellSender()))
    assert second.send(b"2")
    assert consumer.get() == b"1" and consumer.get() == b"2"
    assert isinstance(second.ring, Ring)


def test_outbox_post_queues_in_order_when_full_and_flush_drains(tmp_path, closing):
    from shm.doorbell import BellSender
    from shm.topology import Mailbox, Outbox, Topology
    topo = Topology(str(tmp_path))
    topo.create_ring("a", "b", 4096).close()
    box = Outbox(topo, "a", "b", closing(BellSender()))
    inbox = closing(Mailbox(topo, "b"))
    ring = inbox.add("a")
    msgs = [bytes([i]) * 1000 for i in range(10)]      # more than a 4 KiB ring holds
    for m in msgs:
        box.post(m)
    assert box.queued, "a full ring must queue the rest"
    got = []
    while len(got) < len(msgs):
        while (r := ring.get()) is not None:
            got.append(r)
        box.flush()
    assert got == msgs                                  # nothing lost, order kept
    assert not box.flush()


def test_outbox_post_reports_where_a_record_ends_so_the_sender_can_tell_when_it_was_taken(tmp_path, closing):
    from shm.doorbell import BellSender
    from shm.topology import Mailbox, Outbox, Topology
    topo = Topology(str(tmp_path))
    topo.create_ring("a", "b", 4096).close()
    box = Outbox(topo, "a", "b", closing(BellSender()))
    ring = closing(Mailbox(topo, "b")).add("a")
    first, second = b"x" * 1500, b"y" * 1500
    end1 = box.post(first)
    end2 = box.post(second)
    assert 0 < end1 < end2 == box.ring.tail
    assert box.ring.head == ring.head == 0
    third = b"z" * 1500                                  # does not fit: queued
    assert box.post(third) == -1 and box.is_queued(third) and not box.is_queued(first)
    assert ring.get() == first
    assert end1 <= box.ring.head < end2                  # the first was taken, the second not
    box.flush()
    assert not box.is_queued(third)


def test_outbox_flush_rings_a_waiting_consumer_once(tmp_path, closing):
    from shm.doorbell import BellSender
    from shm.topology import Mailbox, Outbox, Topology
    topo = Topology(str(tmp_path))
    topo.create_ring("a", "b", 65536).close()
    box = Outbox(topo, "a", "b", closing(BellSender()))
    inbox = closing(Mailbox(topo, "b"))
    inbox.add("a")
    inbox.arm()
    for i in range(5):
        box.post(b"x%d" % i)
    box.flush()
    assert inbox.drain() == 1


def test_record_larger_than_the_ring_is_spilled_in_order(tmp_path, closing):
    """Regression: a record over the ring's max_payload (a 2 MiB JoinGroup, a JoinGroup answer
    with every member's subscription) raised ValueError in the sender; it now travels through a
    spill file, in order with the records around it, and the file is removed once read."""
    from appliance import ipc
    from appliance.group.messages import HeartbeatRequest
    from shm.topology import SPILLED, unspill

    topo = Topology(str(tmp_path))
    topo.create_ring("fe0", "co", 4096).close()
    box = Outbox(topo, "fe0", "co", closing(BellSender()))
    ring = topo.open_ring("fe0", "co")
    big = ipc.encode(7, HeartbeatRequest("g" * 10_000, 1, "m", None))
    assert len(big) > ring.max_payload
    box.post(b"first")
    box.post(big)
    box.post(b"last")
    assert ring.get() == b"first"
    ref = ring.get()
    assert ref[0] == SPILLED and len(ref) < 200
    path = bytes(ref[1:]).decode()
    assert os.path.exists(path)
    assert ipc.decode(ref) == (7, HeartbeatRequest("g" * 10_000, 1, "m", None))
    assert not os.path.exists(path)
    assert ring.get() == b"last"
    # Behind a queue (the ring full), the big record is spilled too, still in order.
    while box.post(b"x" * 100) != -1:
        pass
    box.post(big)
    assert box.queued[-1][0][0] == SPILLED
    got = []
    while len(got) == 0 or got[-1][0] != SPILLED:
        while (r := ring.get()) is not None:
            got.append(r)
        box.flush()
    assert ipc.decode(got[-1])[0] == 7 and unspill is not None
    assert not [n for n in os.listdir(tmp_path) if n.startswith("spill.")]
    topo.close()


# -- the ready map (shm.ready): which inputs to read without looking at every ring ----------------

def _many_inputs(tmp_path, n: int, consumer: str = "fe0"):
    topo = Topology(str(tmp_path))
    names = [f"w1.{i}" for i in range(n)]
    for name in names:
        topo.create_ring(name, consumer, 4096).close()
    mb = Mailbox(topo, consumer)
    for name in names:
        mb.add(name)
    return topo, mb, names


def test_take_ready_returns_only_the_rings_posted_to_since_the_last_take(tmp_path, closing):
    topo, mb, names = _many_inputs(tmp_path, 300)
    assert sorted(src for src, _ in mb.take_ready()) == sorted(names)   # marked when added
    assert mb.take_ready() == []
    producer = Topology(str(tmp_path))                  # the producers' own processes
    sender = closing(BellSender())
    for name in ("w1.7", "w1.250"):
        assert Outbox(producer, name, "fe0", sender).send(name.encode())
    taken = mb.take_ready()
    assert sorted(src for src, _ in taken) == ["w1.250", "w1.7"]
    assert [ring.get() for _, ring in sorted(taken)] == [b"w1.250", b"w1.7"]
    assert mb.take_ready() == []
    mb.close()


def test_a_record_queued_behind_a_full_ring_is_marked_when_flush_puts_it(tmp_path, closing):
    topo, mb, _ = _many_inputs(tmp_path, 2)
    mb.take_ready()
    out = Outbox(Topology(str(tmp_path)), "w1.1", "fe0", closing(BellSender()))
    while out.post(bytes(1000)) != -1:
        pass
    ring = mb.inputs["w1.1"]
    while ring.get() is not None:
        pass
    mb.take_ready()
    assert out.flush() is False                         # the queued record went in
    assert [src for src, _ in mb.take_ready()] == ["w1.1"]
    mb.close()


def test_pending_clears_a_mark_over_an_empty_ring_and_keeps_the_one_over_a_record(tmp_path, closing):
    """A consumer that reads every ring itself (a partition writer) never takes its marks:
    pending() must not report them forever (the loop would never sleep), nor drop one whose
    ring holds a record."""
    topo, mb, _ = _many_inputs(tmp_path, 3)
    out = Outbox(Topology(str(tmp_path)), "w1.2", "fe0", closing(BellSender()))
    assert out.send(b"x")
    assert mb.pending()
    assert mb.inputs["w1.2"].get() == b"x"              # read without a take
    assert not mb.pending()                             # every stale mark cleared
    assert mb.ready_map.flagged(4) == []
    assert out.send(b"y")
    assert mb.pending()
    assert [src for src, _ in mb.take_ready()] == ["w1.2"]
    mb.close()


def test_inputs_beyond_the_maps_slots_are_read_every_time(tmp_path, closing, monkeypatch):
    monkeypatch.setattr("shm.topology.SLOTS", 3)        # slots 1 and 2, then none
    topo, mb, names = _many_inputs(tmp_path, 4)
    assert [mb.inputs[n].ready_slot for n in names] == [1, 2, 0, 0]
    mb.take_ready()
    assert sorted(src for src, _ in mb.take_ready()) == ["w1.2", "w1.3"]
    assert not mb.pending()
    Outbox(Topology(str(tmp_path)), "w1.3", "fe0", closing(BellSender())).send(b"z")
    assert mb.pending()
    mb.close()


def test_without_a_map_every_input_is_read_every_time(tmp_path, closing, monkeypatch):
    def full(path):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("shm.topology.ReadyMap.open_or_create", full)
    topo, mb, names = _many_inputs(tmp_path, 3)
    assert mb.ready_map is None
    assert sorted(src for src, _ in mb.take_ready()) == names
    out = Outbox(Topology(str(tmp_path)), "w1.0", "fe0", closing(BellSender()))
    assert not mb.pending()
    assert out.send(b"a")                               # no slot: nothing to mark
    assert mb.pending()
    mb.close()


def test_a_restarted_consumer_reuses_the_map_and_old_producers_mark_its_new_slots(tmp_path, closing):
    topo, mb, _ = _many_inputs(tmp_path, 2)
    out = Outbox(Topology(str(tmp_path)), "w1.0", "fe0", closing(BellSender()))
    assert out.send(b"before")
    mb.close()
    mb2 = Mailbox(Topology(str(tmp_path)), "fe0")       # the successor adds in another order
    mb2.add("w1.1")
    mb2.add("w1.0")
    assert mb2.inputs["w1.0"].ready_slot == 2
    taken = dict(mb2.take_ready())
    assert taken["w1.0"].get() == b"before"             # put before the successor added it
    assert out.send(b"after")                           # the producer's map is the same file
    assert [src for src, _ in mb2.take_ready()] == ["w1.0"]
    mb2.close()


def test_remove_frees_the_slot_for_the_next_input(tmp_path):
    topo, mb, _ = _many_inputs(tmp_path, 2)
    gone = mb.remove("w1.0")
    assert gone.ready_slot == 0
    topo.create_ring("w2.0", "fe0", 4096).close()
    assert mb.add("w2.0").ready_slot == 1
    assert sorted(src for src, _ in mb.take_ready()) == ["w1.1", "w2.0"]
    mb.close()


def test_to_read_gives_the_marked_rings_and_every_ring_once_each_full_look(tmp_path, closing):
    topo, mb, names = _many_inputs(tmp_path, 5)
    t, look = 100.0, FULL_LOOK_S
    assert sorted(src for src, _ in mb.to_read(t)) == names         # the first turn: every ring
    out = Outbox(Topology(str(tmp_path)), "w1.3", "fe0", closing(BellSender()))
    assert out.send(b"x")
    assert [src for src, _ in mb.to_read(t + look / 2)] == ["w1.3"]
    assert list(mb.to_read(t + look * 0.9)) == []
    assert sorted(src for src, _ in mb.to_read(t + look)) == names  # the safety net
    assert list(mb.to_read(t + look * 1.1)) == []       # the full look took the marks too
    mb.close()


def test_an_outbox_made_before_its_consumers_map_opens_it_at_the_first_mark(tmp_path, closing):
    topo = Topology(str(tmp_path))
    topo.create_ring("w1.0", "fe0", 4096).close()
    out = Outbox(Topology(str(tmp_path)), "w1.0", "fe0", closing(BellSender()))
    assert out._ready is None                           # no map yet: looked for again later
    mb = Mailbox(topo, "fe0")
    mb.add("w1.0")
    mb.take_ready()
    assert out.send(b"x")
    assert [src for src, _ in mb.take_ready()] == ["w1.0"]
    mb.close()
