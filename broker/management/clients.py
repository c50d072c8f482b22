"""The clients' side: connections, their channels and consumers; closing a connection.

Administrators and monitoring users see every connection, other users their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aiohttp import web

from .context import USER, broker_of, not_authorised, not_found, rates_of, vhosts_of
from .rows import channel_row, connection_row, consumer_row


def sees_connection(request: web.Request, conn: Any) -> bool:
    """Administrators and monitoring users see every connection; others their own."""
    user = request[USER]
    if "administrator" in user.tags or "monitoring" in user.tags:
        return True
    return conn.user is not None and conn.user.name == user.name


def _own_channels(request: web.Request) -> Iterator[Any]:
    for conn in broker_of(request).connections:
        if conn.vhost is not None and sees_connection(request, conn):
            yield from ((conn, ch) for ch in conn.channels.values())


def _connection_named(request: web.Request) -> Any:
    name = request.match_info["name"]
    conn = next((c for c in broker_of(request).connections if c.name == name), None)
    if conn is None or not sees_connection(request, conn):
        raise not_found()
    return conn


async def connections(request: web.Request) -> web.Response:
    broker, rates = broker_of(request), rates_of(request)
    return web.json_response(
        [
            connection_row(c, broker, rates)
            for c in broker.connections
            if sees_connection(request, c)
        ]
    )


async def connection(request: web.Request) -> web.Response:
    conn = _connection_named(request)
    return web.json_response(connection_row(conn, broker_of(request), rates_of(request)))


async def connection_channels(request: web.Request) -> web.Response:
    conn = _connection_named(request)
    rates = rates_of(request)
    return web.json_response([channel_row(conn, ch, rates) for ch in conn.channels.values()])


async def close_connection(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    conn = next((c for c in broker_of(request).connections if c.name == name), None)
    if conn is None:
        raise not_found()
    user = request[USER]
    if "administrator" not in user.tags and getattr(conn.user, "name", None) != user.name:
        # Only its own user or an administrator closes a connection (monitoring reads).
        return not_authorised("User not authorised to access object")
    reason = request.headers.get("X-Reason", "Closed via management plugin")
    conn.force_close(
        f"Closed via management plugin: {reason}" if "X-Reason" in request.headers else reason
    )
    return web.Response(status=204)


async def channels(request: web.Request) -> web.Response:
    rates = rates_of(request)
    return web.json_response([channel_row(conn, ch, rates) for conn, ch in _own_channels(request)])


async def channel(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    for conn, ch in _own_channels(request):
        if ch.name == name:
            return web.json_response(channel_row(conn, ch, rates_of(request)))
    raise not_found()


async def consumers(request: web.Request) -> web.Response:
    names = {v.name for v in vhosts_of(request)}
    return web.json_response(
        [
            consumer_row(conn, ch, c)
            for conn, ch in _own_channels(request)
            if conn.vhost.name in names
            for c in ch.consumers.values()
        ]
    )
