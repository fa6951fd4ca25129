"""kio glue: request/response classes by (api key, version), request decoding, response building.

Owns no state but per-process caches. Runs in the frontend (decode of every request) and in any
process that answers a request (building and encoding response bodies).

Request decoding (``decode_request``) is two passes over the body:

1. The *shape check* (``appliance.protocol.shape``), generated per request class from kio's
   dataclass schema: Kafka's schema rules (no null where the field is not nullable, no length or
   count beyond the bytes left, no tagged field that overruns), applied before kio reads
   anything, so that no handler sees what Kafka would not have parsed and kio never reserves
   room for a crafted count. Its failures, and kio's, are one ProtocolViolation: Kafka closes the
   connection for an unparsable request.
2. kio's native reader (``entity_reader``), which builds the frozen dataclasses. Where kio is
   stricter than Kafka (a nullable length below -1, a boolean byte of 2, a string that is not
   UTF-8), the body is read again after ``shape``'s lenient edits, off the hot path.

Trailing bytes after a complete body are ignored, as Kafka does (``AbstractRequest.parseRequest``
never checks ``remaining()``).

Response building: ``build(cls, values)`` / ``build_response(api_key, version, values)`` take plain
Python values (ints for error codes, milliseconds for durations and timestamps, dicts for nested
structs, lists for arrays) and fill every field the caller left out with Kafka's default (the
dataclass default when kio has one; else 0 / "" / empty / null records). Keys naming fields that
exist only in other versions of the same message are ignored, so one dict serves all versions;
a key that names no field of any version is a TypeError. Cost (measured on the dev box):
~1.4 µs per struct built (FindCoordinator v6 2.9 µs, a one-partition Produce v11 response 4.5 µs,
Metadata v12 with one broker/topic/partition 7.8 µs), and kio's writer adds ~9 µs for that
Produce response and ~14 µs for that Metadata response. Fine for admin APIs; the two hot
responses (Fetch, Produce) use the hand-written encoders in ``fetch_response`` (~1-2 µs). An
answer that repeats one result many times (a request naming one resource thousands of times)
goes through ``encode_response_items``, which encodes each distinct item once.
Decoding costs the shape check plus kio: ~1.6 µs for a one-partition Produce v9, ~2.1 µs for a
one-partition Fetch v15.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, fields
from importlib import import_module
from typing import Any, Final, TypeVar

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)
from kio.serial.readers import tz_aware_from_i64
from kio.static.constants import EntityType

from appliance.errors import ProtocolViolation
from appliance.protocol import shape
from appliance.protocol.primitives import I32, uvarint

__all__ = [
    "API_VERSIONS_KEY",
    "api_name",
    "known_versions",
    "is_known_version",
    "request_class",
    "response_class",
    "flexible_from",
    "flexible_versions_table",
    "decode_request",
    "preload",
    "encode_response",
    "encode_response_items",
    "build",
    "build_response",
    "build_api_versions_response",
    "api_versions_request_valid",
]

API_VERSIONS_KEY: Final = 18
UNSUPPORTED_VERSION: Final = 35

E = TypeVar("E")

# ---------------------------------------------------------------------------------------------
# Classes by (api key, version)
# ---------------------------------------------------------------------------------------------

_REQUEST_CLASSES: dict[tuple[int, int], type] = {}
_RESPONSE_CLASSES: dict[tuple[int, int], type] = {}


def api_name(api_key: int) -> str | None:
    """kio's snake_case name of an API (``produce``), or None for a key kio does not know."""
    return api_key_map.get(api_key)


def known_versions(api_key: int) -> tuple[int, int] | None:
    """(lowest, highest) version kio can parse for this API, or None for an unknown key."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = [v for v, kinds in schema_name_map[name].items() if EntityType.request in kinds]
    return (min(versions), max(versions)) if versions else None


def is_known_version(api_key: int, version: int) -> bool:
    """True if kio has a request class for this API version (so decode_request can parse it)."""
    name = api_key_map.get(api_key)
    return name is not None and EntityType.request in schema_name_map[name].get(version, {})


def _load(api_key: int, version: int, kind: EntityType) -> type:
    name = api_key_map.get(api_key)
    if name is None:
        raise ProtocolViolation(f"unknown api key {api_key}")
    path = schema_name_map[name].get(version, {}).get(kind)
    if path is None:
        raise ProtocolViolation(f"{name} (api key {api_key}) has no version {version}")
    module, _, attr = path.partition(":")
    cls: type = getattr(import_module(module), attr)
    return cls


def request_class(api_key: int, version: int) -> type:
    """kio's request dataclass; ProtocolViolation for an unknown api key or version."""
    key = (api_key, version)
    cls = _REQUEST_CLASSES.get(key)
    if cls is None:
        cls = _REQUEST_CLASSES[key] = _load(api_key, version, EntityType.request)
    return cls


def response_class(api_key: int, version: int) -> type:
    """kio's response dataclass; ProtocolViolation for an unknown api key or version."""
    key = (api_key, version)
    cls = _RESPONSE_CLASSES.get(key)
    if cls is None:
        cls = _RESPONSE_CLASSES[key] = _load(api_key, version, EntityType.response)
    return cls


_FLEXIBLE_FROM: dict[int, int | None] = {}


def flexible_from(api_key: int) -> int | None:
    """Lowest flexible (KIP-482) version of an API, from kio's classes; None if none is.

    Kafka declares flexibility as an open range ("flexibleVersions": "N+"), so a version above
    kio's highest is flexible too; that matters only for ApiVersions (see frames.py).
    Computed per API on first use: importing every request class of every API costs ~1 s.
    """
    if api_key not in _FLEXIBLE_FROM:
        rng = known_versions(api_key)
        if rng is None:
            raise ProtocolViolation(f"unknown api key {api_key}")
        found = None
        for v in range(rng[0], rng[1] + 1):
            if request_class(api_key, v).__flexible__:
                found = v
                break
        _FLEXIBLE_FROM[api_key] = found
    return _FLEXIBLE_FROM[api_key]


def flexible_versions_table() -> dict[int, tuple[str, int, int, int | None]]:
    """{api key: (name, lowest, highest, first flexible version)} for every API kio knows.

    Imports every request class (~1 s); meant for tests and tooling, not for the hot path.
    """
    table = {}
    for key, name in sorted(api_key_map.items()):
        rng = known_versions(key)
        if rng is not None:
            table[key] = (name, rng[0], rng[1], flexible_from(key))
    return table


# ---------------------------------------------------------------------------------------------
# Shape check (``shape``), then kio's native reader
# ---------------------------------------------------------------------------------------------

_READERS: dict[type, Callable[[Any, int], tuple[Any, int]]] = {}


def _reader(cls: type) -> Callable[[Any, int], tuple[Any, int]]:
    reader = _READERS.get(cls)
    if reader is None:
        reader = _READERS[cls] = entity_reader(cls)
    return reader


_BY_KEY: dict[tuple[int, int], tuple[type, shape.Guard, Callable[[Any, int], tuple[Any, int]]]] = {}


def decode_request(api_key: int, version: int, frame: Any, body_offset: int) -> Any:
    """Decode the request body that starts at ``body_offset`` of ``frame`` into kio's entity.

    A body Kafka cannot parse (truncated, a null where the field is not nullable, a length or
    count larger than the bytes left, a tagged field that overruns, bad varints; ``shape``)
    raises ProtocolViolation; the caller closes the connection, as Kafka does
    (RequestContext.parseRequest -> InvalidRequestException). Handlers therefore never see a
    None where Kafka's schema has no null. An unknown api key or version raises
    ProtocolViolation too. Trailing bytes after the body are ignored, as Kafka ignores them.
    """
    entry = _BY_KEY.get((api_key, version))
    if entry is None:
        cls = request_class(api_key, version)
        entry = _BY_KEY[(api_key, version)] = (cls, shape.guard(cls), _reader(cls))
    cls, guard, reader = entry
    if type(frame) is not bytes:
        if isinstance(frame, memoryview):
            if not frame.readonly:
                frame = frame.toreadonly()  # kio refuses writable buffers
        else:
            frame = bytes(frame)
    unknown: list[tuple[int, int, int, int, int]] = []
    try:
        end = guard(frame, body_offset, unknown)
    except shape.Malformed as exc:
        raise ProtocolViolation(f"{cls.__name__} v{version}: {exc}") from None
    except (IndexError, struct.error, ValueError) as exc:
        raise ProtocolViolation(f"{cls.__name__} v{version}: truncated or malformed body ({exc})") from None
    if end > len(frame):
        raise ProtocolViolation(f"{cls.__name__} v{version}: body truncated ({end - len(frame)} bytes short)")
    body, start = (shape.rewrite(frame, body_offset, unknown), 0) if unknown else (frame, body_offset)
    try:
        entity, _size = reader(body, start)
    except Exception as exc:  # kio's DecodeError family, ValueError, KeyError, UnicodeError ...
        return _decode_leniently(cls, version, frame, body_offset, exc)
    return entity


def _decode_leniently(cls: type, version: int, frame: Any, body_offset: int, refusal: Exception) -> Any:
    """kio refused a body that passed the shape check: read it as Kafka would (``shape``'s
    lenient edits: nullable lengths below -1, booleans other than 0/1, strings that are not
    UTF-8), or raise ProtocolViolation with kio's reason when no edit applies."""
    unknown: list[tuple[int, int, int, int, int]] = []
    fixes: list[tuple[int, int, bytes]] = []
    why = f"{type(refusal).__name__}: {refusal}"
    try:
        shape.lenient_guard(cls)(frame, body_offset, unknown, fixes)
    except shape.Malformed as exc:
        why = str(exc)
    except Exception:
        pass
    else:
        if fixes:
            try:
                entity, _size = _reader(cls)(shape.rewrite(frame, body_offset, unknown, fixes), 0)
                return entity
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
    raise ProtocolViolation(f"{cls.__name__} v{version}: {why}") from None


def preload(ranges: Mapping[int, tuple[int, int]]) -> int:
    """Import and compile everything decode/encode needs for these (api key -> (min, max)).

    Caches are filled lazily otherwise (~4 ms for the first request of each API version): the
    load tests call this to keep it off their measured path. Returns the number of versions loaded.
    """
    loaded = 0
    for api_key, (lo, hi) in ranges.items():
        for version in range(lo, hi + 1):
            if not is_known_version(api_key, version):
                continue
            cls = request_class(api_key, version)
            _BY_KEY.setdefault((api_key, version), (cls, shape.guard(cls), _reader(cls)))
            response_class(api_key, version)
            loaded += 1
    return loaded


# ---------------------------------------------------------------------------------------------
# Encoding and building responses
# ---------------------------------------------------------------------------------------------

_WRITERS: dict[type, Callable[[Any, Any], None]] = {}


def encode_response(entity: Any) -> bytes:
    """Serialize a kio response entity (body only, no header) with kio's writer."""
    cls = type(entity)
    writer = _WRITERS.get(cls)
    if writer is None:
        writer = _WRITERS[cls] = entity_writer(cls)
    buf = io.BytesIO()
    writer(buf, entity)
    return buf.getvalue()


def encode_response_items(entity: Any, field: str, items: tuple) -> list[bytes]:
    """``encode_response(entity)`` with ``items`` as its array ``field``, each distinct item
    (by identity) encoded once: for answers that repeat one result many times (a request naming
    one resource 50,000 times), which kio's writer would serialise entity by entity. ``field``
    must be the entity's last field and the class must have no tagged fields of its own."""
    cls = type(entity)
    names = [f.name for f in fields(cls)]
    if names[-1] != field or any(f.metadata.get("tag") is not None for f in fields(cls)):
        raise TypeError(f"{cls.__name__}.{field} is not the last field of a class without tags")
    empty_count, tags = (b"\x01", b"\x00") if cls.__flexible__ else (b"\x00\x00\x00\x00", b"")
    head = encode_response(dataclasses.replace(entity, **{field: ()}))
    if not head.endswith(empty_count + tags):
        raise TypeError(f"unexpected encoding of {cls.__name__} with an empty {field}")
    prefix = head[:len(head) - len(empty_count) - len(tags)]
    count = uvarint(len(items) + 1) if cls.__flexible__ else I32.pack(len(items))
    done: dict[int, bytes] = {}
    parts = [prefix, count]
    for item in items:
        data = done.get(id(item))
        if data is None:
            writer = _WRITERS.get(type(item))
            if writer is None:
                writer = _WRITERS[type(item)] = entity_writer(type(item))
            buf = io.BytesIO()
            writer(buf, item)
            data = done[id(item)] = buf.getvalue()
        parts.append(data)
    parts.append(tags)
    return parts


_ERROR_CODES: Final = {int(code): code for code in ErrorCode}
_EPOCH: Final = tz_aware_from_i64(0)  # type: ignore[arg-type]
_UUID_ZERO: Final = uuid.UUID(int=0)
_MISSING: Final = object()


def _to_error_code(value: Any) -> ErrorCode:
    if type(value) is ErrorCode:
        return value
    try:
        return _ERROR_CODES[value]
    except KeyError:
        raise ValueError(f"unknown Kafka error code {value!r}") from None


def _to_timedelta(value: Any) -> datetime.timedelta:
    if isinstance(value, datetime.timedelta):
        return value
    return datetime.timedelta(milliseconds=value)


def _to_datetime(value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value
    return tz_aware_from_i64(value)


def _to_optional_datetime(value: Any) -> datetime.datetime | None:
    # Kafka encodes "no timestamp" as -1 (e.g. ProduceResponse.LogAppendTimeMs with CreateTime).
    if value is None or (type(value) is int and value < 0):
        return None
    return _to_datetime(value)


def _to_uuid(value: Any) -> uuid.UUID | None:
    if value is None or isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(bytes=bytes(value))


_PRIMITIVE_CONVERTERS: Final[dict[str, Callable[[Any], Any]]] = {
    "error_code": _to_error_code,
    "timedelta_i32": _to_timedelta,
    "timedelta_i64": _to_timedelta,
    "datetime_i64": _to_datetime,
    "uuid": _to_uuid,
}

_PRIMITIVE_DEFAULTS: Final[dict[str, Any]] = {
    "error_code": ErrorCode.none,
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": _EPOCH,
    "uuid": _UUID_ZERO,
    "bool": False,
    "float64": 0.0,
    "string": "",
    "bytes": b"",
    "records": None,  # Kafka's default for a records field is null
}


class _Plan:
    """How to build one entity class: per field (name, alias, converter or None, default)."""

    __slots__ = ("cls", "fields", "accepted", "everywhere")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.fields: list[tuple[str, str | None, Callable[[Any], Any] | None, Any]] = []
        self.accepted: set[str] = set()
        self.everywhere: frozenset[str] | None = None  # field names in any version (lazy)
        for f in fields(cls):
            conv, default, alias = _field_plan(f)
            self.fields.append((f.name, alias, conv, default))
            self.accepted.add(f.name)
            if alias:
                self.accepted.add(alias)


def _entity_converter(sub: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        return build(sub, value) if isinstance(value, Mapping) else value
    return convert


def _entity_tuple_converter(sub: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        return tuple(build(sub, v) if isinstance(v, Mapping) else v for v in value)
    return convert


def _primitive_tuple_converter(elem: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        return tuple(value) if elem is None else tuple(map(elem, value))
    return convert


def _field_plan(f: Field) -> tuple[Callable[[Any], Any] | None, Any, str | None]:
    fc = classify_field(f)
    optional = is_optional(f)
    conv: Callable[[Any], Any] | None
    alias = None
    if isinstance(fc, PrimitiveField):
        kafka_type = f.metadata["kafka_type"]
        conv = _PRIMITIVE_CONVERTERS.get(kafka_type)
        if kafka_type == "datetime_i64" and optional:
            conv = _to_optional_datetime
        if kafka_type in ("timedelta_i32", "timedelta_i64", "datetime_i64"):
            alias = f"{f.name}_ms"
        if optional and kafka_type in ("datetime_i64", "records"):
            default = None
        else:
            default = _PRIMITIVE_DEFAULTS.get(kafka_type, 0)
    elif isinstance(fc, PrimitiveTupleField):
        conv = _primitive_tuple_converter(_PRIMITIVE_CONVERTERS.get(f.metadata["kafka_type"]))
        default = ()
    elif isinstance(fc, EntityField):
        conv = _entity_converter(fc.type_)
        default = None if optional else _LazyDefault(fc.type_)
    else:
        assert isinstance(fc, EntityTupleField)
        conv = _entity_tuple_converter(fc.type_)
        default = ()
    if f.default is not MISSING:
        default = f.default
    return conv, default, alias


class _LazyDefault:
    """A nested struct default built on first use (plans are made lazily, avoid recursion)."""

    __slots__ = ("cls",)

    def __init__(self, cls: type) -> None:
        self.cls = cls


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _Plan(cls)
        for i, (name, alias, conv, default) in enumerate(plan.fields):
            if isinstance(default, _LazyDefault):
                plan.fields[i] = (name, alias, conv, build(default.cls))
    return plan


def _names_in_any_version(cls: type) -> frozenset[str]:
    """Field names (and _ms aliases) of the same-named struct in every version of its API."""
    parts = cls.__module__.split(".")  # kio.schema.<api>.v<N>.<request|response>
    names: set[str] = set()
    if len(parts) == 5 and parts[:2] == ["kio", "schema"]:
        api, kind = parts[2], parts[4]
        for v in schema_name_map.get(api, {}):
            try:
                other = getattr(import_module(f"kio.schema.{api}.v{v}.{kind}"), cls.__name__, None)
            except ImportError:
                continue
            if other is not None:
                names |= _plan(other).accepted
    return frozenset(names or _plan(cls).accepted)


def build(cls: type[E], values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> E:
    """Build a kio entity from plain values, filling defaults for every field not given.

    ``values``/``kwargs`` use kio's field names (``throttle_time``; ``throttle_time_ms`` also works
    for durations and timestamps, given in milliseconds). Error codes may be ints, UUIDs may be 16
    bytes, nested structs dicts, arrays lists. Keys of fields that this version lacks but another
    version of the same message has are ignored; any other unknown key raises TypeError.
    """
    if values is None:
        values = kwargs
    elif kwargs:
        values = {**values, **kwargs}
    plan = _plan(cls)
    args: dict[str, Any] = {}
    matched = 0
    for name, alias, conv, default in plan.fields:
        value = values.get(name, _MISSING)
        if value is _MISSING and alias is not None:
            value = values.get(alias, _MISSING)
        if value is _MISSING:
            args[name] = default
        else:
            matched += 1
            args[name] = value if conv is None else conv(value)
    if matched != len(values):
        if plan.everywhere is None:
            plan.everywhere = _names_in_any_version(cls)
        unknown = [k for k in values if k not in plan.everywhere]
        if unknown:
            raise TypeError(f"{cls.__module__}.{cls.__name__} has no field {', '.join(map(repr, unknown))}")
    return cls(**args)


def build_response(api_key: int, version: int, values: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Any:
    """``build(response_class(api_key, version), values, **kwargs)``."""
    return build(response_class(api_key, version), values, **kwargs)


# ---------------------------------------------------------------------------------------------
# ApiVersions
# ---------------------------------------------------------------------------------------------

# KIP-511: ClientSoftwareName/Version must match this (ApiVersionsRequest.isValid), else Kafka
# answers INVALID_REQUEST.
_SOFTWARE_NAME: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_versions_request_valid(request: Any) -> bool:
    """False if a v3+ ApiVersions request names its client software with forbidden characters."""
    if request.__version__ < 3:
        return True
    return bool(
        _SOFTWARE_NAME.fullmatch(request.client_software_name)
        and _SOFTWARE_NAME.fullmatch(request.client_software_version)
    )


def build_api_versions_response(
    version: int,
    ranges: Mapping[int, tuple[int, int]],
    error_code: int = 0,
    throttle_time_ms: int = 0,
    supported_features: Mapping[str, tuple[int, int]] | None = None,
    finalized_features: Mapping[str, int] | None = None,
    finalized_features_epoch: int = -1,
) -> bytes:
    """Encode an ApiVersions response body for a request of ``version``.

    ``ranges`` maps api key -> (min, max) of what we serve. A request version we cannot answer
    (not known to kio, or outside ``ranges[18]``) gets what Kafka sends (RequestContext treats it
    as v0; ApiVersionsRequest.getErrorResponse): the v0 layout, UNSUPPORTED_VERSION, and only the
    ApiVersions entry, so the client retries with a version in that range.
    Any other non-zero ``error_code`` (e.g. INVALID_REQUEST for a bad client software name)
    answers with an empty key list, as Kafka does.

    ``supported_features``: name -> (min, max). For request versions < 4, features whose min is
    0 are left out (KAFKA-17492: older clients fail to parse them).
    ``finalized_features``: name -> level (sent as min = max = level; level 0 is left out).
    Both go only into v3+ responses (tagged fields).
    """
    known = known_versions(API_VERSIONS_KEY)
    assert known is not None
    own = ranges.get(API_VERSIONS_KEY, known)
    if not (known[0] <= version <= known[1] and own[0] <= version <= own[1]):
        cls = response_class(API_VERSIONS_KEY, 0)
        entry = _api_version_entry(cls, API_VERSIONS_KEY, own)
        return encode_response(cls(error_code=ErrorCode.unsupported_version, api_keys=(entry,)))
    cls = response_class(API_VERSIONS_KEY, version)
    if error_code:
        entries: tuple[Any, ...] = ()
        if error_code == UNSUPPORTED_VERSION:
            entries = (_api_version_entry(cls, API_VERSIONS_KEY, own),)
        return encode_response(build(cls, error_code=error_code, api_keys=entries,
                                     throttle_time_ms=throttle_time_ms))
    entries = tuple(_api_version_entry(cls, key, rng) for key, rng in sorted(ranges.items()))
    values: dict[str, Any] = {"error_code": 0, "api_keys": entries, "throttle_time_ms": throttle_time_ms}
    if version >= 3:
        module = import_module(cls.__module__)
        values["supported_features"] = tuple(
            module.SupportedFeatureKey(name=name, min_version=lo, max_version=hi)
            for name, (lo, hi) in sorted((supported_features or {}).items())
            if not (version < 4 and lo == 0)
        )
        values["finalized_features"] = tuple(
            module.FinalizedFeatureKey(name=name, min_version_level=level, max_version_level=level)
            for name, level in sorted((finalized_features or {}).items())
            if level != 0
        )
        values["finalized_features_epoch"] = finalized_features_epoch
    return encode_response(build(cls, values))


def _api_version_entry(cls: type, api_key: int, rng: tuple[int, int]) -> Any:
    module = import_module(cls.__module__)
    return module.ApiVersion(api_key=api_key, min_version=rng[0], max_version=rng[1])
