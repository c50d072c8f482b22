"""The `x-delayed-message` exchange type's routing: its `x-delay` rule and its index.

A delayed exchange routes with the rules of the type named by its `x-delayed-type`
argument (an index of that type inside it); a message whose `x-delay` header asks for a
delay reaches one destination instead, the exchange's schedule (broker/core/delayed.py),
which routes it through the same index once it is due. Semantics are those of RabbitMQ's
rabbitmq-delayed-message-exchange plugin (`rabbit_exchange_type_delayed_message`,
`rabbit_delayed_message_utils`): see `delay_of` and `make_delayed_index`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping
from typing import Any

from .fields import is_typed

DELAYED_TYPE = "x-delayed-message"
DELAYED_TYPE_ARGUMENT = "x-delayed-type"
DELAY_HEADER = "x-delay"
#: LavinMQ's form: an exchange of any type declared with this argument true is delayed.
DELAYED_ARGUMENT = "x-delayed-exchange"
#: LavinMQ's policy key: an exchange a policy with this key true applies to is delayed.
DELAYED_POLICY_KEY = "delayed-message"
#: The longest delay the plugin takes (an Erlang timer's limit, 2^32 - 1 ms); a longer
#: one, like zero or a negative one, routes the message at once.
MAX_DELAY_MS = 4294967295

_INTEGER = re.compile(r"[+-]?[0-9]+")


class RefusedArguments(ValueError):
    """Declare arguments refused with exactly this text (406, as the plugin words it)."""


class UnknownExchangeType(ValueError):
    """A type name that is not registered (503, as any unknown exchange type)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def delay_of(headers: Mapping | None) -> int | None:
    """The delay in ms a message's headers ask for, or None: route it at once.

    As the plugin reads `x-delay`: an integer of any width, a string holding an integer
    (decimal digits with an optional sign), a float truncated toward zero; then only
    0 < delay <= 2^32 - 1 delays. Anything else (a boolean, a timestamp, a decimal, a
    string that is not an integer, a table) routes the message at once.
    """
    if not headers:
        return None
    value = headers.get(DELAY_HEADER)
    if value is None:
        return None
    if is_typed(value):
        value = value[1]
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        delay = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        delay = math.trunc(value)
    elif isinstance(value, str | bytes):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if not _INTEGER.fullmatch(text):
            return None
        delay = int(text)
    else:  # bool, datetime, Decimal, tables, arrays, void
        return None
    if 0 < delay <= MAX_DELAY_MS:
        return delay
    return None


def delayed_by_argument(arguments: Mapping | None) -> bool:
    """An exchange declared with `x-delayed-exchange: true` (LavinMQ's form)."""
    if not arguments:
        return False
    value = arguments.get(DELAYED_ARGUMENT)
    if is_typed(value):
        value = value[1]  # type: ignore[index]  # a (type, value) pair
    return value is True


class DelayedIndex:
    """The index of an `x-delayed-message` exchange: the underlying type's index, plus one
    destination, the exchange's schedule, that every message asking for a delay reaches.

    Everything but `route` is the underlying index's: bindings are made, listed and
    removed there, so the exchange routes a message that is not delayed (and, once due,
    one that was) exactly as an exchange of its `x-delayed-type` would.

    One a policy made (`by_policy`: LavinMQ's `delayed-message` key) stops delaying when
    no policy asks for it any more (`delaying(False)`); its schedule stays, so what it
    holds is still routed when due.
    """

    __slots__ = ("inner", "_scheduled", "_schedule", "delayed_type", "by_policy")

    def __init__(self, inner: Any, delayed_type: str, by_policy: bool = False) -> None:
        self.inner = inner
        self.delayed_type = delayed_type
        self.by_policy = by_policy
        self._schedule: Any = None
        self._scheduled: tuple = ()  # where route sends a delayed message: () when none

    @property
    def schedule(self) -> Any:
        """Where delayed messages go (the core attaches it when it makes the exchange)."""
        return self._schedule

    @schedule.setter
    def schedule(self, destination: Hashable) -> None:
        self._schedule = destination
        self._scheduled = (destination,)

    def delaying(self, on: bool) -> None:
        """Whether messages asking for a delay get it from now on."""
        self._scheduled = (self._schedule,) if on and self._schedule is not None else ()

    @property
    def delays(self) -> bool:
        return bool(self._scheduled)

    @property
    def IDENTIFIED(self) -> bool:  # noqa: N802  # the index attribute's name
        return getattr(self.inner, "IDENTIFIED", False)

    def route(self, routing_key: str, headers: Mapping | None = None) -> Collection:
        if headers and delay_of(headers) is not None and self._scheduled:
            return self._scheduled
        return self.inner.route(routing_key, headers)

    def bind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        return self.inner.bind(key, destination, arguments)

    def unbind(self, key: str, destination: Hashable, arguments: Mapping | None = None) -> bool:
        return self.inner.unbind(key, destination, arguments)

    def remove_destination(self, destination: Hashable) -> int:
        return self.inner.remove_destination(destination)

    def remove_all(self) -> int:
        return self.inner.remove_all()

    def to_sweep(self) -> int:
        return self.inner.to_sweep()

    def sweep(self, budget: int) -> int:
        return self.inner.sweep(budget)

    def bindings(self) -> Iterator[tuple[str, Any, Mapping | None]]:
        return self.inner.bindings()

    def has_bindings(self) -> bool:
        return self.inner.has_bindings()

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        # What an index of the underlying type offers beyond the Index protocol (route
        # explain's questions, a topic index's cache figures) is asked of it.
        return getattr(self.inner, name)


def make_delayed_index(
    types: Mapping[str, Any],
) -> Callable[[Mapping | None, int], DelayedIndex]:
    """The registry's `make` for `x-delayed-message`: checks `x-delayed-type` as the plugin
    does (missing or not a string: 406; `x-delayed-message` itself: 406; a name that is no
    exchange type: 503 as any unknown type) and builds the underlying index inside."""

    def make(arguments: Mapping | None, cache_keys: int) -> DelayedIndex:
        value = (arguments or {}).get(DELAYED_TYPE_ARGUMENT)
        if is_typed(value):
            value = value[1]  # type: ignore[index]  # a (type, value) pair
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        if value == DELAYED_TYPE:
            raise RefusedArguments(
                f"Invalid argument, '{DELAYED_TYPE}' can't be used for '{DELAYED_TYPE_ARGUMENT}'"
            )
        if not isinstance(value, str):
            raise RefusedArguments(
                f"Invalid argument, '{DELAYED_TYPE_ARGUMENT}' must be an existing exchange type"
            )
        kind = types.get(value)
        if kind is None:
            raise UnknownExchangeType(value)
        return DelayedIndex(kind.new_index(arguments, cache_keys), value)

    return make
