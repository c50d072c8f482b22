"""Following a message through an exchange graph: e2e bindings, alternate exchanges, CC/BCC.

Pure, like the rest of broker/routing/: the broker's vhost and the PySpark
pipeline route through this one function, so what-if analysis uses exactly
the broker's semantics. An exchange here is any object with `route(key,
headers)`, `alternate` (a name or None) and `exchange_dests` (how many of its
bindings lead to exchanges); a destination with a `route` attribute is an
exchange, anything else is a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

Lookup = Callable[[str], Any]


def route_key(exchange: Any, key: str, headers: Mapping | None, lookup: Lookup) -> Collection:
    """The queues `key` reaches from `exchange`, each once, without looping on cycles."""
    dests = exchange.route(key, headers)
    if not exchange.exchange_dests and (dests or exchange.alternate is None):
        return dests  # the common case: queues only, no graph to walk
    queues: set = set()
    seen = {id(exchange)}
    stack = [(exchange, dests)]
    while stack:
        current, found = stack.pop()
        if not found and current.alternate is not None:
            # RabbitMQ: an exchange that routes nowhere hands the message to its alternate.
            alternate = lookup(current.alternate)
            if alternate is not None and id(alternate) not in seen:
                seen.add(id(alternate))
                stack.append((alternate, alternate.route(key, headers)))
            continue
        for dest in found:
            if not hasattr(dest, "route"):
                queues.add(dest)
            elif id(dest) not in seen:
                seen.add(id(dest))
                stack.append((dest, dest.route(key, headers)))
    return queues


def sender_selected_keys(routing_key: str, headers: Mapping | None) -> list[str] | None:
    """The routing keys of a message with CC/BCC headers, or None when it has neither."""
    if not headers or ("CC" not in headers and "BCC" not in headers):
        return None
    keys = [routing_key]
    for name in ("CC", "BCC"):
        extra = headers.get(name)
        if isinstance(extra, list):
            keys.extend(k for k in extra if isinstance(k, str))
    return keys


def route_message(
    exchange: Any, routing_key: str, headers: Mapping | None, lookup: Lookup
) -> Collection:
    """All queues a publish reaches, counting sender-selected distribution (CC and BCC)."""
    keys = sender_selected_keys(routing_key, headers)
    if keys is None:
        return route_key(exchange, routing_key, headers, lookup)
    result: set = set()
    for key in keys:
        result.update(route_key(exchange, key, headers, lookup))
    return result
