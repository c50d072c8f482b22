"""The stream protocol's connections, publishers and consumers, as RabbitMQ's stream
management plugin lists them: `/api/stream/connections[/{vhost}[/{name}]]`,
`/api/stream/publishers[/{vhost}]`, `/api/stream/consumers[/{vhost}]` (and
`DELETE /api/stream/connections/{vhost}/{name}`). A user sees their own connections;
administrators and monitoring users see all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from .clients import sees_connection
from .context import USER, broker_of, not_authorised, not_found


def _connections(request: web.Request) -> Iterator[Any]:
    vhost = request.match_info.get("vhost")
    for conn in broker_of(request).stream_connections:
        if conn.vhost is None or (vhost is not None and conn.vhost.name != vhost):
            continue
        if sees_connection(request, conn):
            yield conn


def _details(conn: Any) -> dict[str, Any]:
    return {
        "name": conn.name,
        "node": conn.broker.node_name,
        "peer_host": conn.peer[0],
        "peer_port": conn.peer[1],
        "user": conn.user.name,
    }


def connection_row(conn: Any) -> dict[str, Any]:
    return {
        **_details(conn),
        "vhost": conn.vhost.name,
        "host": conn.local[0],
        "port": conn.local[1],
        "protocol": "stream",
        "auth_mechanism": "EXTERNAL" if conn.tls and conn.user else "PLAIN",
        "ssl": conn.tls,
        "client_properties": conn.client_properties,
        "connected_at": int(conn.connected_at * 1000),
        "frame_max": conn.frame_max,
        "heartbeat": conn.heartbeat,
        "recv_oct": conn.recv_oct,
        "send_oct": conn.send_oct,
        "state": "running" if conn.state == "opened" else conn.state,
        "publishers": len(conn.publishers),
        "consumers": len(conn.subscriptions),
    }


def publisher_row(conn: Any, pub: Any) -> dict[str, Any]:
    return {
        "connection_details": _details(conn),
        "publisher_id": pub.id,
        "reference": pub.reference or "",
        "queue": {"name": pub.stream.name, "vhost": conn.vhost.name},
        "published": pub.published,
        "confirmed": pub.confirmed,
        "errored": pub.errored,
        "messages_published": pub.published,
        "messages_confirmed": pub.confirmed,
        "messages_errored": pub.errored,
    }


def consumer_row(conn: Any, sub: Any) -> dict[str, Any]:
    position = sub.stream.subscription_position(sub) if sub.reading else {}
    offset = position.get("offset", sub.start)
    lag = position.get("offset_lag", max(sub.stream.committed - offset, 0))
    return {
        "connection_details": _details(conn),
        "subscription_id": sub.id,
        "queue": {"name": sub.stream.name, "vhost": conn.vhost.name},
        "credits": sub.credit,
        "consumed": sub.delivered,
        "messages_consumed": sub.delivered,
        "offset": offset,
        "offset_lag": lag,
        "active": sub.active or sub.group is None,
        "activity_status": "single_active"
        if sub.group is not None and sub.active
        else ("waiting" if sub.group is not None else "up"),
        "properties": sub.properties,
    }


async def connections(request: web.Request) -> web.Response:
    name = request.match_info.get("name")
    rows = [connection_row(c) for c in _connections(request)]
    if name is None:
        return web.json_response(rows)
    row = next((r for r in rows if r["name"] == name), None)
    if row is None:
        raise not_found()
    return web.json_response(row)


async def close_connection(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    conn = next((c for c in _connections(request) if c.name == name), None)
    if conn is None:
        raise not_found()
    user = request[USER]
    if "administrator" not in user.tags and conn.user.name != user.name:
        return not_authorised("User not authorised to access object")
    conn.force_close(request.headers.get("X-Reason", "Closed via management plugin"))
    return web.Response(status=204)


async def publishers(request: web.Request) -> web.Response:
    return web.json_response(
        [publisher_row(c, p) for c in _connections(request) for p in c.publishers.values()]
    )


async def consumers(request: web.Request) -> web.Response:
    return web.json_response(
        [consumer_row(c, s) for c in _connections(request) for s in c.subscriptions.values()]
    )


ROUTES = (
    ("GET", "/api/stream/connections", connections),
    ("GET", "/api/stream/connections/{vhost}", connections),
    ("GET", "/api/stream/connections/{vhost}/{name}", connections),
    ("DELETE", "/api/stream/connections/{vhost}/{name}", close_connection),
    ("GET", "/api/stream/publishers", publishers),
    ("GET", "/api/stream/publishers/{vhost}", publishers),
    ("GET", "/api/stream/consumers", consumers),
    ("GET", "/api/stream/consumers/{vhost}", consumers),
)
