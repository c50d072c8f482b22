"""A quorum queue's delivery counts and delayed retries survive a kill -9, as RabbitMQ's
do (its Raft log keeps them): the count goes on from where it was (`x-delivery-count` on
the next delivery, the delivery limit still dead-letters at its number), and a message a
delayed retry holds stays held until its ready time, never ready sooner because the
broker restarted. The broker runs as a real subprocess (pika)."""

from __future__ import annotations

import time

import pika
import pytest
from support.faultlib import BrokerProcess, connect
from support.waiting import wait_for

# slow (kill -9, restarts and seconds of retry): `make check` leaves it out
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
#: The delayed retry of the held message (ms): long enough to outlast a kill and a start.
HOLD_MS = 10000


def _synced(ch) -> None:
    """Everything the broker wrote so far is on disk: a confirmed persistent publish's
    fsync covers the records before it (the returned records ride with it)."""
    ch.basic_publish("", "sync", b"sync", PERSISTENT)


def _nack_until(ch, queue: str, count: int) -> None:
    """Get the queue's message and hand it back until its delivery count is `count`."""
    for n in range(count):
        method, props, _body = ch.basic_get(queue)
        assert method is not None, (queue, n)
        assert props.headers == {"x-delivery-count": n}, props.headers  # 0 the first time
        ch.basic_nack(method.delivery_tag, requeue=True)


def test_delivery_counts_and_the_delivery_limit_go_on_after_a_kill_9(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = connect(broker.port).channel()
        ch.confirm_delivery()
        ch.queue_declare("sync", durable=True)
        ch.queue_declare("dead", durable=True)
        quorum = {"x-queue-type": "quorum"}
        ch.queue_declare("counted", durable=True, arguments=quorum)
        limited = {
            **quorum,
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        }
        ch.queue_declare("limited", durable=True, arguments=limited)
        ch.basic_publish("", "counted", b"counted", PERSISTENT)
        ch.basic_publish("", "limited", b"limited", PERSISTENT)
        _nack_until(ch, "counted", 2)
        _nack_until(ch, "limited", 3)
        _synced(ch)
        broker.kill9()
        broker.start()
        ch = connect(broker.port).channel()
        method, props, body = ch.basic_get("counted")
        assert body == b"counted" and method.redelivered
        # a long ("l"), as RabbitMQ writes it: pika decodes it to an int either way, the
        # splice's own test checks the type byte
        assert props.headers == {"x-delivery-count": 2}
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, props, _ = ch.basic_get("counted")
        assert props.headers == {"x-delivery-count": 3}
        ch.basic_ack(method.delivery_tag)
        # the fourth delivery of a message limited to 3 returns: dead-lettered
        method, props, _ = ch.basic_get("limited")
        assert props.headers == {"x-delivery-count": 3}
        ch.basic_nack(method.delivery_tag, requeue=True)
        assert ch.basic_get("limited")[0] is None
        wait_for(lambda: ch.queue_declare("dead", passive=True).method.message_count == 1)
    finally:
        broker.stop()


def test_a_delayed_retry_holds_its_message_across_a_kill_9(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        ch = connect(broker.port).channel()
        ch.confirm_delivery()
        ch.queue_declare("sync", durable=True)
        arguments = {
            "x-queue-type": "quorum",
            "x-delayed-retry-type": "all",
            "x-delayed-retry-min": HOLD_MS,
            "x-delayed-retry-max": HOLD_MS,
        }
        ch.queue_declare("retrying", durable=True, arguments=arguments)
        ch.basic_publish("", "retrying", b"poison", PERSISTENT)
        method, _props, _body = ch.basic_get("retrying")
        ch.basic_reject(method.delivery_tag, requeue=True)
        ready_at = time.time() + HOLD_MS / 1000
        _synced(ch)
        broker.kill9()
        broker.start()
        started = time.time()
        assert started < ready_at - 1.0, "the restart took too long to show the hold"
        ch = connect(broker.port).channel()
        assert ch.basic_get("retrying")[0] is None  # still held, not ready at the start
        row = broker.api("/api/queues/%2F/retrying")
        assert row["messages_delayed"] == 1 and row["messages"] == 0, row
        got: list[tuple[float, pika.BasicProperties, bytes]] = []

        def ready() -> bool:
            method, props, body = ch.basic_get("retrying", auto_ack=True)
            if method is not None:
                got.append((time.time(), props, body))
            return bool(got)

        wait_for(ready, timeout=HOLD_MS / 1000 + 10, step=0.005, what="the retried message")
        at, props, body = got[0]
        assert body == b"poison"
        assert at >= ready_at - 0.05, (at, ready_at)  # never sooner (clock rounding aside)
        assert at < ready_at + 3.0, (at, ready_at)  # and at its time, not much later
        assert props.headers == {"x-delivery-count": 1}
        assert broker.api("/api/queues/%2F/retrying")["messages_delayed"] == 0
    finally:
        broker.stop()
