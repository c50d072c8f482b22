"""Shovels and federation links as RabbitMQ 3.10.8's management API shows them, compared
field by field: the same steps against RabbitMQ (its shovel and federation plugins on)
and against RoarMQ, and the same answers: status codes, parameter rows, shovel and link
status rows (all but the node's name, the time and the ports), refusal reasons (RabbitMQ
HTML-escapes them: compared unescaped), and the `x-shovelled` header as delivered."""

from __future__ import annotations

import html
import time

import pika
import pytest
from support.clusterlib import api_call
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Side:
    """One broker under comparison: its AMQP and management ports."""

    def __init__(self, name: str, port: int, mgmt_port: int) -> None:
        self.name, self.port, self.mgmt_port = name, port, mgmt_port

    def api(self, method: str, path: str, body=None) -> tuple[int, object]:
        status, _headers, doc = api_call(self.mgmt_port, method, path, body)
        return status, doc

    def channel(self):
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port)).channel()


@pytest.fixture
def sides(rabbitmq, mgmt_broker):
    return [
        Side("rabbitmq", rabbitmq.port, rabbitmq.mgmt_port),
        Side("roarmq", mgmt_broker.port, mgmt_broker.broker.mgmt_port),
    ]


def normal(doc, side: Side):
    """A row with what differs by nature between two brokers made alike: the node's name,
    times, our own ports; reasons unescaped."""
    if isinstance(doc, (list, tuple)):
        return type(doc)(normal(d, side) for d in doc)
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            if key in ("node", "timestamp", "shovelled-by"):
                value = "*"
            elif isinstance(value, str):
                value = value.replace(f":{side.port}", ":PORT")
                value = html.unescape(value) if key == "reason" else value
            else:
                value = normal(value, side)
            out[key] = value
        return out
    return doc


def ours(doc):
    """A list answer's rows of this test's own objects (named p-...): the RabbitMQ node
    serves the package's other tests too."""
    status, rows = doc
    mine = [r for r in rows if str(r.get("name", r.get("exchange", ""))).startswith("p-")]
    return status, mine


def same(results: dict[str, object]) -> None:
    rabbit, roar = results["rabbitmq"], results["roarmq"]
    assert roar == rabbit, f"\nRabbitMQ: {rabbit}\nRoarMQ:   {roar}"


def each(sides, step):
    return {side.name: normal(step(side), side) for side in sides}


SHOVEL = {
    "src-uri": "amqp://",
    "src-queue": "p-src",
    "dest-uri": "amqp://",
    "dest-queue": "p-dst",
    "dest-add-forward-headers": True,
    "dest-publish-properties": {"delivery_mode": 2, "app_id": "shov"},
}

BAD_SHOVELS = [
    {},
    {"value": {"src-queue": "a", "dest-uri": "amqp://", "dest-queue": "b"}},
    {"value": {**SHOVEL, "src-uri": "http://x"}},
    {"value": {**SHOVEL, "src-uri": "amqp://h:70000"}},
    {"value": {**SHOVEL, "src-uri": ["amqp://", "foo://"]}},
    {"value": {**SHOVEL, "src-uri": 5}},
    {"value": {**SHOVEL, "foo": 1}},
    {"value": {**SHOVEL, "src-exchange": "x"}},
    {"value": {**SHOVEL, "dest-exchange": "x"}},
    {"value": {**SHOVEL, "src-prefetch-count": "x"}},
    {"value": {**SHOVEL, "ack-mode": "sometimes"}},
    {"value": {**SHOVEL, "src-delete-after": "soon"}},
    {"value": {**SHOVEL, "src-delete-after": 5, "ack-mode": "no-ack"}},
    {"value": {**SHOVEL, "reconnect-delay": "x"}},
    {"value": {**SHOVEL, "dest-add-forward-headers": "yes"}},
    {"value": {**SHOVEL, "dest-publish-properties": {"nope": 1}}},
]


def test_shovels_answer_as_rabbitmqs_do(sides):
    for side in sides:
        ch = side.channel()
        ch.queue_delete("p-src")
        ch.queue_delete("p-dst")
        ch.queue_declare("p-src", durable=True)
    path = "/api/parameters/shovel/%2F/p-move"
    same(each(sides, lambda s: s.api("PUT", path, {"value": SHOVEL})[0]))  # 201
    same(each(sides, lambda s: s.api("PUT", path, {"value": SHOVEL})[0]))  # 204
    same(each(sides, lambda s: ours(s.api("GET", "/api/parameters/shovel"))))
    same(each(sides, lambda s: s.api("GET", path)))

    def running(side):
        rows = ours(side.api("GET", "/api/shovels/%2F"))[1]
        return rows if rows and rows[0]["state"] == "running" else None

    same({side.name: normal(until(lambda s=side: running(s), 20), side) for side in sides})
    for side in sides:
        props = pika.BasicProperties(headers={"h": 1}, priority=3)
        side.channel().basic_publish("", "p-src", b"hello", props)

    got = {}
    for side in sides:
        ch = side.channel()
        for _ in range(100):
            method, props, body = ch.basic_get("p-dst", auto_ack=True)
            if method is not None:
                got[side.name] = normal(
                    {
                        "routing_key": method.routing_key,
                        "exchange": method.exchange,
                        "properties": {
                            "app_id": props.app_id,
                            "delivery_mode": props.delivery_mode,
                            "priority": props.priority,
                            "headers": props.headers,
                        },
                        "body": body.decode(),
                    },
                    side,
                )
                break
            time.sleep(0.1)
    same(got)
    for body in BAD_SHOVELS:
        same(each(sides, lambda s, b=body: s.api("PUT", "/api/parameters/shovel/%2F/p-bad", b)))
    same(each(sides, lambda s: s.api("GET", "/api/parameters/shovel/%2F/p-bad")))
    restart = "/api/shovels/vhost/%2F/p-move/restart"
    same(each(sides, lambda s: s.api("DELETE", restart)))
    same(each(sides, lambda s: s.api("DELETE", "/api/shovels/vhost/%2F/p-nope/restart")))
    same(each(sides, lambda s: s.api("DELETE", path)))
    same(each(sides, lambda s: s.api("DELETE", path)))
    same(each(sides, lambda s: s.api("GET", path)))
    # src-delete-after: what was there moves, and the parameter goes
    for side in sides:
        ch = side.channel()
        for i in range(3):
            ch.basic_publish("", "p-src", b"m%d" % i)
    once = {**SHOVEL, "src-delete-after": "queue-length"}
    same(each(sides, lambda s: s.api("PUT", "/api/parameters/shovel/%2F/p-once", {"value": once})))
    for side in sides:
        assert until(lambda s=side: ours(s.api("GET", "/api/parameters/shovel"))[1] == [], 20)
    same(each(sides, lambda s: ours(s.api("GET", "/api/shovels"))))
    same(
        each(sides, lambda s: s.channel().queue_declare("p-dst", passive=True).method.message_count)
    )


def test_federation_answers_as_rabbitmqs_does(sides):
    up = "/api/parameters/federation-upstream/%2F/p-up"
    gone = {"value": {"uri": "amqp://u:pw@127.0.0.1:1", "expires": 3600000}}
    same(each(sides, lambda s: s.api("PUT", up, gone)[0]))
    bad = {"value": {"uri": "x://", "max-hops": "a"}}
    same(each(sides, lambda s: s.api("PUT", "/api/parameters/federation-upstream/%2F/p-up2", bad)))
    unknown = {"value": {"uri": "amqp://", "zzz": 1}}
    same(
        each(
            sides, lambda s: s.api("PUT", "/api/parameters/federation-upstream/%2F/p-up3", unknown)
        )
    )
    upset = {"value": [{"upstream": "p-up"}]}
    same(
        each(
            sides,
            lambda s: s.api("PUT", "/api/parameters/federation-upstream-set/%2F/p-set", upset)[0],
        )
    )
    same(each(sides, lambda s: ours(s.api("GET", "/api/parameters/federation-upstream"))))
    policy = {
        "pattern": "^p-fed",
        "apply-to": "exchanges",
        "definition": {"federation-upstream-set": "p-set"},
    }
    same(each(sides, lambda s: s.api("PUT", "/api/policies/%2F/p-fed", policy)[0]))
    for side in sides:
        side.channel().exchange_declare("p-fed.x", "topic", durable=True)

    def failed(side):
        rows = ours(side.api("GET", "/api/federation-links/%2F"))[1]
        return rows if rows and rows[0]["status"] == "error" else None

    same({side.name: normal(until(lambda s=side: failed(s), 20), side) for side in sides})
    # (both retry every reconnect-delay, "starting" a moment each time: asked until down)
    same(
        {
            side.name: normal(
                until(
                    lambda s=side: ours(s.api("GET", "/api/federation-links/%2F/state/down"))[1],
                    20,
                ),
                side,
            )
            for side in sides
        }
    )
    same(each(sides, lambda s: s.api("DELETE", "/api/policies/%2F/p-fed")[0]))
    for side in sides:
        assert until(lambda s=side: ours(s.api("GET", "/api/federation-links"))[1] == [], 20)
    for path in (up, "/api/parameters/federation-upstream-set/%2F/p-set"):
        same(each(sides, lambda s, p=path: s.api("DELETE", p)[0]))
