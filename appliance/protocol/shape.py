"""Shape check of request bodies: Kafka's schema rules, generated per kio request class.

Owns nothing but per-process caches of generated code; runs wherever requests are decoded (the
frontends, through ``messages.decode_request``).

kio's native reader builds the request entities, but its rules are not Kafka's: it reads a null
where Kafka's schema forbids one (a null non-nullable array becomes None, and a handler iterating
it raised TypeError), it reserves ``count`` slots before reading an array (a crafted count near
2**31 asks for tens of GiB and the Rust runtime aborts the whole process), and it refuses some
bodies that Kafka reads. Before kio sees a body, a function generated from the class's dataclass
schema (straight-line Python, compiled once; fixed-size runs skipped in one step) walks the wire
layout and applies the rules of Kafka's generated readers (MessageDataGenerator), all of which make
the body unparsable (``Malformed``; the connection is closed, as Kafka's
RequestContext.parseRequest -> InvalidRequestException does):

* a negative length or count in a field that is not nullable in this version: "non-nullable field
  X was serialized as null" (strings, bytes, arrays, array elements; kio's schema carries Kafka's
  nullableVersions, a unit test compares them with Kafka's JSON specs);
* an array count, string or bytes length larger than the bytes left ("Tried to allocate a
  collection of size N, but there are only M bytes remaining"), checked before anything is read;
* a string longer than 0x7fff bytes (compact strings could say more);
* an unknown tagged field whose size runs past the end of the body.

Trailing bytes after a complete body are ignored, as Kafka ignores them
(AbstractRequest.parseRequest never looks at what remains), and so is the size of a known tagged
field (Kafka reads it by its schema).

Tagged fields unknown to kio's schema are skipped by Kafka; kio raises, so they are cut out of a
copy of the body (``rewrite``) before kio sees it (rare: only clients newer than kio's schema send
them).

Where kio is stricter than Kafka, a second, *lenient* variant of the function runs, only after kio
refused the body (never on the hot path), and lists the edits that make the body say what Kafka
would have read: a nullable length below -1 is null to Kafka (any negative length is), a boolean
byte other than 0 and 1 is true, a string that is not UTF-8 is decoded with replacement characters
(Java's ``new String(bytes, UTF_8)``), a nullable struct's marker byte is null when negative, and
a 64-bit duration beyond what kio can represent is clamped to the largest it can (Kafka keeps the
long; either way it is longer than any retention).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field, fields
from typing import Any, Final

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    is_optional,
)

from appliance.protocol.primitives import I16, I32, I64, read_uvarint, uvarint

__all__ = ["Malformed", "ShortArray", "Guard", "guard", "lenient_guard", "guard_source", "rewrite"]

# Wire size of every fixed-width kio kafka_type.
_FIXED_SIZE: Final = {
    "int8": 1, "uint8": 1, "bool": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "timedelta_i64": 8, "datetime_i64": 8,
    "uuid": 16,
}
_VARIABLE: Final = {"string", "bytes", "records"}
_MAX_STRING: Final = 0x7FFF
# kio turns a 64-bit millisecond duration into a timedelta through microseconds in an i64.
_TIMEDELTA_MS_MAX: Final = (2**63 - 1) // 1000


class Malformed(Exception):
    """A body Kafka's generated readers refuse: the request is unparsable."""


class ShortArray(Malformed):
    def __init__(self, name: str, count: int, remaining: int) -> None:
        super().__init__(f"{name}: array of {count} items with only {remaining} bytes left")


# (fast check, lenient check): fast(b, p, unknown) -> end; lenient(b, p, unknown, fixes) -> end.
Guard = Callable[..., int]


class _Source:
    """Generates the check of one request class. ``lenient`` adds the edits (``fix``)."""

    def __init__(self, lenient: bool) -> None:
        self.lenient = lenient
        self.lines: list[str] = []
        self.counter = 0

    def var(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def flush(self, indent: int, fixed: int) -> int:
        if fixed:
            self.emit(indent, f"p += {fixed}")
        return 0

    def varint_into(self, indent: int, var: str) -> None:
        # Inline the one-byte case: nearly every count and length is < 128.
        self.emit(indent, f"{var} = b[p]")
        self.emit(indent, f"if {var} < 128:")
        self.emit(indent + 1, "p += 1")
        self.emit(indent, "else:")
        self.emit(indent + 1, f"{var}, p = _uv(b, p)")

    def null_refused(self, indent: int, name: str) -> None:
        self.emit(indent, f"raise _Malformed('non-nullable field {name} was serialized as null')")

    def skip_variable(self, indent: int, kafka_type: str, flexible: bool, nullable: bool,
                      name: str) -> None:
        n = self.var("s")
        start = self.var("q")
        is_string = kafka_type == "string"
        if flexible:  # compact string/bytes: uvarint length+1, 0 = null
            if self.lenient and is_string:
                self.emit(indent, f"{start} = p")
            self.varint_into(indent, n)
            self.emit(indent, f"if not {n}:")
            if nullable:
                self.emit(indent + 1, "pass")
            else:
                self.null_refused(indent + 1, name)
            if is_string:
                self.emit(indent, f"elif {n} > {_MAX_STRING + 1}:")
                self.emit(indent + 1, f"raise _Malformed(f'string field {name} had invalid length {{{n} - 1}}')")
            self.emit(indent, f"elif {n} - 1 > end - p:")
            self.emit(indent + 1, f"raise _Malformed(f'{name}: {{{n} - 1}} bytes with only {{end - p}} left')")
            self.emit(indent, "else:")
            self.emit(indent + 1, f"{n} -= 1")
        else:
            unpack, width = ("_i16", 2) if is_string else ("_i32", 4)
            self.emit(indent, f"{n} = {unpack}(b, p)[0]")
            self.emit(indent, f"p += {width}")
            self.emit(indent, f"if {n} < 0:")
            if not nullable:
                self.null_refused(indent + 1, name)
            elif self.lenient:
                null = "b'\\xff\\xff'" if width == 2 else "b'\\xff\\xff\\xff\\xff'"
                self.emit(indent + 1, f"if {n} != -1:")
                self.emit(indent + 2, f"fix.append((p - {width}, p, {null}))")
            else:
                self.emit(indent + 1, "pass")
            self.emit(indent, f"elif {n} > end - p:")
            self.emit(indent + 1, f"raise _Malformed(f'{name}: {{{n}}} bytes with only {{end - p}} left')")
            self.emit(indent, "else:")
            if self.lenient and is_string:
                self.emit(indent + 1, f"{start} = p - 2")
        if self.lenient and is_string:
            self.emit(indent + 1, "try:")
            self.emit(indent + 2, f"str(b[p:p + {n}], 'utf-8')")
            self.emit(indent + 1, "except UnicodeDecodeError:")
            self.emit(indent + 2, f"fix.append(({start}, p + {n}, _restring(b[p:p + {n}], {flexible})))")
        self.emit(indent + 1, f"p += {n}")

    def array_count(self, indent: int, var: str, flexible: bool, nullable: bool, name: str) -> None:
        if flexible:
            self.varint_into(indent, var)
            self.emit(indent, f"{var} -= 1")
        else:
            self.emit(indent, f"{var} = _i32(b, p)[0]")
            self.emit(indent, "p += 4")
        self.emit(indent, f"if {var} < 0:")
        if not nullable:
            self.null_refused(indent + 1, name)
        elif self.lenient and not flexible:
            self.emit(indent + 1, f"if {var} != -1:")
            self.emit(indent + 2, "fix.append((p - 4, p, b'\\xff\\xff\\xff\\xff'))")
        else:
            self.emit(indent + 1, "pass")
        # Kafka: "Tried to allocate a collection of size N, but there are only M bytes remaining."
        self.emit(indent, f"elif {var} > end - p:")
        self.emit(indent + 1, f"raise _ShortArray('{name}', {var}, end - p)")

    def fixed_lenient(self, indent: int, kafka_type: str) -> bool:
        """Emit the lenient fix of one fixed-size field; False if the type needs none."""
        if kafka_type == "bool":     # Kafka: readByte() != 0
            self.emit(indent, "if b[p] > 1:")
            self.emit(indent + 1, "fix.append((p, p + 1, b'\\x01'))")
        elif kafka_type == "timedelta_i64":
            v = self.var("d")
            self.emit(indent, f"{v} = _i64(b, p)[0]")
            self.emit(indent, f"if {v} > {_TIMEDELTA_MS_MAX} or {v} < -{_TIMEDELTA_MS_MAX}:")
            self.emit(indent + 1, f"fix.append((p, p + 8, _I64({v} > 0 and {_TIMEDELTA_MS_MAX} "
                                  f"or -{_TIMEDELTA_MS_MAX})))")
        else:
            return False
        self.emit(indent, f"p += {_FIXED_SIZE[kafka_type]}")
        return True

    def field(self, f: Field, flexible: bool, indent: int, fixed: int) -> int:
        fc = classify_field(f)
        name = f.name
        if isinstance(fc, PrimitiveField):
            kafka_type = f.metadata["kafka_type"]
            size = _FIXED_SIZE.get(kafka_type)
            if size is not None:
                if self.lenient and kafka_type in ("bool", "timedelta_i64"):
                    self.flush(indent, fixed)
                    self.fixed_lenient(indent, kafka_type)
                    return 0
                return fixed + size
            if kafka_type not in _VARIABLE:
                raise TypeError(f"no shape rule for kafka_type {kafka_type!r}")
            self.flush(indent, fixed)
            self.skip_variable(indent, kafka_type, flexible, is_optional(f), name)
            return 0
        self.flush(indent, fixed)
        if isinstance(fc, EntityField):
            self.entity(fc.type_, indent, nullable=is_optional(f))
            return 0
        count = self.var("n")
        self.array_count(indent, count, flexible, is_optional(f), name)
        if isinstance(fc, PrimitiveTupleField):
            kafka_type = f.metadata["kafka_type"]
            size = _FIXED_SIZE.get(kafka_type)
            if size is not None and not (self.lenient and kafka_type in ("bool", "timedelta_i64")):
                self.emit(indent, f"if {count} > 0:")
                self.emit(indent + 1, f"p += {count} * {size}")
            elif size is not None:
                self.emit(indent, f"for _ in range({count}):")
                self.fixed_lenient(indent + 1, kafka_type)
            else:
                # Kafka's array elements are never nullable.
                self.emit(indent, f"for _ in range({count}):")
                self.skip_variable(indent + 1, kafka_type, flexible, False, f"{name} element")
        else:
            assert isinstance(fc, EntityTupleField)
            self.emit(indent, f"for _ in range({count}):")
            self.emit(indent + 1, "pass")
            self.entity(fc.type_, indent + 1, nullable=False)
        return 0

    def entity(self, cls: type, indent: int, nullable: bool) -> None:
        if nullable:  # KIP-893 nullable struct: int8 marker; Kafka reads any negative one as null
            marker = self.var("m")
            self.emit(indent, f"{marker} = b[p]")
            self.emit(indent, "p += 1")
            if self.lenient:
                self.emit(indent, f"if 128 <= {marker} < 255:")
                self.emit(indent + 1, "fix.append((p - 1, p, b'\\xff'))")
            self.emit(indent, f"if {marker} < 128:")
            indent += 1
            self.emit(indent, "pass")
        flexible = cls.__flexible__
        tagged: dict[int, Field] = {}
        fixed = 0
        for f in fields(cls):
            tag = f.metadata.get("tag")
            if tag is not None:
                tagged[tag] = f
            else:
                fixed = self.field(f, flexible, indent, fixed)
        self.flush(indent, fixed)
        if flexible:
            self.tags(indent, tagged, flexible)

    def tags(self, indent: int, tagged: dict[int, Field], flexible: bool) -> None:
        count, start, after = self.var("t"), self.var("cs"), self.var("ce")
        self.emit(indent, f"{start} = p")
        self.varint_into(indent, count)
        self.emit(indent, f"if {count}:")
        self.emit(indent + 1, f"{after} = p")
        self.emit(indent + 1, f"for _ in range({count}):")
        inner = indent + 2
        tag_start = self.var("ts")
        self.emit(inner, f"{tag_start} = p")
        self.emit(inner, "tg, p = _uv(b, p)")
        self.emit(inner, "sz, p = _uv(b, p)")
        # kio reads a known tagged field by its schema (ignoring the size), as Kafka does, so we
        # walk it too.
        keyword = "if"
        for tag in sorted(tagged):
            self.emit(inner, f"{keyword} tg == {tag}:")
            self.emit(inner + 1, "pass")
            self.flush(inner + 1, self.field(tagged[tag], flexible, inner + 1, 0))
            keyword = "elif"
        self.emit(inner, "else:" if tagged else "if True:")
        self.emit(inner + 1, "if sz > end - p:")
        self.emit(inner + 2, "raise _Malformed(f'tagged field {tg} of {sz} bytes with only {end - p} left')")
        self.emit(inner + 1, f"unk.append(({start}, {after}, {count}, {tag_start}, p + sz))")
        self.emit(inner + 1, "p += sz")

    def function(self, cls: type) -> list[str]:
        head = "def guard(b, p, unk, fix):" if self.lenient else "def guard(b, p, unk):"
        self.emit(0, head)
        self.emit(1, "end = len(b)")
        self.entity(cls, 1, nullable=False)
        self.emit(1, "return p")
        return self.lines


def _restring(raw: Any, flexible: bool) -> bytes:
    """A string that is not UTF-8, as Java reads it (replacement characters), re-encoded."""
    data = str(raw, "utf-8", "replace").encode()
    if len(data) > _MAX_STRING:
        raise Malformed(f"string of {len(raw)} bytes is {len(data)} bytes once decoded as Kafka does")
    return (uvarint(len(data) + 1) if flexible else I16.pack(len(data))) + data


_NAMESPACE: Final[dict[str, Any]] = {
    "_uv": read_uvarint,
    "_i16": I16.unpack_from,
    "_i32": I32.unpack_from,
    "_i64": I64.unpack_from,
    "_I64": I64.pack,
    "_Malformed": Malformed,
    "_ShortArray": ShortArray,
    "_restring": _restring,
}


def _compile(cls: type, lenient: bool) -> Guard:
    lines = _Source(lenient).function(cls)
    namespace = dict(_NAMESPACE)
    kind = "lenient shape check" if lenient else "shape check"
    exec(compile("\n".join(lines), f"<{kind} {cls.__module__}>", "exec"), namespace)
    fn: Guard = namespace["guard"]
    return fn


_FAST: dict[type, Guard] = {}
_LENIENT: dict[type, Guard] = {}


def guard(cls: type) -> Guard:
    """``check(body, offset, unknown) -> end``: raises Malformed, IndexError, struct.error or
    ValueError (a varint over 5 bytes) for a body Kafka cannot parse; appends the unknown tagged
    fields it skipped to ``unknown`` (for ``rewrite``). ``end`` past the buffer: truncated."""
    fn = _FAST.get(cls)
    if fn is None:
        fn = _FAST[cls] = _compile(cls, lenient=False)
    return fn


def lenient_guard(cls: type) -> Guard:
    """``check(body, offset, unknown, fixes) -> end``: the same checks, plus the edits (start,
    end, replacement bytes) that turn what Kafka reads leniently into what kio reads."""
    fn = _LENIENT.get(cls)
    if fn is None:
        fn = _LENIENT[cls] = _compile(cls, lenient=True)
    return fn


def guard_source(cls: type, lenient: bool = False) -> str:
    """The generated check of a request class, for reading and debugging."""
    return "\n".join(_Source(lenient).function(cls))


def rewrite(frame: Any, start: int, unknown: list[tuple[int, int, int, int, int]],
            fixes: list[tuple[int, int, bytes]] = ()) -> bytes:  # type: ignore[assignment]
    """A copy of frame[start:] without the unknown tagged fields (their sections' counts fixed)
    and with ``fixes`` applied. Spans never overlap: a skipped tagged field is never walked."""
    sections: dict[int, tuple[int, int, list[tuple[int, int]]]] = {}
    for count_start, count_end, count, tag_start, tag_end in unknown:
        sections.setdefault(count_start, (count_end, count, []))[2].append((tag_start, tag_end))
    edits: list[tuple[int, int, bytes]] = list(fixes)
    for count_start, (count_end, count, spans) in sections.items():
        edits.append((count_start, count_end, uvarint(count - len(spans))))
        edits.extend((s, e, b"") for s, e in spans)
    edits.sort()
    view = memoryview(frame)
    out = bytearray()
    pos = start
    for s, e, replacement in edits:
        out += view[pos:s]
        out += replacement
        pos = e
    out += view[pos:]
    return bytes(out)
