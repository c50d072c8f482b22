"""Headers routing: OpenAMQ's inverted bitmap of criteria with per-binding hit counts.

Each binding's criteria are indexed as ``name -> value -> ids`` (equality) and ``name -> ids``
(presence: a criterion of type ``V``). A message looks up each of its headers once; a binding
is *hit* once per header that satisfies one of its criteria (a binding has at most one criterion
per name, a message at most one header per name, so hits never double count). ``any`` bindings
match when hit at all; ``all`` bindings when hit as many times as they have criteria, computed
with bit-sliced counters (``at_least[k]`` = ids hit at least k times) so no per-id Python loop.

Semantics are RabbitMQ's ``rabbit_exchange_type_headers``: ``x-match`` is ``all`` (default),
``any``, ``all-with-x`` or ``any-with-x``; ``x-match`` itself is never a criterion, other
``x-`` names are criteria only in the ``-with-x`` modes; values compare by Erlang ``==`` on the
decoded value, *not* by field type (see :mod:`.fields`); a binding without criteria matches
every message under ``all`` and none under ``any``; the routing key plays no part.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from pyroaring import BitMap

from roarmq.protocol.tables import encode_value

from .bindings import EMPTY, BindingTable
from .fields import is_typed, match_value, typed_table, typed_value

X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")

_ERLANG_TYPES = {
    "t": "bool",
    "b": "byte",
    "B": "unsignedbyte",
    "s": "short",
    "u": "unsignedshort",
    "I": "signedint",
    "i": "unsignedint",
    "l": "long",
    "L": "long",
    "f": "float",
    "d": "double",
    "D": "decimal",
    "S": "longstr",
    "x": "binary",
    "A": "array",
    "T": "timestamp",
    "F": "table",
    "V": "void",
}


class InvalidBinding(ValueError):
    """Binding arguments RabbitMQ rejects; ``str(exc)`` is RabbitMQ's text.

    The exchange layer replies 406 PRECONDITION_FAILED with it, as RabbitMQ's ``rabbit_channel``
    does for ``{binding_invalid, Fmt, Args}``.
    """


def erlang_type_name(value: object) -> str:
    """RabbitMQ's name for the field type a decoded value travels as (``byte``, ``longstr``…)."""
    try:
        tag = encode_value(value)[:1].decode()
    except (TypeError, ValueError):
        return "unknown"
    return _ERLANG_TYPES.get(tag, "unknown")


def _erlang_repr(value: object) -> str:
    """Roughly Erlang's ``~tp`` for the values that can reach an error message."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes | bytearray):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and text.isprintable():
            return '<<"' + text.replace("\\", "\\\\").replace('"', '\\"') + '">>'
        return "<<" + ",".join(str(c) for c in value) + ">>"
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def parse_x_match(arguments: Mapping[str, tuple[str, object]]) -> str:
    """The ``x-match`` mode of typed binding arguments; ``InvalidBinding`` if not valid."""
    item = arguments.get("x-match")
    if item is None:
        return "all"  # RabbitMQ: "spec is vague on whether it can be omitted"
    type_char, value = item
    if type_char != "S":
        raise InvalidBinding(
            f"Invalid x-match field type {_ERLANG_TYPES.get(type_char, type_char)} "
            f"(value {_erlang_repr(value)}); expected longstr"
        )
    mode = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
    if mode not in X_MATCH_MODES:
        raise InvalidBinding(
            f"Invalid x-match field value {_erlang_repr(value)}; "
            "expected all, any, all-with-x, or any-with-x"
        )
    return mode  # type: ignore[return-value]


_PRESENT = object()  # a void criterion: the header must merely be present


def criteria(arguments: Mapping | None) -> tuple[str, list[tuple[str, object]]]:
    """``(mode, [(name, match value or _PRESENT), ...])`` for typed or plain binding arguments."""
    typed = typed_table(arguments)
    mode = parse_x_match(typed)
    with_x = mode.endswith("-with-x")
    out: list[tuple[str, object]] = []
    for name, (type_char, value) in typed.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        out.append((name, _PRESENT if type_char == "V" else match_value(type_char, value)))
    return ("any" if mode.startswith("any") else "all"), out


class HeadersIndex(BindingTable):
    """Headers-exchange bindings: an inverted bitmap of criteria (see the module docstring)."""

    __slots__ = ("_eq", "_present", "_any", "_all_by_n", "_all", "_always", "_always_dests")

    IDENTIFIED = True  # a binding is found through its destination's ids alone

    def __init__(self) -> None:
        super().__init__()
        self._eq: dict[str, dict[Hashable, BitMap]] = {}
        self._present: dict[str, BitMap] = {}
        self._any = BitMap()  # "any" bindings with at least one criterion
        self._all = BitMap()  # "all" bindings with at least one criterion
        self._all_by_n: dict[int, BitMap] = {}  # ... by number of criteria
        self._always = BitMap()  # "all" bindings without criteria: match every message
        self._always_dests: frozenset | None = None

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        """Add a binding; ``InvalidBinding`` (a ``ValueError``) for a bad ``x-match``."""
        mode, crit = criteria(arguments)
        if self._find(self._by_dest.get(destination), key, destination, arguments) is not None:
            return False
        b = self._new_id(key, destination, arguments)
        for name, value in crit:
            if value is _PRESENT:
                bm = self._present.get(name)
                if bm is None:
                    bm = self._present[name] = BitMap()
            else:
                by_value = self._eq.get(name)
                if by_value is None:
                    by_value = self._eq[name] = {}
                bm = by_value.get(value)
                if bm is None:
                    bm = by_value[value] = BitMap()
            bm.add(b)
        n = len(crit)
        if mode == "any":
            if n:
                self._any.add(b)
        elif n:
            self._all.add(b)
            bm = self._all_by_n.get(n)
            if bm is None:
                bm = self._all_by_n[n] = BitMap()
            bm.add(b)
        else:
            self._always.add(b)
            self._always_dests = None
        return True

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        try:
            b = self._find(self._by_dest.get(destination), key, destination, arguments)
        except (TypeError, ValueError):
            return False  # arguments that could never have been bound
        if b is None:
            return False
        self._drop(b)
        return True

    def _unindex(self, b: int) -> None:
        mode, crit = criteria(self._args[b])
        for name, value in crit:
            if value is _PRESENT:
                bm = self._present[name]
                bm.discard(b)
                if not bm:
                    del self._present[name]
            else:
                by_value = self._eq[name]
                bm = by_value[value]
                bm.discard(b)
                if not bm:
                    del by_value[value]
                    if not by_value:
                        del self._eq[name]
        n = len(crit)
        if mode == "any":
            self._any.discard(b)
        elif n:
            self._all.discard(b)
            bm = self._all_by_n[n]
            bm.discard(b)
            if not bm:
                del self._all_by_n[n]
        else:
            self._always.discard(b)
            self._always_dests = None

    def remove_destination(self, destination: Hashable) -> int:
        if destination in self._by_dest:
            self._always_dests = None
        return super().remove_destination(destination)

    def _forget(self, destination: Hashable | None) -> None:
        self._always_dests = None

    def route(self, routing_key: str, headers: Mapping | None = None) -> frozenset:
        """Destinations of the bindings ``headers`` (a typed or plain table) satisfies."""
        hits: list[BitMap] = []
        if headers:
            eq, present = self._eq, self._present
            for name, item in headers.items():
                bm = present.get(name)
                if bm is not None:
                    hits.append(bm)
                by_value = eq.get(name)
                if by_value is not None:
                    if not is_typed(item):
                        item = typed_value(item)
                    bm = by_value.get(match_value(*item))
                    if bm is not None:
                        hits.append(bm)
        if not hits:
            return self._route_always()
        matched = BitMap.union(*hits) if len(hits) > 1 else BitMap(hits[0])
        candidates = matched & self._all
        matched &= self._any
        if candidates:
            matched |= self._all_matches(candidates, hits)
        if self._always:
            matched |= self._always
        if self._dead is not None:  # removed bindings wait to be swept: skip theirs
            matched -= self._dead
        if not matched:
            return EMPTY
        return frozenset(map(self._dests.__getitem__, matched))

    def _all_matches(self, candidates: BitMap, hits: list[BitMap]) -> BitMap:
        """``all`` candidates hit once per criterion, via ``at_least[k]`` bit-sliced counters."""
        top = max(self._all_by_n)
        at_least = [candidates]  # at_least[k]: candidates hit by >= k of the bitmaps so far
        for bm in hits:
            hit = bm & candidates
            if not hit:
                continue
            for k in range(min(len(at_least), top), 0, -1):
                more = at_least[k - 1] & hit
                if k == len(at_least):
                    if more:
                        at_least.append(more)
                else:
                    at_least[k] |= more
        out = BitMap()
        for n, ids in self._all_by_n.items():
            if n < len(at_least):
                out |= at_least[n] & ids
        return out

    def _route_always(self) -> frozenset:
        dests = self._always_dests
        if dests is None:
            always = self._always if self._dead is None else self._always - self._dead
            dests = self._always_dests = frozenset(map(self._dests.__getitem__, always))
        return dests

    def __repr__(self) -> str:
        return f"<HeadersIndex bindings={len(self)}>"
