"""Moving live traffic off RabbitMQ 3.10.8 with a RoarMQ shovel, and back: a queue's
messages on RabbitMQ move to RoarMQ through a shovel RoarMQ runs, each acked on RabbitMQ
only once RoarMQ confirmed it, so a RoarMQ killed mid-move (kill -9) loses none; and a
RoarMQ queue shovelled to RabbitMQ arrives whole."""

from __future__ import annotations

import pika
import pytest
from support.broker_process import BrokerProcess
from support.queues import ready
from support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
MESSAGES = 2000


def connect(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def drain(port: int, queue: str) -> list[bytes]:
    conn = connect(port)
    ch = conn.channel()
    bodies = []
    while (got := ch.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.append(got[2])
    conn.close()
    return bodies


def test_a_rabbitmq_queue_moves_to_roarmq_and_a_kill_9_mid_move_loses_nothing(rabbitmq, tmp_path):
    rabbit = connect(rabbitmq.port)
    ch = rabbit.channel()
    ch.confirm_delivery()
    ch.queue_declare("legacy", durable=True)
    for i in range(MESSAGES):
        ch.basic_publish("", "legacy", b"m%d" % i, PERSISTENT)  # each confirmed by RabbitMQ
    rabbit.close()
    roar = BrokerProcess(tmp_path / "data").start()
    try:
        value = {
            "src-uri": f"amqp://guest:guest@127.0.0.1:{rabbitmq.port}",
            "src-queue": "legacy",
            "src-prefetch-count": 50,
            "dest-uri": "amqp://",
            "dest-queue": "legacy",
            "reconnect-delay": 1,
        }
        assert roar.call("/api/parameters/shovel/%2F/off-rabbit", "PUT", {"value": value})[0] == 201
        assert until(lambda: ready(roar.port, "legacy") >= MESSAGES // 4, 30)
        roar.kill9()  # mid-move: RabbitMQ takes back what RoarMQ had not confirmed
        roar.start()
        assert until(lambda: ready(rabbitmq.port, "legacy") == 0, 60), ready(
            rabbitmq.port, "legacy"
        )
        # every message on RoarMQ (at least once: one RoarMQ confirmed whose ack the kill
        # stopped on its way to RabbitMQ is moved again, as RabbitMQ's shovel would)
        assert until(lambda: ready(roar.port, "legacy") >= MESSAGES, 30)
        rows = roar.api("/api/shovels")
        assert [r["state"] for r in rows] == ["running"], rows
        assert rows[0]["src_uri"] == f"amqp://127.0.0.1:{rabbitmq.port}"  # no credentials
        bodies = drain(roar.port, "legacy")
        assert {b"m%d" % i for i in range(MESSAGES)} == set(bodies)
        assert len(bodies) - MESSAGES < MESSAGES // 4, "more moved twice than were in flight"
        assert roar.call("/api/parameters/shovel/%2F/off-rabbit", "DELETE")[0] == 204
    finally:
        roar.stop()


def test_a_roarmq_queue_moves_to_rabbitmq_whole(rabbitmq, tmp_path):
    roar = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(roar.port)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("outbound", durable=True)
        for i in range(500):
            ch.basic_publish("", "outbound", b"o%d" % i, PERSISTENT)
        conn.close()
        value = {
            "src-uri": "amqp://",
            "src-queue": "outbound",
            "dest-uri": f"amqp://guest:guest@127.0.0.1:{rabbitmq.port}/%2F",
            "dest-queue": "inbound",
            "src-delete-after": "queue-length",
        }
        assert roar.call("/api/parameters/shovel/%2F/to-rabbit", "PUT", {"value": value})[0] == 201
        assert until(lambda: roar.api("/api/parameters/shovel") == [], 30)
        assert ready(roar.port, "outbound") == 0
        assert sorted(drain(rabbitmq.port, "inbound")) == sorted(b"o%d" % i for i in range(500))
    finally:
        roar.stop()
