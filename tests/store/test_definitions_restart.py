"""Durable definitions survive a restart; transient ones do not (as in RabbitMQ)."""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from roarmq.broker.testing import BrokerThread, ephemeral_config

pytestmark = pytest.mark.timeout(60)


def api(broker, method: str, path: str, body: dict | None = None, auth: str = "guest:guest"):
    status, data = broker.api(method, path, body, auth)
    assert status < 400, (status, data)
    return status, data


def test_durable_definitions_restored_transient_gone(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    with BrokerThread(cfg, management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("dur-x", "topic", durable=True, arguments={"x-note": 7})
        ch.exchange_declare("tmp-x", "fanout", durable=False)
        ch.queue_declare(
            "dur-q", durable=True, arguments={"x-max-length": 5, "x-message-ttl": 60000}
        )
        ch.queue_declare("tmp-q", durable=False)
        ch.queue_bind("dur-q", "dur-x", "a.*.c")
        ch.queue_bind("tmp-q", "dur-x", "x.#")  # transient queue: binding not kept
        ch.exchange_declare("dur-x2", "fanout", durable=True)
        ch.exchange_bind("dur-x2", "dur-x", "#")
        conn.close()
        assert api(b, "PUT", "/api/vhosts/extra")[0] == 201
        assert (
            api(b, "PUT", "/api/users/alice", {"password": "s3cret", "tags": "management"})[0]
            == 201
        )
        assert api(
            b,
            "PUT",
            "/api/permissions/extra/alice",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )[0] in (201, 204)
    with BrokerThread(cfg, management=True) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.exchange_declare("dur-x", "topic", durable=True, passive=True)
        ok = ch.queue_declare("dur-q", durable=True, passive=True)
        assert ok.method.queue == "dur-q"
        # Redeclaring with the same arguments is accepted: they were restored exactly.
        ch.queue_declare(
            "dur-q", durable=True, arguments={"x-max-length": 5, "x-message-ttl": 60000}
        )
        ch.exchange_declare("dur-x", "topic", durable=True, arguments={"x-note": 7})
        for name, declare in (
            ("tmp-x", lambda c: c.exchange_declare("tmp-x", passive=True)),
            ("tmp-q", lambda c: c.queue_declare("tmp-q", passive=True)),
        ):
            c = conn.channel()
            with pytest.raises(ChannelClosedByBroker) as info:
                declare(c)
            assert info.value.reply_code == 404, name
        ch = conn.channel()
        ch.basic_publish("dur-x", "a.b.c", b"routed")
        method, _, body = ch.basic_get("dur-q", auto_ack=True)
        assert body == b"routed"
        defs = api(b, "GET", "/api/definitions")[1]
        assert {
            "source": "dur-x",
            "vhost": "/",
            "destination": "dur-x2",
            "destination_type": "exchange",
            "routing_key": "#",
            "arguments": {},
        } in defs["bindings"]
        conn.close()
        alice = pika.BlockingConnection(
            pika.URLParameters(f"amqp://alice:s3cret@127.0.0.1:{b.port}/extra")
        )
        alice.channel().queue_declare("in-extra", exclusive=True)
        alice.close()
        assert api(b, "GET", "/api/overview", auth="alice:s3cret")[0] == 200


def test_definitions_import_and_export_round_trip(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    doc = {
        "vhosts": [{"name": "/"}],
        "exchanges": [
            {
                "name": "imp-x",
                "vhost": "/",
                "type": "headers",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "queues": [
            {
                "name": "imp-q",
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-queue-type": "classic"},
            }
        ],
        "bindings": [
            {
                "source": "imp-x",
                "vhost": "/",
                "destination": "imp-q",
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {"x-match": "any", "kind": "invoice"},
            }
        ],
    }
    with BrokerThread(cfg, management=True) as b:
        assert api(b, "POST", "/api/definitions", doc)[0] == 204
        out = api(b, "GET", "/api/definitions")[1]
        assert doc["bindings"][0] in out["bindings"]
        assert any(q["name"] == "imp-q" for q in out["queues"])
    with BrokerThread(cfg) as b:
        conn = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = conn.channel()
        ch.basic_publish("imp-x", "", b"inv", pika.BasicProperties(headers={"kind": "invoice"}))
        assert ch.basic_get("imp-q", auto_ack=True)[2] == b"inv"
        conn.close()
