"""A message's TTL counts from when it entered its queue, across a kill -9 and a restart,
as RabbitMQ's does: what expired while the broker was down is dead-lettered as soon as it
is back, and what expires later expires when it was due, not a whole TTL after the start.
The broker runs as a real subprocess (pika); time itself is what the test waits for."""

from __future__ import annotations

import time

import pika
import pytest
from support.faultlib import BrokerProcess, connect
from support.waiting import wait_for

# slow (kill -9, a restart and seconds of TTL): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: TTLs in seconds: "short" expires while the broker is down, "long" after it is back.
SHORT, LONG = 6.0, 10.0
#: How long after the publish the broker starts again.
DOWN_UNTIL = 7.0


def _queues(ch) -> None:
    ch.queue_declare("dead", durable=True)
    dead_letter = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    ch.queue_declare("short", durable=True, arguments={**dead_letter, "x-message-ttl": 6000})
    ch.queue_declare("long", durable=True, arguments={**dead_letter, "x-message-ttl": 10000})
    # a TTL of the message's own, in a queue without one
    ch.queue_declare("own", durable=True, arguments=dead_letter)


def test_ttl_counts_from_the_publish_across_a_kill_9(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(broker.port)
        ch = conn.channel()
        ch.confirm_delivery()
        _queues(ch)
        published = time.time()
        ch.basic_publish("", "short", b"short", PERSISTENT)
        ch.basic_publish("", "long", b"long", PERSISTENT)
        own = pika.BasicProperties(delivery_mode=2, expiration="6000")
        ch.basic_publish("", "own", b"own", own)
        assert time.time() - published < 1.0  # confirmed well before anything expires
        broker.kill9()
        time.sleep(max(0.0, published + DOWN_UNTIL - time.time()))
        launched = time.time()
        broker.start()
        conn = connect(broker.port)
        ch = conn.channel()
        seen: dict[bytes, float] = {}

        def dead_letters() -> bool:
            while (got := ch.basic_get("dead", auto_ack=True))[0] is not None:
                seen[got[2]] = time.time()
            return len(seen) == 3

        # Expired while down: dead-lettered at once. Counted from the start again, they
        # could not be before `launched + SHORT`.
        wait_for(lambda: {b"short", b"own"} <= seen.keys() or dead_letters(), timeout=30)
        assert max(seen[b"short"], seen[b"own"]) < launched + SHORT - 1.0
        assert b"long" not in seen  # due at published + LONG, not yet
        assert ch.queue_declare("long", passive=True).method.message_count == 1
        wait_for(dead_letters, timeout=30, what="the long TTL's dead letter")
        # Due at published + LONG (never before); from the start again, not before
        # launched + LONG.
        assert published + LONG <= seen[b"long"] < launched + LONG - 1.0
        for queue in ("short", "long", "own"):
            assert ch.queue_declare(queue, passive=True).method.message_count == 0
        conn.close()
    finally:
        broker.stop()
