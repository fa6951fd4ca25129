"""The cleaner's swap and copies on a full disk (no fork: ENOSPC injected where the file system
would answer it): the commit refused with nothing changed, nothing after the commit waiting for
space, a copy cut short by ENOSPC removed."""

from __future__ import annotations

import errno
import os

import pytest

from appliance.log import swap
from appliance.log.cleaner import clean as clean_mod
from appliance.log.files import CLEANED_SUFFIX, DELETED_SUFFIX
from cleanerkit import Part


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def part(tmp_path):
    p = Part(str(tmp_path))
    for rnd in range(6):
        p.put([(b"k%d" % i, b"r%d-%d" % (rnd, i)) for i in range(4)])
    p.roll()
    yield p
    p.close()


def _leftovers(p: Part) -> list[str]:
    return [n for n in os.listdir(p.d) if n.endswith((CLEANED_SUFFIX, DELETED_SUFFIX))
            or n == "cleaner-swap"]


def test_a_full_disk_at_the_commit_changes_nothing_and_removes_the_copies(part, monkeypatch):
    p = part
    before = p.read()
    with monkeypatch.context() as m:
        m.setattr(swap, "atomic_write", _no_space)
        with pytest.raises(swap.SwapNoSpace):
            p.clean()
    assert isinstance(swap.SwapNoSpace("x"), swap.SwapRefused)
    assert p.read() == before and not _leftovers(p) and p.checkpoint() is None
    p.reopen(clean=False)
    assert p.read() == before
    # With room again the same round goes through.
    p.clean()
    assert len(p.read()) == 4 and p.checkpoint() == p.log.active_segment_base


def test_nothing_after_the_commit_waits_for_space(part, monkeypatch):
    p = part
    with monkeypatch.context() as m:
        # The cleaner checkpoint and the retired names cannot be made: both are given up.
        m.setattr(swap, "write_checkpoint", _no_space)
        m.setattr(os, "link", _no_space)
        p.clean()
    got = p.read()
    assert [r.value for r in got] == [b"r5-%d" % i for i in range(4)]
    assert p.checkpoint() is None and not p.log.has_retired and not _leftovers(p)
    p.reopen(clean=False)
    assert p.read() == got
    p.clean()                                   # reads the clean segments again, changes nothing
    assert p.read() == got and p.checkpoint() == p.log.active_segment_base


def test_the_roll_forward_at_open_needs_no_space(part, monkeypatch):
    p = part

    def crash(name):
        if name == "committed":
            raise RuntimeError(name)
    p.log.crash_hook = crash
    with pytest.raises(RuntimeError):
        p.clean()
    with monkeypatch.context() as m:
        m.setattr(swap, "write_checkpoint", _no_space)
        p.reopen(clean=False)                   # finishes the committed swap
    assert [r.value for r in p.read()] == [b"r5-%d" % i for i in range(4)]
    assert not _leftovers(p)


def test_a_copy_cut_short_by_a_full_disk_is_removed(part, monkeypatch):
    p = part
    before = p.read()
    with monkeypatch.context() as m:
        m.setattr(clean_mod._CleanedWriter, "finish", lambda self, mtime_ms: _no_space())
        with pytest.raises(OSError) as ei:
            p.clean()
    assert ei.value.errno == errno.ENOSPC
    assert not _leftovers(p) and p.read() == before
