"""`appliance run` and `appliance check-config` exit statuses for what stops a start (README,
"Exit status"): each one documented, each with a message naming what to fix."""

from __future__ import annotations

import os
import socket
import subprocess

from appliance.runtime import (EXIT_CONFIG, EXIT_LISTEN_ADDRESS, EXIT_LISTEN_IN_USE,
                               EXIT_RUNTIME_DIR)
from appliance_harness import APPLIANCE, free_port


def _run(args, tmp_path, env=None, timeout=60):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    environ.update(env or {})
    return subprocess.run([APPLIANCE, *args], cwd=tmp_path, env=environ, capture_output=True,
                          timeout=timeout, text=True, errors="replace")


def test_port_in_use_exits_5_and_leaves_no_runtime_dir(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    run_dir = tmp_path / "run"
    try:
        r = _run(["run", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "data")],
                 tmp_path, env={"APPLIANCE_SERVER__RUNTIME_DIR": str(run_dir)})
    finally:
        holder.close()
    assert r.returncode == EXIT_LISTEN_IN_USE == 5, r.stderr
    # The message names the address and the process holding it (this test's).
    assert f"server.listen 127.0.0.1:{port}: address 127.0.0.1:{port} already in use (pid {os.getpid()}" \
        in r.stderr
    assert not run_dir.exists()
    assert not (tmp_path / "data" / ".runtime").exists()


def test_console_port_in_use_exits_5(tmp_path):
    """The console's socket is bound by the supervisor before any fork, as the listeners are."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        r = _run(["run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                  str(tmp_path / "data")], tmp_path,
                 env={"APPLIANCE_CONSOLE__LISTEN": f'"127.0.0.1:{port}"',
                      "APPLIANCE_SERVER__RUNTIME_DIR": str(tmp_path / "run")})
    finally:
        holder.close()
    assert r.returncode == EXIT_LISTEN_IN_USE, r.stderr
    assert f"console.listen 127.0.0.1:{port}: address 127.0.0.1:{port} already in use" in r.stderr


def test_unresolvable_listen_host_exits_6(tmp_path):
    r = _run(["run", "--listen", "no-such-host.invalid:9092", "--data-dir", str(tmp_path / "d")],
             tmp_path)
    assert r.returncode == EXIT_LISTEN_ADDRESS == 6, r.stderr
    assert "server.listen no-such-host.invalid:9092: host 'no-such-host.invalid' does not resolve" \
        in r.stderr


def test_runtime_dir_that_is_not_ours_exits_7_and_is_left_alone(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious").write_text("keep me")
    r = _run(["run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d")],
             tmp_path, env={"APPLIANCE_SERVER__RUNTIME_DIR": str(foreign)})
    assert r.returncode == EXIT_RUNTIME_DIR == 7, r.stderr
    assert "server.runtime_dir" in r.stderr and "refusing to remove it" in r.stderr
    assert (foreign / "precious").read_text() == "keep me"


def test_runtime_dir_that_cannot_be_made_exits_7(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = _run(["run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d")],
             tmp_path, env={"APPLIANCE_SERVER__RUNTIME_DIR": str(blocker / "run")})
    assert r.returncode == EXIT_RUNTIME_DIR, r.stderr
    assert f"runtime dir {blocker / 'run'} (server.runtime_dir) is unusable" in r.stderr


def test_config_errors_exit_2_at_check_config_and_run(tmp_path):
    """Issue 19 item 7: no traceback, no exit 1; the key (and the variable) is named."""
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[server]\n# caf\xe9\n')
    cases = [
        (["--config", str(bad)], {}, "not valid TOML: not UTF-8"),
        ([], {"APPLIANCE_SERVER__FRONTENDS": "100000"},
         "server.frontends: Expected `int` <= 256 (from environment APPLIANCE_SERVER__FRONTENDS)"),
        ([], {"APPLIANCE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1900000"},
         "groups.min_session_timeout_ms: must be <= groups.max_session_timeout_ms"),
        ([], {"APPLIANCE_SERVER__NODE_ID": str(2**31)}, "server.node_id: Expected `int` <= 2147483647"),
    ]
    for args, env, message in cases:
        for command in (["check-config"], ["run", "--listen", f"127.0.0.1:{free_port()}"]):
            r = _run([*command, *args, "--data-dir", str(tmp_path / "d")], tmp_path, env=env)
            assert r.returncode == EXIT_CONFIG, (command, args, env, r.stderr)
            assert message in r.stderr, (command, r.stderr)
            assert "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()     # refused before anything was made


def test_data_dir_that_is_a_file_says_so(tmp_path):
    (tmp_path / "data").write_text("")
    r = _run(["run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "data")],
             tmp_path)
    assert r.returncode == 3, r.stderr
    assert "is a file, not a directory" in r.stderr


def test_invalid_choice_lists_the_valid_values(tmp_path):
    r = _run(["check-config"], tmp_path, env={"APPLIANCE_LOG__FLUSH__POLICY": "fast"})
    assert r.returncode == EXIT_CONFIG
    assert "log.flush.policy: Invalid enum value 'fast' (valid values: 'batch', 'interval', 'os') " \
           "(from environment APPLIANCE_LOG__FLUSH__POLICY)" in r.stderr


def test_suggested_ring_size_is_accepted(tmp_path):
    """Regression: the smallest produce ring the error suggested was then refused as not a power
    of two."""
    r = _run(["check-config"], tmp_path, env={"APPLIANCE_LOG__MESSAGE_MAX_BYTES": "10000000"})
    assert r.returncode == EXIT_CONFIG
    suggested = r.stderr.split(" will do")[0].rsplit(" ", 1)[1]
    r = _run(["check-config"], tmp_path, env={"APPLIANCE_LOG__MESSAGE_MAX_BYTES": "10000000",
                                              "APPLIANCE_SHM__PRODUCE_RING_BYTES": suggested})
    assert r.returncode == 0, r.stderr


def test_version(tmp_path):
    from importlib.metadata import version
    r = _run(["--version"], tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"appliance {version('appliance')}"
