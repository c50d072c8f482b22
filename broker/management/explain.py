"""Route explain: where a message would go from an exchange, and why, without publishing it.

The answer is computed by the exchanges' own routing indexes (so it cannot disagree with a
real publish): the destinations each exchange routes the key to, then, among only the
bindings to those destinations, the ones that match (each checked with a one-binding index
of the exchange's type), exchange-to-exchange hops, alternate exchanges and CC/BCC keys,
plus the topic routing cache's state for the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.definitions_json import json_safe
from ..core.exchange import Exchange
from ..routing import make_index
from ..routing.graph import sender_selected_keys


def _matches(
    exchange: Exchange, key: str, dest: Any, args: Any, routing_key: str, headers: Any
) -> bool:
    probe = make_index(exchange.type, exchange.arguments, cache_keys=0)
    probe.bind(key, dest, args or None)
    return dest in probe.route(routing_key, headers)


def explain(vhost: Any, exchange: Exchange, routing_key: str, headers: Mapping | None) -> dict:
    keys = sender_selected_keys(routing_key, headers) or [routing_key]
    queues: set[str] = set()
    streams: dict[str, Any] = {}  # the streams among them: a stream appends, never removes
    bindings: list[dict[str, Any]] = []
    notes: list[str] = []
    for key in keys:
        seen = {exchange.name}
        stack = [exchange]
        while stack:
            current = stack.pop()
            found = current.route(key, headers)
            index = current.index
            if hasattr(index, "is_cached"):
                state = "a cache hit" if index.is_cached(key) else "a cache miss (a trie walk)"
                notes.append(f"topic exchange '{current.name}': key '{key}' is {state}")
            if not found:
                if current.alternate is not None:
                    alternate = vhost.exchanges.get(current.alternate)
                    if alternate is None:
                        notes.append(
                            f"exchange '{current.name}' routes '{key}' nowhere; its alternate "
                            f"exchange '{current.alternate}' does not exist"
                        )
                    elif alternate.name not in seen:
                        notes.append(
                            f"exchange '{current.name}' routes '{key}' nowhere: "
                            f"handed to its alternate exchange '{alternate.name}'"
                        )
                        seen.add(alternate.name)
                        stack.append(alternate)
                continue
            if not current.name:  # the default exchange: the key names the queue
                for dest in found:
                    queues.add(dest.name)
                    if dest.queue_type == "stream":
                        streams[dest.name] = dest
                    bindings.append(_row(current, dest, key, {}, key))
                continue
            targets = {id(d) for d in found}
            for bkey, dest, args in current.index.bindings():
                if id(dest) in targets and _matches(current, bkey, dest, args, key, headers):
                    bindings.append(_row(current, dest, bkey, args, key))
            for dest in found:
                if isinstance(dest, Exchange):
                    if dest.name not in seen:
                        seen.add(dest.name)
                        stack.append(dest)
                else:
                    queues.add(dest.name)
                    if dest.queue_type == "stream":
                        streams[dest.name] = dest
    if len(keys) > 1:
        notes.append(f"CC/BCC: routed with the keys {', '.join(repr(k) for k in keys)}")
    for name in sorted(streams):
        notes.append(_stream_note(streams[name], headers))
    if not queues:
        notes.append("unroutable: a mandatory publish would be returned (312 NO_ROUTE)")
    return {
        "vhost": vhost.name,
        "exchange": exchange.name,
        "routing_key": routing_key,
        "queues": sorted(queues),
        "streams": sorted(streams),
        "bindings": bindings,
        "notes": notes,
    }


def _row(source: Exchange, dest: Any, key: str, args: Any, routed_key: str) -> dict[str, Any]:
    return {
        "source": source.name,
        "destination": dest.name,
        "destination_type": "exchange" if isinstance(dest, Exchange) else "queue",
        **({} if isinstance(dest, Exchange) else {"queue_type": dest.queue_type}),
        "routing_key": key,
        "arguments": json_safe(args or {}),
        "matched_key": routed_key,
    }


def _stream_note(stream: Any, headers: Mapping | None) -> str:
    """Where a stream would put the message: the offset it would get, and its filter value
    (what `x-stream-filter` consumers select on)."""
    from ..core.stream import FILTER_HEADER

    text = (
        f"stream '{stream.name}': appended at offset {stream.next_offset} (retained, not "
        "removed by consuming)"
    )
    value = (headers or {}).get(FILTER_HEADER)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return f"{text}, filter value '{value}'"
    return f"{text}, no filter value (filtered consumers get it with x-stream-match-unfiltered)"
