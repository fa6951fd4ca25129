"""The ring envelope (appliance.ipc): every message type survives encode/decode under its request
id, every request's error reply carries the code for everything it asked, and the decoder knows
every Message subclass the appliance defines. Instances are built from the type annotations, so a
type added later is covered without touching this file."""

import enum
import importlib
import pathlib
import types
import typing

import msgspec
import pytest

from appliance import ipc
from appliance.errors import ErrorCode as E

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sample(tp):
    """A value of type ``tp`` with every optional and list part filled in."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if origin is list:
        return [sample(args[0]), sample(args[0])]
    if origin is tuple:
        return tuple(sample(a) for a in args)
    if origin is dict:
        return {sample(args[0]): sample(args[1])}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[1]
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        hints = typing.get_type_hints(tp)
        return tp(**{f: sample(hints[f]) for f in tp.__struct_fields__})
    return {int: 7, str: "s", bool: True, bytes: b"b", float: 7.5}[tp]


def error_fields(value) -> list:
    """Every ``error``/``error_code`` field anywhere inside ``value``."""
    out = []
    if isinstance(value, msgspec.Struct):
        for f in value.__struct_fields__:
            v = getattr(value, f)
            if f in ("error", "error_code"):
                out.append(v)
            else:
                out.extend(error_fields(v))
    elif isinstance(value, (list, tuple)):
        for v in value:
            out.extend(error_fields(v))
    return out


TYPES = ipc.message_types()
REQUESTS = [t for t in TYPES if issubclass(t, ipc.Request)]


@pytest.mark.parametrize("tp", TYPES, ids=lambda t: t.__name__)
def test_every_message_round_trips_in_the_envelope(tp):
    msg = sample(tp)
    raw = ipc.encode(2**60 + 5, msg)
    assert raw[0] not in (ipc.KIND_PRODUCE, ipc.KIND_PRODUCE_ACK)
    assert ipc.decode(raw) == (2**60 + 5, msg)
    assert ipc.decode(memoryview(raw)) == (2**60 + 5, msg)


@pytest.mark.parametrize("tp", REQUESTS, ids=lambda t: t.__name__)
def test_every_request_knows_its_error_reply(tp):
    req = sample(tp)
    reply = req.error_reply(E.coordinator_not_available)
    if tp is ipc.FenceProducerRequest:
        assert reply is None                    # one-way: nobody waits for an answer
        return
    assert isinstance(reply, ipc.Message) and not isinstance(reply, ipc.Request)
    codes = error_fields(reply)
    assert codes and all(c == E.coordinator_not_available for c in codes), reply
    assert ipc.decode(ipc.encode(1, reply)) == (1, reply)


def test_a_per_item_error_reply_answers_every_item_asked():
    from appliance.txn.messages import AddPartitionsToTxnRequest
    req = AddPartitionsToTxnRequest("t", 1, 0, [("a", 0), ("a", 1), ("b", 0)], 3)
    assert [(r.topic, r.partition, r.error) for r in req.error_reply(E.not_coordinator).results] == [
        ("a", 0, E.not_coordinator), ("a", 1, E.not_coordinator), ("b", 0, E.not_coordinator)]


def test_the_decoder_knows_every_message_type_the_appliance_defines():
    for path in sorted((ROOT / "appliance").rglob("*.py")):
        text = path.read_text()
        if "(Request)" in text or "(Message)" in text:
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    defined, todo = set(), [ipc.Message]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        defined.add(cls)
    defined -= {ipc.Message, ipc.Request}
    assert defined == set(TYPES)
    assert len({t.__name__ for t in TYPES}) == len(TYPES)        # tags are class names


def test_a_new_packages_messages_module_is_found_without_a_list(tmp_path, monkeypatch):
    """Ring messages are found by their module's name: a package that adds ``messages.py`` on
    ``appliance.ipc`` needs no edit of a hand-kept list (there was one, and a module missing from
    it failed to decode at run time); Kafka's wire messages (``protocol/messages.py``) are not
    ring messages and stay out."""
    root = tmp_path / "appliance"
    for pkg, text in {"newgroups": "from appliance.ipc import Message, Request\n",
                      "deep/er": "from appliance import ipc\n",
                      "protocol": "import kio\n"}.items():
        (root / pkg).mkdir(parents=True)
        (root / pkg / "messages.py").write_text(text)
    monkeypatch.setattr(ipc, "_ROOT", str(root))
    assert ipc.message_modules() == ["appliance.ipc", "appliance.deep.er.messages",
                                     "appliance.newgroups.messages"]
