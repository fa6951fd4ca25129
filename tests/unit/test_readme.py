"""README promises that must stay true."""

import os
import re

from appliance.api import api_ranges, load_handlers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_readme_api_table_matches_the_handler_registry():
    load_handlers()
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    table = {int(k): (int(lo), int(hi))
             for k, lo, hi in re.findall(r"^\| \w+ \((\d+)\) \| (\d+)-(\d+) \|$", text, re.M)}
    assert table == api_ranges()


def test_readme_lists_every_config_section():
    import msgspec
    from appliance.config import Config
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    for section, values in msgspec.to_builtins(Config()).items():
        for key, value in values.items():
            if isinstance(value, dict):
                assert f"`[{section}.{key}]`" in text
                for sub in value:
                    assert f"`{sub}`" in text, f"{section}.{key}.{sub} missing from README"
            else:
                assert f"`{key}`" in text, f"{section}.{key} missing from README"


def test_exit_statuses_the_unit_does_not_restart_are_the_readmes():
    """README's exit-status table and the systemd unit's RestartPreventExitStatus= agree."""
    with open(os.path.join(ROOT, "README.md")) as f:
        rows = re.findall(r"^\| (\d+) \|.*\| (yes|no)[^|]*\|$", f.read(), re.M)
    not_restarted = {int(code) for code, restarted in rows if restarted == "no" and code != "0"}
    with open(os.path.join(ROOT, "systemd", "appliance.service")) as f:
        (line,) = [l for l in f if l.startswith("RestartPreventExitStatus=")]
    assert set(map(int, line.split("=", 1)[1].split())) == not_restarted


def test_readme_reload_table_is_what_a_reload_applies():
    """Every key of every section sits in the column a SIGHUP reload puts it in (appliance.reload),
    and config.toml lists the same."""
    import msgspec
    from appliance import reload
    from appliance.config import Config
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("### Reload"):]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`["):
            rows[cells[0].strip("`[]")] = tuple({k.strip() for k in c.split(",") if k.strip()}
                                                for c in cells[1:])

    def sections(prefix, tree):
        keys = {k: v for k, v in tree.items() if not isinstance(v, dict)}
        if keys:
            yield prefix, keys
        for k, v in tree.items():
            if isinstance(v, dict):
                yield from sections(f"{prefix}.{k}" if prefix else k, v)
    for sec, keys in sections("", msgspec.to_builtins(Config())):
        live = {k.split(" (")[0] for k in rows[sec][0]}
        assert live == {k for k in keys if reload.is_live(f"{sec}.{k}")}, sec
        assert rows[sec][1] == {k for k in keys if not reload.is_live(f"{sec}.{k}")}, sec
    # config.toml marks the others, key by key.
    with open(os.path.join(ROOT, "config.toml")) as f:
        lines = f.read().splitlines()
    sec, marked = "", False
    for line in lines:
        if m := re.match(r"^\[([a-z.]+)\]$", line):
            sec, marked = m.group(1), False
        elif line.startswith("#"):
            marked = marked or line == "# Needs a restart."
        elif m := re.match(r"^([a-z_]+) = ", line):
            assert marked == (not reload.is_live(f"{sec}.{m.group(1)}")), f"{sec}.{m.group(1)}"
            marked = False
        else:
            marked = False


def test_readme_data_layout_names_every_file_the_code_writes():
    """README's "Data layout" table holds every name the code gives a file or folder of the data
    dir (regression: it listed five of them, not acls.json, __coordinator/, .reserve, .txnindex,
    cleaner-offset-checkpoint or the producer snapshots)."""
    from appliance import durable, runtime
    from appliance.data_layout import (CATALOG_FILE, COORDINATOR_DIR, GROUP_LOG_DIR,
                                       PARTITION_METADATA_FILE)
    from appliance.supervisor import reserve
    from appliance.acl import store as acl_store
    from appliance.group import store as group_store
    from appliance.log import files, producer_state
    from appliance.security import credentials
    from appliance.txn import producer_ids, state_manager
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text[text.index("### Data layout"):]
    section = section[:section.index("\n#", 1)]
    names = {
        "meta.properties", credentials.LOCK_FILE, runtime.RUNTIME_POINTER, reserve.RESERVE_FILE,
        CATALOG_FILE, credentials.CREDENTIALS_FILE, acl_store.ACL_FILE,
        PARTITION_METADATA_FILE, COORDINATOR_DIR, GROUP_LOG_DIR,
        files.LOG_SUFFIX, files.INDEX_SUFFIX, files.TIMEINDEX_SUFFIX, files.TXNINDEX_SUFFIX,
        durable.TMP_SUFFIX, files.LOG_START_OFFSET_FILE, files.RECOVERY_POINT_FILE,
        files.CLEAN_SHUTDOWN_FILE, files.DELETED_SUFFIX, files.CLEANED_SUFFIX, files.SWAP_FILE,
        files.CLEANER_CHECKPOINT_FILE, producer_state.SNAPSHOT_SUFFIX,
        state_manager.LOG_DIR, state_manager.COMPACTING_DIR, state_manager.OLD_DIR,
        state_manager.EPOCH_FILE, producer_ids.FILE_NAME,
        group_store.LOG_DIR, group_store.COMPACTING_DIR, group_store.OLD_DIR,
    }
    missing = sorted(n for n in names if n not in section)
    assert missing == []
