"""The ``appliance`` command run by a test: ``in_process`` (click's runner in the test's process:
the command's own code, output and exit code, without a Python start and the CLI's imports per
call) or ``installed`` (the installed entry point in a subprocess, as an operator runs it). Both
give a ``Ran``; neither passes the test's ``APPLIANCE_*`` variables on. A test module that runs
many commands runs most in process and at least one per tool through ``installed``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from appliance_harness import APPLIANCE


@dataclass
class Ran:
    """What a test reads of a command's run, the same in process as from a subprocess."""
    returncode: int
    stdout: str
    stderr: str


def _check(args, r: Ran, ok: bool) -> Ran:
    if ok:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def installed(*args: str, ok: bool = True, stdin: str | None = None, timeout: float = 120) -> Ran:
    """``appliance ARGS`` through the installed entry point, a subprocess; ``ok``: must exit 0."""
    r = subprocess.run([APPLIANCE, *args], capture_output=True, text=True, timeout=timeout, input=stdin,
                       env={k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")})
    return _check(args, Ran(r.returncode, r.stdout, r.stderr), ok)


def in_process(*args: str, ok: bool = True, stdin: str | None = None) -> Ran:
    """``appliance ARGS`` in this process (``appliance.cli.main`` under click's runner, with the
    ``APPLIANCE_*`` variables unset for the call). An exception other than the command's exit
    fails the test, as its traceback would fail a subprocess's checks."""
    from click.testing import CliRunner

    from appliance.cli import main
    try:
        runner = CliRunner(mix_stderr=False)          # click 8.1; 8.2 keeps stderr apart anyway
    except TypeError:
        runner = CliRunner()
    unset = {k: None for k in os.environ if k.startswith("APPLIANCE_")}
    r = runner.invoke(main, list(args), input=stdin, env=unset, prog_name="appliance")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return _check(args, Ran(r.exit_code, r.stdout, r.stderr), ok)
