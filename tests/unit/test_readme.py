"""README promises that must stay true."""

import os
import re

from appliance.api import api_ranges, load_handlers
from appliance.protocol.messages import api_name

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
