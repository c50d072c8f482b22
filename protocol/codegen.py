"""Generate ``protocol/spec.py`` from the AMQP 0-9-1 (RabbitMQ) specification XML.

Usage: ``python -m protocol.codegen [--check] [--spec XML] [--output PY]``.
``--check`` regenerates in memory and exits 1 if the committed file differs.

The spec is read from ``protocol/xml/amqp0-9-1-rabbit.xml`` (a copy kept in
the repository so a clean clone works), falling back to
``../shared/spec/amqp0-9-1-rabbit.xml`` beside the repository root.

Each method becomes a flat class with straight-line ``encode``/``decode``:
fixed-size runs share one precompiled ``struct.Struct`` and there are no
per-field loops or closures, so the hot methods (basic.publish, basic.deliver)
cost a handful of C calls each. The basic class's content properties become
``BasicProperties`` (straight-line too, flag by flag) and one ``FLAG_<NAME>``
constant per property flag bit: the one place the broker takes them from.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
SPEC_NAME = "amqp0-9-1-rabbit.xml"
SPEC_CANDIDATES = (
    PACKAGE_DIR / "xml" / SPEC_NAME,
    REPO_ROOT.parent / "shared" / "spec" / SPEC_NAME,
)
OUTPUT = PACKAGE_DIR / "spec.py"

# RabbitMQ extensions that its published XML leaves out (rabbitmq-codegen adds
# them from its JSON spec): connection.blocked/unblocked and update-secret.
EXTENSIONS_XML = """
<amqp>
  <class name="connection" index="10">
    <method name="blocked" index="60">
      <chassis name="server" implement="MUST"/>
      <chassis name="client" implement="MUST"/>
      <field name="reason" domain="shortstr"/>
    </method>
    <method name="unblocked" index="61">
      <chassis name="server" implement="MUST"/>
      <chassis name="client" implement="MUST"/>
    </method>
    <method name="update-secret" synchronous="1" index="70">
      <chassis name="server" implement="MUST"/>
      <response name="update-secret-ok"/>
      <field name="new-secret" domain="longstr"/>
      <field name="reason" domain="shortstr"/>
    </method>
    <method name="update-secret-ok" synchronous="1" index="71">
      <chassis name="client" implement="MUST"/>
    </method>
  </class>
</amqp>
"""

# Corrections to the published XML, which dropped these attributes: in the
# full 0-9-1 spec (and RabbitMQ's JSON spec) basic.recover is synchronous and
# answered by basic.recover-ok.
ERRATA = {("basic", "recover"): {"synchronous": True, "responses": ["recover-ok"]}}

# The content property RabbitMQ calls cluster-id is "reserved" in the XML.
PROPERTY_RENAMES = {"reserved": "cluster-id"}

# Wire types with a fixed size, by struct format character; and those sizes.
FIXED = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}

PY_TYPES = {
    "bit": ("bool", "False"),
    "octet": ("int", "0"),
    "short": ("int", "0"),
    "long": ("int", "0"),
    "longlong": ("int", "0"),
    "timestamp": ("int", "0"),
    "shortstr": ("str", '""'),
    "longstr": ("bytes | str", 'b""'),
    "table": ("dict[str, Any] | None", "None"),
}


@dataclass
class Field:
    name: str
    type: str
    reserved: bool

    @property
    def attr(self) -> str:
        name = self.name.replace("-", "_")
        return name + "_" if keyword.iskeyword(name) else name

    @property
    def local(self) -> str:
        return "a_" + self.attr


@dataclass
class MethodSpec:
    class_name: str
    class_index: int
    name: str
    index: int
    synchronous: bool
    content: bool
    responses: list[str]
    chassis: set[str]
    fields: list[Field] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.class_name}.{self.name}"

    @property
    def py_name(self) -> str:
        return camel(self.class_name) + camel(self.name)

    @property
    def args(self) -> list[Field]:
        return [f for f in self.fields if not f.reserved]


@dataclass
class Spec:
    major: int
    minor: int
    revision: int
    port: int
    constants: list[tuple[str, int, str]]
    methods: list[MethodSpec]
    properties: list[Field]
    properties_class: int = 60  # the class whose content properties these are (basic)


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def find_spec() -> Path:
    for candidate in SPEC_CANDIDATES:
        if candidate.exists():
            return candidate
    tried = ", ".join(str(c) for c in SPEC_CANDIDATES)
    raise FileNotFoundError(f"AMQP spec XML not found; tried {tried}")


def load_spec(path: Path) -> Spec:
    root = ET.parse(path).getroot()
    domains = {d.get("name"): d.get("type") for d in root.iter("domain")}

    def field_of(element: ET.Element) -> Field:
        kind = element.get("type") or domains[element.get("domain")]
        while kind in domains and domains[kind] != kind:
            kind = domains[kind]
        return Field(element.get("name"), kind, element.get("reserved") == "1")

    def method_of(cls: ET.Element, element: ET.Element) -> MethodSpec:
        return MethodSpec(
            class_name=cls.get("name"),
            class_index=int(cls.get("index")),
            name=element.get("name"),
            index=int(element.get("index")),
            synchronous=element.get("synchronous") == "1",
            content=element.get("content") == "1",
            responses=[r.get("name") for r in element.findall("response")],
            chassis={c.get("name") for c in element.findall("chassis")},
            fields=[field_of(f) for f in element.findall("field")],
        )

    methods: list[MethodSpec] = []
    properties: list[Field] = []
    properties_class = 0
    for cls in root.findall("class"):
        methods.extend(method_of(cls, m) for m in cls.findall("method"))
        if cls.get("name") == "basic":
            properties_class = int(cls.get("index"))
            for prop in cls.findall("field"):
                f = field_of(prop)
                properties.append(Field(PROPERTY_RENAMES.get(f.name, f.name), f.type, False))
    known = {(m.class_index, m.index) for m in methods}
    for cls in ET.fromstring(EXTENSIONS_XML).findall("class"):
        for element in cls.findall("method"):
            extra = method_of(cls, element)
            if (extra.class_index, extra.index) not in known:
                methods.append(extra)
    for m in methods:
        for attr, value in ERRATA.get((m.class_name, m.name), {}).items():
            setattr(m, attr, value)
    methods.sort(key=lambda m: (m.class_index, m.index))
    return Spec(
        major=int(root.get("major")),
        minor=int(root.get("minor")),
        revision=int(root.get("revision")),
        port=int(root.get("port")),
        constants=[
            (c.get("name"), int(c.get("value")), c.get("class", ""))
            for c in root.findall("constant")
        ],
        methods=methods,
        properties=properties,
        properties_class=properties_class,
    )


# -- code emission --------------------------------------------------------------


class Structs:
    """Collects the struct formats used, so each is compiled once at import."""

    def __init__(self) -> None:
        self.formats: set[str] = set()

    def pack(self, fmt: str) -> str:
        self.formats.add(fmt)
        return f"_pack_{fmt}"

    def unpack(self, fmt: str) -> str:
        self.formats.add(fmt)
        return f"_unpack_{fmt}"

    def emit(self) -> list[str]:
        lines = []
        for fmt in sorted(self.formats):
            lines.append(f'_S_{fmt} = Struct(">{fmt}")')
            lines.append(f"_pack_{fmt} = _S_{fmt}.pack")
            lines.append(f"_unpack_{fmt} = _S_{fmt}.unpack_from")
        return lines


def group_bits(fields: list[Field]) -> list[Field | list[Field]]:
    """Consecutive bit fields share an octet (at most 8 per octet)."""
    out: list[Field | list[Field]] = []
    for f in fields:
        if f.type == "bit":
            if out and isinstance(out[-1], list) and len(out[-1]) < 8:
                out[-1].append(f)
            else:
                out.append([f])
        else:
            out.append(f)
    return out


def emit_encode(m: MethodSpec, structs: Structs) -> list[str]:
    body: list[str] = []
    parts: list[str] = []
    fmt, values = "", []

    def flush() -> None:
        nonlocal fmt, values
        if fmt:
            parts.append(f"{structs.pack(fmt)}({', '.join(values)})")
            fmt, values = "", []

    for item in group_bits(m.fields):
        if isinstance(item, list):
            terms = [
                f"({1 << i} if self.{f.attr} else 0)" for i, f in enumerate(item) if not f.reserved
            ]
            fmt += "B"
            values.append(" | ".join(terms) if terms else "0")
            continue
        f = item
        if f.type in FIXED:
            fmt += FIXED[f.type]
            values.append("0" if f.reserved else f"self.{f.attr}")
        elif f.reserved:  # an empty string or table is just a zero length
            fmt += {"shortstr": "B", "longstr": "I", "table": "I"}[f.type]
            values.append("0")
        elif f.type == "shortstr":
            body.append(f'{f.local} = self.{f.attr}.encode("utf-8", "surrogateescape")')
            body.append(f"if len({f.local}) > 255:")
            body.append(f'    raise ValueError("{m.full_name}: {f.attr} is longer than 255 bytes")')
            fmt += "B"
            values.append(f"len({f.local})")
            flush()
            parts.append(f.local)
        elif f.type == "longstr":
            body.append(f"{f.local} = self.{f.attr}")
            body.append(f"if type({f.local}) is str:")
            body.append(f'    {f.local} = {f.local}.encode("utf-8", "surrogateescape")')
            fmt += "I"
            values.append(f"len({f.local})")
            flush()
            parts.append(f.local)
        elif f.type == "table":
            flush()
            parts.append(f"encode_table(self.{f.attr})")
        else:
            raise ValueError(f"unknown field type {f.type}")
    flush()
    if not parts:
        return ["def encode(self) -> bytes:", '    return b""']
    result = parts[0] if len(parts) == 1 else f'b"".join(({", ".join(parts)},))'
    lines = ["def encode(self) -> bytes:", "    try:"]
    lines += [f"        {line}" for line in body]
    lines.append(f"        return {result}")
    lines.append("    except (StructError, OverflowError) as exc:")
    lines.append(f'        raise ValueError(f"{m.full_name}: {{exc}}") from None')
    lines.append("    except AttributeError as exc:")
    lines.append(f'        raise TypeError(f"{m.full_name}: {{exc}}") from None')
    return lines


def strict_utf8(m: MethodSpec) -> bool:
    """Whether the method's shortstrs must be valid UTF-8 (else 501, as RabbitMQ).

    RabbitMQ checks every shortstr of a method only a client sends, except
    basic.publish (its exchange and routing key are taken as bytes: a name no
    exchange can have is a 404, a key no binding can match is unroutable).
    The close methods and server-to-client ones stay lenient so a client
    built on this codec still reads whatever text any server sends.
    """
    return "server" in m.chassis and m.full_name not in _LENIENT_UTF8


_LENIENT_UTF8 = frozenset({"basic.publish", "connection.close", "channel.close"})


def emit_decode(m: MethodSpec, structs: Structs) -> list[str]:
    strict = strict_utf8(m)
    body: list[str] = []
    run: list[tuple[str, str]] = []  # (struct char, target) of the pending fixed run
    bit_groups: list[tuple[str, list[Field]]] = []
    skip = 0  # reserved bytes not yet added to o, folded into the next read

    def flush() -> None:
        nonlocal skip
        if not run:
            return
        fmt = "".join(c for c, _ in run)
        size = sum(SIZES[c] for c in fmt)
        targets = [t for _, t in run]
        if all(t == "_" for t in targets):
            skip += size
            run.clear()
            return
        if skip:
            body.append(f"o += {skip}")
            skip = 0
        if len(targets) == 1:
            body.append(
                f"{targets[0]} = buf[o]"
                if fmt == "B"
                else f"{targets[0]} = {structs.unpack(fmt)}(buf, o)[0]"
            )
            body.append(f"o += {size}")
        else:
            body.append(f"{', '.join(targets)} = {structs.unpack(fmt)}(buf, o)")
            body.append(f"o += {size}")
        for var, group in bit_groups:
            for i, f in enumerate(group):
                if not f.reserved:
                    body.append(f"{f.local} = ({var} & {1 << i}) != 0")
        run.clear()
        bit_groups.clear()

    for item in group_bits(m.fields):
        if isinstance(item, list):
            if all(f.reserved for f in item):
                run.append(("B", "_"))
            else:
                var = f"bits{len(bit_groups)}_{item[0].attr}"
                run.append(("B", var))
                bit_groups.append((var, item))
            continue
        f = item
        if f.type in FIXED:
            run.append((FIXED[f.type], "_" if f.reserved else f.local))
            continue
        flush()
        if f.type == "shortstr":
            # o jumps past the string first: one addition fewer than slicing
            # buf[o + 1 : o + 1 + n] and then advancing.
            at = f"o + {skip}" if skip else "o"
            if f.reserved:
                body.append(f"o += {skip + 1} + buf[{at}]")
            else:
                body.append(f"n = buf[{at}]")
                body.append(f"o += {skip + 1} + n")
                if strict:
                    body.append(f"{f.local} = buf[o - n : o].decode()")
                else:
                    body.append(f'{f.local} = buf[o - n : o].decode("utf-8", "surrogateescape")')
            skip = 0
            continue
        if skip:
            body.append(f"o += {skip}")
            skip = 0
        if f.type == "longstr":
            if f.reserved:
                body.append(f"o += 4 + {structs.unpack('I')}(buf, o)[0]")
            else:
                body.append(f"n = {structs.unpack('I')}(buf, o)[0]")
                body.append("o += 4 + n")
                body.append(f"{f.local} = buf[o - n : o]")
        elif f.type == "table":
            target = "_" if f.reserved else f.local
            body.append(f'{target}, o = _table(buf, o, end, cls, "{f.attr}")')
        else:
            raise ValueError(f"unknown field type {f.type}")
    flush()
    if skip:
        body.append(f"o += {skip}")

    lines = [
        "@classmethod",
        "def decode(",
        "    cls, buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None",
        f") -> {m.py_name}:",
        "    if type(buf) is not bytes:",
        "        buf = bytes(buf)",
        "    if end is None:",
        "        end = len(buf)",
        "    o = offset",
    ]
    if body:
        lines.append("    try:")
        lines += [f"        {line}" for line in body]
        lines.append("    except (IndexError, StructError):")
        lines.append("        raise _truncated(cls, end - offset) from None")
        if strict and any(f.type == "shortstr" and not f.reserved for f in m.fields):
            lines.append("    except UnicodeDecodeError:")
            lines.append("        raise _malformed_utf8(cls) from None")
    lines.append("    if o != end:")
    lines.append("        raise _length_mismatch(cls, end - offset, o - offset)")
    lines.append("    self = _new(cls)")
    for f in m.args:
        lines.append(f"    self.{f.attr} = {f.local}")
    lines.append("    return self")
    return lines


def emit_init(m: MethodSpec) -> list[str]:
    if not m.args:
        return []
    params = []
    for f in m.args:
        annotation, default = PY_TYPES[f.type]
        params.append(f"{f.attr}: {annotation} = {default}")
    one_line = f"def __init__(self, *, {', '.join(params)}) -> None:"
    if len(one_line) <= 90:
        lines = [one_line]
    else:
        lines = [
            "def __init__(",
            "    self,",
            "    *,",
            *[f"    {p}," for p in params],
            ") -> None:",
        ]
    for f in m.args:
        if f.type == "table":
            lines.append(f"    self.{f.attr} = {{}} if {f.attr} is None else {f.attr}")
        else:
            lines.append(f"    self.{f.attr} = {f.attr}")
    return lines


def emit_class(m: MethodSpec, structs: Structs) -> list[str]:
    lines = [f"class {m.py_name}(Method):"]
    flags = []
    if m.synchronous:
        flags.append("synchronous")
    if m.content:
        flags.append("carries content")
    suffix = f"; {', '.join(flags)}" if flags else ""
    lines.append(f'    """``{m.full_name}``: class {m.class_index}, method {m.index}{suffix}."""')
    lines.append("")
    slots = ", ".join(f'"{f.attr}"' for f in m.args)
    lines.append(f"    __slots__ = ({slots}{',' if len(m.args) == 1 else ''})")
    lines.append(f"    CLASS_ID = {m.class_index}")
    lines.append(f"    METHOD_ID = {m.index}")
    lines.append(f"    INDEX = 0x{(m.class_index << 16) | m.index:08X}")
    lines.append(f'    NAME = "{m.full_name}"')
    lines.append(f"    SYNCHRONOUS = {m.synchronous}")
    lines.append(f"    HAS_CONTENT = {m.content}")
    lines.append(f"    TO_SERVER = {'server' in m.chassis}")
    lines.append(f"    TO_CLIENT = {'client' in m.chassis}")
    fields = ", ".join(f'("{f.attr}", "{f.type}")' for f in m.args)
    lines.append(f"    FIELDS = ({fields}{',' if len(m.args) == 1 else ''})")
    for block in (emit_init(m), emit_encode(m, structs), emit_decode(m, structs)):
        if block:
            lines.append("")
            lines += [f"    {line}" if line else "" for line in block]
    return lines


# -- content properties ---------------------------------------------------------------------

# How the property decoder tests the flags, bit 15 first: each group of properties is skipped
# in one test when none of it is set, then each member is tested. A typical publish sets 3-6
# of the 14 (timeit, no properties: 750 -> 360 ns a decode against a test per property).
PROPERTY_GROUPS = (3, 2, 3, 1, 1, 4)

PROPERTY_TYPES = {
    "shortstr": "str | None",
    "octet": "int | None",
    "table": "dict[str, Any] | None",
    "timestamp": "datetime | time.struct_time | int | None",
}

PROPERTY_HELPERS = '''\
def _shortstr(value: str, name: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"basic property {{name}} must be str, not {{type(value).__name__}}")
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError(f"basic property {{name}} is longer than 255 bytes")
    return {pack_B}(len(raw)) + raw


def _octet(value: int, name: str) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"basic property {{name}} must be an int in 0..255, not {{value!r}}")
    return {pack_B}(value)


def _check_flag_words(buf: bytes, o: int, flags: int) -> int:
    """Validate the rare flag bits: those of no property and continuation words."""
    if flags & {unused}:
        raise AMQPSyntaxError(
            "property flag bit 1 is set but basic has only {count} properties", class_id={class_id}
        )
    word = flags
    while word & 1:  # continuation: another flag word follows
        (word,) = {unpack_H}(buf, o)
        o += 2
        if word & 0xFFFE:
            raise AMQPSyntaxError(
                f"continuation property flags 0x{{word:04x}} name properties basic does not have",
                class_id={class_id},
            )
    return o
'''

PROPERTY_METHODS = '''\
def __eq__(self, other: object) -> bool:
    if type(other) is not BasicProperties:
        return NotImplemented
    return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

__hash__ = None  # type: ignore[assignment]  # mutable, so unhashable

def __repr__(self) -> str:
    present = (name for name in self.__slots__ if getattr(self, name) is not None)
    return f"BasicProperties({', '.join(f'{n}={getattr(self, n)!r}' for n in present)})"'''


def flag_of(position: int) -> int:
    """The flag bit of the property at ``position`` in the list: bit 15 first."""
    return 0x8000 >> position


def flag_name(p: Field) -> str:
    return "FLAG_" + p.attr.upper()


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return [("    " * depth + line) if line else "" for line in lines]


def emit_property_read(p: Field, structs: Structs, class_id: int) -> list[str]:
    if p.type == "shortstr":
        # o jumps past the string first, as in the methods' decoders.
        return [
            "n = buf[o]",
            "o += 1 + n",
            f'self.{p.attr} = buf[o - n : o].decode("utf-8", "surrogateescape")',
        ]
    if p.type == "octet":
        return [f"self.{p.attr} = buf[o]", "o += 1"]
    if p.type == "timestamp":
        return [f"self.{p.attr} = timestamp_from_wire({structs.unpack('Q')}(buf, o)[0])", "o += 8"]
    if p.type == "table":
        return [
            "try:",
            f"    self.{p.attr}, o = decode_table(buf, o)",
            "except AMQPSyntaxError as exc:",
            "    raise AMQPSyntaxError(",
            f'        f"basic property {p.attr}: {{exc.text}}", class_id={class_id}',
            "    ) from None",
        ]
    raise ValueError(f"unknown property type {p.type}")


def emit_property_write(p: Field, structs: Structs) -> str:
    value = f"self.{p.attr}"
    if p.type == "shortstr":
        return f'_shortstr({value}, "{p.attr}")'
    if p.type == "octet":
        return f'_octet({value}, "{p.attr}")'
    if p.type == "timestamp":
        return f"{structs.pack('Q')}(timestamp_to_wire({value}))"
    if p.type == "table":
        return f"encode_table({value})"
    raise ValueError(f"unknown property type {p.type}")


def emit_property_decode(spec: Spec, structs: Structs) -> list[str]:
    props, class_id = spec.properties, spec.properties_class
    if sum(PROPERTY_GROUPS) != len(props):
        raise ValueError(
            f"PROPERTY_GROUPS covers {sum(PROPERTY_GROUPS)} of {len(props)} properties"
        )
    body: list[str] = []
    start = 0
    for size in PROPERTY_GROUPS:
        members = list(enumerate(props[start : start + size], start))
        start += size
        tests: list[str] = []
        for position, p in members:
            tests += [f"if flags & 0x{flag_of(position):04X}:"]
            tests += _indent(emit_property_read(p, structs, class_id))
            tests += ["else:", f"    self.{p.attr} = None"]
        if size == 1:
            body += tests
            continue
        mask = sum(flag_of(position) for position, _ in members)
        body.append(f"if flags & 0x{mask:04X}:")
        body += _indent(tests)
        body.append("else:")
        body.append("    " + " = ".join(f"self.{p.attr}" for _, p in members) + " = None")
    rare = (1 << (16 - len(props))) - 1  # flag bits of no property, and the continuation bit
    return [
        "@classmethod",
        "def decode(cls, buf: bytes | bytearray | memoryview, offset: int = 0) -> BasicProperties:",
        '    """Decode flags + property list from ``buf[offset:]``, which they must fill exactly."""',
        "    if type(buf) is not bytes:",
        "        buf = bytes(buf)",
        "    self = _new(cls)",
        "    try:",
        f"        (flags,) = {structs.unpack('H')}(buf, offset)",
        "        o = offset + 2",
        f"        if flags & {rare}:",
        "            o = _check_flag_words(buf, o, flags)",
        *_indent(body, 2),
        "    except (IndexError, StructError):",
        f'        raise AMQPSyntaxError("basic properties truncated", class_id={class_id}) from None',
        "    if o != len(buf):",
        "        if o > len(buf):",
        f'            raise AMQPSyntaxError("basic properties truncated", class_id={class_id})',
        "        raise AMQPSyntaxError(",
        '            f"{len(buf) - o} unexpected bytes after the basic properties",',
        f"            class_id={class_id},",
        "        )",
        "    return self",
    ]


def emit_property_encode(spec: Spec, structs: Structs) -> list[str]:
    lines = [
        "def encode(self) -> bytes:",
        '    """Property flags followed by the property list (no class id, weight or body size)."""',
        "    flags = 0",
        '    parts = [b""]',
        "    append = parts.append",
    ]
    for position, p in enumerate(spec.properties):
        lines.append(f"    if self.{p.attr} is not None:")
        lines.append(f"        flags |= 0x{flag_of(position):04X}")
        lines.append(f"        append({emit_property_write(p, structs)})")
    lines.append(f"    parts[0] = {structs.pack('H')}(flags)")
    lines.append('    return b"".join(parts)')
    return lines


def emit_properties(spec: Spec, structs: Structs) -> str:
    """The flag constants, their helpers and ``BasicProperties``."""
    props = spec.properties
    out = ["# The basic class's content property flags, bit 15 first, in the order of the list."]
    out += [f"{flag_name(p)} = 0x{flag_of(i):04X}" for i, p in enumerate(props)]
    helpers = PROPERTY_HELPERS.format(
        pack_B=structs.pack("B"),
        unpack_H=structs.unpack("H"),
        unused=(1 << (16 - len(props))) - 2,
        count=len(props),
        class_id=spec.properties_class,
    )
    out += ["", "", helpers, ""]
    cls = [
        "class BasicProperties:",
        '    """Message properties; ``None`` means absent (not sent), anything else is sent.',
        "",
        "    ``timestamp`` decodes to an aware UTC ``datetime`` and encodes from a",
        "    ``datetime`` (naive means UTC), ``time.struct_time`` or int seconds.",
        '    """',
        "",
        "    __slots__ = (",
        *(f'        "{p.attr}",' for p in props),
        "    )",
        "",
        "    def __init__(",
        "        self,",
        "        *,",
        *(f"        {p.attr}: {PROPERTY_TYPES[p.type]} = None," for p in props),
        "    ) -> None:",
        *(f"        self.{p.attr} = {p.attr}" for p in props),
    ]
    for block in (
        emit_property_encode(spec, structs),
        emit_property_decode(spec, structs),
        PROPERTY_METHODS.splitlines(),
    ):
        cls.append("")
        cls += _indent(block)
    out += cls
    return "\n".join(out) + "\n"


HEADER = '''\
"""AMQP 0-9-1 methods with RabbitMQ's extensions, one flat class per method.

GENERATED by protocol/codegen.py from protocol/xml/{spec_name}; do not edit.
Regenerate with ``python -m protocol.codegen`` (``--check`` verifies).
"""

# fmt: off
# ruff: noqa
from __future__ import annotations

import time
from datetime import datetime
from struct import Struct
from struct import error as StructError
from typing import Any

from .errors import AMQPSyntaxError, FrameError
from .method import Method
from .tables import decode_table, encode_table, timestamp_from_wire, timestamp_to_wire

VERSION = ({major}, {minor}, {revision})
PORT = {port}
{constants}

_new = object.__new__


def _truncated(cls: type[Method], size: int) -> AMQPSyntaxError:
    return AMQPSyntaxError(
        f"{{cls.NAME}}: arguments truncated ({{size}} bytes)",
        class_id=cls.CLASS_ID,
        method_id=cls.METHOD_ID,
    )


def _length_mismatch(cls: type[Method], size: int, used: int) -> AMQPSyntaxError:
    if used > size:
        return _truncated(cls, size)
    return AMQPSyntaxError(
        f"{{cls.NAME}}: {{size - used}} unexpected bytes after the arguments",
        class_id=cls.CLASS_ID,
        method_id=cls.METHOD_ID,
    )


def _malformed_utf8(cls: type[Method]) -> FrameError:
    # RabbitMQ's words and code for any name that is not UTF-8.
    return FrameError("Malformed UTF-8 in shortstr", class_id=cls.CLASS_ID, method_id=cls.METHOD_ID)


def _table(
    buf: bytes, o: int, end: int, cls: type[Method], name: str
) -> tuple[dict[str, Any], int]:
    try:
        return decode_table(buf, o, end)
    except AMQPSyntaxError as exc:
        raise AMQPSyntaxError(
            f"{{cls.NAME}}.{{name}}: {{exc.text}}", class_id=cls.CLASS_ID, method_id=cls.METHOD_ID
        ) from None

'''


def generate(spec_path: Path | None = None) -> str:
    spec_path = spec_path or find_spec()
    spec = load_spec(spec_path)
    structs = Structs()
    names = {m.full_name: m.py_name for m in spec.methods}
    classes = []
    for m in spec.methods:
        classes.append("\n".join(emit_class(m, structs)))
    properties = emit_properties(spec, structs)

    frame_constants = [
        (name.upper().replace("-", "_"), value)
        for name, value, kind in spec.constants
        if name.startswith("frame-") and not kind  # frame-error is a reply code
    ]
    constants = "\n".join(f"{name} = {value}" for name, value in frame_constants)
    out = [
        HEADER.format(
            spec_name=SPEC_NAME,
            major=spec.major,
            minor=spec.minor,
            revision=spec.revision,
            port=spec.port,
            constants=constants,
        )
    ]
    out.append("\n".join(structs.emit()))
    out.append("\n\n")
    out.append("\n\n\n".join(classes))
    out.append("\n\n\n")
    for m in spec.methods:
        if m.responses:
            replies = ", ".join(names[f"{m.class_name}.{r}"] for r in m.responses)
            out.append(f"{m.py_name}.RESPONSES = ({replies},)\n")
    out.append("\nMETHODS: dict[int, type[Method]] = {\n")
    for m in spec.methods:
        out.append(f"    {m.py_name}.INDEX: {m.py_name},\n")
    out.append("}\n")
    out.append(
        "CONTENT_METHODS: frozenset[int] = frozenset(\n"
        "    index for index, method in METHODS.items() if method.HAS_CONTENT\n"
        ")\n"
    )
    out.append("\n\n")
    out.append(properties)
    out.append("\n\n# The basic class's content properties, in flag order (bit 15 first).\n")
    out.append("BASIC_PROPERTIES: tuple[tuple[str, str], ...] = (\n")
    for p in spec.properties:
        out.append(f'    ("{p.attr}", "{p.type}"),\n')
    out.append(")\n")
    out.append("\n__all__ = [\n")
    exported = [
        "BASIC_PROPERTIES",
        "BasicProperties",
        *(flag_name(p) for p in spec.properties),
        "CONTENT_METHODS",
        "METHODS",
        "PORT",
        "VERSION",
        *(name for name, _ in frame_constants),
        *(m.py_name for m in spec.methods),
    ]
    for name in exported:
        out.append(f'    "{name}",\n')
    out.append("]\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protocol.codegen", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--spec", type=Path, help="spec XML (default: the repository's copy)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="module to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    args = parser.parse_args(argv)
    source = generate(args.spec)
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != source:
            diff = difflib.unified_diff(
                current.splitlines(True), source.splitlines(True), str(args.output), "generated"
            )
            sys.stdout.writelines(list(diff)[:200])
            print(f"{args.output} is stale: run python -m protocol.codegen", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(source)
    print(f"wrote {args.output} ({len(source.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
