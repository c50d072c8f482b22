"""pyrabbit2 (PyPI `pyrabbit2` 1.0.7, a Python client of RabbitMQ's management API), its
`Client` run unmodified against RoarMQ for its everyday calls, asserting on what it returns
the way a user of it would.

What pyrabbit2 sends, read from its api.py/http.py: `requests` with basic auth against
`http://host:port/api/`; names passed through `quote(name, '')` (vhost "/" becomes %2F) except
user names and a binding's routing key, which go into the path as they are; JSON bodies with
Content-Type application/json, except `publish`, which sends none; any status outside 200-206
raises `HTTPError`, and a body-less success returns the status code itself.

Left out as pyrabbit2's own bugs (they fail against RabbitMQ 3.10 just the same):
`get_queue_depths(vhost, names)` quotes the vhost twice (%252F), and `delete_binding` with a
routing key holding "#" or "+" puts it raw into the URL (a fragment, or a space once decoded).
"""

from __future__ import annotations

import time

import pika
import pytest
from pyrabbit2.api import APIError, Client
from pyrabbit2.http import HTTPError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(mgmt_broker):
    return Client(f"127.0.0.1:{mgmt_broker.broker.mgmt_port}", "guest", "guest")


def amqp(broker, user: str = "guest", password: str = "guest", vhost: str = "/"):
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=broker.port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials(user, password),
    )
    return pika.BlockingConnection(params)


def test_node_overview_and_aliveness(client):
    assert client.is_alive() is True
    with pytest.raises(APIError):  # a vhost that does not exist: RabbitMQ's 404
        client.is_alive("no-such-vhost")
    overview = client.get_overview()
    assert overview["rabbitmq_version"]
    assert overview["queue_totals"]["messages"] == 0
    assert {"queues", "exchanges", "connections"} <= set(overview["object_totals"])
    nodes = client.get_nodes()
    assert [n["name"] for n in nodes] == [overview["node"]]
    assert nodes[0]["running"] is True
    assert client.get_whoami()["name"] == "guest"
    assert client.get_extensions() == []


def test_users_vhosts_and_permissions(client, mgmt_broker):
    assert "guest" in [u["name"] for u in client.get_users()]
    client.create_user("ann", "s3cret", tags="management,policymaker")
    ann = next(u for u in client.get_users() if u["name"] == "ann")
    assert sorted(ann["tags"]) == ["management", "policymaker"]

    assert client.get_vhost_names() == ["/"]
    client.create_vhost("team/a")
    assert sorted(client.get_vhost_names()) == ["/", "team/a"]
    assert client.get_vhost("team/a")["name"] == "team/a"

    client.set_vhost_permissions("team/a", "ann", "^ann\\.", ".*", ".*")
    wanted = {"user": "ann", "vhost": "team/a", "configure": "^ann\\.", "write": ".*", "read": ".*"}
    assert wanted in client.get_permissions()
    assert client.get_permission("team/a", "ann") == wanted
    assert client.get_vhost_permissions("team/a") == [wanted]
    assert client.get_user_permissions("ann") == [wanted]

    # The user and the grant are real: ann logs in over AMQP, within her configure pattern.
    conn = amqp(mgmt_broker, "ann", "s3cret", "team/a")
    ch = conn.channel()
    ch.queue_declare("ann.inbox")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare("bob.inbox")  # outside ^ann\.
    conn.close()

    client.delete_permission("team/a", "ann")
    assert client.get_vhost_permissions("team/a") == []
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        amqp(mgmt_broker, "ann", "s3cret", "team/a")

    client.delete_vhost("team/a")
    assert client.get_vhost_names() == ["/"]
    client.delete_user("ann")
    assert "ann" not in [u["name"] for u in client.get_users()]
    with pytest.raises(HTTPError) as missing:
        client.delete_user("ann")
    assert missing.value.status == 404


def test_exchanges_queues_bindings_and_messages(client, capsys):
    assert client.create_exchange("/", "shop", "topic") is True
    shop = client.get_exchange("/", "shop")
    assert (shop["name"], shop["type"], shop["durable"], shop["auto_delete"]) == (
        "shop",
        "topic",
        True,
        False,
    )
    assert "shop" in [x["name"] for x in client.get_exchanges()]
    assert "shop" in [x["name"] for x in client.get_exchanges("/")]

    client.create_queue("/", "orders", durable=True)
    client.create_queue("/", "audit", durable=False, auto_delete=False)
    orders = client.get_queue("/", "orders")
    assert (orders["name"], orders["vhost"], orders["durable"]) == ("orders", "/", True)
    assert {"orders", "audit"} <= {q["name"] for q in client.get_queues()}
    assert {"orders", "audit"} == {q["name"] for q in client.get_queues("/")}
    # pattern= pages through ?page=N&name=... (use_regex too), reading items and page_count
    assert [q["name"] for q in client.get_queues("/", pattern="ord")] == ["orders"]
    assert [q["name"] for q in client.get_queues(pattern="^a", regex=True)] == ["audit"]

    client.create_binding("/", "shop", "orders", "order.*")
    client.create_binding("/", "shop", "audit", "order.paid", {"x-note": "books"})
    bound = [
        (b["source"], b["destination"], b["routing_key"], b["arguments"])
        for b in client.get_bindings()
        if b["source"] == "shop"
    ]
    assert sorted(bound) == [
        ("shop", "audit", "order.paid", {"x-note": "books"}),
        ("shop", "orders", "order.*", {}),
    ]
    on_orders = client.get_queue_bindings("/", "orders")
    # the default exchange's implicit binding first, as RabbitMQ lists it
    assert [(b["source"], b["routing_key"]) for b in on_orders] == [
        ("", "orders"),
        ("shop", "order.*"),
    ]

    assert client.publish("/", "shop", "order.new", "first") is True
    assert client.publish("/", "shop", "order.paid", "second", properties={"delivery_mode": 2})
    assert client.publish("/", "shop", "nobody.listens", "lost") is False
    assert client.get_queue_depth("/", "orders") == 2
    assert client.get_queue_depth("/", "audit") == 1
    client.get_queue_depths("/")  # prints each queue's depth
    assert "\t" in capsys.readouterr().out

    peeked = client.get_messages("/", "orders", count=1, requeue=True)
    assert [(m["payload"], m["routing_key"], m["exchange"]) for m in peeked] == [
        ("first", "order.new", "shop")
    ]
    assert client.get_queue_depth("/", "orders") == 2  # requeued
    taken = client.get_messages("/", "orders", count=5, truncate=3)
    assert [m["payload"] for m in taken] == ["fir", "sec"]
    assert taken[0]["redelivered"] is True and taken[1]["payload_bytes"] == 6
    assert taken[1]["properties"]["delivery_mode"] == 2
    assert client.get_queue_depth("/", "orders") == 0

    client.publish("/", "shop", "order.new", "again")
    client.purge_queue("/", "orders")
    assert client.purge_queues([("audit", "/")]) is True
    assert client.get_queue_depth("/", "orders") == 0
    assert client.get_queue_depth("/", "audit") == 0

    client.delete_binding("/", "shop", "orders", "order.*")  # the routing key as the props
    assert [b["source"] for b in client.get_queue_bindings("/", "orders")] == [""]
    assert client.publish("/", "shop", "order.new", "unbound") is False

    client.delete_queue("/", "orders")
    assert "orders" not in [q["name"] for q in client.get_queues("/")]
    assert client.delete_exchange("/", "shop") is True
    with pytest.raises(HTTPError) as missing:
        client.get_exchange("/", "shop")
    assert missing.value.status == 404


def test_queue_depths_of_named_queues(client, capsys):
    client.create_vhost("depths")
    client.create_queue("depths", "jobs")
    client.publish("depths", "amq.default", "jobs", "one")
    client.get_queue_depths("depths", ["jobs"])
    assert capsys.readouterr().out == "\tjobs: 1\n"


def test_connections_and_channels(client, mgmt_broker):
    assert client.get_connections() == []
    conn = amqp(mgmt_broker)
    ch = conn.channel()
    rows = client.get_connections()
    assert [(c["user"], c["vhost"], c["channels"]) for c in rows] == [("guest", "/", 1)]
    name = rows[0]["name"]
    assert client.get_connection(name)["name"] == name  # quote(name, '') in the path
    channels = client.get_channels()
    assert [(c["number"], c["connection_details"]["name"]) for c in channels] == [(1, name)]
    assert client.get_channel(channels[0]["name"])["number"] == 1

    assert client.delete_connection(name) is True
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        ch.queue_declare("after-close", passive=True)
    deadline = time.monotonic() + 5
    while client.get_connections():
        assert time.monotonic() < deadline, client.get_connections()
        time.sleep(0.05)
    assert client.get_channels() == []
    with pytest.raises(HTTPError) as missing:
        client.get_connection(name)
    assert missing.value.status == 404


def test_policies_and_definitions(client):
    client.create_policy(
        "/",
        "cap",
        pattern="^orders$",
        definition={"max-length": 5},
        priority=1,
        **{"apply-to": "queues"},
    )
    policy = client.get_policy("/", "cap")
    assert (policy["pattern"], policy["definition"], policy["apply-to"]) == (
        "^orders$",
        {"max-length": 5},
        "queues",
    )
    assert [p["name"] for p in client.get_all_policies()] == ["cap"]
    client.delete_policy("/", "cap")
    assert client.get_all_policies() == []

    client.create_queue("/", "kept", durable=True)
    definitions = client.get_definitions()
    assert "kept" in [q["name"] for q in definitions["queues"]]
    assert "guest" in [u["name"] for u in definitions["users"]]


def test_cluster_name(client):
    # GET /api/cluster-name: RabbitMQ answers {"name": <cluster name>}
    # (rabbit_mgmt_wm_cluster_name:to_json, routed at "/cluster-name" by rabbit_mgmt_dispatcher).
    assert client.get_cluster_name() == {"name": client.get_overview()["cluster_name"]}
