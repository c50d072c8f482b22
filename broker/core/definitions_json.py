"""definitions.json, RabbitMQ's format: export and import, and the rows of users,
permissions and limits that GET /api/users & co. list the same way.

One home for the document: the management API (its /api/definitions endpoints, its user,
vhost and limit handlers), the cluster's operator metadata (broker/cluster/metadata.py)
and the pipeline all call it. The functions take the broker, not a request, so they run
without a server; a bad value raises `DefinitionError` (a ValueError) in RabbitMQ's words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import __version__
from .auth import hash_password
from .erlang import ApiArguments
from .exchange import Exchange
from .queue_arguments import QUEUE_TYPES

if TYPE_CHECKING:
    from ..server import Broker

#: The RabbitMQ management API version whose shapes this API follows (definitions export too).
RABBITMQ_API_VERSION = "3.13.0"

#: The limits RabbitMQ knows, by kind (anything else is refused as RabbitMQ does).
LIMIT_NAMES = {
    "vhost": ("max-connections", "max-queues"),
    "user": ("max-connections", "max-channels"),
}

#: What a vhost's own definitions file holds (no users, vhosts or permissions).
VHOST_KEYS = ("parameters", "policies", "queues", "exchanges", "bindings")


class DefinitionError(ValueError):
    """A value a definitions document (or the API body it shares a rule with) may not hold."""


def json_safe(value: Any) -> Any:
    """AMQP field values as JSON can hold them: bytes as text, anything else odd as str."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
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


def limit_rows(broker: Broker, kind: str, owner: str | None = None) -> list[dict[str, Any]]:
    """GET /api/vhost-limits and /api/user-limits: [{"vhost"|"user": name, "value": {...}}]."""
    return [
        {kind: name, "value": dict(sorted(values.items()))}
        for (k, name), values in sorted(broker.limits.items())
        if k == kind and values and (owner is None or name == owner)
    ]


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


def limit_value(kind: str, name: str, value: Any) -> int:
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
                    "arguments": json_safe(x.arguments),
                }
            )
        for q in vhost.queues.values():
            if q.exclusive_owner is not None:
                continue  # as RabbitMQ: an exclusive queue (and its bindings) dies with its owner
            queues.append(
                {
                    "name": q.name,
                    "vhost": vhost.name,
                    "durable": q.durable,
                    "auto_delete": q.auto_delete,
                    "arguments": json_safe(q.arguments),
                }
            )
        for x in vhost.exchanges.values():
            if not x.name:
                continue
            for key, dest, args in x.index.bindings():
                if getattr(dest, "exclusive_owner", None) is not None:
                    continue
                bindings.append(
                    {
                        "source": x.name,
                        "vhost": vhost.name,
                        "destination": dest.name,
                        "destination_type": "exchange" if isinstance(dest, Exchange) else "queue",
                        "routing_key": key,
                        "arguments": json_safe(args or {}),
                    }
                )
    return {
        "rabbit_version": RABBITMQ_API_VERSION,
        "rabbitmq_version": RABBITMQ_API_VERSION,
        "product_name": "RoarMQ",
        "product_version": __version__,
        "users": users,
        "vhosts": [_vhost_definition(v) for v in broker.vhosts.values()],
        "permissions": permissions,
        "topic_permissions": topic_permission_rows(broker),
        "policies": [p.row() for v in broker.vhosts.values() for p in v.policies.values()],
        "parameters": parameter_rows(broker),
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    }


def vhost_metadata(body: dict[str, Any]) -> dict[str, Any]:
    """What a PUT /api/vhosts body (or a definitions file's vhost) sets. As in RabbitMQ 3.10.8,
    a PUT replaces the description and tags (absent: empty); tags are a list or RabbitMQ's
    comma-separated string."""
    given = body.get("metadata")
    meta: dict[str, Any] = given if isinstance(given, dict) else {}
    description = body.get("description", meta.get("description", ""))
    if not isinstance(description, str):
        raise DefinitionError("description must be a string")
    tags = body.get("tags", meta.get("tags", []))
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.split(",")]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise DefinitionError("tags must be a list of strings or a comma-separated string")
    out: dict[str, Any] = {"description": description, "tags": [t for t in tags if t]}
    queue_type = body.get("default_queue_type", body.get("defaultqueuetype"))
    if queue_type is not None:
        usable = [t.name for t in QUEUE_TYPES.values() if t.unsupported is None]
        if queue_type not in usable:
            raise DefinitionError(
                f"default queue type {queue_type!r} is not " + " or ".join(usable)
            )
        out["default_queue_type"] = queue_type
    tracing = body.get("tracing")
    if tracing is not None and not isinstance(tracing, bool):
        raise DefinitionError("tracing must be true or false")
    return out


def _vhost_definition(vhost: Any) -> dict[str, Any]:
    """A vhost as RabbitMQ exports it: its name, and its metadata when it has any."""
    meta = vhost.metadata
    if not meta["description"] and not meta["tags"]:
        return {"name": vhost.name}
    return {
        "name": vhost.name,
        "description": meta["description"],
        "tags": list(meta["tags"]),
        "metadata": {"description": meta["description"], "tags": list(meta["tags"])},
    }


def tags_of(user: dict[str, Any]) -> tuple[str, ...]:
    """A definitions user's tags: a comma-separated string or a list."""
    tags = user.get("tags", "")
    return tuple(t for t in (tags.split(",") if isinstance(tags, str) else tags) if t)


def parameter_rows(broker: Broker) -> list[dict[str, Any]]:
    """Every runtime parameter as GET /api/parameters and definitions list them: the vhost
    limits (component `vhost-limits`, as RabbitMQ keeps them) and the components' own."""
    limits = [
        {
            "value": row["value"],
            "vhost": row["vhost"],
            "component": "vhost-limits",
            "name": "limits",
        }
        for row in limit_rows(broker, "vhost")
    ]
    return [*limits, *broker.parameters.rows()]


def import_definitions(broker: Broker, doc: dict[str, Any]) -> None:
    for v in doc.get("vhosts", []):
        has_meta = any(k in v for k in ("description", "tags", "metadata", "default_queue_type"))
        broker.add_vhost(v["name"], vhost_metadata(v) if has_meta else None)
    for u in doc.get("users", []):
        tags = tags_of(u)
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
    for param in doc.get("parameters", []):
        if param.get("component") != "vhost-limits":
            broker.set_parameter(
                param.get("vhost", "/"), param["component"], param["name"], param.get("value")
            )
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
                _json_arguments(b.get("arguments")),
            )
        else:
            vhost.bind_exchange(
                vhost.get_exchange(b["destination"]),
                source,
                b.get("routing_key", ""),
                _json_arguments(b.get("arguments")),
            )


def _json_arguments(arguments: Any) -> Any:
    """A binding's arguments from a definitions file: typed as JSON's in its properties_key,
    as RabbitMQ types them."""
    return ApiArguments(arguments) if isinstance(arguments, dict) and arguments else None


def _import_limits(broker: Broker, kind: str, owner: str, values: Any) -> None:
    if not isinstance(values, dict):
        raise ValueError(f"{kind} limits of {owner!r} must be an object")
    for name, value in values.items():
        broker.set_limit(kind, owner, name, limit_value(kind, name, value))
