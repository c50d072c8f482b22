"""pika's BlockingConnection, unmodified: publish/consume, confirms, returns, heartbeats."""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError

pytestmark = pytest.mark.timeout(30)


def connect(broker, **kwargs) -> pika.BlockingConnection:
    params = pika.URLParameters(broker.url)
    for key, value in kwargs.items():
        setattr(params, key, value)
    return pika.BlockingConnection(params)


def test_publish_and_consume(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("pika-q")
    for i in range(20):
        ch.basic_publish(
            "",
            "pika-q",
            f"m{i}".encode(),
            pika.BasicProperties(content_type="text/plain", headers={"n": i}),
        )
    bodies = []
    for method, props, body in ch.consume("pika-q", inactivity_timeout=2):
        if method is None:
            break
        bodies.append(body)
        assert props.headers["n"] == len(bodies) - 1
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == 20:
            break
    ch.cancel()
    assert bodies == [f"m{i}".encode() for i in range(20)]
    conn.close()


def test_confirms_and_returns(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("pika-confirm", exclusive=True)
    for _ in range(50):
        ch.basic_publish("", "pika-confirm", b"x")  # raises if nacked
    with pytest.raises(UnroutableError):
        ch.basic_publish("amq.direct", "nobody-home", b"x", mandatory=True)
    assert ch.queue_declare("pika-confirm", passive=True).method.message_count == 50
    conn.close()


def test_basic_get_and_reject(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("pika-get", exclusive=True)
    ch.basic_publish("", "pika-get", b"one")
    method, _, body = ch.basic_get("pika-get")
    assert body == b"one" and not method.redelivered
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = ch.basic_get("pika-get")
    assert body == b"one" and method.redelivered
    ch.basic_ack(method.delivery_tag)
    assert ch.basic_get("pika-get") == (None, None, None)
    conn.close()


def test_channel_error_reply_code(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("does-not-exist", passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no queue 'does-not-exist' in vhost '/'"
    ch2 = conn.channel()  # the connection lives on
    ch2.queue_declare("", exclusive=True)
    conn.close()


@pytest.mark.slow  # waits out heartbeats: not in `make check`
def test_heartbeats_keep_idle_connection_alive(thread_broker):
    """Negotiated heartbeat of 1 s: the broker's frames keep pika happy while idle."""
    conn = connect(thread_broker, heartbeat=1)
    ch = conn.channel()
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.5)
    assert conn.is_open
    ch.queue_declare("", exclusive=True)
    server_conns = thread_broker.call(
        lambda: [c.heartbeat for c in thread_broker.broker.connections]
    )
    assert server_conns == [1]
    conn.close()
