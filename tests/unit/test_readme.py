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
