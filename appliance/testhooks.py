"""Crash points for tests: how an integration test makes a worker die at a precise step.

Owns nothing; imported by the partition writer (each step of a cleaner swap) and the cleaner
(after it wrote a cleaned copy). Without the environment variable ``TESTHOOK_CRASH`` (only the
tests set it; it does not start with ``APPLIANCE_``, so the configuration never reads it) a crash
point does nothing. With ``TESTHOOK_CRASH=<role>:<step>:<path>``, the first process of that role
to reach that step creates ``<path>`` and kills itself with SIGKILL, as a kill -9 would at that
instant; once ``<path>`` exists (the restarted process) the point does nothing again.
"""

from __future__ import annotations

import os
import signal

ENV = "TESTHOOK_CRASH"


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
