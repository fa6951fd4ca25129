"""shm.conntable: one frontend's connections per IP address, read by the other frontends."""

from __future__ import annotations

import pytest

from shm.conntable import ConnectionTable, address_key


def test_address_keys():
    assert address_key("127.0.0.1") == b"\0" * 10 + b"\xff\xff" + bytes([127, 0, 0, 1])
    assert address_key("::ffff:127.0.0.1") == address_key("127.0.0.1")
    assert address_key("fe80::1%eth0") == address_key("fe80::1")
    with pytest.raises(ValueError):
        address_key("not-an-address")


def test_owner_counts_and_readers_see_them(tmp_path):
    path = str(tmp_path / "conns.fe0")
    owner = ConnectionTable.create(path, capacity=64)
    reader = ConnectionTable.open(path)
    a, b = address_key("10.0.0.1"), address_key("10.0.0.2")
    assert owner.add(a, 1) == 1 and owner.add(a, 1) == 2 and owner.add(b, 1) == 1
    assert (reader.count(a), reader.count(b), reader.count(address_key("10.0.0.3"))) == (2, 1, 0)
    assert owner.add(a, -2) == 0
    assert reader.count(a) == 0 and reader.count(b) == 1
    owner.close()
    reader.close()


def test_finished_addresses_are_dropped_by_a_rebuild(tmp_path):
    path = str(tmp_path / "conns.fe0")
    owner = ConnectionTable.create(path, capacity=64)
    reader = ConnectionTable.open(path)
    keep = address_key("192.168.0.1")
    owner.add(keep, 3)
    for i in range(500):                 # far more addresses than slots, one at a time
        k = address_key(f"10.0.{i // 256}.{i % 256}")
        owner.add(k, 1)
        assert reader.count(k) == 1
        owner.add(k, -1)
    assert reader.count(keep) == 3 and not owner.full
    owner.close()
    reader.close()


def test_more_live_addresses_than_slots_go_uncounted_not_wrong(tmp_path):
    path = str(tmp_path / "conns.fe0")
    owner = ConnectionTable.create(path, capacity=16)
    reader = ConnectionTable.open(path)
    keys = [address_key(f"10.0.0.{i}") for i in range(40)]
    for k in keys:
        owner.add(k, 1)
    assert owner.full
    counted = [reader.count(k) for k in keys]
    assert set(counted) <= {0, 1} and sum(counted) >= 8
    for k in keys:
        owner.add(k, -1)
    assert all(reader.count(k) == 0 for k in keys)
    owner.close()
    reader.close()


def test_a_restarted_owner_starts_from_zero(tmp_path):
    path = str(tmp_path / "conns.fe0")
    first = ConnectionTable.create(path, capacity=64)
    first.add(address_key("10.0.0.1"), 5)
    first.close()
    again = ConnectionTable.open(path, owner=True)
    reader = ConnectionTable.open(path)
    assert reader.count(address_key("10.0.0.1")) == 0
    again.close()
    reader.close()
