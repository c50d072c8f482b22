"""Terraform's RabbitMQ provider against RoarMQ, checked by replaying its HTTP conversation.

Terraform itself was NOT run here: this machine reaches only PyPI, Debian and npm, Debian
packages no terraform, and neither terraform nor the provider's binary (a Go program) can be
downloaded or built here. So this file speaks, with plain HTTP, exactly what the provider
says through its Go client, and checks that RoarMQ answers what the provider then parses.

What was read to write it (their code is not copied; this is a re-telling in Python):
- github.com/cyrilgdn/terraform-provider-rabbitmq v1.10.1 (commit c196856d221b):
  rabbitmq/resource_{vhost,user,permissions,topic_permissions,exchange,queue,binding,policy,
  operator_policy}.go, data_source_{vhost,user,exchange,default_user}.go, util.go, and
  resource_binding_test.go / website/docs/r/binding.html.markdown for the binding ids.
- Its Go client, github.com/michaelklishin/rabbit-hole/v3 v3.2.0 (commit 411802e8af1d, the
  version the provider's go.mod pins): client.go, error.go, common.go, misc.go, vhosts.go,
  vhost_limits.go, users.go, permissions.go, topic_permissions.go, exchanges.go, queues.go,
  bindings.go, policies.go, operator_policies.go.
- Where RoarMQ and the provider disagree: RabbitMQ 3.10.8's management plugin
  (rabbitmq/rabbitmq-server tag v3.10.8, deps/rabbitmq_management) and cowboy 2.8.0, the HTTP
  server it pins.

rabbit-hole's manners, which every request below keeps: Basic auth and `Connection: close` on
every request; GET has no body; PUT/POST/DELETE carry `Content-Type: application/json` and a
body (empty on DELETE); names go through Go's url.PathEscape (vhost "/" is %2F, a space %20,
"@", ":", "+", "=", "&", "$" stay as they are). A 401, or any status >= 400, is an error,
except a 404 answering a DELETE (success). Bodies are encoding/json's: struct fields in their
order, `omitempty` fields left out when empty, map keys sorted. A provider Read that gets a 404
forgets the resource (checkDeleted), and Go's decoder refuses a JSON value of the wrong type
for the field it lands in, so every answer is checked against the rabbit-hole struct it is
decoded into (GO_* below).

"terraform apply then plan shows no diff": after each Create (and Update) the provider's Read
runs; what it would write into the state must be what the configuration declared, or the
next plan shows a change.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import urllib.parse
from typing import Any

import pika
import pytest

pytestmark = pytest.mark.timeout(60)

# ---------------------------------------------------------------------------------------------
# Go's encoding/json: what decodes into what. A shape is a scalar name, [shape] for a slice,
# {json_name: shape} for a struct, or Map(shape) for map[string]T. null fits anything except
# the types with their own UnmarshalJSON that refuse it (AutoDelete, Port).


class Map:
    def __init__(self, values: Any) -> None:
        self.values = values


class EmptyListOr:
    """rabbit-hole's ChannelDetails: `[]` (RabbitMQ's empty proplist) or the struct."""

    def __init__(self, struct: dict[str, Any]) -> None:
        self.struct = struct


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


SCALARS = {
    "string": lambda v: v is None or isinstance(v, str),
    "bool": lambda v: v is None or isinstance(v, bool),
    "int": lambda v: v is None or _integer(v),  # a literal like 1.0 does not fit a Go int
    "uint": lambda v: v is None or (_integer(v) and v >= 0),
    "float": lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool)),
    "any": lambda v: True,
    # rabbit-hole's Port: a number, a string of digits, or "undefined"
    "port": lambda v: (
        _integer(v) or (isinstance(v, str) and re.fullmatch(r"[+-]?\d+|undefined", v))
    ),
    # rabbit-hole's AutoDelete: true, false or "undefined"; anything else is an error
    "autodelete": lambda v: v is True or v is False or v == "undefined",
    # UserTags / VhostTags: a comma-separated string or a list of strings
    "tags": lambda v: (
        v is None
        or isinstance(v, str)
        or (isinstance(v, list) and all(t is None or isinstance(t, str) for t in v))
    ),
}


def go_decode_errors(value: Any, shape: Any, where: str = "$") -> list[str]:
    """Why Go's json.Unmarshal would fail to put `value` into `shape` ([] when it would not)."""
    if isinstance(shape, EmptyListOr):
        return [] if value == [] else go_decode_errors(value, shape.struct, where)
    if value is None and not isinstance(shape, str):
        return []
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: a Go struct cannot hold {value!r}"]
        return [
            e
            for k, s in shape.items()
            if k in value
            for e in go_decode_errors(value[k], s, f"{where}.{k}")
        ]
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: a Go slice cannot hold {value!r}"]
        return [
            e for i, v in enumerate(value) for e in go_decode_errors(v, shape[0], f"{where}[{i}]")
        ]
    if isinstance(shape, Map):
        if not isinstance(value, dict):
            return [f"{where}: a Go map cannot hold {value!r}"]
        return [
            e for k, v in value.items() for e in go_decode_errors(v, shape.values, f"{where}.{k}")
        ]
    return [] if SCALARS[shape](value) else [f"{where}: a Go {shape} cannot hold {value!r}"]


STR, BOOL, INT, UINT, FLOAT = "string", "bool", "int", "uint", "float"
OBJECT = Map("any")  # map[string]interface{}
RATE = {"rate": FLOAT, "samples": [{"sample": INT, "timestamp": INT}]}


def _counted(names: str) -> dict[str, Any]:
    """Count fields, each with its *_details rate, as rabbit-hole's structs pair them."""
    return {k: v for n in names.split() for k, v in ((n, INT), (n + "_details", RATE))}


def _all(names: str, shape: Any) -> dict[str, Any]:
    return dict.fromkeys(names.split(), shape)


MESSAGE_STATS = _counted(
    "publish deliver deliver_noack deliver_get redeliver get get_no_ack ack"
    " return_unroutable drop_unroutable"
)
QUEUE_COUNTS = _counted("messages messages_ready messages_unacknowledged")
NAME_AND_VHOST = _all("name vhost", STR)

GO_VHOST_INFO = {
    **_all("name description default_queue_type", STR),
    "tags": "tags",
    "tracing": BOOL,
    **QUEUE_COUNTS,
    **_all("recv_oct send_oct recv_cnt send_cnt send_pend", UINT),
    **_all("recv_oct_details send_oct_details", RATE),
    "cluster_state": Map(STR),
}
GO_VHOST_LIMITS = [{"vhost": STR, "value": Map(INT)}]
GO_USER_INFO = {**_all("name password_hash hashing_algorithm", STR), "tags": "tags"}
GO_PERMISSION_INFO = _all("user vhost configure write read", STR)
GO_TOPIC_PERMISSIONS = [_all("user vhost exchange write read", STR)]
GO_DETAILED_EXCHANGE = {
    **_all("name vhost type", STR),
    **_all("durable auto_delete internal", BOOL),
    "arguments": OBJECT,
    "incoming": [
        {
            "stats": MESSAGE_STATS,
            "channel_details": {
                **_all("name connection_name peer_host", STR),
                "number": INT,
                "peer_port": "port",
            },
        }
    ],
    "outgoing": [{"stats": MESSAGE_STATS, "queue": NAME_AND_VHOST}],
    "message_stats": _counted("publish_in publish_out"),
}
GO_CONSUMER_DETAIL = {
    "arguments": OBJECT,
    "channel_details": EmptyListOr(
        {
            **_all("connection_name name node peer_host user", STR),
            "number": UINT,
            "peer_port": "port",
        }
    ),
    **_all("ack_required active exclusive", BOOL),
    **_all("active_status consumer_tag", STR),
    "prefetch_count": UINT,
    "queue": NAME_AND_VHOST,
}
GO_QUEUE_INFO = {
    **_all("name type vhost node state leader exclusive_consumer_tag policy", STR),
    **_all("durable exclusive", BOOL),
    "auto_delete": "autodelete",
    "arguments": OBJECT,
    **_all("members online", [STR]),
    "consumer_details": [GO_CONSUMER_DETAIL],
    "consumer_utilisation": FLOAT,
    "garbage_collection": _all(
        "fullsweep_after max_heap_size min_bin_vheap_size min_heap_size minor_gcs", INT
    ),
    **_all(
        "memory consumers message_bytes message_bytes_persistent message_bytes_ram"
        " message_bytes_ready message_bytes_unacknowledged messages_persistent messages_ram"
        " active_consumers",
        INT,
    ),
    **QUEUE_COUNTS,
    "message_stats": MESSAGE_STATS,
    "owner_pid_details": {**_all("name peer_host", STR), "peer_port": "port"},
    "backing_queue_status": {
        **_all("q1 q2 q3 q4 len pending_acks ram_msg_count ram_ack_count persistent_count", INT),
        **_all("avg_ingress_rate avg_egress_rate avg_ack_ingress_rate avg_ack_egress_rate", FLOAT),
    },
}
GO_BINDINGS = [
    {
        **_all("source vhost destination destination_type routing_key properties_key", STR),
        "arguments": OBJECT,
    }
]
GO_POLICY = {**_all("vhost pattern apply-to name", STR), "priority": INT, "definition": OBJECT}
GO_OVERVIEW = {
    **_all(
        "management_version statistics_level rabbitmq_version erlang_version"
        " erlang_full_version node statistics_db_node",
        STR,
    ),
    "exchange_types": [{**_all("name description", STR), "enabled": BOOL}],
    "message_stats": MESSAGE_STATS,
    "queue_totals": QUEUE_COUNTS,
    "object_totals": _all("consumers queues exchanges connections channels", INT),
    "listeners": [{**_all("node protocol ip_address", STR), "port": "port"}],
    "contexts": [{**_all("node description path", STR), "port": "port", "ignore_in_use": BOOL}],
}


# ---------------------------------------------------------------------------------------------
# rabbit-hole's HTTP


def path_escape(name: str) -> str:
    """Go's url.PathEscape: all but the unreserved characters and $&+:=@ are %XX-escaped."""
    return urllib.parse.quote(name, safe="$&+:=@")


def go_json(value: Any) -> bytes:
    """encoding/json.Marshal's bytes: compact, and <, >, & escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


class RabbitHoleError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"Error {status}: {body}")
        self.status = status


class Answer:
    def __init__(self, status: int, headers: http.client.HTTPMessage, raw: bytes) -> None:
        self.status, self.headers, self.raw = status, headers, raw

    def json(self) -> Any:
        return json.loads(self.raw)


class RabbitHole:
    """One rabbit-hole Client: its requests, and its rule for which answers are errors."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def raw(self, method: str, path: str, body: Any = None) -> Answer:
        headers = {"Authorization": self.auth, "Connection": "close"}
        data = None
        if method != "GET":  # newRequestWithBody: the JSON body, or an empty one
            headers["Content-Type"] = "application/json"
            data = b"" if body is None else go_json(body)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, "/api/" + path, body=data, headers=headers)
            resp = conn.getresponse()
            return Answer(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def send(self, method: str, path: str, body: Any = None) -> Answer:
        """executeRequest: raises on 401 or >= 400, except a DELETE's 404."""
        answer = self.raw(method, path, body)
        if answer.status == 401 or (
            answer.status >= 400 and not (method == "DELETE" and answer.status == 404)
        ):
            raise RabbitHoleError(answer.status, answer.raw)
        return answer

    def get(self, path: str, shape: Any) -> Any:
        """executeAndParseRequest into a struct of `shape`; None where the provider's Read
        would see a 404 and forget the resource (checkDeleted)."""
        try:
            doc = self.send("GET", path).json()
        except RabbitHoleError as exc:
            if exc.status == 404:
                return None
            raise
        assert go_decode_errors(doc, shape) == [], (path, doc)
        return doc


@pytest.fixture
def rh(mgmt_broker):
    return RabbitHole(mgmt_broker.broker.mgmt_port)


def q(*names: str) -> str:
    return "/".join(path_escape(n) for n in names)


# ---------------------------------------------------------------------------------------------
# The request bodies, as rabbit-hole marshals its settings structs


def vhost_settings(description: str = "", default_queue_type: str = "", tracing: bool = False):
    # VhostSettings: tags is VhostTags (the provider leaves it nil: joined, ""),
    # default_queue_type omitempty
    body: dict[str, Any] = {"description": description, "tags": ""}
    if default_queue_type:
        body["default_queue_type"] = default_queue_type
    body["tracing"] = tracing
    return body


def user_settings(password: str, tags: list[str]) -> dict[str, Any]:
    # UserSettings: name (never filled in by the provider), tags joined with ",", password
    return {"name": "", "tags": ",".join(tags), "password": password}


def exchange_settings(type_: str, durable: bool, auto_delete: bool, arguments: dict) -> dict:
    # ExchangeSettings: auto_delete and arguments omitempty (DeclareExchange's {} is empty)
    body: dict[str, Any] = {"type": type_, "durable": durable}
    if auto_delete:
        body["auto_delete"] = True
    if arguments:
        body["arguments"] = arguments
    return body


def queue_settings(durable: bool, auto_delete: bool, arguments: dict) -> dict[str, Any]:
    # QueueSettings: type is not omitempty (the provider never sets it: ""), auto_delete and
    # arguments are
    body: dict[str, Any] = {"type": "", "durable": durable}
    if auto_delete:
        body["auto_delete"] = True
    if arguments:
        body["arguments"] = dict(sorted(arguments.items()))
    return body


def policy_body(vhost: str, name: str, declared: dict[str, Any]) -> dict[str, Any]:
    """putPolicy / putOperatorPolicy: a definition value that parses as a base-10 int64 is
    sent as a number (the provider's "special case for integers")."""
    definition = {
        k: int(v) if isinstance(v, str) and re.fullmatch(r"[+-]?\d+", v) else v
        for k, v in sorted(declared["definition"].items())
    }
    return {
        "vhost": vhost,
        "pattern": declared["pattern"],
        "apply-to": declared["apply_to"],
        "name": name,
        "priority": declared["priority"],
        "definition": definition,
    }


# ---------------------------------------------------------------------------------------------
# The provider's Read functions: the requests they make and the state they would write


def read_vhost(rh: RabbitHole, name: str) -> dict[str, Any] | None:
    vhost = rh.get(f"vhosts/{q(name)}", GO_VHOST_INFO)
    if vhost is None:
        return None
    limits = rh.get(f"vhost-limits/{q(name)}", GO_VHOST_LIMITS)
    if limits is None:
        return None
    state = {"name": vhost["name"], "description": vhost.get("description") or ""}
    state["tracing"] = bool(vhost.get("tracing"))
    if limits:
        values = limits[0]["value"]
        state["max_connections"] = str(values.get("max-connections", ""))
        state["max_queues"] = str(values.get("max-queues", ""))
    return state


def read_user(rh: RabbitHole, name: str) -> dict[str, Any] | None:
    user = rh.get(f"users/{q(name)}", GO_USER_INFO)
    if user is None:
        return None
    tags = user.get("tags") or []
    tags = tags.split(",") if isinstance(tags, str) else tags
    state: dict[str, Any] = {"name": user["name"]}
    if any(tags):
        state["tags"] = [t for t in tags if t]
    return state


def read_permissions(rh: RabbitHole, user: str, vhost: str) -> dict[str, Any] | None:
    perms = rh.get(f"permissions/{q(vhost, user)}", GO_PERMISSION_INFO)
    if perms is None:
        return None
    return {
        "user": perms["user"],
        "vhost": perms["vhost"],
        "permissions": {k: perms[k] for k in ("configure", "write", "read")},
    }


def read_topic_permissions(rh: RabbitHole, user: str, vhost: str) -> dict[str, Any] | None:
    perms = rh.get(f"topic-permissions/{q(vhost, user)}", GO_TOPIC_PERMISSIONS)
    if perms is None:
        return None
    return {
        "user": perms[0]["user"],
        "vhost": perms[0]["vhost"],
        # a TypeSet in the schema: order does not count
        "permissions": sorted(
            ({k: p[k] for k in ("exchange", "write", "read")} for p in perms),
            key=lambda p: p["exchange"],
        ),
    }


def read_exchange(rh: RabbitHole, name: str, vhost: str) -> dict[str, Any] | None:
    x = rh.get(f"exchanges/{q(vhost, name)}", GO_DETAILED_EXCHANGE)
    if x is None:
        return None
    settings = {k: x[k] for k in ("type", "durable", "auto_delete")}
    settings["arguments"] = x.get("arguments") or {}
    return {"name": x["name"], "vhost": x["vhost"], "settings": settings}


def read_queue(rh: RabbitHole, name: str, vhost: str, as_json: bool) -> dict[str, Any] | None:
    queue = rh.get(f"queues/{q(vhost, name)}", GO_QUEUE_INFO)
    if queue is None:
        return None
    arguments = queue.get("arguments") or {}
    settings: dict[str, Any] = {
        "durable": queue["durable"],
        "auto_delete": queue["auto_delete"] is True,
    }
    if as_json or any(not isinstance(v, str) for v in arguments.values()):
        # arguments_json: compared as JSON values (SuppressJsonDiff), so parsed back here
        settings["arguments_json"] = json.loads(go_json(arguments))
    else:
        settings["arguments"] = arguments
    return {"name": queue["name"], "vhost": queue["vhost"], "settings": settings}


def encode_slashes(s: str) -> str:
    return s.replace("%", "%25").replace("/", "%2F")


def read_binding(rh: RabbitHole, binding_id: str) -> dict[str, Any] | None:
    """ReadBinding: the id split on "/"; the bindings between the two ends listed; the last
    one with the same source, destination, type and properties_key wins; none: forgotten."""
    parts = binding_id.split("/")
    assert len(parts) >= 5, binding_id
    vhost = parts[0].replace("%2F", "/").replace("%25", "%")
    source, destination, dtype, props = parts[1:5]
    kind = {"queue": "q", "exchange": "e"}[dtype]
    rows = rh.get(f"bindings/{q(vhost)}/e/{q(source)}/{kind}/{q(destination)}", GO_BINDINGS)
    if rows is None:  # ListQueueBindingsBetween's error fails the Read outright
        raise RabbitHoleError(404, "bindings between")
    state, wanted = None, (source, destination, dtype, props)
    for row in rows:
        found = tuple(row[k] for k in ("source", "destination", "destination_type"))
        if found + (row["properties_key"],) == wanted:
            state = {
                k: row[k]
                for k in ("vhost", "source", "destination", "destination_type", "routing_key")
            }
            state["properties_key"] = row["properties_key"]
            state["arguments"] = row.get("arguments") or {}
    return state


def read_policy(rh: RabbitHole, kind: str, name: str, vhost: str) -> dict[str, Any] | None:
    policy = rh.get(f"{kind}/{q(vhost, name)}", GO_POLICY)
    if policy is None:
        return None
    definition = {}
    for key, value in (policy.get("definition") or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = repr(float(value)).removesuffix(".0")  # FormatFloat(v, 'f', -1, 64)
        elif isinstance(value, list):
            value = ",".join(v for v in value if isinstance(v, str))
        definition[key] = value
    return {
        "name": policy["name"],
        "vhost": policy["vhost"],
        "policy": {
            "pattern": policy["pattern"],
            "priority": policy["priority"],
            "apply_to": policy["apply-to"],
            "definition": definition,
        },
    }


def applied(read, *args: Any) -> Any:
    """Read after Create/Update, then again as `terraform plan` does: both times the same."""
    first = read(*args)
    assert read(*args) == first
    return first


# ---------------------------------------------------------------------------------------------
# rabbitmq_vhost (and data "rabbitmq_vhost")


def create_vhost(rh: RabbitHole, name: str, description: str = "", **limits: int) -> None:
    """CreateVhost: PutVhost, then PutVhostLimits, one PUT a declared limit (in Go's map
    order: any)."""
    rh.send("PUT", f"vhosts/{q(name)}", vhost_settings(description))
    for limit, value in limits.items():
        rh.send("PUT", f"vhost-limits/{q(name)}/{limit}", {"value": value})


def update_vhost(rh: RabbitHole, name: str, description: str | None, **limits: int) -> None:
    """UpdateVhost: GetVhost, GetVhostLimits, PutVhost with what it read back but for the
    changed description, DeleteVhostLimits of both names (set or not), then PutVhostLimits of
    the declared ones (a changed value, or the unchanged one as read back)."""
    vhost = rh.get(f"vhosts/{q(name)}", GO_VHOST_INFO)
    rh.get(f"vhost-limits/{q(name)}", GO_VHOST_LIMITS)
    settings = vhost_settings(
        (vhost.get("description") or "") if description is None else description,
        vhost.get("default_queue_type") or "",
        bool(vhost.get("tracing")),
    )
    rh.send("PUT", f"vhosts/{q(name)}", settings)
    for limit in ("max-connections", "max-queues"):
        rh.send("DELETE", f"vhost-limits/{q(name)}/{limit}")
    for limit, value in limits.items():
        rh.send("PUT", f"vhost-limits/{q(name)}/{limit}", {"value": value})


def test_vhost_with_limits_create_read_update_delete(rh):
    name = "team a/b"  # PathEscape: team%20a%2Fb
    create_vhost(rh, name, **{"max-connections": 10, "max-queues": 5})
    declared = {"name": name, "description": "", "tracing": False}
    declared |= {"max_connections": "10", "max_queues": "5"}
    assert applied(read_vhost, rh, name) == declared
    assert rh.get(f"vhosts/{q(name)}", GO_VHOST_INFO)["name"] == name  # data "rabbitmq_vhost"

    update_vhost(rh, name, None, **{"max-connections": 20, "max-queues": 5})
    assert applied(read_vhost, rh, name) == {**declared, "max_connections": "20"}

    # No limits: GET vhost-limits answers [] and the Read leaves them unset
    create_vhost(rh, "plain")
    assert read_vhost(rh, "plain") == {"name": "plain", "description": "", "tracing": False}

    # Delete; a later Read forgets it; deleting again is no error (404 on DELETE)
    assert rh.send("DELETE", f"vhosts/{q(name)}").status == 204
    assert read_vhost(rh, name) is None
    assert rh.send("DELETE", f"vhosts/{q(name)}").status == 404


def test_vhost_description_is_kept(rh):
    """`description` is declared, sent in PutVhost and read back by ReadVhost: RabbitMQ 3.10
    stores it (rabbit_mgmt_wm_vhost:accept_content reads `description` from the body;
    rabbit_vhost:put_vhost/6 keeps it in the vhost's metadata on create and on update;
    rabbit_vhost:i(description, ...) reports it in GET /api/vhosts/{name})."""
    create_vhost(rh, "staging", "Staging, EU")
    declared = {"name": "staging", "description": "Staging, EU", "tracing": False}
    assert applied(read_vhost, rh, "staging") == declared
    update_vhost(rh, "staging", "Staging, EU-west")
    assert applied(read_vhost, rh, "staging") == {**declared, "description": "Staging, EU-west"}


# ---------------------------------------------------------------------------------------------
# rabbitmq_user (and data "rabbitmq_user")


def test_user_create_read_update_delete(rh, mgmt_broker):
    rh.send("PUT", f"users/{q('ann')}", user_settings("s3cret", ["management", "policymaker"]))
    declared = {"name": "ann", "tags": ["management", "policymaker"]}
    assert applied(read_user, rh, "ann") == declared  # data "rabbitmq_user" reads the same

    rh.send("PUT", f"permissions/{q('/', 'ann')}", {"configure": "", "write": "", "read": ""})
    credentials = pika.PlainCredentials("ann", "s3cret")
    pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", mgmt_broker.port, credentials=credentials)
    ).close()

    # Update: PutUser with the (new) password and tags; no tags left: the Read sets none
    rh.send("PUT", f"users/{q('ann')}", user_settings("n3w", []))
    assert applied(read_user, rh, "ann") == {"name": "ann"}
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", mgmt_broker.port, credentials=credentials)
        )

    assert rh.send("DELETE", f"users/{q('ann')}").status == 204
    assert read_user(rh, "ann") is None
    assert rh.send("DELETE", f"users/{q('ann')}").status == 404


# ---------------------------------------------------------------------------------------------
# rabbitmq_permissions and rabbitmq_topic_permissions


def test_permissions_create_read_update_delete(rh):
    rh.send("PUT", f"users/{q('ann')}", user_settings("pw", []))
    create_vhost(rh, "v/1")
    perms = {"configure": "^ann\\.", "write": ".*", "read": ""}
    rh.send("PUT", f"permissions/{q('v/1', 'ann')}", perms)  # UpdatePermissionsIn
    declared = {"user": "ann", "vhost": "v/1", "permissions": perms}
    assert applied(read_permissions, rh, "ann", "v/1") == declared
    changed = {**perms, "read": "^reports$"}
    rh.send("PUT", f"permissions/{q('v/1', 'ann')}", changed)
    assert applied(read_permissions, rh, "ann", "v/1") == {**declared, "permissions": changed}
    assert rh.send("DELETE", f"permissions/{q('v/1', 'ann')}").status == 204  # ClearPermissionsIn
    assert read_permissions(rh, "ann", "v/1") is None


def test_topic_permissions_create_read_update_delete(rh):
    rh.send("PUT", f"users/{q('ann')}", user_settings("pw", []))
    declared = [
        {"exchange": "amq.topic", "write": "^ann\\.", "read": ".*"},
        {"exchange": "events", "write": "", "read": "^public\\."},
    ]
    for perms in declared:  # one UpdateTopicPermissionsIn an exchange
        rh.send("PUT", f"topic-permissions/{q('/', 'ann')}", perms)
    state = {"user": "ann", "vhost": "/", "permissions": declared}
    assert applied(read_topic_permissions, rh, "ann", "/") == state
    # Update: ClearTopicPermissionsIn, then a PUT for each exchange now declared
    rh.send("DELETE", f"topic-permissions/{q('/', 'ann')}")
    rh.send("PUT", f"topic-permissions/{q('/', 'ann')}", declared[1])
    assert applied(read_topic_permissions, rh, "ann", "/") == {**state, "permissions": declared[1:]}
    rh.send("DELETE", f"topic-permissions/{q('/', 'ann')}")
    assert read_topic_permissions(rh, "ann", "/") is None  # 404 once none are left


# ---------------------------------------------------------------------------------------------
# rabbitmq_exchange (and data "rabbitmq_exchange")


@pytest.mark.parametrize(
    "vhost, settings",
    [
        ("/", {"type": "topic", "durable": True, "auto_delete": False, "arguments": {}}),
        (
            "team a/b",
            {
                "type": "headers",
                "durable": True,
                "auto_delete": False,
                "arguments": {"alternate-exchange": "unrouted"},
            },
        ),
        # the provider's own acceptance configuration
        ("/", {"type": "fanout", "durable": False, "auto_delete": True, "arguments": {}}),
    ],
)
def test_exchange_create_read_delete(rh, vhost, settings):
    if vhost != "/":
        create_vhost(rh, vhost)
    body = exchange_settings(
        settings["type"], settings["durable"], settings["auto_delete"], settings["arguments"]
    )
    rh.send("PUT", f"exchanges/{q(vhost, 'shop')}", body)  # DeclareExchange
    declared = {"name": "shop", "vhost": vhost, "settings": settings}
    assert applied(read_exchange, rh, "shop", vhost) == declared  # (the data source alike)
    # every setting is ForceNew: no Update; a change is a Delete and a Create
    assert rh.send("DELETE", f"exchanges/{q(vhost, 'shop')}").status == 204
    assert read_exchange(rh, "shop", vhost) is None
    assert rh.send("DELETE", f"exchanges/{q(vhost, 'shop')}").status == 404


# ---------------------------------------------------------------------------------------------
# rabbitmq_queue


@pytest.mark.parametrize(
    "settings, as_json",
    [
        ({"durable": True, "auto_delete": False, "arguments": {}}, False),
        (
            {
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-dead-letter-exchange": "dlx", "x-queue-mode": "lazy"},
            },
            False,
        ),
        # arguments_json: numbers stay numbers
        (
            {
                "durable": False,
                "auto_delete": True,
                "arguments_json": {"x-message-ttl": 60000, "x-max-length": 10},
            },
            True,
        ),
    ],
)
def test_queue_create_read_delete(rh, settings, as_json):
    arguments = settings.get("arguments_json", settings.get("arguments"))
    body = queue_settings(settings["durable"], settings["auto_delete"], arguments)
    rh.send("PUT", f"queues/{q('/', 'orders')}", body)  # DeclareQueue
    declared = {"name": "orders", "vhost": "/", "settings": settings}
    assert applied(read_queue, rh, "orders", "/", as_json) == declared
    # DeleteQueue with no options: an empty query string, "...?"
    assert rh.send("DELETE", f"queues/{q('/', 'orders')}?").status == 204
    assert read_queue(rh, "orders", "/", as_json) is None
    assert rh.send("DELETE", f"queues/{q('/', 'orders')}?").status == 404


# ---------------------------------------------------------------------------------------------
# rabbitmq_binding


def create_binding(rh: RabbitHole, vhost: str, declared: dict[str, Any]) -> str:
    """CreateBinding: DeclareBinding's POST, the properties key from the last segment of the
    Location header (PathUnescape'd), and the resource id the provider builds from it."""
    kind = {"queue": "q", "exchange": "e"}[declared["destination_type"]]
    ends = f"{q(vhost)}/e/{q(declared['source'])}/{kind}/{q(declared['destination'])}"
    body = {  # BindingInfo: vhost is filled in, properties_key omitempty
        "source": declared["source"],
        "vhost": vhost,
        "destination": declared["destination"],
        "destination_type": declared["destination_type"],
        "routing_key": declared["routing_key"],
        "arguments": dict(sorted(declared["arguments"].items())),
    }
    answer = rh.send("POST", f"bindings/{ends}", body)
    props = urllib.parse.unquote(answer.headers["Location"].split("/")[-1])
    return "/".join(
        [
            encode_slashes(vhost),
            declared["source"],
            declared["destination"],
            declared["destination_type"],
            props,
        ]
    )


def delete_binding(rh: RabbitHole, binding_id: str) -> int:
    """DeleteBinding: the id's parts back into the path, the properties key PathEscape'd."""
    vhost, source, destination, dtype, props = binding_id.split("/")[:5]
    vhost = vhost.replace("%2F", "/").replace("%25", "%")
    kind = {"queue": "q", "exchange": "e"}[dtype]
    path = f"bindings/{q(vhost)}/e/{q(source)}/{kind}/{q(destination)}/{q(props)}"
    return rh.send("DELETE", path).status


def declare_ends(rh: RabbitHole, vhost: str) -> None:
    if vhost != "/":
        create_vhost(rh, vhost)
    rh.send("PUT", f"exchanges/{q(vhost, 'test')}", exchange_settings("topic", True, False, {}))
    rh.send("PUT", f"exchanges/{q(vhost, 'other')}", exchange_settings("topic", True, False, {}))
    rh.send("PUT", f"queues/{q(vhost, 'test')}", queue_settings(True, False, {}))


def binding(dest: str, dtype: str, key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": "test",
        "destination": dest,
        "destination_type": dtype,
        "routing_key": key,
        "arguments": arguments,
    }


def assert_binding_round_trips(rh: RabbitHole, vhost: str, declared: dict[str, Any]) -> str:
    binding_id = create_binding(rh, vhost, declared)
    state = applied(read_binding, rh, binding_id)
    assert state is not None, f"the Read after Create finds no binding for id {binding_id!r}"
    assert {k: v for k, v in state.items() if k != "properties_key"} == {**declared, "vhost": vhost}
    return binding_id


@pytest.mark.parametrize(
    "declared",
    [
        binding("test", "queue", "#", {}),  # the provider's acceptance configuration
        binding("test", "queue", "order.*", {"x-match": "all", "k": "v"}),
        binding("other", "exchange", "audit.#", {}),
        binding("test", "queue", "", {}),
    ],
    ids=["queue", "queue-with-arguments", "exchange", "empty-key"],
)
def test_binding_create_read_delete(rh, declared):
    declare_ends(rh, "/")
    binding_id = assert_binding_round_trips(rh, "/", declared)
    assert delete_binding(rh, binding_id) == 204
    assert read_binding(rh, binding_id) is None
    assert delete_binding(rh, binding_id) == 404


def test_binding_arguments_json(rh):
    declare_ends(rh, "/")
    declared = binding("test", "queue", "#", {"x-priority": 5, "flags": ["a", "b"]})
    binding_id = assert_binding_round_trips(rh, "/", declared)
    assert json.loads(go_json(read_binding(rh, binding_id)["arguments"])) == declared["arguments"]


def test_binding_routing_key_with_slashes(rh):
    """The provider's own acceptance test (TestAccBinding_slashesAreOkay): vhost
    "/virtual//host///", routing key "///routing//key/", three arguments. The id is split on
    "/", so the properties key must hold none: RabbitMQ's is the routing key through
    rabbit_http_util:quote_plus ("/" is %2F), then "~" and a hash of the arguments
    (rabbit_mgmt_format:pack_binding_props/2), and the Location header carries it quoted once
    more (rabbit_mgmt_wm_bindings:accept_content via rabbit_mgmt_format:url/2)."""
    vhost = "/virtual//host///"
    declare_ends(rh, vhost)
    arguments = {"key1": "value1", "key2": "value2", "key3": "value3"}
    declared = binding("test", "queue", "///routing//key/", arguments)
    binding_id = assert_binding_round_trips(rh, vhost, declared)
    props = binding_id.split("/")[4]
    assert re.fullmatch(r"%2F%2F%2Frouting%2F%2Fkey%2F~[A-Za-z0-9_-]+", props), props
    assert delete_binding(rh, binding_id) == 204
    assert read_binding(rh, binding_id) is None


def test_bindings_differing_only_in_arguments_are_two_resources(rh):
    """Same source, destination and routing key, other arguments: two bindings to RabbitMQ,
    and two properties keys ("key~<hash of the arguments>", pack_binding_props/2), so two
    Terraform ids; each Read must find its own, and deleting one must leave the other."""
    declare_ends(rh, "/")
    first = binding("test", "queue", "order.*", {"x-tenant": "a"})
    second = binding("test", "queue", "order.*", {"x-tenant": "b"})
    first_id = create_binding(rh, "/", first)
    second_id = create_binding(rh, "/", second)
    assert first_id != second_id
    assert read_binding(rh, first_id)["arguments"] == {"x-tenant": "a"}
    assert read_binding(rh, second_id)["arguments"] == {"x-tenant": "b"}
    assert delete_binding(rh, second_id) == 204
    assert read_binding(rh, first_id)["arguments"] == {"x-tenant": "a"}


def test_binding_import_by_documented_id(rh):
    """website/docs/r/binding.html.markdown: `terraform import rabbitmq_binding.test
    test/test/test/queue/%23`, the properties key as RabbitMQ lists it: the routing key "#"
    through quote_plus is "%23" (pack_binding_props/2 with no arguments). Import then Reads."""
    declare_ends(rh, "test")
    rh.send("POST", "bindings/test/e/test/q/test", binding("test", "queue", "#", {}))
    state = read_binding(rh, "test/test/test/queue/%23")
    assert state == {**binding("test", "queue", "#", {}), "vhost": "test", "properties_key": "%23"}


# ---------------------------------------------------------------------------------------------
# rabbitmq_policy and rabbitmq_operator_policy


@pytest.mark.parametrize(
    "kind, declared, changed",
    [
        (
            "policies",
            {
                "pattern": "^orders\\.",
                "priority": 0,
                "apply_to": "queues",
                "definition": {
                    "max-length": "100",
                    "overflow": "reject-publish",
                    "dead-letter-exchange": "dlx",
                },
            },
            {"priority": 3, "definition": {"max-length": "200", "message-ttl": "60000"}},
        ),
        (
            "operator-policies",
            {
                "pattern": ".*",
                "priority": 1,
                "apply_to": "queues",
                "definition": {"max-length": "1000", "message-ttl": "3600000"},
            },
            {"pattern": "^tmp", "definition": {"expires": "60000"}},
        ),
    ],
)
def test_policy_create_read_update_delete(rh, kind, declared, changed):
    create_vhost(rh, "v/1")
    path = f"{kind}/{q('v/1', 'limits')}"
    rh.send("PUT", path, policy_body("v/1", "limits", declared))  # PutPolicy / PutOperatorPolicy
    state = {"name": "limits", "vhost": "v/1", "policy": declared}
    assert applied(read_policy, rh, kind, "limits", "v/1") == state
    update = {**declared, **changed}
    rh.send("PUT", path, policy_body("v/1", "limits", update))
    assert applied(read_policy, rh, kind, "limits", "v/1") == {**state, "policy": update}
    assert rh.send("DELETE", path).status == 204
    assert read_policy(rh, kind, "limits", "v/1") is None
    assert rh.send("DELETE", path).status == 404


# ---------------------------------------------------------------------------------------------
# What else the provider decodes


def test_overview_decodes(rh):
    """Overview is read when a topic permission write fails (checkVersion)."""
    overview = rh.get("overview", GO_OVERVIEW)
    assert overview["rabbitmq_version"]


def test_answers_decode_with_a_consumer_and_messages(rh, mgmt_broker):
    """The queue and exchange Reads decode whatever the objects hold at the time: consumer
    details, message stats and rates included."""
    declare_ends(rh, "/")
    create_binding(rh, "/", binding("test", "queue", "#", {}))
    conn = pika.BlockingConnection(pika.URLParameters(mgmt_broker.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    ch.basic_consume("test", lambda *a: None, consumer_tag="reader")
    for _ in range(5):
        ch.basic_publish("test", "a.b", b"payload")
    conn.process_data_events(0.2)
    mgmt_broker.call(mgmt_broker.broker._management.rates.sample)
    queue = rh.get(f"queues/{q('/', 'test')}", GO_QUEUE_INFO)
    assert queue["consumer_details"][0]["consumer_tag"] == "reader"
    rh.get(f"exchanges/{q('/', 'test')}", GO_DETAILED_EXCHANGE)
    rh.get(f"vhosts/{q('/')}", GO_VHOST_INFO)
    rh.get(f"bindings/{q('/')}/e/test/q/test", GO_BINDINGS)
    conn.close()


def test_list_calls_with_a_trailing_slash(rh):
    """rabbit-hole's ListUsers, ListPermissions and ListTopicPermissions ask for "users/",
    "permissions/" and "topic-permissions/" (the provider's acceptance tests check destroys
    with them). RabbitMQ's HTTP server drops a trailing empty segment (cowboy 2.8.0
    cowboy_router:split_path/2), so they are GET /api/users and so on."""
    rh.send(
        "PUT", f"topic-permissions/{q('/', 'guest')}", {"exchange": "x", "write": "", "read": ""}
    )
    users = rh.get("users/", [GO_USER_INFO])
    assert users is not None and "guest" in [u["name"] for u in users]
    permissions = rh.get("permissions/", [GO_PERMISSION_INFO])
    assert permissions is not None and ("guest", "/") in [
        (p["user"], p["vhost"]) for p in permissions
    ]
    topic = rh.get("topic-permissions/", GO_TOPIC_PERMISSIONS)
    assert topic is not None and [t["exchange"] for t in topic] == ["x"]
