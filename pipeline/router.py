"""The broker's own routing, rebuilt from a definitions file, with per-binding hit counting.

Each exchange gets the index ``broker.routing.make_index`` gives the broker, and messages go
through ``broker.routing.graph.route_message``, so exchange-to-exchange bindings, alternate
exchanges and CC/BCC behave exactly as in the broker. The one difference is what the index holds
as a destination: the binding's id rather than the queue or exchange, so a route also says which
bindings matched; :class:`_Exchange` maps ids back to destinations (a queue name, or another
``_Exchange``) and records the ids as hits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from roarmq.broker.routing import HeadersIndex, InvalidBinding, make_index
from roarmq.broker.routing.graph import route_message
from roarmq.protocol.errors import AMQPSyntaxError
from roarmq.protocol.tables import decode_table

from .definitions import Definitions


class Routed(NamedTuple):
    queues: tuple[str, ...]  # sorted queue names
    hits: tuple[int, ...]  # sorted ids of the bindings that matched


class _Exchange:
    """What ``route_message`` needs of an exchange: ``route``, ``alternate``, ``exchange_dests``."""

    __slots__ = ("name", "index", "alternate", "exchange_dests", "targets", "hits")

    def __init__(self, name: str, index: Any, alternate: str | None, hits: set[int]) -> None:
        self.name = name
        self.index = index
        self.alternate = alternate
        self.exchange_dests = 0
        self.targets: dict[int, Any] = {}  # binding id -> queue name or _Exchange
        self.hits = hits  # the router's, shared by every exchange

    def route(self, routing_key: str, headers: Mapping | None) -> Collection:
        found = self.index.route(routing_key, headers)
        if not found:
            return ()
        self.hits.update(found)
        targets = self.targets
        return [targets[b] for b in found]


class _DefaultExchange:
    """The nameless exchange: to the queue named by the routing key, if that queue exists."""

    __slots__ = ("queues", "alternate", "exchange_dests")

    def __init__(self, queues: set[str]) -> None:
        self.queues = queues
        self.alternate = None
        self.exchange_dests = 0

    def route(self, routing_key: str, headers: Mapping | None) -> Collection:
        return (routing_key,) if routing_key in self.queues else ()


class Router:
    """Routes archived envelopes through indexes built from one definitions file."""

    def __init__(self, defs: Definitions, cache_keys: int = 10000) -> None:
        self.defs = defs
        self._hits: set[int] = set()
        self._vhosts: dict[str, dict[str, Any]] = {}
        queues_by_vhost: dict[str, set[str]] = {}
        for vhost, name in defs.queues:
            queues_by_vhost.setdefault(vhost, set()).add(name)
        for (vhost, name), x in defs.exchanges.items():
            exchanges = self._vhosts.setdefault(vhost, {})
            if name == "":
                exchanges[name] = _DefaultExchange(queues_by_vhost.setdefault(vhost, set()))
                continue
            try:
                index = make_index(x.type, x.arguments or None, cache_keys=cache_keys)
            except ValueError as exc:
                raise defs.fail(f"{x.where}.arguments", str(exc)) from None
            exchanges[name] = _Exchange(name, index, x.alternate, self._hits)
        for b in defs.bindings:
            exchanges = self._vhosts[b.vhost]
            source = exchanges[b.source]
            try:
                source.index.bind(b.routing_key, b.id, b.arguments or None)
            except InvalidBinding as exc:
                raise defs.fail(f"{b.where}.arguments", str(exc)) from None
            except ValueError as exc:
                raise defs.fail(f"{b.where}.routing_key", str(exc)) from None
            if b.destination_type == "exchange":
                source.targets[b.id] = exchanges[b.destination]
                source.exchange_dests += 1
            else:
                source.targets[b.id] = b.destination

    def knows(self, vhost: str, exchange: str) -> bool:
        return exchange in self._vhosts.get(vhost, ())

    def route(
        self, vhost: str, exchange: str, routing_key: str, headers: bytes | None
    ) -> Routed | None:
        """Where a publish goes; ``None`` when the exchange is not defined.

        ``headers`` is the archived field table (``None``: the message had no headers).
        """
        exchanges = self._vhosts.get(vhost)
        x = None if exchanges is None else exchanges.get(exchange)
        if x is None:
            return None
        table = None
        if headers is not None:
            try:
                table = decode_table(headers)[0]
            except AMQPSyntaxError:
                table = None  # cannot happen for what the broker accepted; route as headerless
        hits = self._hits
        hits.clear()
        queues = route_message(x, routing_key, table, exchanges.get)
        return Routed(tuple(sorted(set(queues))), tuple(sorted(hits)))

    def headers_sensitive(self) -> set[tuple[str, str]]:
        """``(vhost, exchange)`` pairs whose routes can depend on headers other than CC/BCC.

        Those that reach a headers exchange through exchange bindings or alternates; the
        pipeline drops the headers of every other message before grouping, so messages that
        differ only in (say) a trace id are routed once.
        """
        out = set()
        for vhost, exchanges in self._vhosts.items():
            for name, x in exchanges.items():
                if self._reaches_headers(x, exchanges):
                    out.add((vhost, name))
        return out

    @staticmethod
    def _reaches_headers(start: Any, exchanges: dict[str, Any]) -> bool:
        stack, seen = [start], {id(start)}
        while stack:
            x = stack.pop()
            if isinstance(x, _DefaultExchange):
                continue
            if isinstance(x.index, HeadersIndex):
                return True
            nexts = [t for t in x.targets.values() if isinstance(t, _Exchange)]
            if x.alternate is not None and x.alternate in exchanges:
                nexts.append(exchanges[x.alternate])
            for n in nexts:
                if id(n) not in seen:
                    seen.add(id(n))
                    stack.append(n)
        return False
