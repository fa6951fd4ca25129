"""Kafka's own JSON message definitions (``clients/src/main/resources/common/message/*.json``), for
the tests that compare our protocol tables with Kafka's rather than with kio's (from which the
tables come: that comparison would prove nothing).

Where they come from, first found wins:
1. ``KAFKA_MESSAGE_SPECS``: a folder holding the definitions, directly or under ``protocol/``
   (a checkout of Kafka's, or any fuller copy);
2. the installed kafka-python (a test dependency, its range pinned in pyproject.toml), which ships
   Kafka 4.3's definitions in ``kafka/protocol/schemas/resources/``;

and, for the APIs neither has (kafka-python lacks KIP-848's), the copies of Kafka's definitions in
``tests/unit/kafka_message_specs/``.

Nothing outside the clone and its virtual environment is read unless the variable says so. A
missing source fails the test (``pytest.fail``), never a skip: a skip would let CI pass without
ever comparing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

SPECS_ENV = "KAFKA_MESSAGE_SPECS"


def _installed_specs() -> Path | None:
    # Located, not imported: importing kafka-python is not needed to read its data files.
    found = importlib.util.find_spec("kafka")
    for root in (found.submodule_search_locations or []) if found else []:
        path = Path(root) / "protocol" / "schemas" / "resources"
        if any(path.glob("*Request.json")):
            return path
    return None


def spec_dir() -> Path:
    """The folder of ``*Request.json`` / ``*Response.json`` definitions."""
    named = os.environ.get(SPECS_ENV)
    if named:
        for path in (Path(named), Path(named) / "protocol"):
            if any(path.glob("*Request.json")):
                return path
        pytest.fail(f"{SPECS_ENV}={named} holds no *Request.json (directly or under protocol/)",
                    pytrace=False)
    path = _installed_specs()
    if path is None:
        pytest.fail("Kafka's JSON message definitions not found: kafka-python (a test dependency, "
                    "which ships them in kafka/protocol/schemas/resources/) is not installed; run "
                    f"`make install-test`, or set {SPECS_ENV} to a folder that holds them",
                    pytrace=False)
    return path


# Kafka's definitions of the APIs kafka-python does not ship (3.0.12 has no KIP-848
# ConsumerGroupHeartbeat / ConsumerGroupDescribe, nor KIP-932's Share* requests), copied from Kafka's
# clients/src/main/resources/common/message/ with their Apache license headers; KIP-714's
# GetTelemetrySubscriptions and PushTelemetry requests restated in our own words.
VENDORED = Path(__file__).parent / "kafka_message_specs"


def request_specs() -> dict[int, dict]:
    """{api key: the parsed request definition} (Kafka's JSON allows // comments); the
    vendored definitions fill in only APIs the source found lacks."""
    specs = {}
    for path in spec_dir().glob("*Request.json"):
        spec = json.loads(re.sub(r"//.*", "", path.read_text()))
        specs[spec["apiKey"]] = spec
    for path in VENDORED.glob("*Request.json"):
        spec = json.loads(re.sub(r"//.*", "", path.read_text()))
        specs.setdefault(spec["apiKey"], spec)
    return specs


def require(specs: dict[int, dict], api_keys, names: dict[int, str]) -> None:
    """Fail, naming them, when an API we serve has no definition in the source found."""
    missing = sorted(k for k in api_keys if k not in specs)
    if missing:
        pytest.fail("no Kafka message definition for the served API(s) "
                    + ", ".join(f"{names.get(k, '?')} ({k})" for k in missing)
                    + f" in {spec_dir()}: install a kafka-python that ships them, or set "
                    f"{SPECS_ENV} to a fuller copy", pytrace=False)
