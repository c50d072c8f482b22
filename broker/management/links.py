"""Runtime parameters and the links they make, as RabbitMQ's management API and its shovel
management plugin serve them: /api/parameters (every component; `vhost-limits` are the
broker's limits, shown and set here too, as RabbitMQ does) and /api/shovels."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..core.definitions_json import limit_value, parameter_rows
from ..core.parameters import ParameterError
from .context import (
    USER,
    bad_request,
    broker_of,
    change,
    not_found,
    read_json,
    sees_vhost,
    vhosts_of,
)

#: The component whose values are the vhost's limits (kept as limits, listed as parameters).
VHOST_LIMITS = "vhost-limits"


def _rows(request: web.Request) -> list[dict[str, Any]]:
    return parameter_rows(broker_of(request))


async def parameters(request: web.Request) -> web.Response:
    """GET /api/parameters[/{component}[/{vhost}]]."""
    component = request.match_info.get("component")
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        vhosts_of(request)  # 404 for an unknown vhost, 401 for one the user may not see
    return web.json_response(
        [
            p
            for p in _rows(request)
            if (component is None or p["component"] == component)
            and (vhost is None or p["vhost"] == vhost)
            and sees_vhost(request, p["vhost"])
        ]
    )


async def parameter(request: web.Request) -> web.Response:
    """GET /api/parameters/{component}/{vhost}/{name}."""
    info = request.match_info
    vhost = vhosts_of(request)[0].name
    for p in _rows(request):
        if (p["component"], p["vhost"], p["name"]) == (info["component"], vhost, info["name"]):
            return web.json_response(p)
    raise not_found()


async def put_parameter(request: web.Request) -> web.Response:
    """PUT /api/parameters/{component}/{vhost}/{name} with {"value": ...}: 201 when new,
    204 when it replaced one, 400 with RabbitMQ's reason when refused (nothing stored)."""
    info = request.match_info
    vhost = vhosts_of(request)[0].name
    body = await read_json(request)
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    value = body["value"]
    broker = broker_of(request)
    component, name = info["component"], info["name"]
    if component == VHOST_LIMITS:
        if not isinstance(value, dict):
            raise bad_request("Validation failed\n\nvalue should be a JSON object\n")
        try:
            limits = {k: limit_value("vhost", k, v) for k, v in value.items()}
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        for key, limit in limits.items():
            await change(broker, "set_limit", "vhost", vhost, key, limit)
        return web.Response(status=204)
    user = request.get(USER)
    acting = user.name if user is not None else "guest"
    try:
        new = await change(broker, "set_parameter", vhost, component, name, value, acting)
    except ParameterError as exc:
        raise bad_request(str(exc)) from None
    except KeyError:
        raise not_found() from None
    return web.Response(status=201 if new else 204)


async def delete_parameter(request: web.Request) -> web.Response:
    info = request.match_info
    vhost = vhosts_of(request)[0].name
    broker = broker_of(request)
    component, name = info["component"], info["name"]
    if component == VHOST_LIMITS:
        if ("vhost", vhost) not in broker.limits:
            raise not_found()
        for key in list(broker.limits[("vhost", vhost)]):
            await change(broker, "clear_limit", "vhost", vhost, key)
        return web.Response(status=204)
    if not await change(broker, "clear_parameter", vhost, component, name):
        raise not_found()
    return web.Response(status=204)


# -- shovels ----------------------------------------------------------------------------


async def shovels(request: web.Request) -> web.Response:
    """GET /api/shovels[/{vhost}] and /api/shovels/vhost/{vhost}/{name}: each shovel's
    status row (RabbitMQ's fields; URIs without their passwords)."""
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        vhosts_of(request)
    name = request.match_info.get("name")
    rows = [
        row
        for row in broker_of(request).shovels.rows(vhost)
        if sees_vhost(request, row["vhost"]) and (name is None or row["name"] == name)
    ]
    return web.json_response(rows)


async def delete_shovel(request: web.Request) -> web.Response:
    """DELETE /api/shovels/vhost/{vhost}/{name}: the shovel and its parameter go;
    .../restart: its session starts over (a shovel not running here: 404)."""
    vhost = vhosts_of(request)[0].name
    name = request.match_info["name"]
    broker = broker_of(request)
    if (vhost, name) not in broker.shovels.running:
        raise not_found()
    if request.path.endswith("/restart"):
        await broker.shovels.restart(vhost, name)
    else:
        await change(broker, "clear_parameter", vhost, "shovel", name)
    return web.Response(status=204)


# -- federation -------------------------------------------------------------------------


async def federation_links(request: web.Request) -> web.Response:
    """GET /api/federation-links[/{vhost}][/state/down]: each link's status row on this
    node (rabbit_federation_status's fields), /state/down only those neither running nor
    starting."""
    vhost = request.match_info.get("vhost")
    if vhost is not None:
        vhosts_of(request)
    down = request.path.rstrip("/").endswith("/state/down")
    rows = broker_of(request).federation.rows(vhost, down=down)
    return web.json_response([r for r in rows if sees_vhost(request, r["vhost"])])


async def restart_federation_link(request: web.Request) -> web.Response:
    """DELETE /api/federation-links/vhost/{vhost}/{id}/{node}/restart."""
    vhost = vhosts_of(request)[0].name
    broker = broker_of(request)
    if request.match_info["node"] != broker.node_name:
        raise not_found()
    if not await broker.federation.restart(vhost, request.match_info["id"]):
        raise not_found()
    return web.Response(status=204)
