"""The first moments of a forked worker: from the supervisor's ``fork()`` to its entry point.

Runs in each child the supervisor forks (``Supervisor._spawn``), once, before the worker's own
code (``workers/*.py``): it drops what the child inherited and must not keep, names the process,
sets up its logging, runs the entry and exits with its status. Owns
nothing after that; it never returns.
"""

from __future__ import annotations

import gc
import logging
import os
from typing import Callable, NoReturn

from appliance import testhooks
from appliance.runtime import (WorkerContext, child_reset_signals, die_with_parent,
                               set_process_title, setup_logging, worker_title)

from .process_table import WorkerSpec


def run_child(spec: WorkerSpec, ctx: WorkerContext, parent_pid: int,
              close_inherited: Callable[[str], None], log_format: str) -> NoReturn:
    """Run ``spec``'s worker in the child just forked; ``close_inherited(role)`` closes the
    supervisor's descriptors the child must not hold."""
    # Everything inherited goes to the collector's permanent generation (a splice of its
    # lists, touching no object): the child's collections then never walk the parent's
    # objects, whose GC headers they would write, copying every page that holds one.
    gc.freeze()
    code = 1
    try:
        testhooks.pause_point(spec.role, "forked")
        child_reset_signals()
        die_with_parent(parent_pid)
        close_inherited(spec.role)
        title = worker_title(ctx)
        set_process_title(title)
        setup_logging(spec.name, fmt=log_format, role=spec.role, title=title)
        code = spec.entry(ctx) or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        logging.getLogger(spec.name).exception("worker crashed")
        code = 1
    finally:
        logging.shutdown()
        os._exit(code)
