"""Exchanges: a name, a type, and a routing index from broker/routing/.

The exchange does not match anything itself; it owns the index for its type
(dict for direct, trie + roaring bitmaps for topic, inverted criteria bitmap
for headers, a plain set for fanout) and says which destinations a message
reaches. Following exchange-to-exchange bindings is the vhost's job. The types
and their indexes are registered once, in ``broker/routing/__init__.py``
(``EXCHANGE_TYPES``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from roarmq.protocol.errors import COMMAND_INVALID, PRECONDITION_FAILED, HardError, SoftError

from ..errors import channel_error, connection_error
from ..routing import EXCHANGE_TYPES, make_index
from ..routing.delayed import (
    DELAYED_POLICY_KEY,
    DelayedIndex,
    RefusedArguments,
    UnknownExchangeType,
)
from .delayed import Schedule
from .policy import Policy, effective_definition

if TYPE_CHECKING:
    from .vhost import VirtualHost

__all__ = ["EXCHANGE_TYPES", "DefaultExchange", "Exchange", "unknown_exchange_type"]

log = logging.getLogger("roarmq.exchange")


def unknown_exchange_type(type_: str) -> HardError:
    """exchange.declare of a type not in ``EXCHANGE_TYPES``: RabbitMQ's 503 and words."""
    return connection_error(COMMAND_INVALID, f"unknown exchange type '{type_}'", 40, 10)


class Exchange:
    __slots__ = (
        "vhost",
        "name",
        "type",
        "durable",
        "auto_delete",
        "internal",
        "arguments",
        "index",
        "alternate",
        "exchange_dests",
        "deleted",
        "builtin",
        "stats_in",
        "stats_unroutable",
        "policy",
        "operator_policy",
    )

    def __init__(
        self,
        vhost: VirtualHost,
        name: str,
        type_: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict | None = None,
        builtin: bool = False,
        cache_keys: int = 10000,
    ) -> None:
        if type_ not in EXCHANGE_TYPES:
            raise unknown_exchange_type(type_)
        self.vhost = vhost
        self.name = name
        self.type = type_
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        try:
            self.index = make_index(type_, self.arguments, cache_keys=cache_keys)
        except UnknownExchangeType as exc:  # a delayed exchange's x-delayed-type
            raise unknown_exchange_type(exc.name) from None
        except RefusedArguments as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), 40, 10) from None
        except ValueError as exc:
            raise channel_error(
                PRECONDITION_FAILED,
                f"invalid arguments for exchange '{name}' in vhost '{vhost.name}': {exc}",
                40,
                10,
            ) from None
        if isinstance(self.index, DelayedIndex):
            # Its delayed messages wait in a schedule of its own, a destination of its index.
            self.index.schedule = Schedule(self)
        self.policy: Policy | None = None
        self.operator_policy: Policy | None = None
        self.alternate: str | None = None
        if name:  # policies never apply to the default exchange
            self.apply_policy(*vhost.policies_for("exchange", name))
        else:
            self._settle()
        self.exchange_dests = 0
        self.deleted = False
        self.builtin = builtin
        self.stats_in = 0
        self.stats_unroutable = 0

    def __repr__(self) -> str:
        return f"<Exchange {self.name!r} type={self.type} vhost={self.vhost.name!r}>"

    def apply_policy(self, policy: Policy | None, operator: Policy | None) -> None:
        """alternate-exchange from the argument, else from the policy (as RabbitMQ)."""
        self.policy, self.operator_policy = policy, operator
        self._settle()

    def _settle(self) -> None:
        alternate = self.arguments.get("alternate-exchange")
        if not isinstance(alternate, str) and self.policy is not None:
            alternate = self.policy.definition.get("alternate-exchange")
        self.alternate = alternate if isinstance(alternate, str) else None
        if self.name:
            self._settle_delayed()

    def _settle_delayed(self) -> None:
        """LavinMQ's policy key `delayed-message: true` makes the exchange delayed, its
        type unchanged (as its `x-delayed-exchange` argument does); when no policy asks for
        it any more, one a policy made stops delaying new messages, and what it holds is
        still routed when due (its schedule stays: nothing confirmed is dropped)."""
        wanted = self.policy is not None and self.policy.definition.get(DELAYED_POLICY_KEY) is True
        index = self.index
        if isinstance(index, DelayedIndex):
            if index.by_policy:
                index.delaying(wanted)
        elif wanted:
            try:
                self.make_delayed(delaying=True)
            except SoftError as exc:  # its schedule would share another's store id
                log.warning(
                    "policy %r cannot make exchange %r delayed: %s",
                    self.policy.name if self.policy is not None else None,
                    self.name,
                    exc.text,
                    extra={"vhost": self.vhost.name},
                )

    def make_delayed(self, delaying: bool, store_id: int | None = None) -> Schedule:
        """Wrap the index in a policy-made DelayedIndex with a schedule of its own (delaying
        from now on, or not: a recovery's `DormantSchedule`); `store_id`: the one its
        stored messages already name."""
        index = DelayedIndex(self.index, self.type, by_policy=True)
        schedule = Schedule(self, store_id)
        index.schedule = schedule
        index.delaying(delaying)
        self.index = index
        return schedule

    @property
    def effective_policy(self) -> dict:
        return effective_definition(self.policy, self.operator_policy)

    @property
    def description(self) -> str:
        return f"exchange '{self.name}' in vhost '{self.vhost.name}'"

    def bind(self, key: str, destination: Any, arguments: dict | None) -> bool:
        added = self.index.bind(key, destination, arguments or None)
        if added and isinstance(destination, Exchange):
            self.exchange_dests += 1
        return added

    def unbind(self, key: str, destination: Any, arguments: Mapping | None) -> bool:
        removed = self.index.unbind(key, destination, arguments or None)
        if removed and isinstance(destination, Exchange):
            self.exchange_dests -= 1
        return removed

    def remove_destination(self, destination: Any) -> int:
        removed = self.index.remove_destination(destination)
        if removed and isinstance(destination, Exchange):
            self.exchange_dests -= removed
        return removed

    def route(self, routing_key: str, headers: dict | None) -> Any:
        return self.index.route(routing_key, headers)


class DefaultExchange(Exchange):
    """The nameless direct exchange that routes to the queue named by the routing key."""

    __slots__ = ()

    def __init__(self, vhost: VirtualHost) -> None:
        super().__init__(vhost, "", "direct", durable=True, builtin=True)

    def route(self, routing_key: str, headers: dict | None) -> Any:
        queue = self.vhost.queues.get(routing_key)
        return (queue,) if queue is not None else ()
