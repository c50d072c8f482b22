"""/api/definitions: export, a vhost's export, and import (the document itself is
broker/core/definitions_json.py's)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from roarmq.protocol.errors import ProtocolError

from ..cluster_hooks import OBJECT_KEYS
from ..core.definitions_json import (
    VHOST_KEYS,
    DefinitionError,
    export_definitions,
    import_definitions,
    tags_of,
)
from .cluster import import_at_the_leaders
from .context import bad_request, broker_of, keep_an_administrator, read_json, vhosts_of


async def get_definitions(request: web.Request) -> web.Response:
    return web.json_response(export_definitions(broker_of(request)))


async def vhost_definitions(request: web.Request) -> web.Response:
    """One vhost's definitions, as RabbitMQ exports them (no users, vhosts, permissions)."""
    name = vhosts_of(request)[0].name
    doc = export_definitions(broker_of(request))
    out: dict[str, Any] = {
        "rabbit_version": doc["rabbit_version"],
        "rabbitmq_version": doc["rabbitmq_version"],
    }
    for key in VHOST_KEYS:
        out[key] = [
            {k: v for k, v in row.items() if k != "vhost"}
            for row in doc.get(key, [])
            if row.get("vhost") == name
        ]
    return web.json_response(out)


async def post_definitions(request: web.Request) -> web.Response:
    """Load RabbitMQ-format definitions (users, vhosts, permissions, exchanges, queues, bindings)."""
    body = await read_json(request)
    if "vhost" in request.match_info:
        # One vhost's file (as GET /api/definitions/{vhost} writes it): its objects go
        # into the vhost named in the path, whatever they say; users and vhosts are not
        # part of such a file.
        vhost = vhosts_of(request)[0].name
        body = {key: [{**row, "vhost": vhost} for row in body.get(key, [])] for key in VHOST_KEYS}
    users = body.get("users")
    if isinstance(users, list) and all(
        isinstance(u, dict) and "name" in u and isinstance(u.get("tags", ""), (str, list))
        for u in users
    ):
        # an import replaces the tags of the users it names: not to leave no administrator
        keep_an_administrator(broker_of(request), {u["name"]: tags_of(u) for u in users})
    broker = broker_of(request)
    try:
        # Operator metadata where it lives (etcd in a cluster), then each vhost's objects
        # at its leader (this node, alone).
        await broker.cluster.import_metadata(body, lambda doc: import_definitions(broker, doc))
        await import_at_the_leaders(request, {key: body.get(key) or [] for key in OBJECT_KEYS})
    except DefinitionError as exc:
        raise bad_request(str(exc)) from None
    except (KeyError, TypeError, ValueError, ProtocolError) as exc:
        raise bad_request(f"cannot import definitions: {exc}") from None
    return web.Response(status=204)
