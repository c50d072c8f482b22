"""docs/operations.md "Moving from RabbitMQ", step by step, against RabbitMQ 3.10.8: its
definitions exported and imported into RoarMQ (the application's user logs in to RoarMQ
with its RabbitMQ password), consumers moved to RoarMQ with a shovel per queue while a
producer goes on publishing to RabbitMQ, then the producer moved, then RabbitMQ retired:
every message confirmed by either broker is consumed from RoarMQ, none lost."""

from __future__ import annotations

import threading

import pika
import pytest
from support.clusterlib import api_call
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

VHOST = "migrate-shop"
QUEUES = {"orders.eu": "eu.#", "orders.us": "us.#"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(port: int, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, VHOST, credentials))


def publish(port: int, bodies: list[bytes], user: str = "app", password: str = "s3cret") -> None:
    """Each confirmed by the broker (pika raises on a nack)."""
    conn = connect(port, user, password)
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        region = "eu" if int(body.split(b"-")[1]) % 2 else "us"
        ch.basic_publish("orders", f"{region}.new", body, PERSISTENT)
    conn.close()


def ready(port: int, queue: str) -> int:
    conn = connect(port)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def test_a_live_workload_moves_from_rabbitmq_to_roarmq_losing_nothing(rabbitmq, mgmt_broker):
    rabbit = rabbitmq.mgmt_port
    # the workload on RabbitMQ: a vhost, the application's user, a policy, a topic
    # exchange and two durable queues, messages waiting in them
    assert api_call(rabbit, "PUT", f"/api/vhosts/{VHOST}")[0] in (201, 204)
    user = {"password": "s3cret", "tags": ""}
    assert api_call(rabbit, "PUT", "/api/users/app", user)[0] in (201, 204)
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    for who in ("app", "guest"):
        assert api_call(rabbit, "PUT", f"/api/permissions/{VHOST}/{who}", grant)[0] in (201, 204)
    policy = {"pattern": "^orders\\.", "apply-to": "queues", "definition": {"max-length": 100000}}
    assert api_call(rabbit, "PUT", f"/api/policies/{VHOST}/limit", policy)[0] in (201, 204)
    conn = connect(rabbitmq.port, "app", "s3cret")
    ch = conn.channel()
    ch.exchange_declare("orders", "topic", durable=True)
    for queue, key in QUEUES.items():
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, "orders", key)
    conn.close()
    before = [b"order-%d" % i for i in range(400)]
    publish(rabbitmq.port, before)

    # 1. the definitions, exported from RabbitMQ and imported into RoarMQ
    status, _headers, doc = api_call(rabbit, "GET", "/api/definitions")
    assert status == 200
    doc["vhosts"] = [v for v in doc["vhosts"] if v["name"] in ("/", VHOST)]
    status, _ = mgmt_broker.api("POST", "/api/definitions", doc)
    assert status in (200, 201, 204), _
    roar = mgmt_broker.port
    assert mgmt_broker.api("GET", f"/api/policies/{VHOST}/limit")[0] == 200
    connect(roar, "app", "s3cret").close()  # RabbitMQ's password hash, RoarMQ's login

    # 2. consumers on RoarMQ, a shovel per queue from RabbitMQ, a producer still on RabbitMQ
    for queue in QUEUES:
        value = {
            "src-uri": f"amqp://app:s3cret@127.0.0.1:{rabbitmq.port}/{VHOST}",
            "src-queue": queue,
            "dest-uri": f"amqp:///{VHOST}",
            "dest-queue": queue,
        }
        path = f"/api/parameters/shovel/{VHOST}/{queue}"
        assert mgmt_broker.api("PUT", path, {"value": value})[0] == 201
    consumed: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        conn = connect(roar, "app", "s3cret")
        ch = conn.channel()
        for queue in QUEUES:
            ch.basic_consume(queue, lambda c, m, p, body: consumed.append(body), auto_ack=True)
        while not stop.is_set():
            conn.process_data_events(0.05)
        conn.close()

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        during = [b"order-%d" % i for i in range(400, 800)]
        publish(rabbitmq.port, during)  # the producer, not moved yet

        # 3. the producer moves to RoarMQ
        after = [b"order-%d" % i for i in range(800, 1000)]
        publish(roar, after)

        # 4. RabbitMQ's queues stay empty: every message is RoarMQ's, then consumed
        for queue in QUEUES:
            assert until(lambda q=queue: ready(rabbitmq.port, q) == 0, 30), queue
        assert until(lambda: len(set(consumed)) >= 1000, 30), len(set(consumed))
    finally:
        stop.set()
        consumer.join(10)
    assert set(consumed) == set(before + during + after)
    for queue in QUEUES:
        assert mgmt_broker.api("DELETE", f"/api/parameters/shovel/{VHOST}/{queue}")[0] == 204
    assert api_call(rabbit, "DELETE", f"/api/vhosts/{VHOST}")[0] == 204  # RabbitMQ retired
