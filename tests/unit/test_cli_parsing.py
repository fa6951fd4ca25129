"""What the CLI's Kafka tools parse: console-producer lines (Kafka's LineMessageReader
properties), kafka-configs.sh's --add-config lists, consumer-protocol assignments."""

import struct

import click
import pytest

from appliance.cli.console import PRODUCER_DEFAULTS, _properties, parse_line
from appliance.cli.tool import names, parse_configs
from appliance.client.admin import decode_assignment


def test_console_lines_with_keys_headers_and_null_markers():
    plain = _properties([], PRODUCER_DEFAULTS)
    assert parse_line("just a value", plain) == (None, b"just a value", [])
    keyed = _properties(["parse.key=true", "key.separator=:", "null.marker=<null>"], PRODUCER_DEFAULTS)
    assert parse_line("k:v:w", keyed) == (b"k", b"v:w", [])
    assert parse_line("<null>:<null>", keyed) == (None, None, [])
    with pytest.raises(ValueError):
        parse_line("no separator", keyed)
    full = _properties(["parse.key=true", "parse.headers=true"], PRODUCER_DEFAULTS)
    assert parse_line("a:1,b:\tkey\tvalue", full) == (b"key", b"value", [("a", b"1"), ("b", b"")])
    assert parse_line("\tkey\tvalue", full) == (b"key", b"value", [])
    with pytest.raises(click.BadParameter):
        _properties(["no.such=1"], PRODUCER_DEFAULTS)


def test_add_config_lists_and_names():
    assert parse_configs(["a=1,b=[x,y]", "c=2"]) == {"a": "1", "b": "x,y", "c": "2"}
    with pytest.raises(click.BadParameter):
        parse_configs(["novalue"])
    assert names(["a,b", "b", " c "]) == ["a", "b", "c"]


def test_consumer_protocol_assignment():
    data = struct.pack(">hi", 1, 2) + struct.pack(">h", 1) + b"t" + struct.pack(">iii", 2, 1, 0) \
        + struct.pack(">h", 1) + b"u" + struct.pack(">ii", 1, 7) + struct.pack(">i", -1)
    assert decode_assignment(data) == [("t", 0), ("t", 1), ("u", 7)]
    assert decode_assignment(b"") == [] and decode_assignment(b"\x00\x01garbage") == []
