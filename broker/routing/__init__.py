"""Routing indexes: exchange bindings -> the destinations a message goes to.

Pure data structures (no I/O, no asyncio): topic (trie + roaring-bitmap key cache), headers
(inverted bitmap of criteria), direct and fanout, all behind the same bind/unbind/route API,
and the exchange types registry (``EXCHANGE_TYPES``) that names the index of each type.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .delayed import DELAYED_TYPE, DelayedIndex, delayed_by_argument, make_delayed_index
from .direct import DirectIndex
from .fanout import FanoutIndex
from .fields import typed_table
from .headers import HeadersIndex, InvalidBinding
from .topic import TopicIndex

TOPIC_SYNTAX_ARGUMENT = "x-topic-syntax"

__all__ = [
    "DELAYED_TYPE",
    "EXCHANGE_TYPES",
    "DelayedIndex",
    "DirectIndex",
    "ExchangeType",
    "FanoutIndex",
    "HeadersIndex",
    "Index",
    "InvalidBinding",
    "TOPIC_SYNTAX_ARGUMENT",
    "TopicIndex",
    "make_index",
    "register_exchange_type",
    "typed_table",
]


class Index(Protocol):
    """What an exchange and the pipeline ask of the index of any exchange type."""

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool: ...

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool: ...

    def remove_destination(self, destination: Hashable) -> int: ...

    def remove_all(self) -> int: ...

    def to_sweep(self) -> int: ...

    def sweep(self, budget: int) -> int: ...

    def route(self, routing_key: str, headers: Mapping | None = None) -> Collection: ...

    def bindings(self) -> Iterator[tuple[str, Any, Mapping | None]]: ...

    def has_bindings(self) -> bool: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ExchangeType:
    """One exchange type, as RabbitMQ's ``rabbit_registry`` holds one: its name, its index
    class, and the description ``GET /api/overview`` gives (RabbitMQ's words)."""

    name: str
    index: type[Index]
    description: str
    #: ``(declare arguments, cache_keys) -> index``; None: the index class takes neither.
    make: Callable[[Mapping | None, int], Index] | None = None

    def new_index(self, arguments: Mapping | None, cache_keys: int) -> Index:
        return self.index() if self.make is None else self.make(arguments, cache_keys)


#: Every exchange type, by name, in the order registered: what an exchange may be declared
#: as (broker, management API, pipeline) and what ``/api/overview`` lists.
EXCHANGE_TYPES: dict[str, ExchangeType] = {}


def register_exchange_type(
    name: str,
    index: type[Index],
    description: str,
    make: Callable[[Mapping | None, int], Index] | None = None,
) -> ExchangeType:
    """Add an exchange type: everything that lists or builds exchange types reads this."""
    if name in EXCHANGE_TYPES:
        raise ValueError(f"exchange type {name!r} is already registered")
    kind = EXCHANGE_TYPES[name] = ExchangeType(name, index, description, make)
    return kind


def make_index(
    exchange_type: str, arguments: Mapping | None = None, cache_keys: int = 10000
) -> Index:
    """A fresh index for an exchange of ``exchange_type`` declared with ``arguments``.

    A topic exchange takes its syntax from the ``x-topic-syntax`` argument (``"amqp"``, the
    default, or ``"mqtt"``). Unknown types and syntaxes raise ``ValueError``.
    """
    kind = EXCHANGE_TYPES.get(exchange_type)
    if kind is None:
        raise ValueError(f"unknown exchange type {exchange_type!r}")
    index = kind.new_index(arguments, cache_keys)
    if delayed_by_argument(arguments) and not isinstance(index, DelayedIndex):
        return DelayedIndex(index, exchange_type)  # LavinMQ's form of a delayed exchange
    return index


def _topic_index(arguments: Mapping | None, cache_keys: int) -> TopicIndex:
    syntax = typed_table(arguments).get(TOPIC_SYNTAX_ARGUMENT, ("S", "amqp"))[1]
    if isinstance(syntax, bytes):
        syntax = syntax.decode("utf-8", "surrogateescape")
    return TopicIndex(syntax=syntax, cache_keys=cache_keys)  # type: ignore[arg-type]


register_exchange_type("direct", DirectIndex, "AMQP direct exchange, as per the AMQP specification")
register_exchange_type("fanout", FanoutIndex, "AMQP fanout exchange, as per the AMQP specification")
register_exchange_type(
    "topic", TopicIndex, "AMQP topic exchange, as per the AMQP specification", _topic_index
)
register_exchange_type(
    "headers", HeadersIndex, "AMQP headers exchange, as per the AMQP specification"
)
register_exchange_type(
    DELAYED_TYPE, DelayedIndex, "Delayed Message Exchange.", make_delayed_index(EXCHANGE_TYPES)
)
