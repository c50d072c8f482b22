"""`roarmq ctl`: rabbitmqctl's everyday commands, over the management HTTP API.

Command names, arguments and `-p VHOST` are rabbitmqctl's, so runbooks carry over; output is
an aligned table (or `--format json`). It talks HTTP, so it works against any broker whose
management port it can reach, RoarMQ or RabbitMQ, with a broker user's credentials.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

DEFAULT_URL = "http://127.0.0.1:15672"

#: rabbitmqctl's exit codes (sysexits.h) where a runbook may test them.
EX_NOUSER = 67  # User "x" does not exist
EX_SOFTWARE = 70  # User "x" already exists


class CtlError(Exception):
    """A refusal from the broker or a bad invocation: printed as one line, exit 1 (or 2)."""

    def __init__(self, text: str, code: int = 1) -> None:
        super().__init__(text)
        self.code = code


class ApiError(CtlError):
    """An HTTP error answer: its status and the broker's reason, for commands to put in words."""

    def __init__(self, text: str, status: int, reason: str) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason


class Api:
    def __init__(self, url: str, user: str, password: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={
                "Authorization": self.auth,
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                data = resp.read()
        except urllib.error.HTTPError as exc:
            raise self._in_words(method, path, exc.code, _reason(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(f"cannot reach the management API at {self.url}: {reason}") from None
        return json.loads(data) if data else None

    def exists(self, path: str) -> bool:
        try:
            self.call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _in_words(self, method: str, path: str, status: int, reason: str) -> ApiError:
        """An error answer as a sentence: what is missing for a 404 (the vhost, when that is
        what is missing), who was refused for a 401, the broker's reason otherwise."""
        if status == 404:
            text = self._missing(path)
        elif status == 401:
            text = (
                f"user '{self.user}' is not allowed to do this: {reason} (log in as another "
                "user with --username/--password or ROARMQ_CTL_USER/ROARMQ_CTL_PASSWORD)"
            )
        elif status == 405:
            text = f"the management API at {self.url} has no {method} {path.split('?')[0]}"
        else:
            text = f"the broker refused: {reason}"
        return ApiError(text, status, reason)

    def _missing(self, path: str) -> str:
        parts = [urllib.parse.unquote(p) for p in path.split("?")[0].split("/")[2:]]
        kind, rest = (parts[0], parts[1:]) if parts else ("", [])
        if kind in VHOST_SCOPED and rest:
            vhost = rest[0]
            if not self.exists(f"/api/vhosts/{q(vhost)}"):
                return f"no vhost '{vhost}'"
            if kind == "bindings" and len(rest) > 4:  # {vhost}/e/{source}/{q|e}/{dest}
                what = "queue" if rest[3] == "q" else "exchange"
                return f"no exchange '{rest[2]}' or {what} '{rest[4]}' in vhost '{vhost}'"
            if kind == "permissions" and len(rest) > 1:
                return f"no permissions for user '{rest[1]}' in vhost '{vhost}'"
            if len(rest) > 1:
                return f"no {VHOST_SCOPED[kind]} '{rest[1]}' in vhost '{vhost}'"
            return f"no vhost '{vhost}'"
        if kind == "parameters" and len(rest) == 3:
            return f"Parameter does not exist: {rest[0]} '{rest[2]}' in vhost '{rest[1]}'"
        if kind == "users" and rest:
            return f'User "{rest[0]}" does not exist'
        if kind == "user-limits" and rest:
            return f'User "{rest[0]}" does not exist'
        if kind == "vhosts" and rest:
            return f"no vhost '{rest[0]}'"
        if kind == "connections" and rest:
            return f"no connection '{rest[0]}' (list_connections shows their names)"
        return f"not found: {path.split('?')[0]}"


#: What a 404 on /api/<kind>/<vhost>/<name> is missing.
VHOST_SCOPED = {
    "queues": "queue",
    "exchanges": "exchange",
    "route": "exchange",
    "bindings": "exchange",
    "policies": "policy",
    "operator-policies": "operator policy",
    "permissions": "permissions",
    "vhost-limits": "limit",
    "consumers": "vhost",
}


def _reason(data: bytes) -> str:
    try:
        doc = json.loads(data)
    except ValueError:
        return data.decode(errors="replace").strip()
    if isinstance(doc, dict):
        return str(doc.get("reason") or doc.get("error") or doc)
    return str(doc)


def q(name: str) -> str:
    """A path segment: vhost "/" is "%2F", as the API wants."""
    return urllib.parse.quote(name, safe="")


# -- output ------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _get(row: dict[str, Any], column: str) -> Any:
    """A column, dotted names reaching into nested objects (message_stats.publish)."""
    value: Any = row
    for part in column.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def render(rows: list[dict[str, Any]], columns: list[str], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([{c: _get(r, c) for c in columns} for r in rows], indent=2)
    table = [columns] + [[_cell(_get(r, c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


# -- commands -----------------------------------------------------------------------------

#: list command -> (API path with {vhost} where scoped, default columns)
LISTS: dict[str, tuple[str, list[str]]] = {
    "list_queues": ("/api/queues/{vhost}", ["name", "messages"]),
    "list_exchanges": ("/api/exchanges/{vhost}", ["name", "type"]),
    "list_bindings": (
        "/api/bindings/{vhost}",
        ["source", "destination", "destination_type", "routing_key", "arguments"],
    ),
    "list_connections": ("/api/connections", ["name", "user", "vhost", "state", "channels"]),
    "list_channels": ("/api/channels", ["name", "user", "vhost", "number", "consumer_count"]),
    "list_consumers": (
        "/api/consumers/{vhost}",
        ["queue.name", "consumer_tag", "ack_required", "prefetch_count"],
    ),
    "list_users": ("/api/users", ["name", "tags"]),
    "list_vhosts": ("/api/vhosts", ["name"]),
    "list_permissions": ("/api/vhosts/{vhost}/permissions", ["user", "configure", "write", "read"]),
    "list_policies": (
        "/api/policies/{vhost}",
        ["vhost", "name", "pattern", "apply-to", "definition", "priority"],
    ),
    "shovel_status": ("/api/shovels", ["name", "vhost", "type", "state", "src_uri", "dest_uri"]),
    "federation_status": (
        "/api/federation-links",
        ["vhost", "type", "exchange", "queue", "upstream", "status", "error", "id"],
    ),
}


def _list(api: Api, args: argparse.Namespace) -> str:
    path, default = LISTS[args.command]
    rows = api.call("GET", path.format(vhost=q(getattr(args, "vhost", "/"))))
    return render(rows, args.columns or default, args.format)


def _user(api: Api, name: str) -> dict[str, Any]:
    try:
        return api.call("GET", f"/api/users/{q(name)}")
    except ApiError as exc:
        if exc.status == 404:
            exc.code = EX_NOUSER
        raise


def _tags(user: dict[str, Any]) -> list[str]:
    tags = user.get("tags", [])
    return [t for t in tags.split(",") if t] if isinstance(tags, str) else list(tags)


def add_user(api: Api, a: argparse.Namespace) -> str:
    """A new user, no tags; an existing one is refused as rabbitmqctl refuses it (exit 70):
    a PUT would replace its password and wipe its tags (change_password, set_user_tags)."""
    if api.exists(f"/api/users/{q(a.username)}"):
        raise CtlError(f'User "{a.username}" already exists', EX_SOFTWARE)
    api.call("PUT", f"/api/users/{q(a.username)}", {"password": a.password, "tags": ""})
    return f'Adding user "{a.username}" ...'


def delete_user(api: Api, a: argparse.Namespace) -> str:
    _user(api, a.username)  # rabbitmqctl's words and exit code (67) for a missing user
    api.call("DELETE", f"/api/users/{q(a.username)}")
    return f'Deleting user "{a.username}" ...'


def change_password(api: Api, a: argparse.Namespace) -> str:
    tags = _tags(_user(api, a.username))
    api.call("PUT", f"/api/users/{q(a.username)}", {"password": a.password, "tags": tags})
    return f'Changing password for user "{a.username}" ...'


def set_user_tags(api: Api, a: argparse.Namespace) -> str:
    user = _user(api, a.username)
    body = {"password_hash": user["password_hash"], "tags": a.tags}
    api.call("PUT", f"/api/users/{q(a.username)}", body)
    return f'Setting tags for user "{a.username}" to [{", ".join(a.tags)}] ...'


def add_vhost(api: Api, a: argparse.Namespace) -> str:
    api.call("PUT", f"/api/vhosts/{q(a.name)}")
    return f'Adding vhost "{a.name}" ...'


def delete_vhost(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/vhosts/{q(a.name)}")
    return f'Deleting vhost "{a.name}" ...'


def set_permissions(api: Api, a: argparse.Namespace) -> str:
    body = {"configure": a.conf, "write": a.write, "read": a.read}
    api.call("PUT", f"/api/permissions/{q(a.vhost)}/{q(a.username)}", body)
    return f'Setting permissions for user "{a.username}" in vhost "{a.vhost}" ...'


def clear_permissions(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/permissions/{q(a.vhost)}/{q(a.username)}")
    return f'Clearing permissions for user "{a.username}" in vhost "{a.vhost}" ...'


def set_policy(api: Api, a: argparse.Namespace) -> str:
    try:
        definition = json.loads(a.definition)
    except ValueError:
        raise CtlError(f"the definition is not JSON: {a.definition}", 2) from None
    body = {
        "pattern": a.pattern,
        "definition": definition,
        "priority": a.priority,
        "apply-to": a.apply_to,
    }
    api.call("PUT", f"/api/policies/{q(a.vhost)}/{q(a.name)}", body)
    return f'Setting policy "{a.name}" for pattern "{a.pattern}" to "{a.definition}" ...'


def clear_policy(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/policies/{q(a.vhost)}/{q(a.name)}")
    return f'Clearing policy "{a.name}" on vhost "{a.vhost}" ...'


def set_parameter(api: Api, a: argparse.Namespace) -> str:
    try:
        value = json.loads(a.value)
    except ValueError:
        raise CtlError(f"the value is not JSON: {a.value}", 2) from None
    path = f"/api/parameters/{q(a.component)}/{q(a.vhost)}/{q(a.name)}"
    api.call("PUT", path, {"value": value})
    return f'Setting runtime parameter "{a.name}" for component "{a.component}" to "{a.value}" ...'


def clear_parameter(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/parameters/{q(a.component)}/{q(a.vhost)}/{q(a.name)}")
    return f'Clearing runtime parameter "{a.name}" for component "{a.component}" on vhost "{a.vhost}" ...'


def list_parameters(api: Api, a: argparse.Namespace) -> str:
    rows = [r for r in api.call("GET", "/api/parameters") if r["vhost"] == a.vhost]
    return render(rows, a.columns or ["component", "name", "value"], a.format)


def restart_shovel(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/shovels/vhost/{q(a.vhost)}/{q(a.name)}/restart")
    return f"Restarting dynamic Shovel {a.name} in virtual host {a.vhost}"


def restart_federation_link(api: Api, a: argparse.Namespace) -> str:
    rows = [r for r in api.call("GET", "/api/federation-links") if r["id"] == a.link_id]
    if not rows:
        raise CtlError(f"no federation link '{a.link_id}' (federation_status shows their ids)")
    row = rows[0]
    api.call(
        "DELETE",
        f"/api/federation-links/vhost/{q(row['vhost'])}/{q(a.link_id)}/{q(row['node'])}/restart",
    )
    return f"Restarting federation link {a.link_id} ..."


def delete_shovel(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/shovels/vhost/{q(a.vhost)}/{q(a.name)}")
    return f"Deleting shovel {a.name} in vhost {a.vhost}"


def _limits(text: str) -> dict[str, Any]:
    try:
        limits = json.loads(text)
    except ValueError:
        limits = None
    if not isinstance(limits, dict):
        raise CtlError(
            f"limits must be a JSON object such as '{{\"max-connections\": 10}}': {text}", 2
        )
    return limits


def set_vhost_limits(api: Api, a: argparse.Namespace) -> str:
    for name, value in _limits(a.definition).items():
        api.call("PUT", f"/api/vhost-limits/{q(a.vhost)}/{q(name)}", {"value": value})
    return f'Setting vhost limits to "{a.definition}" for vhost "{a.vhost}" ...'


def clear_vhost_limits(api: Api, a: argparse.Namespace) -> str:
    for row in api.call("GET", f"/api/vhost-limits/{q(a.vhost)}"):
        for name in row["value"]:
            api.call("DELETE", f"/api/vhost-limits/{q(a.vhost)}/{q(name)}")
    return f'Clearing vhost "{a.vhost}" limits ...'


def set_user_limits(api: Api, a: argparse.Namespace) -> str:
    for name, value in _limits(a.definition).items():
        api.call("PUT", f"/api/user-limits/{q(a.username)}/{q(name)}", {"value": value})
    return f'Setting user limits to "{a.definition}" for user "{a.username}" ...'


def clear_user_limits(api: Api, a: argparse.Namespace) -> str:
    names = [a.limit]
    if a.limit == "all":
        rows = api.call("GET", f"/api/user-limits/{q(a.username)}")
        names = [n for row in rows for n in row["value"]]
    for name in names:
        api.call("DELETE", f"/api/user-limits/{q(a.username)}/{q(name)}")
    return f'Clearing "{a.limit}" limit for user "{a.username}" ...'


def purge_queue(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/queues/{q(a.vhost)}/{q(a.queue)}/contents")
    return f'Purging queue "{a.queue}" in vhost "{a.vhost}" ...'


def delete_queue(api: Api, a: argparse.Namespace) -> str:
    query = "&".join(
        f"{flag}=true" for flag, on in (("if-unused", a.if_unused), ("if-empty", a.if_empty)) if on
    )
    api.call("DELETE", f"/api/queues/{q(a.vhost)}/{q(a.queue)}" + (f"?{query}" if query else ""))
    return f'Deleting queue "{a.queue}" in vhost "{a.vhost}" ...'


def close_connection(api: Api, a: argparse.Namespace) -> str:
    api.call("DELETE", f"/api/connections/{q(a.connection)}", headers={"X-Reason": a.explanation})
    return f'Closing connection "{a.connection}", reason: {a.explanation} ...'


def _tracing(api: Api, vhost: str, on: bool) -> None:
    """The vhost's firehose on or off; its description and tags sent back as they are (a PUT
    of a vhost replaces them)."""
    row = api.call("GET", f"/api/vhosts/{q(vhost)}")
    api.call(
        "PUT",
        f"/api/vhosts/{q(vhost)}",
        {"description": row.get("description", ""), "tags": row.get("tags", []), "tracing": on},
    )


def trace_on(api: Api, a: argparse.Namespace) -> str:
    _tracing(api, a.vhost, True)
    return f'Starting tracing for vhost "{a.vhost}" ...'


def trace_off(api: Api, a: argparse.Namespace) -> str:
    _tracing(api, a.vhost, False)
    return f'Stopping tracing for vhost "{a.vhost}" ...'


def archive_roll(api: Api, a: argparse.Namespace) -> str:
    """Close the archive's open journals into Parquet now (the pipeline reads only those)."""
    result = api.call("POST", "/api/archive/roll")
    if a.format == "json":
        return json.dumps(result, indent=2)
    text = (
        f"Rolling the archive in {result.get('dir')} ...\n"
        f"{result.get('journals_closed', 0)} open journals closed, "
        f"{result.get('files_written', 0)} Parquet files written"
    )
    if result.get("conversions_waiting"):
        text += f"; {result['conversions_waiting']} waiting for the disk (see the broker log)"
    return text


def export_definitions(api: Api, a: argparse.Namespace) -> str:
    doc = api.call("GET", "/api/definitions")
    text = json.dumps(doc, indent=2)
    if a.file == "-":
        return text
    with open(a.file, "w") as f:
        f.write(text + "\n")
    return f'Exporting definitions to "{a.file}" ...'


def import_definitions(api: Api, a: argparse.Namespace) -> str:
    try:
        with open(a.file) if a.file != "-" else sys.stdin as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise CtlError(f"cannot read definitions from {a.file}: {exc}", 2) from None
    api.call("POST", "/api/definitions", doc)
    return f'Importing definitions from "{a.file}" ...'


def route(api: Api, a: argparse.Namespace) -> str:
    path = f"/api/route/{q(a.vhost)}/{q(a.exchange)}?routing_key={q(a.routing_key)}"
    result = api.call("GET", path)
    if a.format == "json":
        return json.dumps(result, indent=2)
    lines = [f'Routing key "{a.routing_key}" on exchange "{a.exchange}" in vhost "{a.vhost}":']
    queues = result.get("queues", [])
    lines.append(f"reaches {len(queues)} queue(s): {', '.join(queues) or '(none)'}")
    for hop in result.get("bindings", []):
        lines.append(
            f"  {hop.get('source') or '(default)'} --[{hop.get('routing_key')}]--> "
            f"{hop.get('destination_type')} {hop.get('destination')}"
        )
    for note in result.get("notes", []):
        lines.append(f"  {note}")
    return "\n".join(lines)


def human_bytes(n: Any) -> str:
    """1536 -> "1.5 KiB", 3.2e9 -> "3.0 GiB"; anything not a number as it is."""
    if not isinstance(n, (int, float)) or isinstance(n, bool):
        return _cell(n)
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)  # pragma: no cover - the loop always returns


def listeners_line(listeners: list[dict[str, Any]]) -> str:
    """Each protocol and port once, with its addresses: "amqp 5672 (127.0.0.1, ::1)"."""
    grouped: dict[tuple[str, Any], list[str]] = {}
    for x in listeners:
        addresses = grouped.setdefault((x.get("protocol", "?"), x.get("port")), [])
        if x.get("ip_address") not in addresses:
            addresses.append(x.get("ip_address"))
    return ", ".join(
        f"{protocol} {port} ({', '.join(str(a) for a in addresses)})"
        for (protocol, port), addresses in grouped.items()
    )


def status(api: Api, a: argparse.Namespace) -> str:
    o = api.call("GET", "/api/overview")
    if a.format == "json":
        return json.dumps(o, indent=2)
    totals, objects = o.get("queue_totals", {}), o.get("object_totals", {})
    rows = [
        ("product", f"{o.get('product_name')} {o.get('product_version')}"),
        ("cluster name", o.get("cluster_name")),
        ("listeners", listeners_line(o.get("listeners", []))),
        ("connections", objects.get("connections")),
        ("queues", objects.get("queues")),
        ("exchanges", objects.get("exchanges")),
        ("consumers", objects.get("consumers")),
        ("messages ready", totals.get("messages_ready")),
        ("messages unacknowledged", totals.get("messages_unacknowledged")),
        (
            "memory used / limit",
            f"{human_bytes(o.get('mem_used'))} / {human_bytes(o.get('mem_limit'))}",
        ),
        (
            "disk free / limit",
            f"{human_bytes(o.get('disk_free'))} / {human_bytes(o.get('disk_free_limit'))}",
        ),
        ("alarms", ", ".join(k for k in ("memory_alarm", "disk_free_alarm") if o.get(k)) or "none"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {_cell(v)}" for k, v in rows)


def _wait_for_leader(api: Api, vhost: str, node: str, timeout: float = 20.0) -> str | None:
    """None once `node` leads the vhost; else the leader last seen, or "no node"."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = api.call("GET", f"/api/vhosts/{q(vhost)}").get("leader")
            if seen == node:
                return None
        except CtlError:
            pass  # the node asked may itself be between leaders
        time.sleep(0.1)
    return seen or "no node"


def move_vhost_leader(api: Api, a: argparse.Namespace) -> str:
    """A clean hand-over: the new leader (an in-sync member) has every confirmed message
    before the old one resigns; the old leader's clients are closed (320) to reconnect."""
    try:
        api.call("POST", f"/api/vhosts/{q(a.vhost)}/leader", {"node": a.node})
    except ApiError as exc:
        if exc.status == 404 or exc.status == 405:
            raise CtlError(f"no vhost '{a.vhost}', or this broker is not a cluster") from None
        raise CtlError(f"cannot move vhost '{a.vhost}' to node '{a.node}': {exc.reason}") from None
    other = _wait_for_leader(api, a.vhost, a.node)
    if other is not None:
        raise CtlError(
            f"vhost '{a.vhost}': node '{a.node}' has not taken over after 20 s"
            f" (the leader is {other if other == 'no node' else repr(other)})"
        )
    return f'Moving the leadership of vhost "{a.vhost}" to node "{a.node}" ... done'


def cluster_status(api: Api, a: argparse.Namespace) -> str:
    """The nodes (running, what each leads) and each vhost's leader, members and in-sync set."""
    nodes = api.call("GET", "/api/nodes")
    vhosts = api.call("GET", "/api/vhosts")
    if a.format == "json":
        return json.dumps({"nodes": nodes, "vhosts": vhosts}, indent=2)
    node_rows = [
        {
            "node": n.get("name"),
            "running": n.get("running"),
            "address": n.get("address"),
            "leads": ", ".join(n.get("leaders") or []),
        }
        for n in nodes
    ]
    vhost_rows = [
        {
            "vhost": v.get("name"),
            "leader": v.get("leader"),
            "members": ", ".join(v.get("members") or []),
            "in_sync": ", ".join(v.get("in_sync") or []),
            "replicas": v.get("replicas"),
        }
        for v in vhosts
    ]
    return "\n".join(
        [
            "Nodes",
            render(node_rows, ["node", "running", "address", "leads"], "table"),
            "",
            "Vhosts",
            render(vhost_rows, ["vhost", "leader", "members", "in_sync", "replicas"], "table"),
        ]
    )


def _membership(api: Api, method: str, path: str, body: Any, what: str) -> Any:
    try:
        return api.call(method, path, body)
    except ApiError as exc:
        if exc.status in (404, 405):
            raise CtlError("this broker is not a cluster node") from None
        raise CtlError(f"cannot {what}: {exc.reason}") from None


def add_vhost_member(api: Api, a: argparse.Namespace) -> str:
    """A copy of the vhost on one more node (RabbitMQ's add_member): it catches up, then
    joins the in-sync set; `move_vhost_leader` can hand it the vhost after that."""
    what = f"add node '{a.node}' to vhost '{a.vhost}'"
    result = _membership(api, "POST", f"/api/vhosts/{q(a.vhost)}/members", {"node": a.node}, what)
    return f'Adding node "{a.node}" to vhost "{a.vhost}" ... members: ' + ", ".join(
        result.get("members", [])
    )


def delete_vhost_member(api: Api, a: argparse.Namespace) -> str:
    """Take a node's copy out of a vhost (RabbitMQ's delete_member); the vhost's replica
    count shrinks with it. Its leader cannot be taken out: move the leadership first."""
    what = f"remove node '{a.node}' from vhost '{a.vhost}'"
    path = f"/api/vhosts/{q(a.vhost)}/members/{q(a.node)}"
    result = _membership(api, "DELETE", path, None, what)
    return f'Removing node "{a.node}" from vhost "{a.vhost}" ... members: ' + ", ".join(
        result.get("members", [])
    )


def set_vhost_replicas(api: Api, a: argparse.Namespace) -> str:
    """How many copies one vhost keeps (its leader adds or removes members to match)."""
    what = f"set the replicas of vhost '{a.vhost}'"
    body = {"replicas": a.replicas}
    _membership(api, "PUT", f"/api/vhosts/{q(a.vhost)}/replicas", body, what)
    return f'Setting the replicas of vhost "{a.vhost}" to {a.replicas} ...'


def forget_cluster_node(api: Api, a: argparse.Namespace) -> str:
    """Drain a node: its leaderships move to in-sync members, then it leaves every vhost's
    members; stop it afterwards. Starting it again with [cluster] adds it back."""
    try:
        result = api.call("DELETE", f"/api/nodes/{q(a.node)}")
    except ApiError as exc:
        if exc.status in (404, 405):
            raise CtlError("this broker is not a cluster node") from None
        raise CtlError(f"cannot forget node '{a.node}': {exc.reason}") from None
    vhosts = result.get("vhosts", []) if isinstance(result, dict) else []
    return (
        f'Removing node "{a.node}" from the cluster ... it left {len(vhosts)} vhost(s)'
        + (f": {', '.join(vhosts)}" if vhosts else "")
        + "; it can be stopped now"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="roarmq ctl",
        description="rabbitmqctl's everyday commands over the management HTTP API.",
    )
    env = os.environ
    p.add_argument(
        "--url",
        default=env.get("ROARMQ_CTL_URL") or DEFAULT_URL,
        help=f"management API (default: $ROARMQ_CTL_URL, else {DEFAULT_URL})",
    )
    p.add_argument(
        "-u",
        "--username",
        dest="api_user",
        default=env.get("ROARMQ_CTL_USER") or "guest",
        help="default: $ROARMQ_CTL_USER, else guest",
    )
    p.add_argument(
        "--password",
        dest="api_password",
        default=env.get("ROARMQ_CTL_PASSWORD") or "guest",
        help="default: $ROARMQ_CTL_PASSWORD, else guest",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, fn: Callable[..., str], text: str, vhost: bool = False) -> Any:
        c = sub.add_parser(name, help=text, description=text)
        if vhost:
            c.add_argument("-p", "--vhost", default="/", help="default /")
        c.set_defaults(fn=fn)
        return c

    for name, (path, default) in LISTS.items():
        c = command(
            name,
            _list,
            f"columns: any field of GET {path} (default: {' '.join(default)})",
            vhost="{vhost}" in path,
        )
        c.add_argument("columns", nargs="*")
    command(
        "add_user", add_user, "add a new user, no tags (an existing one is refused, exit 70)"
    ).add_argument("username")
    sub.choices["add_user"].add_argument("password")
    command("delete_user", delete_user, "delete a user").add_argument("username")
    c = command("change_password", change_password, "set a user's password")
    c.add_argument("username")
    c.add_argument("password")
    c = command("set_user_tags", set_user_tags, "replace a user's tags")
    c.add_argument("username")
    c.add_argument("tags", nargs="*")
    command("add_vhost", add_vhost, "add a vhost").add_argument("name")
    command("delete_vhost", delete_vhost, "delete a vhost and all in it").add_argument("name")
    c = command("set_permissions", set_permissions, "set a user's permissions", vhost=True)
    for arg in ("username", "conf", "write", "read"):
        c.add_argument(arg)
    c = command("clear_permissions", clear_permissions, "remove a user's permissions", vhost=True)
    c.add_argument("username")
    c = command("set_policy", set_policy, "set a policy", vhost=True)
    c.add_argument("--priority", type=int, default=0)
    c.add_argument(
        "--apply-to",
        default="all",
        choices=("all", "queues", "exchanges", "classic_queues", "quorum_queues"),
    )
    for arg in ("name", "pattern", "definition"):
        c.add_argument(arg)
    command("clear_policy", clear_policy, "remove a policy", vhost=True).add_argument("name")
    c = command("set_parameter", set_parameter, "set a runtime parameter (JSON)", vhost=True)
    for arg in ("component", "name", "value"):
        c.add_argument(arg)
    c = command("clear_parameter", clear_parameter, "remove a runtime parameter", vhost=True)
    c.add_argument("component")
    c.add_argument("name")
    c = command("list_parameters", list_parameters, "a vhost's runtime parameters", vhost=True)
    c.add_argument("columns", nargs="*")
    command(
        "restart_shovel", restart_shovel, "start a dynamic shovel's session over", vhost=True
    ).add_argument("name")
    command(
        "delete_shovel", delete_shovel, "delete a dynamic shovel (its parameter)", vhost=True
    ).add_argument("name")
    command(
        "restart_federation_link",
        restart_federation_link,
        "start a federation link's session over",
    ).add_argument("link_id")
    command(
        "set_vhost_limits", set_vhost_limits, "set vhost limits (JSON)", vhost=True
    ).add_argument("definition")
    command("clear_vhost_limits", clear_vhost_limits, "remove a vhost's limits", vhost=True)
    c = command("set_user_limits", set_user_limits, "set user limits (JSON)")
    c.add_argument("username")
    c.add_argument("definition")
    c = command("clear_user_limits", clear_user_limits, "remove a user limit (or all)")
    c.add_argument("username")
    c.add_argument("limit", help="max-connections, max-channels or all")
    command("purge_queue", purge_queue, "drop a queue's ready messages", vhost=True).add_argument(
        "queue"
    )
    c = command("delete_queue", delete_queue, "delete a queue", vhost=True)
    c.add_argument("queue")
    c.add_argument("--if-unused", "-u", action="store_true")
    c.add_argument("--if-empty", "-e", action="store_true")
    c = command("close_connection", close_connection, "close a connection (320, with reason)")
    c.add_argument("connection", help="its name, as list_connections shows it")
    c.add_argument("explanation")
    command(
        "trace_on",
        trace_on,
        "copy every publish and delivery in the vhost to amq.rabbitmq.trace (the firehose)",
        vhost=True,
    )
    command("trace_off", trace_off, "stop the vhost's firehose", vhost=True)
    command(
        "export_definitions", export_definitions, "write definitions JSON (- for stdout)"
    ).add_argument("file")
    command(
        "import_definitions", import_definitions, "load definitions JSON (- for stdin)"
    ).add_argument("file")
    c = command("route", route, "where a message with this key would go, and why", vhost=True)
    c.add_argument("exchange")
    c.add_argument("routing_key")
    command("status", status, "the broker at a glance")
    command(
        "archive_roll",
        archive_roll,
        "close the archive's open journals into Parquet now, for the pipeline (administrator)",
    )
    command("cluster_status", cluster_status, "nodes, who leads what, members and in-sync sets")
    c = command(
        "move_vhost_leader",
        move_vhost_leader,
        "hand a vhost's leadership to an in-sync member (administrator)",
    )
    c.add_argument("vhost")
    c.add_argument("node")
    command(
        "forget_cluster_node",
        forget_cluster_node,
        "drain a node: move its leaderships, remove it from every vhost (administrator)",
    ).add_argument("node")
    for name, run, text in (
        ("add_vhost_member", add_vhost_member, "give a vhost a copy on a node (administrator)"),
        (
            "delete_vhost_member",
            delete_vhost_member,
            "take a node's copy out of a vhost (administrator)",
        ),
    ):
        c = command(name, run, text)
        c.add_argument("vhost")
        c.add_argument("node")
    c = command(
        "set_vhost_replicas",
        set_vhost_replicas,
        "how many copies a vhost keeps, 1 to 9 (administrator)",
    )
    c.add_argument("vhost")
    c.add_argument("replicas", type=int)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    api = Api(args.url, args.api_user, args.api_password)
    try:
        out = args.fn(api, args)
    except CtlError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.code
    if out:
        print(out)
    return 0
