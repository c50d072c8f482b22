"""Routing indexes: exchange bindings -> the destinations a message goes to.

Pure data structures (no I/O, no asyncio): topic (trie + roaring-bitmap key cache), headers
(inverted bitmap of criteria), direct and fanout, all behind the same bind/unbind/route API.
"""

from __future__ import annotations

from collections.abc import Mapping

from .direct import DirectIndex
from .fanout import FanoutIndex
from .fields import typed_table
from .headers import HeadersIndex, InvalidBinding
from .topic import TopicIndex

Index = TopicIndex | DirectIndex | FanoutIndex | HeadersIndex

TOPIC_SYNTAX_ARGUMENT = "x-topic-syntax"

__all__ = [
    "DirectIndex",
    "FanoutIndex",
    "HeadersIndex",
    "Index",
    "InvalidBinding",
    "TOPIC_SYNTAX_ARGUMENT",
    "TopicIndex",
    "make_index",
    "typed_table",
]


def make_index(
    exchange_type: str, arguments: Mapping | None = None, cache_keys: int = 10000
) -> Index:
    """A fresh index for an exchange of ``exchange_type`` declared with ``arguments``.

    A topic exchange takes its syntax from the ``x-topic-syntax`` argument (``"amqp"``, the
    default, or ``"mqtt"``). Unknown types and syntaxes raise ``ValueError``.
    """
    if exchange_type == "topic":
        syntax = typed_table(arguments).get(TOPIC_SYNTAX_ARGUMENT, ("S", "amqp"))[1]
        if isinstance(syntax, bytes):
            syntax = syntax.decode("utf-8", "surrogateescape")
        return TopicIndex(syntax=syntax, cache_keys=cache_keys)  # type: ignore[arg-type]
    if exchange_type == "direct":
        return DirectIndex()
    if exchange_type == "fanout":
        return FanoutIndex()
    if exchange_type == "headers":
        return HeadersIndex()
    raise ValueError(f"unknown exchange type {exchange_type!r}")
