"""Who may do what: vhosts, users, permissions, topic permissions, limits and policies."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from ..core.auth import hash_password
from ..core.definitions_json import (
    DefinitionError,
    limit_rows,
    limit_value,
    permission_rows,
    topic_permission_rows,
    user_rows,
    vhost_metadata,
)
from ..core.policy import PolicyError
from ..core.trace import set_tracing
from .context import (
    USER,
    bad_request,
    broker_of,
    change,
    keep_an_administrator,
    not_found,
    rates_of,
    read_json,
    sees_vhost,
    vhost_exists,
    vhost_refused,
    vhosts_of,
)
from .rows import connections_by_vhost, vhost_row


async def vhosts(request: web.Request) -> web.Response:
    broker, rates = broker_of(request), rates_of(request)
    if "vhost" in request.match_info:
        return web.json_response(vhost_row(vhosts_of(request)[0], broker, rates))
    rows = sorted(vhosts_of(request), key=lambda v: v.name.encode())  # as RabbitMQ
    conns = connections_by_vhost(broker)
    return web.json_response([vhost_row(v, broker, rates, conns.get(v, [])) for v in rows])


async def put_vhost(request: web.Request) -> web.Response:
    body = await read_json(request) if request.can_read_body else {}
    try:
        metadata = vhost_metadata(body)  # RabbitMQ: a PUT with no body clears them too
    except DefinitionError as exc:
        raise bad_request(str(exc)) from None
    broker = broker_of(request)
    created = await change(broker, "add_vhost", request.match_info["vhost"], metadata)
    if created:
        await broker.cluster.placed(request.match_info["vhost"])  # a cluster's keys in etcd
    vhost = broker.vhosts.get(request.match_info["vhost"])
    if isinstance(body.get("tracing"), bool) and vhost is not None:
        set_tracing(vhost, body["tracing"])  # this node's firehose (absent: unchanged)
    return web.Response(status=201 if created else 204)


async def cluster_name(request: web.Request) -> web.Response:
    return web.json_response({"name": broker_of(request).cluster_name})


async def put_cluster_name(request: web.Request) -> web.Response:
    name = (await read_json(request)).get("name")
    if not isinstance(name, str) or not name:
        raise bad_request("name must be a non-empty string")
    await change(broker_of(request), "set_cluster_name", name)
    return web.Response(status=204)


async def delete_vhost(request: web.Request) -> web.Response:
    if not await change(broker_of(request), "delete_vhost", request.match_info["vhost"]):
        raise not_found()
    return web.Response(status=204)


async def whoami(request: web.Request) -> web.Response:
    user = request[USER]
    return web.json_response({"name": user.name, "tags": list(user.tags)})


async def users(request: web.Request) -> web.Response:
    return web.json_response(user_rows(broker_of(request)))


async def user(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    rows = [u for u in user_rows(broker_of(request)) if u["name"] == name]
    if not rows:
        raise not_found()
    return web.json_response(rows[0])


async def put_user(request: web.Request) -> web.Response:
    broker = broker_of(request)
    body = await read_json(request)
    name = request.match_info["name"]
    tags = body.get("tags", "")
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",") if t.strip()]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise bad_request("tags must be a comma-separated string or a list of strings")
    if isinstance(body.get("password"), str):
        password_hash = hash_password(body["password"])
    elif isinstance(body.get("password_hash"), str):
        password_hash = body["password_hash"]
    else:
        raise bad_request("either password or password_hash is required")
    existed = name in broker.auth.users
    if existed:
        keep_an_administrator(broker, {name: tuple(tags)})
    await change(broker, "put_user", name, password_hash, tuple(tags))
    return web.Response(status=204 if existed else 201)


async def delete_user(request: web.Request) -> web.Response:
    """Delete a user; never the one making the request (the UI's session would end mid-way
    and, were it the last administrator, nobody could manage the broker), nor the last
    administrator."""
    broker = broker_of(request)
    name = request.match_info["name"]
    if name not in broker.auth.users:
        raise not_found()
    if name == request[USER].name:
        raise bad_request(
            f"refused: user '{name}' is the user making this request; "
            "log in as another administrator to delete it"
        )
    keep_an_administrator(broker, {name: None})
    await change(broker, "delete_user", name)
    return web.Response(status=204)


def _rows_of_path(request: web.Request, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the user and the vhost the path names (either, both or neither); 404 for
    a user or vhost that does not exist, or for a pair with none."""
    broker = broker_of(request)
    user, vhost = request.match_info.get("user"), request.match_info.get("vhost")
    if user is not None and user not in broker.auth.users:
        raise not_found()
    if vhost is not None and not vhost_exists(broker, vhost):
        raise not_found()
    rows = [
        r
        for r in rows
        if (user is None or r["user"] == user) and (vhost is None or r["vhost"] == vhost)
    ]
    if user is not None and vhost is not None and not rows:
        raise not_found()
    return rows


def _permission_fields(body: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """The fields of a permissions PUT, checked: RabbitMQ's key_missing list, then strings
    that compile (the exchange name is a string, not an expression)."""
    missing = [k for k in keys if k not in body]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    fields = {}
    for key in keys:
        value = body[key]
        if not isinstance(value, str):
            raise bad_request(f"{key}: a string is required")
        if key != "exchange":
            try:
                re.compile(value)
            except re.error:
                raise bad_request(f"{key}: not a valid regular expression") from None
        fields[key] = value
    return fields


async def permissions(request: web.Request) -> web.Response:
    """All permissions, a user's, a vhost's, or one user's in one vhost (an object)."""
    rows = _rows_of_path(request, permission_rows(broker_of(request)))
    if "user" in request.match_info and "vhost" in request.match_info:
        return web.json_response(rows[0])
    return web.json_response(rows)


async def put_permission(request: web.Request) -> web.Response:
    broker = broker_of(request)
    body = await read_json(request)
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    perms = _permission_fields(body, ("configure", "write", "read"))
    if user not in broker.auth.users or not vhost_exists(broker, vhost):
        raise bad_request("vhost_or_user_not_found")
    await change(
        broker, "set_permission", user, vhost, *(perms[k] for k in ("configure", "write", "read"))
    )
    # RabbitMQ 3.10.8 answers 204 whether it made the permission or changed it (a topic
    # permission, below, is 201 when it is the user's first in the vhost).
    return web.Response(status=204)


async def delete_permission(request: web.Request) -> web.Response:
    broker = broker_of(request)
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    known = broker.auth.users.get(user)
    if known is None or vhost not in known.permissions:
        raise not_found()
    await change(broker, "clear_permission", user, vhost)
    return web.Response(status=204)


def _has_topic_permissions(request: web.Request, user: str, vhost: str) -> bool:
    return any(
        t.user == user and t.vhost == vhost
        for t in broker_of(request).persistence.definitions.topic_permissions()
    )


async def topic_permissions(request: web.Request) -> web.Response:
    """All topic permissions, or those of a user, a vhost, or a user in a vhost."""
    return web.json_response(_rows_of_path(request, topic_permission_rows(broker_of(request))))


async def put_topic_permission(request: web.Request) -> web.Response:
    broker = broker_of(request)
    body = await read_json(request)
    user, vhost = request.match_info["user"], request.match_info["vhost"]
    perms = _permission_fields(body, ("exchange", "write", "read"))
    exchange = perms.pop("exchange")
    if user not in broker.auth.users or not vhost_exists(broker, vhost):
        raise bad_request("vhost_or_user_not_found")
    existed = _has_topic_permissions(request, user, vhost)
    await change(
        broker, "set_topic_permission", user, vhost, exchange, perms["write"], perms["read"]
    )
    return web.Response(status=204 if existed else 201)


async def delete_topic_permission(request: web.Request) -> web.Response:
    """All of a user's topic permissions in a vhost, or one exchange's (RabbitMQ answers
    204 for an exchange without any, as long as the user has some in the vhost)."""
    info = request.match_info
    user, vhost = info["user"], info["vhost"]
    if not _has_topic_permissions(request, user, vhost):
        raise not_found()
    await change(broker_of(request), "clear_topic_permissions", user, vhost, info.get("exchange"))
    return web.Response(status=204)


def _limit_kind(request: web.Request) -> str:
    return "vhost" if request.path.startswith("/api/vhost-limits") else "user"


def _limit_owner(request: web.Request, kind: str) -> str:
    broker = broker_of(request)
    owner = request.match_info["owner"]
    known = owner in broker.auth.users if kind == "user" else vhost_exists(broker, owner)
    if not known:
        raise not_found()
    if kind == "vhost" and not sees_vhost(request, owner):
        raise vhost_refused()
    return owner


async def limits(request: web.Request) -> web.Response:
    kind = _limit_kind(request)
    owner = _limit_owner(request, kind) if "owner" in request.match_info else None
    rows = limit_rows(broker_of(request), kind, owner)
    if kind == "vhost":
        rows = [r for r in rows if sees_vhost(request, r["vhost"])]
    return web.json_response(rows)


async def put_limit(request: web.Request) -> web.Response:
    broker = broker_of(request)
    kind = _limit_kind(request)
    owner = request.match_info["owner"]
    if kind == "user" and owner not in broker.auth.users:
        raise bad_request(["no_such_user", owner])  # RabbitMQ's 400 here
    if kind == "vhost" and not vhost_exists(broker, owner):
        raise web.HTTPNotFound(
            text='{"error":"not_found","reason":"vhost_not_found"}',
            content_type="application/json",
        )
    owner = _limit_owner(request, kind)
    body = await read_json(request)
    name = request.match_info["limit"]
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    try:
        value = limit_value(kind, name, body.get("value"))
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    await change(broker, "set_limit", kind, owner, name, value)
    return web.Response(status=204)


async def delete_limit(request: web.Request) -> web.Response:
    kind = _limit_kind(request)
    owner = _limit_owner(request, kind)
    await change(broker_of(request), "clear_limit", kind, owner, request.match_info["limit"])
    return web.Response(status=204)


def _operator(request: web.Request) -> bool:
    return request.path.startswith("/api/operator-policies")


async def policies(request: web.Request) -> web.Response:
    operator = _operator(request)
    return web.json_response(
        [
            p.row()
            for v in vhosts_of(request)
            for p in (v.operator_policies if operator else v.policies).values()
        ]
    )


async def policy(request: web.Request) -> web.Response:
    vhost = vhosts_of(request)[0]
    table = vhost.operator_policies if _operator(request) else vhost.policies
    found = table.get(request.match_info["name"])
    if found is None:
        raise not_found()
    return web.json_response(found.row())


async def put_policy(request: web.Request) -> web.Response:
    vhost = vhosts_of(request)[0]
    body = await read_json(request)
    try:
        new = await change(
            broker_of(request),
            "set_policy",
            vhost.name,
            request.match_info["name"],
            body,
            _operator(request),
        )
    except PolicyError as exc:
        raise bad_request(str(exc)) from None
    return web.Response(status=201 if new else 204)


async def delete_policy(request: web.Request) -> web.Response:
    vhost = vhosts_of(request)[0]
    if not await change(
        broker_of(request),
        "clear_policy",
        vhost.name,
        request.match_info["name"],
        _operator(request),
    ):
        raise not_found()
    return web.Response(status=204)
