"""The test tree itself: pytest's default import mode (rootdir-relative basenames, no packages)
refuses two test modules with one basename in different folders, and the whole run stops at
collection. Regression for CI exit 2 on tests/unit/test_operating.py vs tests/integration/."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_duplicate_test_module_basenames_stop_collection():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
