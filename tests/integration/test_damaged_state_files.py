"""A damaged topic catalog, SCRAM credential file or ACL file (issue 34: torn, or a flipped byte
that leaves valid JSON) stops the start with exit status 3 and a message naming the file; it
never starts with the file believed or ignored (open to everyone), and changes nothing in the
data dir (the catalog's sweep would delete the directories of a topic whose name lost a bit)."""

from __future__ import annotations

import os
import subprocess

import pytest

from appliance.acl.model import (AclBinding, AclOperation as O, AclPermissionType as A,
                                 PatternType as P, ResourceType as R)
from appliance.acl.store import ACL_FILE, AclStore
from appliance.data_layout import CATALOG_FILE
from appliance.runtime import EXIT_DATA_DIR
from appliance.security.credentials import CREDENTIALS_FILE
from appliance_harness import APPLIANCE, free_port
from security_setup import users_add
from test_bit_rot import create, produce


def run(data_dir: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env["APPLIANCE_SERVER__RUNTIME_DIR"] = str(tmp_path / "run")
    env["APPLIANCE_SERVER__DISK_RESERVE_BYTES"] = "0"
    return subprocess.run([APPLIANCE, "run", "--listen", f"127.0.0.1:{free_port()}", "--data-dir",
                           data_dir], capture_output=True, text=True, timeout=60, env=env,
                          errors="replace")


def damage(path: str, how: str, needle: bytes) -> None:
    with open(path, "rb") as f:
        content = f.read()
    if how == "torn":
        content = content[:len(content) // 2]
    else:                                     # one bit of a byte inside a string value: valid JSON
        at = content.index(needle) + 1
        content = content[:at] + bytes([content[at] ^ 0x01]) + content[at + 1:]
    with open(path, "wb") as f:
        f.write(content)


def tree(d: str) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(d):
        for n in files:
            p = os.path.join(root, n)
            if n != ".lock" and "/." not in p[len(d):]:
                with open(p, "rb") as f:
                    out[os.path.relpath(p, d)] = f.read()
    return out


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A data dir with a topic, a SCRAM user and an ACL, cleanly stopped."""
    from appliance_harness import Appliance
    d = tmp_path_factory.mktemp("seeded")
    a = Appliance(data_dir=str(d / "data"), log_path=str(d / "appliance.log"))
    a.start()
    try:
        create(a, "orders", partitions=2)
        produce(a, "orders", 0, 50)
    finally:
        assert a.terminate() == 0
    assert users_add(a.data_dir, "alice", "alice-secret").returncode == 0
    AclStore(a.data_dir).create([AclBinding(int(R.TOPIC), "orders", int(P.LITERAL), "User:alice",
                                            "*", int(O.READ), int(A.ALLOW))])
    return a.data_dir


@pytest.mark.parametrize("name,needle", [(CATALOG_FILE, b'"orders"'),
                                         (CREDENTIALS_FILE, b'"alice"'),
                                         (ACL_FILE, b'"User:alice"')])
@pytest.mark.parametrize("how", ["torn", "flipped"])
def test_a_damaged_state_file_refuses_to_start_naming_it(seeded, tmp_path, name, needle, how):
    import shutil
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    path = os.path.join(data, name)
    damage(path, how, needle)
    before = tree(data)
    r = run(data, tmp_path)
    assert r.returncode == EXIT_DATA_DIR == 3, r.stderr[-3000:]
    assert path in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert tree(data) == before                 # nothing swept, rewritten or removed


def test_the_files_as_written_start(seeded, tmp_path):
    import shutil
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    from appliance_harness import Appliance
    a = Appliance(data_dir=data, log_path=str(tmp_path / "ok.log"))
    a.start()
    try:
        assert a.high_watermark("orders", 0) == 50
    finally:
        assert a.terminate() == 0


def test_the_offline_users_tool_refuses_a_damaged_credential_file_naming_it(seeded, tmp_path):
    import shutil
    data = str(tmp_path / "data")
    shutil.copytree(seeded, data)
    path = os.path.join(data, CREDENTIALS_FILE)
    damage(path, "flipped", b'"alice"')
    before = tree(data)
    r = users_add(data, "bob", "bob-secret")
    assert r.returncode == 1 and path in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert tree(data) == before                 # not written over
