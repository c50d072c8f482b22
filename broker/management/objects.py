"""Exchanges, queues and bindings: list, declare, delete, publish, get, purge, route explain."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from aiohttp import web

from roarmq.protocol.errors import ProtocolError
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

from ..core.erlang import ApiArguments
from ..core.exchange import Exchange
from ..core.message import Message
from ..core.queue import delivery_header
from .api_query import paged_objects, paged_stream
from .context import bad_request, broker_of, not_found, rates_of, read_json, vhosts_of
from .explain import explain
from .rows import (
    binding_row,
    exchange_row,
    json_safe,
    matches_properties_key,
    message_row,
    queue_row,
)


def _name(obj: Any) -> str:
    return obj.name


#: Fields a paged list can sort on without building every row (broker/management/api_query.py).
QUEUE_SORT_KEYS = {
    "name": _name,
    "vhost": lambda q: q.vhost.name,
    "type": lambda q: q.queue_type,
    "durable": lambda q: q.durable,
    "messages_ready": lambda q: q.message_count(),
    "messages_unacknowledged": lambda q: q.unacked,
    "messages": lambda q: q.message_count() + q.unacked,
    "consumers": lambda q: q.consumer_count,
    "policy": lambda q: q.policy.name if q.policy is not None else None,
    "message_stats.publish": lambda q: q.stats_published,
    "message_stats.deliver_get": lambda q: q.stats_delivered,
    "message_stats.ack": lambda q: q.stats_acked,
}
EXCHANGE_SORT_KEYS = {
    "name": _name,
    "vhost": lambda x: x.vhost.name,
    "type": lambda x: x.type,
    "durable": lambda x: x.durable,
    "policy": lambda x: x.policy.name if x.policy is not None else None,
    "message_stats.publish_in": lambda x: x.stats_in,
    "message_stats.publish_out": lambda x: x.stats_in - x.stats_unroutable,
}

#: A queue's rate columns: the sort key -> the sampler's fields it is the rate of.
QUEUE_RATE_KEYS = {
    **{
        f"message_stats.{name}_details.rate": (name,)
        for name in (
            "publish", "deliver_get", "deliver", "deliver_no_ack", "ack", "redeliver", "get",
            "get_no_ack", "get_empty",
        )
    },
    "messages_details.rate": ("_ready", "_unacked"),
    "messages_ready_details.rate": ("_ready",),
    "messages_unacknowledged_details.rate": ("_unacked",),
}  # fmt: skip
EXCHANGE_RATE_KEYS = {
    "message_stats.publish_in_details.rate": ("publish_in",),
    "message_stats.publish_out_details.rate": ("publish_out",),
}


def _with_rates(keys: dict[str, Any], rate_keys: dict[str, tuple[str, ...]], rates: Any) -> Any:
    """`keys` and the rate columns, each read from the sampler's last two passes (what the
    rows report, so a paged sort orders as the unpaged one does)."""
    out = dict(keys)
    for sort, fields in rate_keys.items():
        out[sort] = lambda o, fields=fields: rates.rate(o, *fields)
    return out


#: POST .../get's ackmodes, RabbitMQ's four.
ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")

_PROPERTY_NAMES = frozenset(BasicProperties.__slots__)


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean from JSON, or from rabbitmqadmin's "true"/"false" strings."""
    value = body.get(key, default)
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _properties(values: dict[str, Any]) -> BasicProperties:
    """BasicProperties from the management API's JSON (RabbitMQ's property names)."""
    unknown = set(values) - _PROPERTY_NAMES
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}")
    return BasicProperties(**values)


def _exchange_of(request: web.Request, key: str = "name") -> Any:
    vhost = vhosts_of(request)[0]
    name = request.match_info[key]
    x = vhost.exchanges.get("" if name == "amq.default" else name)
    if x is None:
        raise not_found()
    return vhost, x


def _queue_of(request: web.Request) -> Any:
    vhost = vhosts_of(request)[0]
    q = vhost.queues.get(request.match_info["name"])
    if q is None:
        raise not_found()
    return vhost, q


async def exchanges(request: web.Request) -> web.Response:
    rates = rates_of(request)
    listed = [x for v in vhosts_of(request) for x in v.exchanges.values()]
    keys = _with_rates(EXCHANGE_SORT_KEYS, EXCHANGE_RATE_KEYS, rates)
    paged = paged_objects(request, listed, _name, lambda x: exchange_row(x, rates), keys)
    if paged is not None:
        return web.json_response(paged)
    return web.json_response([exchange_row(x, rates) for x in listed])


async def exchange(request: web.Request) -> web.Response:
    return web.json_response(exchange_row(_exchange_of(request)[1], rates_of(request)))


def _declared(
    request: web.Request, body: dict[str, Any], declare: Any, second: Any, **options: Any
) -> web.Response:
    """A PUT declaring an exchange or a queue (`declare`, with its second argument): 201 when
    it is new, 204 when it was there, 400 with the channel error's text when refused."""
    try:
        _, created = declare(
            request.match_info["name"],
            second,
            durable=_flag(body, "durable", True),
            auto_delete=_flag(body, "auto_delete", False),
            **options,
        )
    except ProtocolError as exc:
        raise bad_request(exc.text) from None
    return web.Response(status=201 if created else 204)


async def put_exchange(request: web.Request) -> web.Response:
    body = await read_json(request)

    def declare() -> web.Response:
        return _declared(
            request,
            body,
            vhosts_of(request)[0].declare_exchange,
            str(body.get("type", "")),
            internal=_flag(body, "internal", False),
            arguments=body.get("arguments") or {},
        )

    return await _change(request, declare)


async def delete_exchange(request: web.Request) -> web.Response:
    def delete() -> web.Response:
        vhost, x = _exchange_of(request)
        try:
            vhost.delete_exchange(x.name, if_unused=request.query.get("if-unused") == "true")
        except ProtocolError as exc:
            raise bad_request(exc.text) from None
        return web.Response(status=204)

    return await _change(request, delete)


async def _change(request: web.Request, make: Callable[[], web.Response]) -> web.Response:
    """A declare, bind or delete whose definitions write goes off the event loop, `make`
    run again with its outcome (broker/core/persistence.py, `Persistence.change`)."""
    return await broker_of(request).persistence.change(make)


async def queues(request: web.Request) -> web.Response:
    broker, rates = broker_of(request), rates_of(request)
    listed = [q for v in vhosts_of(request) for q in v.queues.values()]

    def row(q: Any) -> dict[str, Any]:
        return queue_row(q, broker, rates)

    keys = _with_rates(QUEUE_SORT_KEYS, QUEUE_RATE_KEYS, rates)
    paged = paged_objects(request, listed, _name, row, keys)
    if paged is not None:
        return web.json_response(paged)
    return web.json_response([row(q) for q in listed])


async def queue(request: web.Request) -> web.Response:
    q = _queue_of(request)[1]
    return web.json_response(queue_row(q, broker_of(request), rates_of(request), detailed=True))


async def put_queue(request: web.Request) -> web.Response:
    body = await read_json(request)
    arguments = dict(body.get("arguments") or {})
    if body.get("queue_type"):
        arguments["x-queue-type"] = body["queue_type"]

    def declare() -> web.Response:
        declare_queue = vhosts_of(request)[0].declare_queue
        return _declared(request, body, declare_queue, None, arguments=arguments)

    return await _change(request, declare)


async def delete_queue(request: web.Request) -> web.Response:
    def delete() -> web.Response:
        vhost, q = _queue_of(request)
        try:
            vhost.delete_queue(
                q,
                if_unused=request.query.get("if-unused") == "true",
                if_empty=request.query.get("if-empty") == "true",
            )
        except ProtocolError as exc:
            raise bad_request(exc.text) from None
        return web.Response(status=204)

    return await _change(request, delete)


async def purge_queue(request: web.Request) -> web.Response:
    _, q = _queue_of(request)
    try:
        q.purge()
    except ProtocolError as exc:  # a stream: 400 with the AMQP text, as RabbitMQ 3.10.8
        raise bad_request(exc.text) from None
    return web.Response(status=204)


async def publish(request: web.Request) -> web.Response:
    """POST /api/exchanges/{vhost}/{name}/publish: {"routed": true|false}."""
    vhost, x = _exchange_of(request)
    body = await read_json(request)
    key = body.get("routing_key")
    if not isinstance(key, str):
        raise bad_request("routing_key is required")
    payload = body.get("payload", "")
    try:
        if body.get("payload_encoding", "string") == "base64":
            data = base64.b64decode(payload, validate=True)
        else:
            data = str(payload).encode()
        props = _properties(body.get("properties") or {})
        msg = Message(x.name, key, ContentHeader.from_properties(props, body_size=len(data)), data)
    except (ValueError, TypeError) as exc:
        raise bad_request(f"cannot publish: {exc}") from None
    x.stats_in += 1
    routed = vhost.route(x, msg)
    if not routed:
        x.stats_unroutable += 1
    else:
        vhost.enqueue(msg, routed)
    return web.json_response({"routed": bool(routed)})


async def get_messages(request: web.Request) -> web.Response:
    """POST /api/queues/{vhost}/{name}/get: RabbitMQ's ackmode, encoding, truncate."""
    _, q = _queue_of(request)
    body = await read_json(request)
    ackmode = body.get("ackmode", "ack_requeue_true")
    if ackmode not in ACKMODES:
        raise bad_request(f"ackmode {ackmode!r} is not one of RabbitMQ's four")
    try:
        count = int(body.get("count", 1))
        truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
    except (TypeError, ValueError):
        raise bad_request("count and truncate must be integers") from None
    broker = broker_of(request)
    taken, out = [], []
    for _ in range(max(count, 0)):
        try:
            entry = q.get()
        except ProtocolError as exc:  # a stream: RabbitMQ 3.10.8 says "540 basic.get not..."
            raise bad_request(f"{exc.reply_code} {exc.text}") from None
        if entry is None:
            break
        q.stats_get += 1  # RabbitMQ's management get is a basic.get with manual ack
        taken.append(entry)
        msg = entry.msg
        data = msg.body if msg.body is not None else (q.store or broker.store).body(msg)
        props = msg.properties
        if q.counts_deliveries:  # a quorum queue's x-delivery-count, as a delivery has it
            props = ContentHeader(60, 0, delivery_header(entry)).properties
        left = q.message_count()
        out.append(message_row(msg, props, data, entry.redelivered, left, body, truncate))
    if ackmode == "ack_requeue_false":
        for entry in taken:
            q.ack(entry)
    elif ackmode == "reject_requeue_false":
        for entry in taken:
            q.reject(entry, requeue=False)
    else:  # ack_requeue_true, reject_requeue_true: handed back, not failed
        q.requeue(taken, failed=False)
    return web.json_response(out)


def _bindings_of(vhosts: list[Any]) -> Any:
    """Every binding of `vhosts` as (vhost, source, destination, key, arguments), in the order
    GET /api/bindings lists them (RabbitMQ's: the default exchange's implicit ones too)."""
    for vhost in vhosts:
        for x in list(vhost.exchanges.values()):
            if not x.name:
                for q in list(vhost.queues.values()):
                    yield vhost.name, "", q, q.name, None
                continue
            for key, dest, args in x.index.bindings():
                yield vhost.name, x.name, dest, key, args


def _binding_count(vhosts: list[Any]) -> int:
    """How many `_bindings_of(vhosts)` yields, without walking them where an index knows."""
    count = 0
    for vhost in vhosts:
        for x in vhost.exchanges.values():
            if not x.name:
                count += len(vhost.queues)
            elif hasattr(x.index, "__len__"):
                count += len(x.index)
            else:
                count += sum(1 for _ in x.index.bindings())
    return count


def _binding_row(b: tuple[Any, ...]) -> dict[str, Any]:
    return binding_row(*b)


#: Fields a paged list of bindings sorts on from its tuples (the rows' values exactly).
BINDING_SORT_KEYS = {
    "vhost": itemgetter(0),
    "source": itemgetter(1),
    "destination": lambda b: b[2].name,
    "destination_type": lambda b: "exchange" if isinstance(b[2], Exchange) else "queue",
    "routing_key": itemgetter(3),
}


async def bindings(request: web.Request) -> web.Response:
    vhosts = vhosts_of(request)
    query = request.query
    if "page" in query and "sort" not in query and not query.get("name"):
        # RabbitMQ's order, unfiltered: count, then build the rows of one page only.
        paged = paged_stream(request, _binding_count(vhosts), _bindings_of(vhosts), _binding_row)
        return web.json_response(paged)
    if "page" in query:
        # A binding row has no name: `name=` filters on "", as the general path does.
        listed = list(_bindings_of(vhosts))
        paged = paged_objects(request, listed, lambda b: "", _binding_row, BINDING_SORT_KEYS)
        if paged is not None:
            return web.json_response(paged)
    return web.json_response([binding_row(*b) for b in _bindings_of(vhosts)])


async def object_bindings(request: web.Request) -> web.Response:
    """A queue's bindings, or an exchange's as source or destination."""
    path = request.path
    if "/api/queues/" in path:
        vhost, target = _queue_of(request)
    else:
        vhost, target = _exchange_of(request)
    rows = []
    for x in vhost.exchanges.values():
        if not x.name:
            if target in vhost.queues.values() and "/api/queues/" in path:
                rows.append(binding_row(vhost.name, "", target, target.name, None))
            continue
        for key, d, args in x.index.bindings():
            if (path.endswith("/source") and x is target) or (
                not path.endswith("/source") and d is target
            ):
                rows.append(binding_row(vhost.name, x.name, d, key, args))
    return web.json_response(rows)


def _binding_ends(request: web.Request) -> tuple[Any, Any, Any]:
    vhost, source = _exchange_of(request, "source")
    info = request.match_info
    table = vhost.queues if info["kind"] == "q" else vhost.exchanges
    dest = table.get(info["destination"])
    if dest is None:
        raise not_found()
    return vhost, source, dest


def _binding_by_props(request: web.Request) -> dict[str, Any]:
    vhost, source, dest = _binding_ends(request)
    props = request.match_info["props"]
    for key, d, args in source.index.bindings():
        if d is dest and matches_properties_key(props, key, args):
            return binding_row(vhost.name, source.name, d, key, args)
    raise not_found()


async def bindings_between(request: web.Request) -> web.Response:
    """GET /api/bindings/{vhost}/e/{source}/q|e/{destination}."""
    vhost, source, dest = _binding_ends(request)
    return web.json_response(
        [
            binding_row(vhost.name, source.name, d, key, args)
            for key, d, args in source.index.bindings()
            if d is dest
        ]
    )


async def post_binding(request: web.Request) -> web.Response:
    _binding_ends(request)  # 404 before the body is read
    body = await read_json(request)
    key = str(body.get("routing_key", ""))
    args = body.get("arguments") or None
    if isinstance(args, dict):
        args = ApiArguments(args)  # typed as JSON's in its properties_key, as RabbitMQ

    def bind() -> web.Response:
        vhost, source, dest = _binding_ends(request)
        try:
            if request.match_info["kind"] == "q":
                vhost.bind_queue(dest, source, key, args)
            else:
                vhost.bind_exchange(dest, source, key, args)
        except ProtocolError as exc:
            raise bad_request(exc.text) from None
        row = binding_row(vhost.name, source.name, dest, key, args)
        # The path as the client spelled it (vhost "/" stays %2F), then the key quoted again.
        location = f"{request.raw_path}/{urllib.parse.quote(row['properties_key'], safe='')}"
        return web.Response(status=201, headers={"Location": location})

    return await _change(request, bind)


async def binding(request: web.Request) -> web.Response:
    return web.json_response(_binding_by_props(request))


async def delete_binding(request: web.Request) -> web.Response:
    def unbind() -> web.Response:
        row = _binding_by_props(request)
        vhost, source, dest = _binding_ends(request)
        args = row["arguments"] or None
        for key, d, a in source.index.bindings():
            if d is dest and key == row["routing_key"] and json_safe(a or {}) == row["arguments"]:
                args = a
                break
        if request.match_info["kind"] == "q":
            vhost.unbind_queue(dest, source, row["routing_key"], args)
        else:
            vhost.unbind_exchange(dest, source, row["routing_key"], args)
        return web.Response(status=204)

    return await _change(request, unbind)


async def route(request: web.Request) -> web.Response:
    """Route explain: GET with ?routing_key=, or POST {"routing_key", "headers"}."""
    vhost = vhosts_of(request)[0]
    exchange = vhost.exchanges.get(request.match_info["exchange"])
    if request.match_info["exchange"] == "amq.default":
        exchange = vhost.exchanges.get("")
    if exchange is None:
        raise not_found()
    key, headers = request.query.get("routing_key", ""), None
    if request.method == "POST":
        body = await read_json(request)
        key = body.get("routing_key", key)
        headers = body.get("headers")
        if not isinstance(key, str) or not (headers is None or isinstance(headers, dict)):
            raise bad_request("routing_key must be a string and headers an object")
    return web.json_response(explain(vhost, exchange, key, headers))
