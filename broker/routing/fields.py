"""Typed AMQP field values: inference from plain Python values, and hashable canonical forms.

Binding arguments and message headers arrive as typed tables, ``{name: (type_char, value)}``,
exactly what ``protocol.tables.decode_table_typed`` returns (type chars per the RabbitMQ errata:
``t b B s u I i l f d D S x A T F V``; ``L`` is accepted as RabbitMQ's alias of ``l``). Plain
tables are accepted too, value by value: anything that is not a ``(type_char, value)`` pair has
its type inferred the way a client encoder would (see :func:`infer_type`). A plain value that
happens to be a 2-tuple starting with a type char is read as typed; that is the one ambiguity.

Two canonical forms exist because RabbitMQ compares values in two different ways:

* :func:`match_value` is the headers-exchange equality. ``rabbit_exchange_type_headers``
  compares a criterion with a header by Erlang ``==`` on the decoded *values only*, ignoring the
  field types: so ``I 1``, ``l 1``, ``T 1`` and ``d 1.0`` are all equal, ``S "a"`` equals
  ``x b"a"``, booleans equal only booleans, decimals compare as ``(scale, unscaled)`` pairs, an
  empty table equals an empty array, and inside tables and arrays the types *do* count (they are
  part of the decoded Erlang terms).
* :func:`arguments_key` is the binding identity: the sorted table with its types, so
  ``{"a": ("I", 1)}`` and ``{"a": ("l", 1)}`` are two different bindings, as in RabbitMQ.
"""

from __future__ import annotations

import calendar
import datetime
import math
from collections.abc import Hashable, Iterator, Mapping
from decimal import Decimal

TYPE_CHARS = frozenset("tbBsuIilLfdDSxATFV")

_INT_TYPES = frozenset("bBsuIilLT")
_FLOAT_TYPES = frozenset("fd")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# Erlang has no NaN (RabbitMQ cannot even decode one); we let a NaN equal itself so that a
# binding on a NaN value is at least reachable.
_NAN = ("nan",)


def infer_type(value: object) -> str:
    """The type char a client encoder would pick for a plain Python value.

    bool -> t, int -> I (fits int32) else l, float -> d, str -> S, bytes -> x, None -> V,
    dict -> F, list/tuple -> A, Decimal -> D, datetime -> T. Anything else is a ``TypeError``.
    """
    if value is None:
        return "V"
    if isinstance(value, bool):
        return "t"
    if isinstance(value, int):
        return "I" if _INT32_MIN <= value <= _INT32_MAX else "l"
    if isinstance(value, float):
        return "d"
    if isinstance(value, str):
        return "S"
    if isinstance(value, bytes | bytearray | memoryview):
        return "x"
    if isinstance(value, Mapping):
        return "F"
    if isinstance(value, list | tuple):
        return "A"
    if isinstance(value, Decimal):
        return "D"
    if isinstance(value, datetime.datetime):
        return "T"
    raise TypeError(f"cannot infer an AMQP field type for {type(value).__name__!r}")


def is_typed(item: object) -> bool:
    """True if ``item`` is a ``(type_char, value)`` pair."""
    return type(item) is tuple and len(item) == 2 and type(item[0]) is str and item[0] in TYPE_CHARS


def typed_value(item: object) -> tuple[str, object]:
    """``item`` as a ``(type_char, value)`` pair, inferring the type of a plain value."""
    if is_typed(item):
        return item  # type: ignore[return-value]
    return (infer_type(item), item)


def typed_table(table: Mapping[str, object] | None) -> dict[str, tuple[str, object]]:
    """A typed table from a typed, plain or mixed one (``None`` is the empty table).

    Nested tables and arrays are left as given; :func:`match_value` and :func:`arguments_key`
    type their items the same way when they need to.
    """
    if not table:
        return {}
    return {name: typed_value(item) for name, item in table.items()}


def _to_bytes(value: object) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"expected a string or bytes, got {type(value).__name__}")


def _timestamp(value: object) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # naive: taken as UTC, as AMQP timestamps are
            return calendar.timegm(value.utctimetuple())
        return math.floor(value.timestamp())
    return int(value)  # type: ignore[call-overload]


def _decimal(value: object) -> tuple[int, int]:
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValueError(f"decimal field cannot hold {value}")
        unscaled = int("".join(map(str, digits)) or "0")
        return (-exponent, -unscaled if sign else unscaled)
    if isinstance(value, tuple) and len(value) == 2:  # already (scale, unscaled)
        return (int(value[0]), int(value[1]))
    if isinstance(value, int):
        return (0, value)
    raise ValueError(f"decimal field cannot hold {value!r}")


def _items(value: object) -> list:
    if isinstance(value, list | tuple):
        return list(value)
    raise ValueError(f"array field must be a list, got {type(value).__name__}")


def match_value(type_char: str, value: object) -> Hashable:
    """The headers-exchange equality class of a value (Erlang ``==`` on the decoded term)."""
    if type_char in _INT_TYPES:
        if type_char == "T":
            return _timestamp(value)
        if isinstance(value, int):
            return int(value)
        raise ValueError(f"integer field {type_char!r} cannot hold {value!r}")
    if type_char == "S" or type_char == "x":
        return _to_bytes(value)
    if type_char in _FLOAT_TYPES:
        f = float(value)  # type: ignore[arg-type]
        return _NAN if f != f else f
    if type_char == "t":
        return ("t", bool(value))
    if type_char == "V":
        return None
    if type_char == "D":
        return ("D", *_decimal(value))
    if type_char == "F" or type_char == "A":
        return ("L", _container_key(type_char, value))
    raise ValueError(f"unknown AMQP field type {type_char!r}")


def _container_key(type_char: str, value: object) -> bytes:
    """A nested table or array as one canonical byte string, built without recursion.

    Inside containers the types count (they are part of the Erlang term), keys keep their
    order, and an empty table equals an empty array. Each entry is written as its key (tables
    only), its type char and its scalar equality class, length-prefixed; containers open and
    close with markers. The loop keeps its own stack, so a 20,000-deep array (which RabbitMQ
    accepts) costs no Python or C stack.
    """
    out: list[bytes] = []
    stack = [_entries(type_char, value)]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            out.append(b")")
            continue
        key, item = entry
        if key is not None:
            raw = key.encode("utf-8", "surrogateescape")
            out.append(len(raw).to_bytes(2, "big") + raw)
        tag, inner = typed_value(item)
        if tag == "L":
            tag = "l"
        if tag == "F" or tag == "A":
            out.append(tag.encode() + b"(")
            stack.append(_entries(tag, inner))
            continue
        token = repr(match_value(tag, inner)).encode("utf-8", "surrogateescape")
        out.append(tag.encode() + len(token).to_bytes(4, "big") + token)
    if len(out) == 1:  # only the closing marker: the empty table or array
        return b""
    return b"".join(out)


def _entries(type_char: str, value: object) -> Iterator[tuple[str | None, object]]:
    if type_char == "F":
        if not isinstance(value, Mapping):
            raise ValueError(f"table field must be a mapping, got {type(value).__name__}")
        return iter(value.items())
    return ((None, v) for v in _items(value))


def _nested(type_char: str, value: object) -> tuple[str, Hashable]:
    """A value inside a table or array: its type is part of the Erlang term, so it counts."""
    return ("l" if type_char == "L" else type_char, match_value(type_char, value))


def arguments_key(arguments: Mapping[str, object] | None) -> tuple:
    """Hashable identity of a binding's arguments: sorted names with typed canonical values.

    ``None`` and ``{}`` are the same (RabbitMQ stores no arguments as the empty table).
    """
    if not arguments:
        return ()
    return tuple(sorted((name, *_nested(*typed_value(v))) for name, v in arguments.items()))
