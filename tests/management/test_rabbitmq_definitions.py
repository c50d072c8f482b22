"""A definitions file exported from RabbitMQ 3.10.8 (data/rabbitmq-3.10.8-shop-definitions.json:
a vhost with a user, permissions, a topic permission, a vhost limit, a policy, exchanges with
an alternate exchange, queues and exchange-to-exchange bindings) imports into RoarMQ, behaves
as it did in RabbitMQ, and exports back to the same definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pika
import pytest

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)

EXPORT = json.loads(
    (Path(__file__).parent / "data" / "rabbitmq-3.10.8-shop-definitions.json").read_text()
)


def channel(b, user="guest", password="guest"):
    params = pika.ConnectionParameters(
        "127.0.0.1", b.port, "shop", pika.PlainCredentials(user, password)
    )
    conn = pika.BlockingConnection(params)
    return conn, conn.channel()


def count(ch, queue):
    return ch.queue_declare(queue, passive=True).method.message_count


def test_import_behave_and_export_back(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("POST", "/api/definitions", EXPORT)[0] == 204
        assert b.api(
            "PUT", "/api/permissions/shop/guest", {"configure": ".*", "write": ".*", "read": ".*"}
        )[0] in (201, 204)
        conn, ch = channel(b)
        # The policy's max-length (5) is below the queue's x-max-length (1000): 5 wins, and
        # what drop-head pushes out is dead-lettered through amq.fanout to shop-dead.
        for i in range(7):
            ch.basic_publish("events", "order.new", b"%d" % i)
        assert count(ch, "shop-orders") == 5
        assert count(ch, "shop-dead") == 2
        _, props, _ = ch.basic_get("shop-dead", auto_ack=True)
        assert props.headers["x-death"][0]["reason"] == "maxlen"
        # events --#--> audit --> shop-audit; strict's alternate exchange is audit.
        assert count(ch, "shop-audit") == 7
        ch.basic_publish("strict", "no-binding", b"to the alternate")
        assert count(ch, "shop-audit") == 8
        conn.close()
        # RabbitMQ's password hash logs shopper in; the topic permission holds.
        conn, ch = channel(b, "shopper", "s3cret")
        ch.confirm_delivery()
        ch.basic_publish("events", "shopper.note", b"mine")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.basic_publish("events", "order.new", b"not mine")
        assert info.value.reply_code == 403
        assert "access to topic 'order.new' in exchange 'events'" in info.value.reply_text
        conn.close()
        # The vhost limit came in as RabbitMQ's parameter.
        assert b.api("GET", "/api/vhost-limits/shop")[1] == [
            {"vhost": "shop", "value": {"max-queues": 10}}
        ]
        out = b.api("GET", "/api/definitions")[1]

    def by(key, rows, fields):
        return sorted(
            (
                tuple(json.dumps(r.get(f), sort_keys=True) for f in fields)
                for r in rows
                if r.get("vhost", "shop") == "shop"
            ),
        )

    for key, fields in {
        "queues": ("name", "durable", "auto_delete", "arguments"),
        "exchanges": ("name", "type", "durable", "auto_delete", "internal", "arguments"),
        "bindings": ("source", "destination", "destination_type", "routing_key", "arguments"),
        "policies": ("name", "pattern", "apply-to", "definition", "priority"),
        "topic_permissions": ("user", "exchange", "write", "read"),
        "parameters": ("component", "name", "value"),
    }.items():
        assert by(key, out[key], fields) == by(key, EXPORT[key], fields), key
    shopper = next(u for u in out["users"] if u["name"] == "shopper")
    assert shopper["password_hash"] == EXPORT["users"][0]["password_hash"]
    assert shopper["tags"] == ["management"]
