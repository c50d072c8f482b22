"""Slow reference matchers, written independently of broker.routing, for the property tests.

Topic: a pattern becomes a regular expression over the key written as ``word.`` per word
(the empty key is zero words, as RabbitMQ's ``split_topic_key(<<>>) -> []``). Headers: a
transcription of RabbitMQ's sorted-merge ``headers_match`` over values converted to Erlang-like
terms, compared with Python ``==`` (bools become atoms so that ``true /= 1``).
"""

from __future__ import annotations

import calendar
import datetime
import re
from decimal import Decimal
from typing import Any


def amqp_words(key: str) -> list[str]:
    return key.split(".") if key else []


def _terminated(words: list[str], sep: str) -> str:
    return "".join(w + sep for w in words)


def amqp_regex(pattern: str) -> re.Pattern:
    parts = []
    for w in amqp_words(pattern):
        if w == "*":
            parts.append(r"[^.]*\.")
        elif w == "#":
            parts.append(r"(?:[^.]*\.)*")
        else:
            parts.append(re.escape(w) + r"\.")
    return re.compile("".join(parts), re.DOTALL)


def amqp_match(pattern: str, key: str) -> bool:
    return amqp_regex(pattern).fullmatch(_terminated(amqp_words(key), ".")) is not None


def mqtt_valid(pattern: str) -> bool:
    if not pattern:
        return False
    levels = pattern.split("/")
    for i, level in enumerate(levels):
        if level == "#" and i != len(levels) - 1:
            return False
        if level not in ("#", "+") and ("#" in level or "+" in level):
            return False
    return True


def mqtt_match(pattern: str, topic: str) -> bool:
    levels = topic.split("/")
    filt = pattern.split("/")
    if filt[0] in ("+", "#") and levels[0].startswith("$"):
        return False
    parts = []
    for f in filt:
        if f == "+":
            parts.append(r"[^/]*/")
        elif f == "#":
            parts.append(r"(?:[^/]*/)*")
        else:
            parts.append(re.escape(f) + "/")
    return re.fullmatch("".join(parts), _terminated(levels, "/"), re.DOTALL) is not None


class Atom(str):
    """An Erlang atom: equal only to the same atom (never to a binary or number)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is Atom and str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


ERL_TYPE = {
    "t": "bool", "b": "byte", "B": "unsignedbyte", "s": "short", "u": "unsignedshort",
    "I": "signedint", "i": "unsignedint", "l": "long", "L": "long", "f": "float",
    "d": "double", "D": "decimal", "S": "longstr", "x": "binary", "A": "array",
    "T": "timestamp", "F": "table", "V": "void",
}  # fmt: skip


def plain_type(v: object) -> str:
    if v is None:
        return "V"
    if isinstance(v, bool):
        return "t"
    if isinstance(v, int):
        return "I" if -(2**31) <= v < 2**31 else "l"
    if isinstance(v, float):
        return "d"
    if isinstance(v, str):
        return "S"
    if isinstance(v, bytes):
        return "x"
    if isinstance(v, dict):
        return "F"
    if isinstance(v, list):
        return "A"
    if isinstance(v, Decimal):
        return "D"
    if isinstance(v, datetime.datetime):
        return "T"
    raise TypeError(v)


def as_typed(item: object) -> tuple[str, object]:
    if isinstance(item, tuple) and len(item) == 2 and item[0] in ERL_TYPE:
        return item  # type: ignore[return-value]
    return (plain_type(item), item)


def erl(t: str, v: object) -> object:
    """The Erlang term RabbitMQ's parser would produce for a typed value."""
    if t == "t":
        return Atom("true" if v else "false")
    if t == "V":
        return Atom("undefined")
    if t in "Sx":
        return v.encode("utf-8", "surrogateescape") if isinstance(v, str) else bytes(v)
    if t == "T" and isinstance(v, datetime.datetime):
        return calendar.timegm(v.utctimetuple())
    if t == "D":
        sign, digits, exp = v.as_tuple()
        n = int("".join(map(str, digits)))
        return (-exp, -n if sign else n)
    if t == "F":
        return [(k, Atom(ERL_TYPE[tt]), erl(tt, vv)) for k, (tt, vv) in
                ((k, as_typed(x)) for k, x in v.items())]  # fmt: skip
    if t == "A":
        return [(Atom(ERL_TYPE[tt]), erl(tt, vv)) for tt, vv in map(as_typed, v)]
    return v  # numbers


def headers_match(args: dict | None, headers: dict | None) -> bool:
    """RabbitMQ's headers_match/2, transcribed (both tables sorted by key, then merged)."""
    args = {k: as_typed(v) for k, v in (args or {}).items()}
    data = sorted((k, *as_typed(v)) for k, v in (headers or {}).items())
    kind = args.get("x-match", ("S", "all"))[1]
    kind = kind.decode() if isinstance(kind, bytes) else kind
    pattern = sorted((k, t, v) for k, (t, v) in args.items())
    all_match, any_match = True, False
    di = 0
    for pk, pt, pv in pattern:
        if pk == "x-match":
            continue
        if pk.startswith("x-") and kind not in ("all-with-x", "any-with-x"):
            continue
        while di < len(data) and data[di][0] < pk:
            di += 1
        if di == len(data) or data[di][0] != pk:
            all_match = False
            continue
        _, dt, dv = data[di]
        di += 1
        if pt == "V" or erl(pt, pv) == erl(dt, dv):
            any_match = True
        else:
            all_match = False
    return all_match if kind in ("all", "all-with-x") else any_match


def routed(index: Any, key: str, headers: Any = None) -> set:
    """An index's route as a set, having checked it names each destination once (a route is
    a frozenset, or a one-tuple where a cold key reaches a single binding)."""
    got = index.route(key, headers)
    assert isinstance(got, (frozenset, tuple)), type(got)
    assert len(set(got)) == len(got), got
    return set(got)
