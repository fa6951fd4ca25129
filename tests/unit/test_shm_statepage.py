"""shm.statepage: seqlock consistency, dead-writer repair, flags, validation."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from shm.region import Region
from shm.statepage import StalePage, StatePage

FIELDS = [("generation", "I"), ("status", "I"), ("high_watermark", "q"),
          ("log_start_offset", "q"), ("segments_version", "Q")]
SEQ = 64 // 8          # index of seq in the page viewed as u64
PAYLOAD = 80


@pytest.fixture(params=[False, True], ids=["plain", "checksums"])
def checksums(request) -> bool:
    return request.param


def seq_view(page: StatePage) -> memoryview:
    return memoryview(page._region.buf)[:PAYLOAD].cast("Q")


def test_publish_read_roundtrip(tmp_path, checksums):
    path = str(tmp_path / "p")
    writer = StatePage.create(path, FIELDS, checksums=checksums)
    reader = StatePage.open(path, FIELDS, readonly=True, checksums=checksums)
    assert tuple(reader.read()) == (0, 0, 0, 0, 0)
    writer.publish(generation=3, status=2, high_watermark=-1)
    writer.publish(high_watermark=42)             # untouched fields keep their value
    got = reader.read()
    assert got.generation == 3 and got.status == 2 and got.high_watermark == 42
    assert got == writer.current
    assert reader.seq == 4
    with pytest.raises(ValueError):
        writer.publish(no_such_field=1)
    with pytest.raises(ValueError):
        reader.publish(status=1)                  # read-only mapping
    assert StatePage.size_for(FIELDS) == writer.size == 192
    assert StatePage.size_for(FIELDS, flag_slots=0) == 128


def test_restarted_writer_starts_from_the_page(tmp_path):
    path = str(tmp_path / "p")
    first = StatePage.create(path, FIELDS)
    first.publish(generation=7, high_watermark=1000, segments_version=3)
    first.close()
    second = StatePage.open(path, FIELDS)
    assert second.current.high_watermark == 1000
    second.publish(generation=second.current.generation + 1)
    assert tuple(second.read()) == (8, 0, 1000, 0, 3)


def test_open_rejects_other_fields_or_flag_slots(tmp_path):
    path = str(tmp_path / "p")
    StatePage.create(path, FIELDS).close()
    with pytest.raises(ValueError, match="fields"):
        StatePage.open(path, FIELDS[:-1])
    with pytest.raises(ValueError, match="fields"):
        StatePage.open(path, [(n, "q" if c == "Q" else c) for n, c in FIELDS])
    with pytest.raises(ValueError, match="flag slots"):
        StatePage.open(path, FIELDS, flag_slots=8)
    with pytest.raises(ValueError):
        StatePage.create(str(tmp_path / "x"), [("a", "2I")])


def test_reader_racing_a_writer_thread_never_sees_a_mixed_page(tmp_path, checksums):
    path = str(tmp_path / "p")
    fields = [("a", "Q"), ("b", "I"), ("c", "q"), ("d", "Q")]
    writer = StatePage.create(path, fields)
    reader = StatePage.open(path, fields, readonly=True, checksums=checksums)
    reader.spin_limit = 10**6         # a busy writer thread must not make this test flaky
    stop = threading.Event()
    seen: list[int] = []
    bad: list[tuple] = []

    def read_loop() -> None:
        last = -1
        while not stop.is_set():
            v = reader.read()
            if not (v.a == v.b == v.c == v.d) or v.a < last:
                bad.append(tuple(v))
                return
            last = v.a
            seen.append(v.a)

    t = threading.Thread(target=read_loop)
    t.start()
    try:
        for i in range(1, 20001):
            writer.publish(a=i, b=i, c=i, d=i)
            if i % 97 == 0:
                time.sleep(0)
    finally:
        stop.set()
        t.join(timeout=60)
    assert bad == []
    assert seen and seen[-1] <= 20000


def test_reader_racing_a_field_by_field_writer_never_sees_a_mixed_page(tmp_path, checksums):
    """A writer that stores one field at a time (yielding the GIL in between, as a writer in
    another process may be preempted) is only safe because of the seqlock."""
    path = str(tmp_path / "p")
    fields = [("a", "Q"), ("b", "Q"), ("c", "Q")]
    page = StatePage.create(path, fields)
    reader = StatePage.open(path, fields, readonly=True, checksums=checksums)
    reader.spin_limit = 10**6
    q = seq_view(page)
    buf = memoryview(page._region.buf)
    stop = threading.Event()
    bad: list[tuple] = []
    reads = [0]

    def read_loop() -> None:
        while not stop.is_set():
            v = reader.read()
            reads[0] += 1
            if not v.a == v.b == v.c:
                bad.append(tuple(v))
                return

    def slow_publish(i: int) -> None:
        from crc32c import crc32c
        seq = q[SEQ]
        body = struct.pack("<QQQ", i, i, i)
        q[SEQ] = seq + 1
        for k in range(3):
            struct.pack_into("<Q", buf, PAYLOAD + 8 * k, i)
            time.sleep(0)                          # invite the reader in mid-update
        struct.pack_into("<I", buf, 72, crc32c(body, crc32c(struct.pack("<Q", seq + 2))))
        q[SEQ] = seq + 2

    t = threading.Thread(target=read_loop)
    t.start()
    try:
        for i in range(1, 3001):
            slow_publish(i)
    finally:
        stop.set()
        t.join(timeout=60)
    assert bad == []
    assert reads[0] > 0
    assert tuple(reader.read()) == (3000, 3000, 3000)


def test_read_retries_when_seq_changes_under_it(tmp_path):
    path = str(tmp_path / "p")
    fields = [("a", "Q"), ("b", "Q")]
    writer = StatePage.create(path, fields)
    reader = StatePage.open(path, fields, checksums=False)
    writer.publish(a=1, b=1)
    real_unpack = reader._unpack_from
    results: list[tuple] = []

    def unpack_while_writer_runs(mv, off):
        vals = real_unpack(mv, off)
        if not results:
            # Between the reader's two seq loads a writer stores a, the reader sees (2, 1), and
            # the writer completes its publish before the reader checks seq again.
            struct.pack_into("<Q", writer._region.buf, PAYLOAD, 2)
            vals = real_unpack(mv, off)
            writer.publish(a=2, b=2)
        results.append(vals)
        return vals

    reader._unpack_from = unpack_while_writer_runs
    assert tuple(reader.read()) == (2, 2)
    assert results == [(2, 1), (2, 2)]            # the torn snapshot was seen and discarded


def test_odd_seq_gives_stale_page_and_reset_seq_repairs(tmp_path, checksums):
    path = str(tmp_path / "p")
    writer = StatePage.create(path, FIELDS)
    writer.publish(generation=1, high_watermark=10)
    q = seq_view(writer)
    q[SEQ] += 1                                    # writer "died" mid-publish
    reader = StatePage.open(path, FIELDS, readonly=True, checksums=checksums)
    with pytest.raises(StalePage):
        reader.read(max_spins=100)
    with pytest.raises(StalePage):
        reader.read()                              # default budget is bounded too
    successor = StatePage.open(path, FIELDS)       # must not hang or fail on the odd seq
    assert successor.current.high_watermark == 10
    successor.reset_seq()
    assert successor.seq % 2 == 0
    assert reader.read().high_watermark == 10
    successor.publish(generation=2)
    assert reader.read().generation == 2


def test_publish_repairs_an_odd_seq(tmp_path):
    path = str(tmp_path / "p")
    writer = StatePage.create(path, FIELDS)
    q = seq_view(writer)
    q[SEQ] = 5
    writer.publish(status=4)
    assert writer.seq % 2 == 0 and writer.seq > 5
    assert StatePage.open(path, FIELDS).read().status == 4


def test_checksum_reader_rejects_a_payload_that_does_not_match_seq(tmp_path):
    """Models a weakly ordered machine where the new seq is visible before the new payload."""
    path = str(tmp_path / "p")
    writer = StatePage.create(path, FIELDS)
    writer.publish(high_watermark=5)
    q = seq_view(writer)
    q[SEQ] += 2                                    # even, but the payload is the old one
    checked = StatePage.open(path, FIELDS, readonly=True, checksums=True)
    with pytest.raises(StalePage):
        checked.read(max_spins=5)
    unchecked = StatePage.open(path, FIELDS, readonly=True, checksums=False)
    assert unchecked.read().high_watermark == 5    # TSO readers rely on store order instead
    q[SEQ] -= 2
    assert checked.read().high_watermark == 5


def test_flags_are_outside_the_seqlock(tmp_path):
    path = str(tmp_path / "p")
    writer = StatePage.create(path, FIELDS, flag_slots=8)
    fetcher = StatePage.open(path, FIELDS, flag_slots=8)
    assert not writer.any_flag() and writer.flags() == bytes(8)
    seq = writer.seq
    fetcher.set_flag(3, 1)
    assert writer.seq == seq                       # no seqlock traffic for flags
    assert writer.any_flag() and writer.flags() == bytes([0, 0, 0, 1, 0, 0, 0, 0])
    writer.publish(high_watermark=99)
    assert writer.flag(3) == 1                     # publish does not touch flags
    fetcher.set_flag(3, 0)
    assert not writer.any_flag()
    with pytest.raises(IndexError):
        fetcher.set_flag(8, 1)
    with pytest.raises(IndexError):
        fetcher.set_flag(-1, 1)


def test_page_inside_a_bigger_buffer():
    size = StatePage.size_for(FIELDS)
    region = Region.anonymous(4096)
    a = StatePage(region.buf, 0, FIELDS, init=True)
    b = StatePage(region.buf, size, FIELDS, init=True)
    a.publish(generation=1)
    b.publish(generation=2)
    assert StatePage(region.buf, 0, FIELDS).read().generation == 1
    assert StatePage(region.buf, size, FIELDS).read().generation == 2
    with pytest.raises(ValueError):
        StatePage(region.buf, 4096 - 64, FIELDS)
    with pytest.raises(ValueError):
        StatePage(region.buf, 2 * size, FIELDS)    # never formatted: bad magic


def test_regression_layouts_of_fields_given_as_lists_were_never_cached():
    # The runtime's page fields are lists; the cache took only tuples, so every page opened
    # (10,000 partitions' pages in a fetcher) compiled its layout again.
    from shm import statepage
    fields = [("a", "Q"), ("b", "I")]
    first = statepage._layout(fields, 8)
    assert statepage._layout(list(fields), 8) is first
    assert statepage._layout(tuple(fields), 8) is first
