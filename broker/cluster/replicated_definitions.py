"""A clustered vhost's durable definitions as one record of its replicated log.

Why whole snapshots: definitions change rarely, and a snapshot of everything durable in
the vhost (exchanges, queues with their message-log ids, bindings) needs no ordering or
merging rules on the follower: the last one in the log is the truth. It is appended to the
vhost's log before the next message record after any change, so a confirmed publish is
always preceded, in the log, by definitions that know its queues.

Record: ``b"J"`` + JSON. Arguments are AMQP tables (they may hold bytes, decimals,
timestamps), so each is kept as the base64 of its AMQP encoding.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from roarmq.protocol.tables import decode_table, encode_table

from ..routing.delayed import DelayedIndex
from ..store.record_tags import DEFINITIONS_TAG

if TYPE_CHECKING:
    from ..core.vhost import VirtualHost
    from ..server import Broker

log = logging.getLogger("roarmq.cluster")


def _table(args: Mapping | None) -> str:
    return base64.b64encode(encode_table(args or {})).decode()


def _untable(text: str) -> dict[str, Any]:
    return decode_table(base64.b64decode(text), 0)[0]


def queue_arguments(q: dict[str, Any]) -> dict[str, Any]:
    """A snapshot queue's arguments."""
    return _untable(q["arguments"])


def snapshot(vhost: VirtualHost) -> dict[str, Any]:
    """Everything durable in the vhost, with each queue's message-log id."""
    exchanges = [
        {
            "name": x.name,
            "type": x.type,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": _table(x.arguments),
        }
        for x in vhost.exchanges.values()
        if x.durable and not x.builtin
    ]
    queues = [
        {
            "id": q.store_id,
            "name": q.name,
            "auto_delete": q.auto_delete,
            "arguments": _table(q.arguments),
        }
        for q in vhost.queues.values()
        if q.store_id is not None
    ]
    from ..core.queue import Queue

    bindings = []
    for x in vhost.exchanges.values():
        if not x.durable or x.name == "":
            continue
        for key, dest, args in x.index.bindings():
            is_queue = isinstance(dest, Queue)  # a Stream is one too
            if (dest.store_id is None) if is_queue else not dest.durable:
                continue
            bindings.append(
                {
                    "source": x.name,
                    "destination": dest.name,
                    "queue": is_queue,
                    "routing_key": key,
                    "arguments": _table(args),
                }
            )
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def encode(definitions: dict[str, Any]) -> bytes:
    return DEFINITIONS_TAG + json.dumps(definitions, separators=(",", ":")).encode()


def decode(payload: bytes) -> dict[str, Any]:
    return json.loads(bytes(payload[1:]))


def apply(broker: Broker, vhost: VirtualHost, definitions: dict[str, Any]) -> dict[int, Any]:
    """Make the vhost's durable objects those of `definitions`; returns queues by log id.

    Runs when this node becomes the vhost's leader, before recovery. Every durable queue it
    holds is dropped from memory and made again from the snapshot, empty, with the
    snapshot's ids, so recovery fills it from the log alone (a node that led the vhost
    before in this process would otherwise add the log's messages to what it still held).
    Durable exchanges the snapshot does not name go too, and so do bindings between durable
    exchanges it does not hold. Nothing is written to the local
    SQLite store: a clustered vhost's definitions live in its log.
    """
    from ..core.exchange import Exchange
    from ..core.stream import queue_class

    persistence = broker.persistence
    persistence.restoring = True
    try:
        for x in definitions["exchanges"]:
            if x["name"] not in vhost.exchanges:
                vhost.declare_exchange(
                    x["name"],
                    x["type"],
                    durable=True,
                    auto_delete=x["auto_delete"],
                    internal=x["internal"],
                    arguments=_untable(x["arguments"]),
                )
        named = {x["name"] for x in definitions["exchanges"]}
        for name in [
            n for n, x in vhost.exchanges.items() if x.durable and not x.builtin and n not in named
        ]:
            _forget_exchange(vhost, vhost.exchanges[name])
        # Bindings between durable exchanges are the snapshot's alone (queues' go with the
        # queues below): one this process still holds may have been removed since.
        for x in vhost.exchanges.values():
            if x.durable:
                for key, dest, args in list(x.index.bindings()):
                    if isinstance(dest, Exchange) and dest.durable:
                        x.unbind(key, dest, args)
        wanted = {q["name"]: q for q in definitions["queues"]}
        for name in [n for n, q in vhost.queues.items() if q.durable and q.exclusive_owner is None]:
            _forget_queue(vhost, vhost.queues[name])
        by_id: dict[int, Any] = {}
        for name, q in wanted.items():
            queue = vhost.queues.get(name)
            if queue is None:
                arguments = _untable(q["arguments"])
                queue = queue_class(arguments)(
                    vhost,
                    name,
                    durable=True,
                    auto_delete=q["auto_delete"],
                    arguments=arguments,
                )
                vhost.queues[name] = queue
            queue.store_id = q["id"]
            by_id[q["id"]] = queue
        for b in definitions["bindings"]:
            source = vhost.exchanges.get(b["source"])
            dest = (vhost.queues if b["queue"] else vhost.exchanges).get(b["destination"])
            if source is not None and dest is not None:
                source.bind(b["routing_key"], dest, _untable(b["arguments"]) or None)
        return by_id
    finally:
        persistence.restoring = False


def _forget_exchange(vhost: VirtualHost, exchange: Any) -> None:
    """Drop an exchange the log does not know from memory, without writing any record."""
    if isinstance(exchange.index, DelayedIndex):
        exchange.index.schedule.forget()
    for x in vhost.exchanges.values():
        for key, dest, args in list(x.index.bindings()):
            if dest is exchange:
                x.unbind(key, dest, args)
    vhost.exchanges.pop(exchange.name, None)


def _forget_queue(vhost: VirtualHost, queue: Any) -> None:
    """Drop a queue the log does not know from memory, without writing any record."""
    for x in vhost.exchanges.values():
        for key, dest, args in list(x.index.bindings()):
            if dest is queue:
                x.unbind(key, dest, args)
    queue.store = None
    queue.deleted = True
    close = getattr(queue, "close", None)  # a stream's files: a new leader rebuilds them
    if close is not None:
        close()
    vhost.queues.pop(queue.name, None)
