"""What every handler reads from its request, and the refusals it answers with.

Handlers are plain functions; the server, the logged-in user, the vhosts that user may
see and the JSON body all come from the request, so each area's module needs only this one.
Refusals are RabbitMQ's JSON shapes.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from ..server import Broker
    from .rates import RateSampler
    from .server import ManagementServer

#: The ManagementServer an app belongs to: the broker, the rate sampler and the metrics
#: registries, for handlers that are functions rather than its methods.
SERVER: web.AppKey[ManagementServer] = web.AppKey("server")

#: Where the auth middleware leaves the logged-in user (a typed key where aiohttp has them).
USER: Any = web.RequestKey("user", object) if hasattr(web, "RequestKey") else "user"


def broker_of(request: web.Request) -> Broker:
    return request.app[SERVER].broker


def rates_of(request: web.Request) -> RateSampler:
    return request.app[SERVER].rates


def sees_vhost(request: web.Request, name: str) -> bool:
    """In lists, as RabbitMQ: administrators and monitoring users see every vhost, other
    users the vhosts they have permissions in."""
    user = request.get(USER)
    return (
        user is None
        or not {"administrator", "monitoring"}.isdisjoint(user.tags)
        or name in user.permissions
    )


def vhosts_of(request: web.Request) -> list[Any]:
    """The vhost the path names, or every vhost the user sees when it names none."""
    broker = broker_of(request)
    name = request.match_info.get("vhost")
    if name is None:
        return [v for v in broker.vhosts.values() if sees_vhost(request, v.name)]
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise not_found()
    # A path naming a vhost needs permissions in it (monitoring included) or the
    # administrator tag: RabbitMQ's 401, not a 404 that hides nothing anyway.
    user = request.get(USER)
    if user is not None and "administrator" not in user.tags and name not in user.permissions:
        raise vhost_refused()
    return [vhost]


async def change(broker: Broker, method: str, *args: Any) -> Any:
    """A change to users, vhosts, permissions, limits, policies or global parameters: on a
    cluster node through etcd, their home there (broker/cluster/metadata.py: answered once
    etcd has it and this node has applied it; 503 when etcd cannot be reached), else the
    broker's own method of the same name and answer."""
    return await broker.cluster.change(method, *args)


def vhost_exists(broker: Broker, name: str) -> bool:
    """This node has it, or (a cluster node) the cluster knows it and it is on its way."""
    if name in broker.vhosts:
        return True
    return broker.cluster.knows_vhost(name)


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or 400."""
    try:
        body = await request.json()
    except ValueError:
        raise bad_request("not_json") from None
    if not isinstance(body, dict):
        raise bad_request("body must be a JSON object")
    try:
        # JSON can spell a lone surrogate ("\\udcff"), which no store or AMQP name holds.
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("body holds a string that is not valid Unicode") from None
    return body


def administrators_after(broker: Broker, changes: dict[str, tuple[str, ...] | None]) -> set[str]:
    """The users holding the administrator tag once ``changes`` are made: a user name to its
    new tags, or to None when the user is deleted."""
    admins = {name for name, u in broker.auth.users.items() if "administrator" in u.tags}
    for name, tags in changes.items():
        if tags is not None and "administrator" in tags:
            admins.add(name)
        else:
            admins.discard(name)
    return admins


def keep_an_administrator(broker: Broker, changes: dict[str, tuple[str, ...] | None]) -> None:
    """400 when ``changes`` would leave the broker with no administrator: nobody could manage
    users, vhosts or permissions through the API any more (RabbitMQ lets it happen; an
    operator locked out needs a restart with a new default user to get back in)."""
    if administrators_after(broker, changes):
        return
    name = next(iter(changes))
    what = "deleting" if changes[name] is None else "removing the administrator tag from"
    raise web.HTTPBadRequest(
        text=json.dumps(
            {
                "error": "bad_request",
                "reason": f"refused: {what} user '{name}' would leave no administrator; "
                "give another user the administrator tag first",
            }
        ),
        content_type="application/json",
    )


def bad_request(reason: Any) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": "bad_request", "reason": reason}), content_type="application/json"
    )


def not_found() -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text='{"error":"Object Not Found","reason":"Not Found"}', content_type="application/json"
    )


def vhost_refused() -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text=json.dumps(
            {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
        ),
        content_type="application/json",
    )


def not_authorised(reason: str) -> web.Response:
    # RabbitMQ spells the tag refusals "not_authorised" and a failed login "not_authorized".
    error = "not_authorized" if reason == "Login failed" else "not_authorised"
    return web.json_response(
        {"error": error, "reason": reason},
        status=401,
        headers={"WWW-Authenticate": 'Basic realm="RoarMQ Management"'},
    )
