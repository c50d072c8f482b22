"""Management HTTP API (a RabbitMQ-shaped subset) and Prometheus metrics.

Statistics are plain integers kept on queues and exchanges and read only when
someone asks (`/api/...` or a `/metrics` scrape), so observability costs the
per-message path nothing but an increment.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from roarmq.protocol.errors import ProtocolError
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

from . import __version__
from .api_query import list_query, paged_objects
from .auth import hash_password
from .exchange import Exchange
from .explain import explain
from .message import Message
from .metrics import RabbitCollector, RoarCollector, churn_counts, global_counts, queue_counts
from .policy import PolicyError
from .rates import RateSampler
from .tls import PLAIN_REPORT, server_context

if TYPE_CHECKING:
    from .server import Broker

log = logging.getLogger("roarmq.management")

#: GET /api/overview's exchange_types, RabbitMQ's descriptions.
EXCHANGE_TYPE_TEXTS = {
    "direct": "AMQP direct exchange, as per the AMQP specification",
    "fanout": "AMQP fanout exchange, as per the AMQP specification",
    "headers": "AMQP headers exchange, as per the AMQP specification",
    "topic": "AMQP topic exchange, as per the AMQP specification",
}

#: The web UI's files.
WWW = Path(__file__).parent / "www"

#: The RabbitMQ management API version whose shapes this API follows (definitions export too).
RABBITMQ_API_VERSION = "3.13.0"

MANAGEMENT_TAGS = {"administrator", "management", "monitoring", "policymaker"}

#: Where the auth middleware leaves the logged-in user (a typed key where aiohttp has them).
_USER: Any = web.RequestKey("user", object) if hasattr(web, "RequestKey") else "user"

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
)

#: Reads that need the monitoring tag (or administrator): RabbitMQ's "Not monitor user".
MONITORING_ONLY = ("/api/nodes",)

#: Writes that need the policymaker tag (or administrator).
POLICYMAKER_ONLY = (("PUT", "/api/policies"), ("DELETE", "/api/policies"))


def _needs_administrator(method: str, path: str) -> bool:
    if path.endswith(("/permissions", "/topic-permissions")):  # /api/vhosts/{v}/permissions
        return True
    for want, prefix in ADMIN_ONLY:
        if (want == "*" or want == method) and (path == prefix or path.startswith(prefix + "/")):
            return True
    return False


def _not_authorised(reason: str) -> web.Response:
    # RabbitMQ spells the tag refusals "not_authorised" and a failed login "not_authorized".
    error = "not_authorized" if reason == "Login failed" else "not_authorised"
    return web.json_response(
        {"error": error, "reason": reason},
        status=401,
        headers={"WWW-Authenticate": 'Basic realm="RoarMQ Management"'},
    )


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Errors in RabbitMQ's shapes: an unknown path is its JSON 404, a wrong method a bare
    405; anything unexpected is logged and answered as JSON, never an HTML page."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed:
        return web.Response(status=405)
    except web.HTTPNotFound as exc:
        if exc.content_type == "application/json":
            raise
        raise _not_found() from None
    except web.HTTPException:
        raise
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


def _name(obj: Any) -> str:
    return obj.name


#: Fields a paged list can sort on without building every row (broker/api_query.py).
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
}
EXCHANGE_SORT_KEYS = {
    "name": _name,
    "vhost": lambda x: x.vhost.name,
    "type": lambda x: x.type,
    "durable": lambda x: x.durable,
    "policy": lambda x: x.policy.name if x.policy is not None else None,
    "message_stats.publish_in": lambda x: x.stats_in,
}


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def user_rows(broker: Broker) -> list[dict[str, Any]]:
    """The users as RabbitMQ lists them (GET /api/users and definitions.json alike)."""
    return [
        {
            "name": u.name,
            "password_hash": u.password_hash,
            "hashing_algorithm": "rabbit_password_hashing_sha256",
            "tags": list(u.tags),
            "limits": dict(sorted(broker.limits.get(("user", u.name), {}).items())),
        }
        for u in broker.auth.users.values()
    ]


#: The limits RabbitMQ knows, by kind (anything else is refused as RabbitMQ does).
LIMIT_NAMES = {
    "vhost": ("max-connections", "max-queues"),
    "user": ("max-connections", "max-channels"),
}


def limit_rows(broker: Broker, kind: str, owner: str | None = None) -> list[dict[str, Any]]:
    """GET /api/vhost-limits and /api/user-limits: [{"vhost"|"user": name, "value": {...}}]."""
    return [
        {kind: name, "value": dict(sorted(values.items()))}
        for (k, name), values in sorted(broker.limits.items())
        if k == kind and values and (owner is None or name == owner)
    ]


def _import_limits(broker: Broker, kind: str, owner: str, values: Any) -> None:
    if not isinstance(values, dict):
        raise ValueError(f"{kind} limits of {owner!r} must be an object")
    for name, value in values.items():
        broker.set_limit(kind, owner, name, _limit_value(kind, name, value))


def _limit_value(kind: str, name: str, value: Any) -> int:
    """A limit's value, checked; the refusals in RabbitMQ's words (vhost limits go through
    its parameter validation, user limits do not, hence the two spellings)."""
    if name not in LIMIT_NAMES[kind]:
        terms = f"Unrecognised terms [{{{_erlang(name)},{_erlang(value)}}}] in"
        if kind == "vhost":
            raise ValueError(_validation_failed(f"{terms} limits"))
        raise ValueError(f"{terms} user-limits")
    if type(value) is not int:
        text = f"{name} should be a number, actually was {_erlang(value)}"
        raise ValueError(_validation_failed(text) if kind == "vhost" else text)
    # RabbitMQ takes any integer; the store holds 64 bits, and beyond them no count reaches.
    return max(-(2**63), min(value, 2**63 - 1))


def _validation_failed(text: str) -> str:
    return f"Validation failed\n\n{text}\n"


def _erlang(value: Any) -> str:
    """A JSON value as RabbitMQ's error texts print it: the Erlang term it decodes to."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return '<<"' + value.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    if isinstance(value, list):
        return "[" + ",".join(_erlang(v) for v in value) + "]"
    if isinstance(value, dict):
        return "#{" + ",".join(f"{_erlang(k)} => {_erlang(v)}" for k, v in value.items()) + "}"
    return repr(value)


def permission_rows(broker: Broker) -> list[dict[str, Any]]:
    """Every user's permissions per vhost (GET /api/permissions and definitions.json alike)."""
    return [
        {
            "user": p.user,
            "vhost": p.vhost,
            "configure": p.configure,
            "write": p.write,
            "read": p.read,
        }
        for p in broker.persistence.definitions.permissions()  # the expressions as written
    ]


def topic_permission_rows(broker: Broker) -> list[dict[str, Any]]:
    """Every topic permission, as GET /api/topic-permissions and definitions.json list them."""
    return [
        {"user": t.user, "vhost": t.vhost, "exchange": t.exchange, "write": t.write, "read": t.read}
        for t in broker.persistence.definitions.topic_permissions()
    ]


def export_definitions(broker: Broker) -> dict[str, Any]:
    """Durable and transient definitions in RabbitMQ's definitions.json format."""
    users = user_rows(broker)
    permissions = permission_rows(broker)
    exchanges, queues, bindings = [], [], []
    for vhost in broker.vhosts.values():
        for x in vhost.exchanges.values():
            if x.builtin:
                continue
            exchanges.append(
                {
                    "name": x.name,
                    "vhost": vhost.name,
                    "type": x.type,
                    "durable": x.durable,
                    "auto_delete": x.auto_delete,
                    "internal": x.internal,
                    "arguments": _json_safe(x.arguments),
                }
            )
        for q in vhost.queues.values():
            queues.append(
                {
                    "name": q.name,
                    "vhost": vhost.name,
                    "durable": q.durable,
                    "auto_delete": q.auto_delete,
                    "arguments": _json_safe(q.arguments),
                }
            )
        for x in vhost.exchanges.values():
            if not x.name:
                continue
            for key, dest, args in x.index.bindings():
                bindings.append(
                    {
                        "source": x.name,
                        "vhost": vhost.name,
                        "destination": dest.name,
                        "destination_type": "exchange" if isinstance(dest, Exchange) else "queue",
                        "routing_key": key,
                        "arguments": _json_safe(args or {}),
                    }
                )
    return {
        "rabbit_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "RoarMQ",
        "product_version": __version__,
        "users": users,
        "vhosts": [{"name": name} for name in broker.vhosts],
        "permissions": permissions,
        "topic_permissions": topic_permission_rows(broker),
        "policies": [p.row() for v in broker.vhosts.values() for p in v.policies.values()],
        "parameters": [
            {
                "value": row["value"],
                "vhost": row["vhost"],
                "component": "vhost-limits",
                "name": "limits",
            }
            for row in limit_rows(broker, "vhost")
        ],
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    }


def import_definitions(broker: Broker, doc: dict[str, Any]) -> None:
    for v in doc.get("vhosts", []):
        broker.add_vhost(v["name"])
    for u in doc.get("users", []):
        tags = u.get("tags", "")
        tags = tuple(t for t in (tags.split(",") if isinstance(tags, str) else tags) if t)
        password_hash = u.get("password_hash") or hash_password(u["password"])
        broker.put_user(u["name"], password_hash, tags)
        if u.get("limits"):
            _import_limits(broker, "user", u["name"], u["limits"])
    for param in doc.get("parameters", []):
        if param.get("component") == "vhost-limits":
            _import_limits(broker, "vhost", param["vhost"], param.get("value"))
    for p in doc.get("permissions", []):
        broker.set_permission(
            p["user"],
            p["vhost"],
            p.get("configure", ".*"),
            p.get("write", ".*"),
            p.get("read", ".*"),
        )
    for t in doc.get("topic_permissions", []):
        broker.set_topic_permission(
            t["user"], t["vhost"], t["exchange"], t.get("write", ".*"), t.get("read", ".*")
        )
    for p in doc.get("policies", []):
        broker.set_policy(p.get("vhost", "/"), p["name"], p)
    for x in doc.get("exchanges", []):
        vhost = broker.vhosts[x.get("vhost", "/")]
        vhost.declare_exchange(
            x["name"],
            x.get("type", "direct"),
            durable=x.get("durable", True),
            auto_delete=x.get("auto_delete", False),
            internal=x.get("internal", False),
            arguments=x.get("arguments"),
        )
    for q in doc.get("queues", []):
        vhost = broker.vhosts[q.get("vhost", "/")]
        vhost.declare_queue(
            q["name"],
            None,
            durable=q.get("durable", True),
            auto_delete=q.get("auto_delete", False),
            arguments=q.get("arguments"),
        )
    for b in doc.get("bindings", []):
        vhost = broker.vhosts[b.get("vhost", "/")]
        source = vhost.get_exchange(b["source"])
        if b.get("destination_type", "queue") == "queue":
            vhost.bind_queue(
                vhost.get_queue(b["destination"]),
                source,
                b.get("routing_key", ""),
                b.get("arguments") or None,
            )
        else:
            vhost.bind_exchange(
                vhost.get_exchange(b["destination"]),
                source,
                b.get("routing_key", ""),
                b.get("arguments") or None,
            )


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean from JSON, or from rabbitmqadmin's "true"/"false" strings."""
    value = body.get(key, default)
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


def _exchange_row(x: Any, rates: RateSampler | None = None) -> dict[str, Any]:
    return {
        "name": x.name,
        "vhost": x.vhost.name,
        "type": x.type,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": _json_safe(x.arguments),
        "policy": x.policy.name if x.policy is not None else None,
        "user_who_performed_action": "rmq-internal" if x.builtin else None,
        "message_stats": _stats(
            rates, x, {"publish_in": x.stats_in, "publish_out": x.stats_in - x.stats_unroutable}
        ),
    }


def _stats(rates: RateSampler | None, key: Any, counts: dict[str, int]) -> dict[str, Any]:
    if rates is None:
        return dict(counts)
    return rates.stats(key, counts)


_PROPERTY_NAMES = frozenset(BasicProperties.__slots__)


def _properties(values: dict[str, Any]) -> BasicProperties:
    """BasicProperties from the management API's JSON (RabbitMQ's property names)."""
    unknown = set(values) - _PROPERTY_NAMES
    if unknown:
        raise ValueError(f"unknown properties {sorted(unknown)}")
    return BasicProperties(**values)


def _message_row(
    msg: Any, data: bytes, redelivered: bool, left: int, body: dict[str, Any], truncate: int | None
) -> dict[str, Any]:
    props = msg.properties
    shown = data[:truncate] if truncate is not None else data
    encoding = "string"
    if body.get("encoding") == "base64":
        payload, encoding = base64.b64encode(shown).decode(), "base64"
    else:
        try:
            payload = shown.decode()
        except UnicodeDecodeError:
            payload, encoding = base64.b64encode(shown).decode(), "base64"
    return {
        "payload_bytes": len(data),
        "redelivered": redelivered,
        "exchange": msg.exchange,
        "routing_key": msg.routing_key,
        "message_count": left,
        "properties": _json_safe(
            {
                k: getattr(props, k)
                for k in BasicProperties.__slots__
                if getattr(props, k) is not None
            }
        ),
        "payload": payload,
        "payload_encoding": encoding,
    }


def _channel_row(conn: Any, ch: Any, rates: RateSampler) -> dict[str, Any]:
    peer = conn.peer or (None, None)
    return {
        **rates.idle_since(ch),
        "name": f"{conn.name} ({ch.id})",
        "number": ch.id,
        "user": conn.user.name if conn.user is not None else None,
        "vhost": conn.vhost.name if conn.vhost is not None else None,
        "connection_details": {"name": conn.name, "peer_host": peer[0], "peer_port": peer[1]},
        "consumer_count": len(ch.consumers),
        "messages_unacknowledged": len(ch.unacked),
        "prefetch_count": ch.prefetch_count,
        "global_prefetch_count": ch.prefetch_global,
        "confirm": bool(ch.confirm),
        "transactional": ch.tx is not None,
        "state": "running",
    }


def _binding_row(vhost: str, source: str, dest: Any, key: str, args: Any) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": dest.name,
        "destination_type": "exchange" if isinstance(dest, Exchange) else "queue",
        "routing_key": key,
        "arguments": _json_safe(args or {}),
        "properties_key": key.replace("%", "%25").replace("~", "%7E") or "~",
    }


def _bad_request(reason: Any) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(
        text=json.dumps({"error": "bad_request", "reason": reason}), content_type="application/json"
    )


def _permission_fields(body: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """The fields of a permissions PUT, checked: RabbitMQ's key_missing list, then strings
    that compile (the exchange name is a string, not an expression)."""
    missing = [k for k in keys if k not in body]
    if missing:
        raise _bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in missing) + "]")
    fields = {}
    for key in keys:
        value = body[key]
        if not isinstance(value, str):
            raise _bad_request(f"{key}: a string is required")
        if key != "exchange":
            try:
                re.compile(value)
            except re.error:
                raise _bad_request(f"{key}: not a valid regular expression") from None
        fields[key] = value
    return fields


def _vhost_refused() -> web.HTTPUnauthorized:
    return web.HTTPUnauthorized(
        text=json.dumps(
            {"error": "not_authorised", "reason": "User not authorised to access virtual host"}
        ),
        content_type="application/json",
    )


def _not_found() -> web.HTTPNotFound:
    return web.HTTPNotFound(
        text='{"error":"Object Not Found","reason":"Not Found"}', content_type="application/json"
    )


class ManagementServer:
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
        app = web.Application(middlewares=[_errors, _no_browser_prompt, self._auth, list_query])
        app.router.add_get("/", self.index)
        app.router.add_static("/ui/", WWW, show_index=False)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/metrics/per-object", self.metrics)
        app.router.add_get("/api/overview", self.overview)
        app.router.add_get("/api/vhosts", self.vhosts)
        app.router.add_get("/api/vhosts/{vhost}", self.vhosts)
        app.router.add_get("/api/whoami", self.whoami)
        app.router.add_get("/api/exchanges", self.exchanges)
        app.router.add_get("/api/exchanges/{vhost}", self.exchanges)
        app.router.add_get("/api/queues", self.queues)
        app.router.add_get("/api/queues/{vhost}", self.queues)
        app.router.add_get("/api/queues/{vhost}/{name}", self.queue)
        app.router.add_get("/api/connections", self.connections)
        app.router.add_get("/api/definitions", self.definitions)
        app.router.add_post("/api/definitions", self.import_definitions)
        app.router.add_post("/api/definitions/{vhost}", self.import_definitions)
        app.router.add_put("/api/vhosts/{vhost}", self.put_vhost)
        app.router.add_delete("/api/vhosts/{vhost}", self.delete_vhost)
        app.router.add_get("/api/users", self.users)
        app.router.add_put("/api/users/{name}", self.put_user)
        app.router.add_delete("/api/users/{name}", self.delete_user)
        app.router.add_get("/api/permissions", self.permissions)
        app.router.add_get("/api/permissions/{vhost}/{user}", self.permissions)
        app.router.add_get("/api/users/{user}/permissions", self.permissions)
        app.router.add_get("/api/vhosts/{vhost}/permissions", self.permissions)
        app.router.add_put("/api/permissions/{vhost}/{user}", self.put_permission)
        app.router.add_delete("/api/permissions/{vhost}/{user}", self.delete_permission)
        app.router.add_get("/api/topic-permissions", self.topic_permissions)
        app.router.add_get("/api/topic-permissions/{vhost}/{user}", self.topic_permissions)
        app.router.add_put("/api/topic-permissions/{vhost}/{user}", self.put_topic_permission)
        app.router.add_delete("/api/topic-permissions/{vhost}/{user}", self.delete_topic_permission)
        app.router.add_delete(
            "/api/topic-permissions/{vhost}/{user}/{exchange}", self.delete_topic_permission
        )
        app.router.add_get("/api/users/{user}/topic-permissions", self.topic_permissions)
        app.router.add_get("/api/vhosts/{vhost}/topic-permissions", self.topic_permissions)
        for kind in ("vhost", "user"):
            base = f"/api/{kind}-limits"
            app.router.add_get(base, self.limits)
            app.router.add_get(base + "/{owner}", self.limits)
            app.router.add_put(base + "/{owner}/{limit}", self.put_limit)
            app.router.add_delete(base + "/{owner}/{limit}", self.delete_limit)
        for base in ("/api/policies", "/api/operator-policies"):
            app.router.add_get(base, self.policies)
            app.router.add_get(base + "/{vhost}", self.policies)
            app.router.add_get(base + "/{vhost}/{name}", self.policy)
            app.router.add_put(base + "/{vhost}/{name}", self.put_policy)
            app.router.add_delete(base + "/{vhost}/{name}", self.delete_policy)
        app.router.add_get("/api/exchanges/{vhost}/{name}", self.exchange)
        app.router.add_put("/api/exchanges/{vhost}/{name}", self.put_exchange)
        app.router.add_delete("/api/exchanges/{vhost}/{name}", self.delete_exchange)
        app.router.add_post("/api/exchanges/{vhost}/{name}/publish", self.publish)
        app.router.add_get("/api/exchanges/{vhost}/{name}/bindings/source", self.object_bindings)
        app.router.add_get(
            "/api/exchanges/{vhost}/{name}/bindings/destination", self.object_bindings
        )
        app.router.add_put("/api/queues/{vhost}/{name}", self.put_queue)
        app.router.add_post("/api/queues/{vhost}/{name}/get", self.get_messages)
        app.router.add_get("/api/queues/{vhost}/{name}/bindings", self.object_bindings)
        between = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
        app.router.add_get(between, self.bindings_between)
        app.router.add_post(between, self.post_binding)
        app.router.add_get(between + "/{props}", self.binding)
        app.router.add_delete(between + "/{props}", self.delete_binding)
        app.router.add_get("/api/aliveness-test/{vhost}", self.aliveness)
        app.router.add_get("/api/health/checks/local-alarms", self.alarms)
        app.router.add_get("/api/health/checks/virtual-hosts", self.health_ok)
        app.router.add_get("/api/health/checks/node-is-quorum-critical", self.health_ok)
        app.router.add_get("/api/health/checks/node-is-mirror-sync-critical", self.health_ok)
        app.router.add_get("/api/health/checks/port-listener/{port}", self.port_listener)
        app.router.add_get(
            "/api/health/checks/protocol-listener/{protocol}", self.protocol_listener
        )
        app.router.add_get("/api/extensions", self.extensions)
        app.router.add_get("/api/definitions/{vhost}", self.vhost_definitions)
        app.router.add_get("/api/parameters", self.parameters)
        app.router.add_get("/api/parameters/{component}", self.parameters)
        app.router.add_get("/api/parameters/{component}/{vhost}", self.parameters)
        app.router.add_get("/api/global-parameters", self.global_parameters)
        app.router.add_get("/api/nodes", self.nodes)
        app.router.add_get("/api/nodes/{name}", self.nodes)
        app.router.add_get("/api/users/{name}", self.user)
        app.router.add_get("/api/bindings", self.bindings)
        app.router.add_get("/api/bindings/{vhost}", self.bindings)
        app.router.add_get("/api/channels", self.channels)
        app.router.add_get("/api/channels/{name}", self.channel)
        app.router.add_get("/api/connections/{name}", self.connection)
        app.router.add_get("/api/connections/{name}/channels", self.connection_channels)
        app.router.add_get("/api/consumers", self.consumers)
        app.router.add_get("/api/consumers/{vhost}", self.consumers)
        app.router.add_delete("/api/queues/{vhost}/{name}", self.delete_queue)
        app.router.add_delete("/api/queues/{vhost}/{name}/contents", self.purge_queue)
        app.router.add_delete("/api/connections/{name}", self.close_connection)
        app.router.add_get("/api/route/{vhost}/{exchange}", self.route)
        app.router.add_post("/api/route/{vhost}/{exchange}", self.route)
        app.router.add_get("/api/health/checks/alarms", self.alarms)
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

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
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
            known = self.broker.auth.check(user, password)
            if known is not None:
                if not MANAGEMENT_TAGS.intersection(known.tags):
                    return _not_authorised("Not management user")
                if "administrator" not in known.tags and _needs_administrator(
                    request.method, request.path
                ):
                    return _not_authorised("Not administrator user")
                if {"administrator", "monitoring"}.isdisjoint(known.tags) and any(
                    request.path == p or request.path.startswith(p + "/") for p in MONITORING_ONLY
                ):
                    return _not_authorised("Not monitor user")
                if not {"administrator", "policymaker"} & set(known.tags) and any(
                    request.method == m and request.path.startswith(p + "/")
                    for m, p in POLICYMAKER_ONLY
                ):
                    return _not_authorised("Not policymaker user")
                request[_USER] = known
                return await handler(request)
            # As RabbitMQ's "HTTP access denied" line, with the peer; never the password.
            log.warning(
                "HTTP login refused",
                extra={"peer": request.remote, "user": user, "reason": "invalid credentials"},
            )
        return _not_authorised("Login failed")

    def _sees_vhost(self, request: web.Request, name: str) -> bool:
        """In lists, as RabbitMQ: administrators and monitoring users see every vhost, other
        users the vhosts they have permissions in."""
        user = request.get(_USER)
        return (
            user is None
            or not {"administrator", "monitoring"}.isdisjoint(user.tags)
            or name in user.permissions
        )

    def _vhosts(self, request: web.Request) -> list[Any]:
        name = request.match_info.get("vhost")
        if name is None:
            return [v for v in self.broker.vhosts.values() if self._sees_vhost(request, v.name)]
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise _not_found()
        # A path naming a vhost needs permissions in it (monitoring included) or the
        # administrator tag: RabbitMQ's 401, not a 404 that hides nothing anyway.
        user = request.get(_USER)
        if user is not None and "administrator" not in user.tags and name not in user.permissions:
            raise _vhost_refused()
        return [vhost]

    async def index(self, request: web.Request) -> web.FileResponse:
        """The web UI (broker/www/): plain HTML and JS over this API, nothing fetched elsewhere."""
        return web.FileResponse(WWW / "index.html")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(
                self.per_object if request.path.endswith("/per-object") else self.registry
            ),
            content_type="text/plain",
            charset="utf-8",
        )

    async def overview(self, request: web.Request) -> web.Response:
        b = self.broker
        queues = [q for v in b.vhosts.values() for q in v.queues.values()]
        ready = sum(q.message_count() for q in queues)
        unacked = sum(q.unacked for q in queues)
        return web.json_response(
            {
                "product_name": "RoarMQ",
                "product_version": __version__,
                "management_version": __version__,
                # The RabbitMQ API level this one follows (tools branch on it).
                "rabbitmq_version": RABBITMQ_API_VERSION,
                "cluster_name": b.cluster_name,
                "node": b.cluster_name,
                "message_stats": self.rates.stats("global", global_counts(b)),
                "churn_rates": self.rates.stats("churn", churn_counts(b)),
                "exchange_types": [
                    {"name": t, "description": EXCHANGE_TYPE_TEXTS[t], "enabled": True}
                    for t in ("direct", "fanout", "headers", "topic")
                ],
                "queue_totals": {
                    "messages": ready + unacked,
                    "messages_ready": ready,
                    "messages_unacknowledged": unacked,
                    **self.rates.depth("depth"),
                },
                "object_totals": {
                    "channels": sum(len(c.channels) for c in b.connections),
                    "connections": len(b.connections),
                    "queues": len(queues),
                    "exchanges": sum(len(v.exchanges) for v in b.vhosts.values()),
                    "consumers": sum(q.consumer_count for q in queues),
                },
                "listeners": self._listeners(),
                "memory_alarm": "memory" in b.alarms,
                "disk_free_alarm": "disk" in b.alarms,
                "mem_used": b.resources.rss,
                "mem_limit": b.resources.high,
                "disk_free": b.resources.disk_free,
                "disk_free_limit": b.resources.disk_limit,
            }
        )

    async def aliveness(self, request: web.Request) -> web.Response:
        """RabbitMQ's aliveness test: declare a queue, publish to it and get the message."""
        vhost = self._vhosts(request)[0]
        queue, _ = vhost.declare_queue("aliveness-test", None, durable=False)
        props = BasicProperties()
        msg = Message("", queue.name, ContentHeader.from_properties(props, body_size=4), b"test")
        vhost.enqueue(msg, [queue])
        entry = queue.get()
        if entry is None or entry.msg.body != b"test":
            return web.json_response({"status": "failed", "reason": "no message"}, status=503)
        queue.stats_get_no_ack += 1
        queue.stats_no_ack += 1
        queue.settle(entry)
        return web.json_response({"status": "ok"})

    async def health_ok(self, request: web.Request) -> web.Response:
        # A single node with nothing mirrored or replicated: these checks always pass.
        return web.json_response({"status": "ok"})

    async def port_listener(self, request: web.Request) -> web.Response:
        port = request.match_info["port"]
        listening = [str(p) for p in self.broker.ports]
        if self.broker.tls is not None:
            listening.append(str(self.broker.tls.port))
        listening.append(str(self.broker.mgmt_port))
        if port in listening:
            return web.json_response({"status": "ok", "port": int(port)})
        reason = f"No active listener on port {port}"
        return web.json_response({"status": "failed", "reason": reason}, status=503)

    async def protocol_listener(self, request: web.Request) -> web.Response:
        protocol = request.match_info["protocol"]
        have = {"amqp": bool(self.broker.ports), "amqp/ssl": self.broker.tls is not None}
        have["amqps"] = have["amqp/ssl"]
        have["http"] = True
        if have.get(protocol):
            return web.json_response({"status": "ok", "protocol": protocol})
        reason = f"No active listener for protocol {protocol}"
        return web.json_response({"status": "failed", "reason": reason}, status=503)

    async def extensions(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def vhost_definitions(self, request: web.Request) -> web.Response:
        """One vhost's definitions, as RabbitMQ exports them (no users, vhosts, permissions)."""
        name = self._vhosts(request)[0].name
        doc = export_definitions(self.broker)
        out: dict[str, Any] = {
            "rabbit_version": doc["rabbit_version"],
            "rabbitmq_version": doc["rabbitmq_version"],
        }
        for key in ("parameters", "policies", "queues", "exchanges", "bindings"):
            out[key] = [
                {k: v for k, v in row.items() if k != "vhost"}
                for row in doc.get(key, [])
                if row.get("vhost") == name
            ]
        return web.json_response(out)

    async def parameters(self, request: web.Request) -> web.Response:
        """Runtime parameters: RoarMQ's only component is vhost-limits (as RabbitMQ lists it)."""
        component = request.match_info.get("component")
        vhost = request.match_info.get("vhost")
        rows = [
            p
            for p in export_definitions(self.broker)["parameters"]
            if (component is None or p["component"] == component)
            and (vhost is None or p["vhost"] == vhost)
            and self._sees_vhost(request, p["vhost"])
        ]
        return web.json_response(rows)

    async def global_parameters(self, request: web.Request) -> web.Response:
        return web.json_response([{"name": "cluster_name", "value": self.broker.cluster_name}])

    def _listeners(self) -> list[dict[str, Any]]:
        b = self.broker
        rows = [
            {"node": b.cluster_name, "protocol": "amqp", "ip_address": host, "port": port}
            for port in b.ports
            for host in (b.bound or ["127.0.0.1"])
        ]
        if b.tls is not None:
            rows += [
                {
                    "node": b.cluster_name,
                    "protocol": "amqp/ssl",
                    "ip_address": h,
                    "port": b.tls.port,
                }
                for h in (b.tls.bound or ["127.0.0.1"])
            ]
        scheme = "https" if b.config.management.tls.enabled else "http"
        rows.append(
            {
                "node": b.cluster_name,
                "protocol": scheme,
                "ip_address": b.config.management.bind,
                "port": b.mgmt_port,
            }
        )
        return rows

    async def nodes(self, request: web.Request) -> web.Response:
        b = self.broker
        res = b.resources
        node = {
            "name": b.cluster_name,
            "type": "disc",
            "running": True,
            "mem_used": res.rss,
            "mem_limit": res.high,
            "mem_alarm": "memory" in b.alarms,
            "disk_free": res.disk_free,
            "disk_free_limit": res.disk_limit,
            "disk_free_alarm": "disk" in b.alarms,
            "uptime": int((time.time() - b.totals.started) * 1000),
            "processors": os.cpu_count(),
        }
        if "name" in request.match_info:
            if request.match_info["name"] != b.cluster_name:
                raise _not_found()
            return web.json_response(node)
        return web.json_response([node])

    def _vhost_row(self, vhost: Any) -> dict[str, Any]:
        queues = vhost.queues.values()
        ready = sum(q.message_count() for q in queues)
        unacked = sum(q.unacked for q in queues)
        stats = {"publish": 0, "deliver_get": 0, "ack": 0}
        for q in queues:
            stats["publish"] += q.stats_published
            stats["deliver_get"] += q.stats_delivered
            stats["ack"] += q.stats_acked
        return {
            "name": vhost.name,
            "description": "",
            "tags": [],
            "metadata": {"description": "", "tags": []},
            "default_queue_type": "classic",
            "tracing": False,
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
            "message_stats": stats,
            "cluster_state": {self.broker.cluster_name: "running"},
        }

    async def vhosts(self, request: web.Request) -> web.Response:
        if "vhost" in request.match_info:
            return web.json_response(self._vhost_row(self._vhosts(request)[0]))
        rows = sorted(self._vhosts(request), key=lambda v: v.name.encode())  # as RabbitMQ
        return web.json_response([self._vhost_row(v) for v in rows])

    async def whoami(self, request: web.Request) -> web.Response:
        user = request[_USER]
        return web.json_response({"name": user.name, "tags": list(user.tags)})

    async def exchanges(self, request: web.Request) -> web.Response:
        exchanges = [x for v in self._vhosts(request) for x in v.exchanges.values()]
        paged = paged_objects(
            request, exchanges, _name, lambda x: _exchange_row(x, self.rates), EXCHANGE_SORT_KEYS
        )
        if paged is not None:
            return web.json_response(paged)
        return web.json_response([_exchange_row(x, self.rates) for x in exchanges])

    def _exchange_of(self, request: web.Request, key: str = "name") -> Any:
        vhost = self._vhosts(request)[0]
        name = request.match_info[key]
        x = vhost.exchanges.get("" if name == "amq.default" else name)
        if x is None:
            raise _not_found()
        return vhost, x

    async def exchange(self, request: web.Request) -> web.Response:
        return web.json_response(_exchange_row(self._exchange_of(request)[1], self.rates))

    async def put_exchange(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        body = await self._json(request)
        try:
            _, created = vhost.declare_exchange(
                request.match_info["name"],
                str(body.get("type", "")),
                durable=_flag(body, "durable", True),
                auto_delete=_flag(body, "auto_delete", False),
                internal=_flag(body, "internal", False),
                arguments=body.get("arguments") or {},
            )
        except ProtocolError as exc:
            raise _bad_request(exc.text) from None
        return web.Response(status=201 if created else 204)

    async def delete_exchange(self, request: web.Request) -> web.Response:
        vhost, x = self._exchange_of(request)
        try:
            vhost.delete_exchange(x.name, if_unused=request.query.get("if-unused") == "true")
        except ProtocolError as exc:
            raise _bad_request(exc.text) from None
        return web.Response(status=204)

    async def put_queue(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        body = await self._json(request)
        arguments = dict(body.get("arguments") or {})
        if body.get("queue_type"):
            arguments["x-queue-type"] = body["queue_type"]
        try:
            _, created = vhost.declare_queue(
                request.match_info["name"],
                None,
                durable=_flag(body, "durable", True),
                auto_delete=_flag(body, "auto_delete", False),
                arguments=arguments,
            )
        except ProtocolError as exc:
            raise _bad_request(exc.text) from None
        return web.Response(status=201 if created else 204)

    async def publish(self, request: web.Request) -> web.Response:
        """POST /api/exchanges/{vhost}/{name}/publish: {"routed": true|false}."""
        vhost, x = self._exchange_of(request)
        body = await self._json(request)
        key = body.get("routing_key")
        if not isinstance(key, str):
            raise _bad_request("routing_key is required")
        payload = body.get("payload", "")
        try:
            if body.get("payload_encoding", "string") == "base64":
                data = base64.b64decode(payload, validate=True)
            else:
                data = str(payload).encode()
            props = _properties(body.get("properties") or {})
            msg = Message(
                x.name, key, ContentHeader.from_properties(props, body_size=len(data)), data
            )
        except (ValueError, TypeError) as exc:
            raise _bad_request(f"cannot publish: {exc}") from None
        x.stats_in += 1
        queues = vhost.route(x, msg)
        if not queues:
            x.stats_unroutable += 1
        else:
            vhost.enqueue(msg, queues)
        return web.json_response({"routed": bool(queues)})

    async def get_messages(self, request: web.Request) -> web.Response:
        """POST /api/queues/{vhost}/{name}/get: RabbitMQ's ackmode, encoding, truncate."""
        _, q = self._queue_of(request)
        body = await self._json(request)
        ackmode = body.get("ackmode", "ack_requeue_true")
        if ackmode not in (
            "ack_requeue_true",
            "ack_requeue_false",
            "reject_requeue_true",
            "reject_requeue_false",
        ):
            raise _bad_request(f"ackmode {ackmode!r} is not one of RabbitMQ's four")
        try:
            count = int(body.get("count", 1))
            truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
        except (TypeError, ValueError):
            raise _bad_request("count and truncate must be integers") from None
        taken, out = [], []
        for _ in range(max(count, 0)):
            entry = q.get()
            if entry is None:
                break
            q.stats_get += 1  # RabbitMQ's management get is a basic.get with manual ack
            taken.append(entry)
            msg = entry.msg
            data = msg.body if msg.body is not None else self.broker.store.body(msg)
            out.append(
                _message_row(msg, data, entry.redelivered, q.message_count(), body, truncate)
            )
        if ackmode == "ack_requeue_false":
            for entry in taken:
                q.ack(entry)
        elif ackmode == "reject_requeue_false":
            for entry in taken:
                q.reject(entry, requeue=False)
        else:
            q.requeue(taken)
        return web.json_response(out)

    async def bindings_between(self, request: web.Request) -> web.Response:
        """GET /api/bindings/{vhost}/e/{source}/q|e/{destination}."""
        vhost, source, dest = self._binding_ends(request)
        return web.json_response(
            [
                _binding_row(vhost.name, source.name, d, key, args)
                for key, d, args in source.index.bindings()
                if d is dest
            ]
        )

    def _binding_ends(self, request: web.Request) -> tuple[Any, Any, Any]:
        vhost, source = self._exchange_of(request, "source")
        info = request.match_info
        table = vhost.queues if info["kind"] == "q" else vhost.exchanges
        dest = table.get(info["destination"])
        if dest is None:
            raise _not_found()
        return vhost, source, dest

    async def post_binding(self, request: web.Request) -> web.Response:
        vhost, source, dest = self._binding_ends(request)
        body = await self._json(request)
        key = str(body.get("routing_key", ""))
        args = body.get("arguments") or None
        try:
            if request.match_info["kind"] == "q":
                vhost.bind_queue(dest, source, key, args)
            else:
                vhost.bind_exchange(dest, source, key, args)
        except ProtocolError as exc:
            raise _bad_request(exc.text) from None
        row = _binding_row(vhost.name, source.name, dest, key, args)
        location = f"{request.path}/{urllib.parse.quote(row['properties_key'], safe='')}"
        return web.Response(status=201, headers={"Location": location})

    async def binding(self, request: web.Request) -> web.Response:
        found = self._binding_by_props(request)
        return web.json_response(found)

    def _binding_by_props(self, request: web.Request) -> dict[str, Any]:
        vhost, source, dest = self._binding_ends(request)
        props = request.match_info["props"]
        for key, d, args in source.index.bindings():
            if d is dest:
                row = _binding_row(vhost.name, source.name, d, key, args)
                if row["properties_key"] == props:
                    return row
        raise _not_found()

    async def delete_binding(self, request: web.Request) -> web.Response:
        row = self._binding_by_props(request)
        vhost, source, dest = self._binding_ends(request)
        args = row["arguments"] or None
        for key, d, a in source.index.bindings():
            if d is dest and key == row["routing_key"] and _json_safe(a or {}) == row["arguments"]:
                args = a
                break
        if request.match_info["kind"] == "q":
            vhost.unbind_queue(dest, source, row["routing_key"], args)
        else:
            vhost.unbind_exchange(dest, source, row["routing_key"], args)
        return web.Response(status=204)

    async def object_bindings(self, request: web.Request) -> web.Response:
        """A queue's bindings, or an exchange's as source or destination."""
        path = request.path
        if "/api/queues/" in path:
            vhost, target = self._queue_of(request)
        else:
            vhost, target = self._exchange_of(request)
        rows = []
        for x in vhost.exchanges.values():
            if not x.name:
                if target in vhost.queues.values() and "/api/queues/" in path:
                    rows.append(_binding_row(vhost.name, "", target, target.name, None))
                continue
            for key, d, args in x.index.bindings():
                if (path.endswith("/source") and x is target) or (
                    not path.endswith("/source") and d is target
                ):
                    rows.append(_binding_row(vhost.name, x.name, d, key, args))
        return web.json_response(rows)

    def _consumer_details(self, q: Any) -> list[dict[str, Any]]:
        return [
            {
                "consumer_tag": c.tag,
                "channel_details": {
                    "name": f"{conn.name} ({ch.id})",
                    "number": ch.id,
                    "connection_name": conn.name,
                    "user": conn.user.name,
                },
                "ack_required": not c.no_ack,
                "prefetch_count": c.prefetch,
                "exclusive": bool(c.exclusive),
                "arguments": _json_safe(c.arguments or {}),
                "active": True,
            }
            for conn in self.broker.connections
            for ch in conn.channels.values()
            for c in ch.consumers.values()
            if c.queue is q
        ]

    def _queue_info(self, q: Any, detailed: bool = False) -> dict[str, Any]:
        """A queue as GET /api/queues lists it; `detailed` (one queue's page) adds what
        needs a pass over the channels: consumer details."""
        return {
            "name": q.name,
            "vhost": q.vhost.name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "exclusive": q.exclusive_owner is not None,
            "arguments": _json_safe(q.arguments),
            "type": q.queue_type,
            "messages_ready": q.message_count(),
            "messages_unacknowledged": q.unacked,
            "messages": q.message_count() + q.unacked,
            **self.rates.depth(q),
            "message_bytes_ready": q.ready_bytes,
            "message_bytes_unacknowledged": q.unacked_bytes,
            "message_bytes": q.ready_bytes + q.unacked_bytes,
            "messages_persistent": q.persistent,
            "message_bytes_persistent": q.persistent_bytes,
            "consumer_utilisation": self.rates.utilisation(q),
            "consumer_capacity": self.rates.utilisation(q),
            **self.rates.idle_since(q),
            "consumers": q.consumer_count,
            "state": "running",
            "node": self.broker.cluster_name,
            "exclusive_consumer_tag": None,
            "memory": q.ready_bytes if q.store is None else 0,  # bodies held in memory
            "consumer_details": [] if not detailed else self._consumer_details(q),
            "policy": q.policy.name if q.policy is not None else None,
            "operator_policy": q.operator_policy.name if q.operator_policy is not None else None,
            "effective_policy_definition": q.effective_policy,
            "message_stats": _stats(self.rates, q, queue_counts(q)),
        }

    async def queues(self, request: web.Request) -> web.Response:
        queues = [q for v in self._vhosts(request) for q in v.queues.values()]
        paged = paged_objects(request, queues, _name, self._queue_info, QUEUE_SORT_KEYS)
        if paged is not None:
            return web.json_response(paged)
        return web.json_response([self._queue_info(q) for q in queues])

    async def queue(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        q = vhost.queues.get(request.match_info["name"])
        if q is None:
            raise web.HTTPNotFound(
                text='{"error":"Object Not Found","reason":"Not Found"}',
                content_type="application/json",
            )
        return web.json_response(self._queue_info(q, detailed=True))

    async def user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        rows = [u for u in user_rows(self.broker) if u["name"] == name]
        if not rows:
            raise _not_found()
        return web.json_response(rows[0])

    async def bindings(self, request: web.Request) -> web.Response:
        out = []
        for vhost in self._vhosts(request):
            for x in vhost.exchanges.values():
                if not x.name:
                    for q in vhost.queues.values():  # RabbitMQ lists the implicit ones too
                        out.append(_binding_row(vhost.name, "", q, q.name, None))
                    continue
                for key, dest, args in x.index.bindings():
                    out.append(_binding_row(vhost.name, x.name, dest, key, args))
        return web.json_response(out)

    def _own_channels(self, request: web.Request) -> Iterator[Any]:
        for conn in self.broker.connections:
            if conn.vhost is not None and self._sees_connection(request, conn):
                yield from ((conn, ch) for ch in conn.channels.values())

    async def channels(self, request: web.Request) -> web.Response:
        return web.json_response(
            [_channel_row(conn, ch, self.rates) for conn, ch in self._own_channels(request)]
        )

    async def consumers(self, request: web.Request) -> web.Response:
        names = {v.name for v in self._vhosts(request)}
        return web.json_response(
            [
                {
                    "consumer_tag": c.tag,
                    "queue": {"name": c.queue.name, "vhost": conn.vhost.name},
                    "channel_details": {
                        "name": f"{conn.name} ({ch.id})",
                        "number": ch.id,
                        "connection_name": conn.name,
                        "user": conn.user.name,
                    },
                    "ack_required": not c.no_ack,
                    "prefetch_count": c.prefetch,
                    "exclusive": bool(getattr(c, "exclusive", False)),
                    "arguments": {},
                }
                for conn, ch in self._own_channels(request)
                if conn.vhost.name in names
                for c in ch.consumers.values()
            ]
        )

    def _queue_of(self, request: web.Request) -> Any:
        vhost = self._vhosts(request)[0]
        q = vhost.queues.get(request.match_info["name"])
        if q is None:
            raise _not_found()
        return vhost, q

    async def delete_queue(self, request: web.Request) -> web.Response:
        vhost, q = self._queue_of(request)
        try:
            vhost.delete_queue(
                q,
                if_unused=request.query.get("if-unused") == "true",
                if_empty=request.query.get("if-empty") == "true",
            )
        except ProtocolError as exc:
            raise _bad_request(exc.text) from None
        return web.Response(status=204)

    async def purge_queue(self, request: web.Request) -> web.Response:
        _, q = self._queue_of(request)
        q.purge()
        return web.Response(status=204)

    async def close_connection(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        conn = next((c for c in self.broker.connections if c.name == name), None)
        if conn is None:
            raise _not_found()
        user = request[_USER]
        if "administrator" not in user.tags and getattr(conn.user, "name", None) != user.name:
            # Only its own user or an administrator closes a connection (monitoring reads).
            return _not_authorised("User not authorised to access object")
        reason = request.headers.get("X-Reason", "Closed via management plugin")
        conn.force_close(
            f"Closed via management plugin: {reason}" if "X-Reason" in request.headers else reason
        )
        return web.Response(status=204)

    async def route(self, request: web.Request) -> web.Response:
        """Route explain: GET with ?routing_key=, or POST {"routing_key", "headers"}."""
        vhost = self._vhosts(request)[0]
        exchange = vhost.exchanges.get(request.match_info["exchange"])
        if request.match_info["exchange"] == "amq.default":
            exchange = vhost.exchanges.get("")
        if exchange is None:
            raise _not_found()
        key, headers = request.query.get("routing_key", ""), None
        if request.method == "POST":
            body = await self._json(request)
            key = body.get("routing_key", key)
            headers = body.get("headers")
            if not isinstance(key, str) or not (headers is None or isinstance(headers, dict)):
                raise _bad_request("routing_key must be a string and headers an object")
        return web.json_response(explain(vhost, exchange, key, headers))

    def _connection_row(self, c: Any) -> dict[str, Any]:
        transport = c.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        return {
            "name": c.name,
            "node": self.broker.cluster_name,
            "type": "network",
            "protocol": "AMQP 0-9-1",
            "user": getattr(c.user, "name", None),
            "vhost": getattr(c.vhost, "name", None),
            "state": c.flow_state(),
            "channels": len(c.channels),
            "channel_max": c.channel_max,
            "frame_max": c.frame_max,
            "timeout": c.heartbeat,
            "peer_host": c.peer[0] if c.peer else None,
            "peer_port": c.peer[1] if c.peer else None,
            "host": local[0] if isinstance(local, tuple) else None,
            "port": local[1] if isinstance(local, tuple) else None,
            "client_properties": _json_safe(c.client_properties),
            "auth_mechanism": c.auth_mechanism,
            **(c.tls.report() if c.tls is not None else PLAIN_REPORT),
            "connected_at": c.connected_at,
            "recv_cnt": c.recv_cnt,
            "send_cnt": c.send_cnt,
            "send_pend": transport.get_write_buffer_size() if transport is not None else 0,
            **_stats(self.rates, c, {"recv_oct": c.recv_oct, "send_oct": c.send_oct}),
        }

    async def connections(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                self._connection_row(c)
                for c in self.broker.connections
                if self._sees_connection(request, c)
            ]
        )

    def _connection_named(self, request: web.Request) -> Any:
        name = request.match_info["name"]
        conn = next((c for c in self.broker.connections if c.name == name), None)
        if conn is None or not self._sees_connection(request, conn):
            raise _not_found()
        return conn

    async def connection(self, request: web.Request) -> web.Response:
        return web.json_response(self._connection_row(self._connection_named(request)))

    async def connection_channels(self, request: web.Request) -> web.Response:
        conn = self._connection_named(request)
        return web.json_response(
            [_channel_row(conn, ch, self.rates) for ch in conn.channels.values()]
        )

    async def channel(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        for conn, ch in self._own_channels(request):
            if f"{conn.name} ({ch.id})" == name:
                return web.json_response(_channel_row(conn, ch, self.rates))
        raise _not_found()

    def _sees_connection(self, request: web.Request, conn: Any) -> bool:
        """Administrators and monitoring users see every connection, others their own."""
        user = request[_USER]
        if "administrator" in user.tags or "monitoring" in user.tags:
            return True
        return conn.user is not None and conn.user.name == user.name

    async def definitions(self, request: web.Request) -> web.Response:
        return web.json_response(export_definitions(self.broker))

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise _bad_request("not_json") from None
        if not isinstance(body, dict):
            raise _bad_request("body must be a JSON object")
        try:
            # JSON can spell a lone surrogate ("\\udcff"), which no store or AMQP name holds.
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _bad_request("body holds a string that is not valid Unicode") from None
        return body

    async def put_vhost(self, request: web.Request) -> web.Response:
        created = self.broker.add_vhost(request.match_info["vhost"])
        return web.Response(status=201 if created else 204)

    async def delete_vhost(self, request: web.Request) -> web.Response:
        if not self.broker.delete_vhost(request.match_info["vhost"]):
            raise _not_found()
        return web.Response(status=204)

    async def users(self, request: web.Request) -> web.Response:
        return web.json_response(user_rows(self.broker))

    async def put_user(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        name = request.match_info["name"]
        tags = body.get("tags", "")
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise _bad_request("tags must be a comma-separated string or a list of strings")
        if isinstance(body.get("password"), str):
            password_hash = hash_password(body["password"])
        elif isinstance(body.get("password_hash"), str):
            password_hash = body["password_hash"]
        else:
            raise _bad_request("either password or password_hash is required")
        existed = name in self.broker.auth.users
        self.broker.put_user(name, password_hash, tuple(tags))
        return web.Response(status=204 if existed else 201)

    async def delete_user(self, request: web.Request) -> web.Response:
        if not self.broker.delete_user(request.match_info["name"]):
            raise _not_found()
        return web.Response(status=204)

    async def permissions(self, request: web.Request) -> web.Response:
        """All permissions, a user's, a vhost's, or one user's in one vhost (an object)."""
        user, vhost = request.match_info.get("user"), request.match_info.get("vhost")
        if user is not None and user not in self.broker.auth.users:
            raise _not_found()
        if vhost is not None and vhost not in self.broker.vhosts:
            raise _not_found()
        rows = [
            r
            for r in permission_rows(self.broker)
            if (user is None or r["user"] == user) and (vhost is None or r["vhost"] == vhost)
        ]
        if user is not None and vhost is not None:
            if not rows:
                raise _not_found()
            return web.json_response(rows[0])
        return web.json_response(rows)

    async def put_permission(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        perms = _permission_fields(body, ("configure", "write", "read"))
        if user not in self.broker.auth.users or vhost not in self.broker.vhosts:
            raise _bad_request("vhost_or_user_not_found")
        existed = vhost in self.broker.auth.users[user].permissions
        self.broker.set_permission(user, vhost, **perms)
        return web.Response(status=204 if existed else 201)

    async def delete_permission(self, request: web.Request) -> web.Response:
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        known = self.broker.auth.users.get(user)
        if known is None or vhost not in known.permissions:
            raise _not_found()
        self.broker.clear_permission(user, vhost)
        return web.Response(status=204)

    async def topic_permissions(self, request: web.Request) -> web.Response:
        """All topic permissions, or those of a user, a vhost, or a user in a vhost."""
        user, vhost = request.match_info.get("user"), request.match_info.get("vhost")
        if user is not None and user not in self.broker.auth.users:
            raise _not_found()
        if vhost is not None and vhost not in self.broker.vhosts:
            raise _not_found()
        rows = [
            r
            for r in topic_permission_rows(self.broker)
            if (user is None or r["user"] == user) and (vhost is None or r["vhost"] == vhost)
        ]
        if user is not None and vhost is not None and not rows:
            raise _not_found()
        return web.json_response(rows)

    async def put_topic_permission(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        perms = _permission_fields(body, ("exchange", "write", "read"))
        exchange = perms.pop("exchange")
        if user not in self.broker.auth.users or vhost not in self.broker.vhosts:
            raise _bad_request("vhost_or_user_not_found")
        existed = any(
            t.user == user and t.vhost == vhost
            for t in self.broker.persistence.definitions.topic_permissions()
        )
        self.broker.set_topic_permission(user, vhost, exchange, **perms)
        return web.Response(status=204 if existed else 201)

    async def delete_topic_permission(self, request: web.Request) -> web.Response:
        """All of a user's topic permissions in a vhost, or one exchange's (RabbitMQ answers
        204 for an exchange without any, as long as the user has some in the vhost)."""
        info = request.match_info
        user, vhost = info["user"], info["vhost"]
        if not any(
            t.user == user and t.vhost == vhost
            for t in self.broker.persistence.definitions.topic_permissions()
        ):
            raise _not_found()
        self.broker.clear_topic_permissions(user, vhost, info.get("exchange"))
        return web.Response(status=204)

    @staticmethod
    def _limit_kind(request: web.Request) -> str:
        return "vhost" if request.path.startswith("/api/vhost-limits") else "user"

    def _limit_owner(self, request: web.Request, kind: str) -> str:
        owner = request.match_info["owner"]
        known = self.broker.vhosts if kind == "vhost" else self.broker.auth.users
        if owner not in known:
            raise _not_found()
        if kind == "vhost" and not self._sees_vhost(request, owner):
            raise _vhost_refused()
        return owner

    async def limits(self, request: web.Request) -> web.Response:
        kind = self._limit_kind(request)
        owner = self._limit_owner(request, kind) if "owner" in request.match_info else None
        rows = limit_rows(self.broker, kind, owner)
        if kind == "vhost":
            rows = [r for r in rows if self._sees_vhost(request, r["vhost"])]
        return web.json_response(rows)

    async def put_limit(self, request: web.Request) -> web.Response:
        kind = self._limit_kind(request)
        owner = request.match_info["owner"]
        if kind == "user" and owner not in self.broker.auth.users:
            raise _bad_request(["no_such_user", owner])  # RabbitMQ's 400 here
        if kind == "vhost" and owner not in self.broker.vhosts:
            raise web.HTTPNotFound(
                text='{"error":"not_found","reason":"vhost_not_found"}',
                content_type="application/json",
            )
        owner = self._limit_owner(request, kind)
        body = await self._json(request)
        name = request.match_info["limit"]
        if "value" not in body:
            raise _bad_request("[{key_missing,value}]")
        try:
            value = _limit_value(kind, name, body.get("value"))
        except ValueError as exc:
            raise _bad_request(str(exc)) from None
        self.broker.set_limit(kind, owner, name, value)
        return web.Response(status=204)

    async def delete_limit(self, request: web.Request) -> web.Response:
        kind = self._limit_kind(request)
        owner = self._limit_owner(request, kind)
        self.broker.clear_limit(kind, owner, request.match_info["limit"])
        return web.Response(status=204)

    @staticmethod
    def _operator(request: web.Request) -> bool:
        return request.path.startswith("/api/operator-policies")

    async def policies(self, request: web.Request) -> web.Response:
        operator = self._operator(request)
        return web.json_response(
            [
                p.row()
                for v in self._vhosts(request)
                for p in (v.operator_policies if operator else v.policies).values()
            ]
        )

    async def policy(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        table = vhost.operator_policies if self._operator(request) else vhost.policies
        found = table.get(request.match_info["name"])
        if found is None:
            raise _not_found()
        return web.json_response(found.row())

    async def put_policy(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        body = await self._json(request)
        try:
            new = self.broker.set_policy(
                vhost.name, request.match_info["name"], body, self._operator(request)
            )
        except PolicyError as exc:
            raise _bad_request(str(exc)) from None
        return web.Response(status=201 if new else 204)

    async def delete_policy(self, request: web.Request) -> web.Response:
        vhost = self._vhosts(request)[0]
        if not self.broker.clear_policy(
            vhost.name, request.match_info["name"], self._operator(request)
        ):
            raise _not_found()
        return web.Response(status=204)

    async def import_definitions(self, request: web.Request) -> web.Response:
        """Load RabbitMQ-format definitions (users, vhosts, permissions, exchanges, queues, bindings)."""
        body = await self._json(request)
        if "vhost" in request.match_info:
            # One vhost's file (as GET /api/definitions/{vhost} writes it): its objects go
            # into the vhost named in the path, whatever they say; users and vhosts are not
            # part of such a file.
            vhost = self._vhosts(request)[0].name
            body = {
                key: [{**row, "vhost": vhost} for row in body.get(key, [])]
                for key in ("parameters", "policies", "queues", "exchanges", "bindings")
            }
        try:
            import_definitions(self.broker, body)
        except (KeyError, TypeError, ValueError, ProtocolError) as exc:
            raise _bad_request(f"cannot import definitions: {exc}") from None
        return web.Response(status=204)

    async def alarms(self, request: web.Request) -> web.Response:
        if self.broker.blocked:
            return web.json_response({"status": "failed", "reason": "memory alarm"}, status=503)
        return web.json_response({"status": "ok"})
