"""The writer's flusher thread: durable offset moves only after fdatasync, errors surface."""

import os
import threading

from appliance.log.flusher import Flusher


def test_durable_advances_after_fdatasync_and_wakes(tmp_path):
    woke = threading.Event()
    f = Flusher(woke.set, durable=10)
    fd = os.open(tmp_path / "seg", os.O_RDWR | os.O_CREAT)
    os.write(fd, b"x" * 100)
    f.start(os.dup(fd), 42)
    assert woke.wait(10)
    assert f.durable == 42 and not f.busy and f.error is None
    # never goes backwards
    woke.clear()
    f.start(os.dup(fd), 30)
    assert woke.wait(10) and f.durable == 42
    f.stop()
    os.close(fd)


def test_io_error_is_reported_not_swallowed(tmp_path):
    woke = threading.Event()
    f = Flusher(woke.set, durable=0)
    r, w = os.pipe()                 # fdatasync on a pipe fails (EINVAL)
    f.start(r, 5)
    assert woke.wait(10)
    assert f.error is not None and f.durable == 0
    f.stop()
    os.close(w)
