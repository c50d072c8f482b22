"""Federation with RabbitMQ 3.10.8 at the other end: RoarMQ federates an exchange and a
queue from RabbitMQ (whose federation plugin gives the link RabbitMQ's
x-federation-upstream exchange type there; against a RoarMQ upstream, which has no such
type, the link falls back to a fanout and checks hops itself: tests/links/test_federation.py),
and RabbitMQ federates an exchange from RoarMQ (RoarMQ takes the declarations, bindings
and `x-bound-from` arguments RabbitMQ's link makes, and its fallback to a fanout)."""

from __future__ import annotations

import base64
import json
import urllib.request

import pika
import pytest
from support.federation import federation_keys
from support.queues import ready
from support.waiting import until

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def roar(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/cluster-name", {"name": "roar-cluster"})[0] == 204
        yield b


def rabbit_api(node, method: str, path: str, body=None):
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.mgmt_port}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        data = resp.read()
    return json.loads(data) if data else None


def channel(port: int):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).channel()


def running_links(api):
    rows = api()
    return rows if rows and all(r["status"] == "running" for r in rows) else None


def test_roarmq_federates_an_exchange_and_a_queue_from_rabbitmq(rabbitmq, roar):
    uri = f"amqp://guest:guest@127.0.0.1:{rabbitmq.port}"
    value = {"value": {"uri": uri}}
    assert roar.api("PUT", "/api/parameters/federation-upstream/%2F/rabbit", value)[0] == 201
    for name, apply_to in (("^from-rabbit", "exchanges"), ("^jobs$", "queues")):
        policy = {
            "pattern": name,
            "apply-to": apply_to,
            "definition": {"federation-upstream": "rabbit"},
        }
        assert roar.api("PUT", f"/api/policies/%2F/{apply_to}", policy)[0] == 201
    ch = channel(roar.port)
    ch.exchange_declare("from-rabbit", "direct", durable=True)
    ch.queue_declare("here")
    ch.queue_bind("here", "from-rabbit", "k")
    upstream = channel(rabbitmq.port)
    upstream.queue_declare("jobs", durable=True)
    for i in range(30):
        upstream.basic_publish("", "jobs", b"j%d" % i)
    ch.queue_declare("jobs", durable=True)
    rows = until(lambda: running_links(lambda: roar.api("GET", "/api/federation-links")[1]), 20)
    assert rows and len(rows) == 2, roar.api("GET", "/api/federation-links")
    # RabbitMQ has the exchange now (declared as ours), and the link's queue and binding
    upstream.exchange_declare("from-rabbit", "direct", durable=True, passive=True)
    on_rabbitmq = lambda: federation_keys(lambda p: rabbit_api(rabbitmq, "GET", p), "from-rabbit")  # noqa: E731
    assert until(lambda: on_rabbitmq() == {"k"}, 15), on_rabbitmq()
    for i in range(20):
        upstream.basic_publish("from-rabbit", "k", b"m%d" % i)
    upstream.basic_publish("from-rabbit", "other", b"not bound")
    assert until(lambda: ready(roar.port, "here") == 20, 15), ready(roar.port, "here")
    _m, props, body = ch.basic_get("here", auto_ack=True)
    (entry,) = props.headers["x-received-from"]
    assert entry["cluster-name"] == rabbit_api(rabbitmq, "GET", "/api/cluster-name")["name"]
    assert (
        entry["uri"] == f"amqp://127.0.0.1:{rabbitmq.port}" and entry["exchange"] == "from-rabbit"
    )
    assert ready(rabbitmq.port, "jobs") == 30  # no consumer here yet: the queue link waits
    got = []
    ch.basic_consume("jobs", lambda c, m, p, b: got.append(b), auto_ack=True)
    until(lambda: ch.connection.process_data_events(0.05) or len(got) == 30, 20)
    assert sorted(got) == sorted(b"j%d" % i for i in range(30))


def test_rabbitmq_federates_an_exchange_from_roarmq(rabbitmq, roar):
    uri = f"amqp://guest:guest@127.0.0.1:{roar.port}"
    rabbit_api(
        rabbitmq, "PUT", "/api/parameters/federation-upstream/%2F/roar", {"value": {"uri": uri}}
    )
    policy = {
        "pattern": "^from-roar",
        "apply-to": "exchanges",
        "definition": {"federation-upstream": "roar"},
    }
    rabbit_api(rabbitmq, "PUT", "/api/policies/%2F/from-roar", policy)
    down = channel(rabbitmq.port)
    down.exchange_declare("from-roar", "topic", durable=True)
    down.queue_declare("there")
    down.queue_bind("there", "from-roar", "t.#")

    def links():
        return rabbit_api(rabbitmq, "GET", "/api/federation-links/%2F")

    rows = until(lambda: running_links(links), 30)
    assert rows, links()
    up = channel(roar.port)
    up.exchange_declare("from-roar", "topic", durable=True, passive=True)
    on_roarmq = lambda: federation_keys(lambda p: roar.api("GET", p)[1], "from-roar")  # noqa: E731
    assert until(lambda: on_roarmq() == {"t.#"}, 15), on_roarmq()  # RabbitMQ's link's binding
    for i in range(20):
        up.basic_publish("from-roar", "t.x", b"r%d" % i)
    up.basic_publish("from-roar", "u.x", b"not bound there")
    assert until(lambda: ready(rabbitmq.port, "there") == 20, 15), ready(rabbitmq.port, "there")
    _m, props, _b = down.basic_get("there", auto_ack=True)
    (entry,) = props.headers["x-received-from"]
    assert entry["cluster-name"] == "roar-cluster"
    rabbit_api(rabbitmq, "DELETE", "/api/policies/%2F/from-roar")
    rabbit_api(rabbitmq, "DELETE", "/api/parameters/federation-upstream/%2F/roar")
