"""ManagementServer: the aiohttp app, its route table, start and stop, and the middleware
every request passes (RabbitMQ's error shapes, login and authorization by user tags).

The handlers live in one module per area; this module only says which path goes where.
"""

from __future__ import annotations

import base64
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from ..amqp.tls import server_context
from ..errors import MetadataUnavailable
from ..store.definitions import DefinitionsWriteFailed
from . import (
    access,
    clients,
    cluster,
    console,
    definitions,
    history,
    links,
    node,
    objects,
    streams,
)
from .api_query import list_query
from .context import SERVER, USER, broker_of, not_authorised, not_found
from .metrics import RabbitCollector, RoarCollector
from .rates import RateSampler

if TYPE_CHECKING:
    from ..server import Broker

log = logging.getLogger("roarmq.management")

#: The web UI's files.
WWW = Path(__file__).parent.parent / "www"

MANAGEMENT_TAGS = {"administrator", "management", "monitoring", "policymaker"}

#: What needs the administrator tag, as RabbitMQ's management plugin: users, permissions,
#: limits per user, definitions, and every vhost or vhost-limit write. (method or "*", path
#: prefix); the prefix ends at a path segment.
ADMIN_ONLY = (
    ("*", "/api/users"),
    ("*", "/api/permissions"),
    ("*", "/api/topic-permissions"),
    ("*", "/api/user-limits"),
    ("*", "/api/definitions"),
    ("PUT", "/api/vhosts"),
    ("DELETE", "/api/vhosts"),
    ("PUT", "/api/vhost-limits"),
    ("DELETE", "/api/vhost-limits"),
    ("*", "/api/operator-policies"),
    ("PUT", "/api/cluster-name"),
    ("*", "/api/archive"),
    ("POST", "/api/vhosts"),  # .../leader: move a vhost's leadership (cluster)
    ("DELETE", "/api/nodes"),  # forget a node (cluster)
    ("*", "/api/diagnostics"),  # loop stalls, GC, job times: what the broker's internals did
)

#: Reads that need the monitoring tag (or administrator): RabbitMQ's "Not monitor user".
MONITORING_ONLY = ("/api/nodes", "/api/shovels", "/api/federation-links")

#: Writes that need the policymaker tag (or administrator).
POLICYMAKER_ONLY = (
    ("PUT", "/api/policies"),
    ("DELETE", "/api/policies"),
    ("PUT", "/api/parameters"),
    ("DELETE", "/api/parameters"),
)


def _needs_administrator(method: str, path: str) -> bool:
    if path.endswith(("/permissions", "/topic-permissions")):  # /api/vhosts/{v}/permissions
        return True
    for want, prefix in ADMIN_ONLY:
        if (want == "*" or want == method) and (path == prefix or path.startswith(prefix + "/")):
            return True
    return False


def _refusal(method: str, path: str, tags: Any) -> str | None:
    """Why a logged-in user's tags do not allow this request, or None when they do."""
    if not MANAGEMENT_TAGS.intersection(tags):
        return "Not management user"
    if "administrator" not in tags and _needs_administrator(method, path):
        return "Not administrator user"
    if {"administrator", "monitoring"}.isdisjoint(tags) and any(
        path == p or path.startswith(p + "/") for p in MONITORING_ONLY
    ):
        return "Not monitor user"
    if not {"administrator", "policymaker"} & set(tags) and any(
        method == m and path.startswith(p + "/") for m, p in POLICYMAKER_ONLY
    ):
        return "Not policymaker user"
    return None


def _route(request: web.Request) -> str:
    """A request as a job's name: its method and route, never its own path (names stay few)."""
    resource = request.match_info.route.resource
    return f"management {request.method} {resource.canonical if resource else '(no route)'}"


@web.middleware
async def _timed(request: web.Request, handler: Any) -> web.StreamResponse:
    """With the loop-lag probe on, each request is a job of the stall attribution
    (broker/ops/stalls.py); its time includes what it awaited, not only its time on the loop."""
    jobs = broker_of(request).clock.jobs
    if jobs is None:
        return await handler(request)
    start = time.perf_counter()
    try:
        return await handler(request)
    finally:
        jobs.note(_route(request), start, time.perf_counter())


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors in RabbitMQ's shapes: an unknown path is its JSON 404, a wrong method a bare
    405; a definition the store could not write a 500 saying so; anything unexpected is
    logged and answered as JSON, never an HTML page."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return web.Response(status=405)
    except web.HTTPNotFound as exc:
        if exc.content_type == "application/json":
            raise
        raise not_found() from None
    except web.HTTPException:
        raise
    except MetadataUnavailable as exc:  # a cluster node without etcd: nothing changed
        log.warning("%s", exc, extra={"method": request.method, "path": request.path})
        return web.json_response({"error": "service_unavailable", "reason": str(exc)}, status=503)
    except DefinitionsWriteFailed as exc:  # the disk, not a bug: one line, no traceback
        exc.log_to(log, method=request.method, path=request.path)
        return web.json_response({"error": "internal_error", "reason": str(exc)}, status=500)
    except Exception:
        log.exception("management API error", extra={"path": request.path})
        return web.json_response(
            {"error": "internal_error", "reason": "see the broker log"}, status=500
        )


@web.middleware
async def _no_browser_prompt(request: web.Request, handler: Any) -> web.StreamResponse:
    """The web UI asks with X-Requested-With: a 401 to it carries no WWW-Authenticate,
    or the browser would put up its own login box over the UI's."""
    response = await handler(request)
    if response.status == 401 and request.headers.get("X-Requested-With") == "XMLHttpRequest":
        response.headers.pop("WWW-Authenticate", None)
    return response


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    """HTTP basic login, then the user's tags against what the request needs."""
    if request.path.startswith("/metrics"):  # open, as RabbitMQ's Prometheus port
        return await handler(request)
    if request.path == "/" or request.path.startswith("/ui/"):
        return await handler(request)  # the web UI's files; it logs in through the API
    header = request.headers.get("Authorization", "")
    if header.startswith("Basic "):
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            user, password = "", ""
        known = broker_of(request).auth.check(user, password)
        if known is not None:
            refusal = _refusal(request.method, request.path, known.tags)
            if refusal is not None:
                return not_authorised(refusal)
            request[USER] = known
            return await handler(request)
        # As RabbitMQ's "HTTP access denied" line, with the peer; never the password.
        log.warning(
            "HTTP login refused",
            extra={"peer": request.remote, "user": user, "reason": "invalid credentials"},
        )
    return not_authorised("Login failed")


async def index(request: web.Request) -> web.FileResponse:
    """The web UI (broker/www/): plain HTML and JS over this API, nothing fetched elsewhere."""
    return web.FileResponse(WWW / "index.html")


def _also_with_trailing_slash(router: web.UrlDispatcher) -> None:
    """Every API GET also answers with a trailing "/": RabbitMQ's HTTP server (Cowboy) drops
    a trailing empty segment, and clients rely on it (rabbit-hole lists `users/`,
    `permissions/`, `bindings/`). Registered last, so no existing route changes."""
    for route in list(router.routes()):
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        if route.method != "GET" or not path or not path.startswith("/api/"):
            continue
        if path.endswith("/") or "{kind}" in path:  # {kind} is constrained to [qe]
            continue
        router.add_get(path + "/", route.handler, allow_head=False)


def _add_routes(router: web.UrlDispatcher) -> None:
    """The route table, in the order it has always been registered: aiohttp tries routes
    in that order, so keep new ones at the end unless they must come earlier."""
    router.add_get("/", index)
    router.add_static("/ui/", WWW, show_index=False)
    router.add_get("/metrics", node.metrics)
    router.add_get("/metrics/per-object", node.metrics)
    router.add_get("/api/overview", history.ranged(node.overview))
    router.add_get("/api/vhosts", access.vhosts)
    router.add_get("/api/vhosts/{vhost}", access.vhosts)
    router.add_get("/api/whoami", access.whoami)
    router.add_get("/api/exchanges", objects.exchanges)
    router.add_get("/api/exchanges/{vhost}", objects.exchanges)
    router.add_get("/api/queues", objects.queues)
    router.add_get("/api/queues/{vhost}", objects.queues)
    router.add_get("/api/queues/{vhost}/{name}", history.ranged(objects.queue))
    router.add_get("/api/connections", clients.connections)
    for method, path, handler in streams.ROUTES:
        router.add_route(method, path, handler)
    router.add_get("/api/definitions", definitions.get_definitions)
    router.add_post("/api/definitions", definitions.post_definitions)
    router.add_post("/api/definitions/{vhost}", definitions.post_definitions)
    router.add_put("/api/vhosts/{vhost}", access.put_vhost)
    router.add_delete("/api/vhosts/{vhost}", access.delete_vhost)
    router.add_get("/api/users", access.users)
    router.add_put("/api/users/{name}", access.put_user)
    router.add_delete("/api/users/{name}", access.delete_user)
    router.add_get("/api/permissions", access.permissions)
    router.add_get("/api/permissions/{vhost}/{user}", access.permissions)
    router.add_get("/api/users/{user}/permissions", access.permissions)
    router.add_get("/api/vhosts/{vhost}/permissions", access.permissions)
    router.add_put("/api/permissions/{vhost}/{user}", access.put_permission)
    router.add_delete("/api/permissions/{vhost}/{user}", access.delete_permission)
    router.add_get("/api/topic-permissions", access.topic_permissions)
    router.add_get("/api/topic-permissions/{vhost}/{user}", access.topic_permissions)
    router.add_put("/api/topic-permissions/{vhost}/{user}", access.put_topic_permission)
    router.add_delete("/api/topic-permissions/{vhost}/{user}", access.delete_topic_permission)
    router.add_delete(
        "/api/topic-permissions/{vhost}/{user}/{exchange}", access.delete_topic_permission
    )
    router.add_get("/api/users/{user}/topic-permissions", access.topic_permissions)
    router.add_get("/api/vhosts/{vhost}/topic-permissions", access.topic_permissions)
    for kind in ("vhost", "user"):
        base = f"/api/{kind}-limits"
        router.add_get(base, access.limits)
        router.add_get(base + "/{owner}", access.limits)
        router.add_put(base + "/{owner}/{limit}", access.put_limit)
        router.add_delete(base + "/{owner}/{limit}", access.delete_limit)
    for base in ("/api/policies", "/api/operator-policies"):
        router.add_get(base, access.policies)
        router.add_get(base + "/{vhost}", access.policies)
        router.add_get(base + "/{vhost}/{name}", access.policy)
        router.add_put(base + "/{vhost}/{name}", access.put_policy)
        router.add_delete(base + "/{vhost}/{name}", access.delete_policy)
    router.add_get("/api/exchanges/{vhost}/{name}", history.ranged(objects.exchange))
    router.add_put("/api/exchanges/{vhost}/{name}", objects.put_exchange)
    router.add_delete("/api/exchanges/{vhost}/{name}", objects.delete_exchange)
    router.add_post("/api/exchanges/{vhost}/{name}/publish", objects.publish)
    router.add_get("/api/exchanges/{vhost}/{name}/bindings/source", objects.object_bindings)
    router.add_get("/api/exchanges/{vhost}/{name}/bindings/destination", objects.object_bindings)
    router.add_put("/api/queues/{vhost}/{name}", objects.put_queue)
    router.add_post("/api/queues/{vhost}/{name}/get", objects.get_messages)
    router.add_get("/api/queues/{vhost}/{name}/bindings", objects.object_bindings)
    between = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
    router.add_get(between, objects.bindings_between)
    router.add_post(between, objects.post_binding)
    router.add_get(between + "/{props}", objects.binding)
    router.add_delete(between + "/{props}", objects.delete_binding)
    router.add_get("/api/aliveness-test/{vhost}", node.aliveness)
    router.add_get("/api/health/checks/local-alarms", node.alarms)
    router.add_get("/api/health/checks/virtual-hosts", node.health_ok)
    router.add_get("/api/health/checks/node-is-quorum-critical", node.quorum_critical)
    router.add_get("/api/health/checks/node-is-mirror-sync-critical", node.health_ok)
    router.add_get("/api/health/checks/port-listener/{port}", node.port_listener)
    router.add_get("/api/health/checks/protocol-listener/{protocol}", node.protocol_listener)
    router.add_get("/api/extensions", node.extensions)
    router.add_get("/api/definitions/{vhost}", definitions.vhost_definitions)
    router.add_get("/api/parameters", links.parameters)
    router.add_get("/api/parameters/{component}", links.parameters)
    router.add_get("/api/parameters/{component}/{vhost}", links.parameters)
    router.add_get("/api/parameters/{component}/{vhost}/{name}", links.parameter)
    router.add_put("/api/parameters/{component}/{vhost}/{name}", links.put_parameter)
    router.add_delete("/api/parameters/{component}/{vhost}/{name}", links.delete_parameter)
    router.add_get("/api/shovels", links.shovels)
    router.add_get("/api/shovels/{vhost}", links.shovels)
    router.add_get("/api/shovels/vhost/{vhost}/{name}", links.shovels)
    router.add_delete("/api/shovels/vhost/{vhost}/{name}", links.delete_shovel)
    router.add_delete("/api/shovels/vhost/{vhost}/{name}/restart", links.delete_shovel)
    router.add_get("/api/federation-links", links.federation_links)
    router.add_get("/api/federation-links/state/down", links.federation_links)
    router.add_get("/api/federation-links/state/down/", links.federation_links)
    router.add_get("/api/federation-links/{vhost}", links.federation_links)
    router.add_get("/api/federation-links/{vhost}/state/down", links.federation_links)
    router.add_delete(
        "/api/federation-links/vhost/{vhost}/{id}/{node}/restart", links.restart_federation_link
    )
    router.add_get("/api/global-parameters", node.global_parameters)
    router.add_get("/api/cluster-name", access.cluster_name)
    router.add_put("/api/cluster-name", access.put_cluster_name)
    router.add_get("/api/nodes", node.nodes)
    router.add_get("/api/nodes/{name}", node.nodes)
    router.add_get("/api/users/{name}", access.user)
    router.add_get("/api/bindings", objects.bindings)
    router.add_get("/api/bindings/{vhost}", objects.bindings)
    router.add_get("/api/channels", clients.channels)
    router.add_get("/api/channels/{name}", clients.channel)
    router.add_get("/api/connections/{name}", clients.connection)
    router.add_get("/api/connections/{name}/channels", clients.connection_channels)
    router.add_get("/api/consumers", clients.consumers)
    router.add_get("/api/consumers/{vhost}", clients.consumers)
    router.add_delete("/api/queues/{vhost}/{name}", objects.delete_queue)
    router.add_delete("/api/queues/{vhost}/{name}/contents", objects.purge_queue)
    router.add_delete("/api/connections/{name}", clients.close_connection)
    router.add_get("/api/route/{vhost}/{exchange}", objects.route)
    router.add_post("/api/route/{vhost}/{exchange}", objects.route)
    router.add_get("/api/health/checks/alarms", node.alarms)
    router.add_post("/api/archive/roll", node.archive_roll)
    router.add_post("/api/vhosts/{vhost}/leader", cluster.move_leader)
    router.add_delete("/api/vhosts/{vhost}/members/{node}", cluster.remove_member)
    router.add_post("/api/vhosts/{vhost}/members", cluster.add_member)
    router.add_put("/api/vhosts/{vhost}/replicas", cluster.set_replicas)
    router.add_delete("/api/nodes/{name}", cluster.forget_node)
    router.add_get("/api/queue-arguments", console.queue_arguments)
    router.add_post("/api/queues/{vhost}/{name}/move", console.move_messages)
    router.add_get("/api/diagnostics/stalls", node.stalls)


class ManagementServer:
    """The management API of one broker: its app (handlers find this server through
    `request.app[SERVER]`), the Prometheus registries and the message-rate sampler."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.registry = CollectorRegistry()
        self.rates = RateSampler(broker)  # message_stats' *_details.rate, every 5 s
        self.registry.register(RabbitCollector(broker))
        self.registry.register(RoarCollector(broker))
        self.per_object = CollectorRegistry()  # /metrics/per-object: a series per queue
        self.per_object.register(RabbitCollector(broker, per_object=True))
        self.per_object.register(RoarCollector(broker, per_object=True))
        self._runner: web.AppRunner | None = None
        app = web.Application(
            middlewares=[
                _timed,
                _errors,
                _no_browser_prompt,
                _auth,
                cluster.metadata_barrier,
                cluster.at_the_leader,
                cluster.merged_lists,
                list_query,
            ]
        )
        app[SERVER] = self
        _add_routes(app.router)
        _also_with_trailing_slash(app.router)
        self.app = app

    async def start(self) -> int:
        cfg = self.broker.config.management
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        context = server_context(cfg.tls, "management.tls") if cfg.tls.enabled else None
        site = web.TCPSite(self._runner, cfg.bind, cfg.port, ssl_context=context)
        await site.start()
        self.rates.start()
        server = site._server  # noqa: SLF001 - aiohttp exposes no public accessor for the port
        return server.sockets[0].getsockname()[1] if server and server.sockets else cfg.port

    async def stop(self) -> None:
        self.rates.stop()
        if self._runner is not None:
            await self._runner.cleanup()
