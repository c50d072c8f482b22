"""What the web console (broker/www/) asks for beyond RabbitMQ's API: the catalogue of
arguments its forms offer, and moving a queue's messages to another queue.

- GET /api/queue-arguments: the queue x-arguments and policy keys from
  broker/core/queue_arguments.py's table (nothing listed twice), the exchange arguments and
  policy keys, and the queue types — what the "Add a new queue/exchange" and policy forms
  offer, with the value each takes.
- POST /api/queues/{vhost}/{name}/move {"destination": queue, "count": N}: RabbitMQ's UI
  moves messages with a dynamic shovel (rabbitmq_shovel, which RoarMQ has not); this takes
  up to N (default: as many as the queue has now) from the head of the queue and publishes
  each to the destination queue through the default exchange, as that shovel does (routing
  key = the destination's name, properties and body unchanged), acknowledging each at the
  source once the destination has it. {"moved": n}.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..core.message import Message
from ..core.policy import EXCHANGE_KEYS
from ..core.queue_arguments import ARGUMENTS, DEFAULT_QUEUE_TYPE, QUEUE_TYPES, Bool, Int, OneOf
from ..core.queue_arguments import QueueTypeCheck as _QueueTypeCheck
from ..routing import EXCHANGE_TYPES, TOPIC_SYNTAX_ARGUMENT
from .context import bad_request, broker_of, not_found, read_json, vhosts_of

#: Messages moved per turn of the event loop.
MOVE_SLICE = 500


def _value(check: Any) -> dict[str, Any]:
    """The kind of value a check takes, as a form needs it."""
    if isinstance(check, _QueueTypeCheck):
        return {"type": "string", "values": list(QUEUE_TYPES)}
    if isinstance(check, OneOf):
        return {"type": "string", "values": list(check.values)}
    if isinstance(check, Int):
        out: dict[str, Any] = {"type": "number", "minimum": check.minimum}
        if check.maximum is not None:
            out["maximum"] = check.maximum
        return out
    if isinstance(check, Bool):
        return {"type": "boolean"}
    return {"type": "string"}


def _label(name: str, noun: str) -> str:
    text = noun or name.replace("-", " ")
    return text[0].upper() + text[1:]


def catalogue() -> dict[str, Any]:
    queue = [
        {
            "argument": row.argument,
            "policy_key": row.policy_key,
            "label": _label(row.name, row.noun),
            "queue_types": sorted(row.types),
            "operator_policy": row.operator,
            "default": row.default,
            **_value(row.check),
        }
        for row in ARGUMENTS
    ]
    exchange = [
        {
            "argument": key,
            "policy_key": key,
            "label": _label(key, noun),
            "exchange_types": sorted(EXCHANGE_TYPES),
            **_value(check),
        }
        for key, (check, noun) in EXCHANGE_KEYS.items()
    ]
    if "topic" in EXCHANGE_TYPES:
        exchange.append(
            {
                "argument": TOPIC_SYNTAX_ARGUMENT,
                "policy_key": None,
                "label": "Topic syntax",
                "exchange_types": ["topic"],
                "type": "string",
                "values": ["amqp", "mqtt"],
            }
        )
    return {
        "queue_types": list(QUEUE_TYPES),
        "default_queue_type": DEFAULT_QUEUE_TYPE,
        "queue": queue,
        "exchange": exchange,
    }


async def queue_arguments(request: web.Request) -> web.Response:
    """GET /api/queue-arguments."""
    return web.json_response(catalogue())


async def move_messages(request: web.Request) -> web.Response:
    """POST /api/queues/{vhost}/{name}/move (module doc)."""
    vhost = vhosts_of(request)[0]
    source = vhost.queues.get(request.match_info["name"])
    if source is None:
        raise not_found()
    body = await read_json(request)
    dest = vhost.queues.get(str(body.get("destination", "")))
    if dest is None:
        raise bad_request(f"no queue '{body.get('destination', '')}' in vhost '{vhost.name}'")
    if dest is source:
        raise bad_request("the destination is the queue itself")
    if "stream" in (source.queue_type, dest.queue_type):
        raise bad_request("messages cannot be moved from or to a stream")
    try:
        count = int(body.get("count") or source.message_count())
    except (TypeError, ValueError):
        raise bad_request("count must be an integer") from None
    store = broker_of(request).store
    moved = 0
    while moved < count and not source.deleted and not dest.deleted:
        for _ in range(min(MOVE_SLICE, count - moved)):
            entry = source.get()
            if entry is None:
                return web.json_response({"moved": moved})
            msg = entry.msg
            data = msg.body if msg.body is not None else (source.store or store).body(msg)
            copy = Message("", dest.name, msg.header, data)
            accepted, _ = vhost.enqueue(copy, [dest])
            if not accepted:  # refused (overflow reject-publish, a failed store): put back
                source.requeue([entry], failed=False)
                return web.json_response({"moved": moved, "stopped": "destination refused"})
            source.ack(entry)
            moved += 1
        await asyncio.sleep(0)  # one slice a turn: other clients go on meanwhile
    return web.json_response({"moved": moved})
