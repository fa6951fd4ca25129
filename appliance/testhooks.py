"""Crash points for tests: how an integration test makes a worker die at a precise step.

Owns nothing; imported by the partition writer (each step of a cleaner swap) and the cleaner
(after it wrote a cleaned copy). Without the environment variable ``TESTHOOK_CRASH`` (only the
tests set it; it does not start with ``APPLIANCE_``, so the configuration never reads it) a crash
point does nothing. With ``TESTHOOK_CRASH=<role>:<step>:<path>``, the first process of that role
to reach that step creates ``<path>`` and kills itself with SIGKILL, as a kill -9 would at that
instant; once ``<path>`` exists (the restarted process) the point does nothing again.

``TESTHOOK_PAUSE=<role>:<step>:<seconds>`` makes every process of that role sleep that long at
that step (``pause_point``): a test widens a window that is otherwise a few microseconds wide.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "TESTHOOK_CRASH"
PAUSE_ENV = "TESTHOOK_PAUSE"


def crash_point(role: str, step: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    want_role, want_step, path = spec.split(":", 2)
    if want_role != role or want_step != step or os.path.exists(path):
        return
    with open(path, "w") as f:
        f.write(f"{role} {step} {os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def hook(role: str):
    """A step callback for ``role`` when a crash point is set, else None (no cost at all)."""
    if not os.environ.get(ENV):
        return None
    return lambda step: crash_point(role, step)


def pause_point(role: str, step: str) -> None:
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    want_role, want_step, seconds = spec.split(":", 2)
    if want_role == role and want_step == step:
        time.sleep(float(seconds))
