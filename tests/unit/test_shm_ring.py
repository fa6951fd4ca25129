"""shm.ring: SPSC ring layout, wrap-around, back-pressure, restarts, torn-read protection."""

from __future__ import annotations

import array
import random
import struct
import threading
import time

import pytest

from shm.region import Region
from shm.ring import HEADER_SIZE, PADDING, Ring, RingCorrupt

HEAD, TAIL, WAITING = 64 // 8, 128 // 8, 192 // 8


def payload(seq: int, size: int) -> bytes:
    """Deterministic content that differs per record, so misplaced bytes are caught."""
    head = struct.pack("<Q", seq)
    body = (head * (size // 8 + 1))[:size]
    return bytes(b ^ (i & 0xFF) for i, b in enumerate(body)) if size < 64 else body


def counters(ring: Ring) -> tuple[int, int]:
    q = memoryview(ring.region.buf)[:HEADER_SIZE].cast("Q")
    try:
        return q[HEAD], q[TAIL]
    finally:
        q.release()


@pytest.fixture(params=[False, True], ids=["plain", "checksums"])
def checksums(request) -> bool:
    return request.param


def test_roundtrip_parts_written_back_to_back(tmp_path, checksums):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=checksums)
    assert ring.empty() and ring.peek() is None and ring.get() is None
    ints = array.array("I", [1, 2, 3])
    assert ring.try_put(b"ab", bytearray(b"cd"), memoryview(b"xxefxx")[2:4], ints)
    assert not ring.empty()
    assert ring.get() == b"abcdef" + ints.tobytes()
    assert ring.try_put()  # empty record is legal
    assert ring.get() == b""
    assert ring.empty()
    ring.close()


def test_peek_is_stable_until_advance(tmp_path):
    ring = Ring.create(str(tmp_path / "r"), 4096)
    ring.try_put(b"one")
    ring.try_put(b"two")
    v1 = ring.peek()
    v2 = ring.peek()
    assert bytes(v1) == bytes(v2) == b"one"
    ring.advance()
    assert bytes(ring.peek()) == b"two"
    ring.advance()
    with pytest.raises(RuntimeError):
        ring.advance()
    assert ring.peek() is None


def test_wrap_around_many_laps_varied_sizes(tmp_path, checksums):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=checksums)
    rnd = random.Random(7)
    produced = consumed = 0
    sizes: list[int] = []
    while counters(ring)[1] < 60 * ring.capacity:
        # Producer fills until back-pressure (or a random stop), consumer drains part of it.
        for _ in range(rnd.randint(1, 12)):
            size = rnd.choice([0, 1, 7, 8, 9, 100, 255, 1000, rnd.randint(0, ring.max_payload)])
            if not ring.try_put(payload(produced, size)):
                break
            sizes.append(size)
            produced += 1
        for _ in range(rnd.randint(0, produced - consumed)):
            got = ring.get()
            assert got == payload(consumed, sizes[consumed])
            consumed += 1
    while (got := ring.get()) is not None:
        assert got == payload(consumed, sizes[consumed])
        consumed += 1
    assert consumed == produced > 200
    head, tail = counters(ring)
    assert head == tail >= 60 * 4096


def test_padding_record_at_the_wrap(tmp_path, checksums):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=checksums)
    data = memoryview(ring.region.buf)[HEADER_SIZE:HEADER_SIZE + 4096]
    for i in range(2):                   # two records of 2008 bytes each: position 4016
        assert ring.try_put(bytes([i]) * 2000)
        assert ring.get() == bytes([i]) * 2000
    assert counters(ring) == (4016, 4016)
    # 100-byte payload needs 112 bytes; only 80 remain before the end: padding + record at 0.
    assert ring.try_put(b"w" * 100)
    assert struct.unpack_from("<I", data, 4016)[0] == PADDING
    assert struct.unpack_from("<I", data, 0)[0] == 100
    assert bytes(data[8:108]) == b"w" * 100
    assert counters(ring)[1] == 4096 + 112
    assert ring.get() == b"w" * 100
    assert counters(ring) == (4096 + 112, 4096 + 112)
    data.release()


def test_full_ring_back_pressure(tmp_path):
    ring = Ring.create(str(tmp_path / "r"), 4096)
    n = 0
    while ring.try_put(payload(n, 500)):
        n += 1
    assert n == 4096 // 512
    before = counters(ring)
    assert ring.free_bytes() == 0
    assert not ring.try_put(b"x")
    assert counters(ring) == before           # nothing written
    assert ring.get() == payload(0, 500)
    assert ring.free_bytes() == 512
    assert ring.try_put(payload(n, 500))
    for i in range(1, n + 1):
        assert ring.get() == payload(i, 500)
    assert ring.empty()


def test_put_fails_cleanly_when_free_space_does_not_cover_the_padding(tmp_path):
    ring = Ring.create(str(tmp_path / "r"), 4096)
    data = memoryview(ring.region.buf)[HEADER_SIZE:HEADER_SIZE + 4096]
    assert ring.try_put(bytes(1992))          # 2000 bytes at 0
    assert ring.try_put(b"\x01" * 1992)       # 2000 bytes at 2000 -> tail 4000
    assert ring.get() == bytes(1992)          # head 2000: 2096 free, only 96 before the end
    assert ring.free_bytes() == 2096
    before = counters(ring)
    # 2008-byte record: fits in the free space, but not with the 96 bytes of padding in front.
    assert not ring.try_put(b"z" * 2000)
    assert counters(ring) == before
    assert struct.unpack_from("<I", data, 4000)[0] == 0   # no padding written either
    assert ring.get() == b"\x01" * 1992
    assert ring.try_put(b"z" * 2000)
    assert ring.get() == b"z" * 2000
    data.release()


def move_to(ring: Ring, target: int) -> None:
    """Advance an empty ring's position to ``target`` with filler records that never wrap."""
    while (pos := counters(ring)[1] % ring.capacity) != target:
        step = min((target - pos) % ring.capacity, ring.capacity - pos, ring.max_payload + 8)
        assert ring.try_put(bytes(step - 8))
        assert ring.get() == bytes(step - 8)


def test_max_payload_boundary(tmp_path, checksums):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=checksums)
    assert ring.max_payload == 4096 // 2 - 8
    with pytest.raises(ValueError):
        ring.try_put(bytes(ring.max_payload + 1))
    with pytest.raises(ValueError):
        ring.try_put(bytes(ring.max_payload), b"x")   # the parts together are too big
    assert ring.empty()
    # A max_payload record fits into an empty ring at every possible (8-aligned) position.
    for target in range(0, 4096, 8):
        move_to(ring, target)
        big = bytes([target % 251]) * ring.max_payload
        assert ring.try_put(big), target
        assert ring.get() == big
        assert ring.empty()


def test_reopen_continues_where_the_previous_owner_stopped(tmp_path, checksums):
    path = str(tmp_path / "r")
    first = Ring.create(path, 4096, checksums=checksums)
    for i in range(5):
        assert first.try_put(payload(i, 700))
    assert first.get() == payload(0, 700)
    # A restarted consumer sees the published head; a record peeked but not advanced is redelivered.
    assert bytes(first.peek()) == payload(1, 700)
    consumer = Ring.open(path)
    assert consumer.checksums == checksums        # the mode comes from the header
    assert consumer.get() == payload(1, 700)
    # A restarted producer continues from the published tail, through several wraps.
    producer = Ring.open(path)

    def size_of(seq: int) -> int:
        return 700 if seq < 5 else 300 + seq % 500

    seq_out, seq_in = 5, 2
    for _ in range(200):
        while producer.try_put(payload(seq_out, size_of(seq_out))):
            seq_out += 1
        while (got := consumer.get()) is not None:
            assert got == payload(seq_in, size_of(seq_in))
            seq_in += 1
    assert seq_in == seq_out
    assert counters(consumer)[1] > 10 * 4096
    for r in (first, consumer, producer):
        r.close()


def test_open_validates(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(8192))
    with pytest.raises(ValueError, match="magic"):
        Ring.open(str(bad))
    path = str(tmp_path / "r")
    Ring.create(path, 8192, checksums=False).close()
    with pytest.raises(ValueError, match="checksums"):
        Ring.open(path, checksums=True)
    assert Ring.open(path, checksums=False).capacity == 8192
    with pytest.raises(ValueError):
        Ring.create(str(tmp_path / "x"), 5000)
    with pytest.raises(ValueError):
        Ring.create(str(tmp_path / "x"), 2048)


def test_rings_inside_one_region_are_independent():
    cap = 4096
    region = Region.anonymous(2 * Ring.region_size(cap))
    a = Ring.on_region(region, 0, cap, init=True, checksums=False)
    b = Ring.on_region(region, Ring.region_size(cap), cap, init=True, checksums=True)
    assert a.try_put(b"to-a") and b.try_put(b"to-b")
    a2 = Ring.on_region(region, 0, cap, init=False)
    assert not a2.checksums and a2.get() == b"to-a"
    assert b.get() == b"to-b" and a.empty()
    with pytest.raises(ValueError):
        Ring.on_region(region, 100, cap, init=True)
    a.close()
    b.close()
    a2.close()
    assert not region.closed      # the region is the caller's
    region.close()


def test_consumer_waiting_flag_is_shared(tmp_path):
    path = str(tmp_path / "r")
    c = Ring.create(path, 4096)
    p = Ring.open(path)
    assert not p.consumer_waiting
    c.consumer_waiting = True
    assert p.consumer_waiting
    c.consumer_waiting = False
    assert not p.consumer_waiting


def test_torn_payload_is_not_returned_until_repaired(tmp_path):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=True)
    data = memoryview(ring.region.buf)[HEADER_SIZE:HEADER_SIZE + 4096]
    assert ring.try_put(b"hello world")
    good = data[10]
    data[10] = good ^ 0xFF                     # payload not yet (fully) visible
    assert ring.peek() is None and ring.get() is None
    assert not ring.empty()                    # published: the consumer should retry, not sleep
    data[10] = good
    assert ring.get() == b"hello world"
    # A torn length field is treated the same way (no exception, no garbage).
    assert ring.try_put(b"abc")
    pos = counters(ring)[0] & 4095
    struct.pack_into("<I", data, pos, 3000)
    assert ring.peek() is None
    struct.pack_into("<I", data, pos, 3)
    assert ring.get() == b"abc"
    data.release()


def test_stale_record_from_an_earlier_lap_is_not_taken_for_a_new_one(tmp_path):
    """The checksum covers the absolute position: an intact record left at the same offset by
    the previous lap must not pass when the new tail is visible before the new record is."""
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=True)
    q = memoryview(ring.region.buf)[:HEADER_SIZE].cast("Q")
    for _ in range(2):
        assert ring.try_put(bytes(2040))       # two 2048-byte records: one full lap
        assert ring.get() is not None
    assert counters(ring) == (4096, 4096)
    q[TAIL] = 4096 + 2048                      # tail visible, new record's bytes not yet
    assert ring.peek() is None
    q[TAIL] = 4096
    assert ring.try_put(b"new")                # the real publish
    assert ring.get() == b"new"
    q.release()


def test_corruption_without_checksums_raises(tmp_path):
    ring = Ring.create(str(tmp_path / "r"), 4096, checksums=False)
    data = memoryview(ring.region.buf)[HEADER_SIZE:HEADER_SIZE + 4096]
    assert ring.try_put(b"abc")
    struct.pack_into("<I", data, 0, 3000)
    with pytest.raises(RingCorrupt):
        ring.peek()
    data.release()


def test_producer_and_consumer_threads(tmp_path, checksums):
    path = str(tmp_path / "r")
    producer = Ring.create(path, 8192, checksums=checksums)
    consumer = Ring.open(path)
    count = 20000
    rnd = random.Random(3)
    sizes = [rnd.choice([0, 5, 64, 333, 1500, 4088]) for _ in range(count)]
    errors: list[str] = []

    def produce() -> None:
        for i, size in enumerate(sizes):
            data = payload(i, size)
            while not producer.try_put(data[:size // 2], data[size // 2:]):
                time.sleep(0)          # let the consumer thread have the GIL

    def consume() -> None:
        for i, size in enumerate(sizes):
            while (got := consumer.get()) is None:
                time.sleep(0)
            if got != payload(i, size):
                errors.append(f"record {i} differs")
                return

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert consumer.empty()
