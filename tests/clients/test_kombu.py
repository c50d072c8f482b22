"""kombu (Celery's transport) over py-amqp, unmodified."""

from __future__ import annotations

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

pytestmark = pytest.mark.timeout(30)


def test_producer_consumer_topic(thread_broker):
    exchange = Exchange("kombu-x", type="topic", durable=False)
    queue = Queue("kombu-q", exchange=exchange, routing_key="tasks.#", durable=False)
    received = []
    with Connection(f"pyamqp://guest:guest@127.0.0.1:{thread_broker.port}//") as conn:
        with conn.channel() as channel:
            producer = Producer(channel, exchange=exchange)
            for i in range(10):
                producer.publish(
                    {"n": i}, routing_key=f"tasks.add.{i}", declare=[queue], serializer="json"
                )
            producer.publish({"n": -1}, routing_key="other.thing", serializer="json")

            def on_message(body, message):
                received.append(body["n"])
                message.ack()

            with Consumer(channel, queues=[queue], callbacks=[on_message]):
                while len(received) < 10:
                    conn.drain_events(timeout=5)
    assert received == list(range(10))


def test_simple_queue_roundtrip(thread_broker):
    with Connection(f"amqp://guest:guest@127.0.0.1:{thread_broker.port}//") as conn:
        q = conn.SimpleQueue("kombu-simple")
        q.put({"hello": "world"})
        msg = q.get(timeout=5)
        assert msg.payload == {"hello": "world"}
        msg.ack()
        q.close()
