"""A quorum queue's delayed retry (RabbitMQ 4.3's `x-delayed-retry-*`), over real sockets
with pika: a returned message waits min(min x delivery count, max) ms before it is ready
again, never less; which returns wait follows the retry type (basic.reject and a lost
channel are failed deliveries, basic.nack hands a message back); the delivery limit
still dead-letters; set by argument or policy, seen in the API as `messages_delayed`."""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

pytestmark = pytest.mark.timeout(60)

MIN_MS, MAX_MS = 300, 700


def retrying_queue(ch, name: str, kind: str = "all", **extra) -> None:
    arguments = {
        "x-queue-type": "quorum",
        "x-delayed-retry-type": kind,
        "x-delayed-retry-min": MIN_MS,
        "x-delayed-retry-max": MAX_MS,
        **extra,
    }
    ch.queue_declare(name, durable=True, arguments=arguments)


def get_within(ch, queue: str, timeout: float = 5.0):
    """The next message basic.get finds (polling), and when it found it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(queue)
        if method is not None:
            return method, props, body, time.monotonic()
        time.sleep(0.005)
    raise AssertionError(f"nothing in {queue} within {timeout} s")


def test_a_rejected_message_waits_longer_each_time_up_to_the_max(ch, b):
    retrying_queue(ch, "work")
    ch.basic_publish("", "work", b"poison")
    method, _props, _body, _ = get_within(ch, "work")
    waits = []
    for _ in range(3):
        ch.basic_reject(method.delivery_tag, requeue=True)
        rejected = time.monotonic()
        assert ch.basic_get("work")[0] is None  # not ready: waiting out its retry
        assert ch.queue_declare("work", passive=True).method.message_count == 0
        assert b.api("GET", "/api/queues/%2F/work")[1]["messages_delayed"] == 1
        method, _props, body, back = get_within(ch, "work")
        assert body == b"poison" and method.redelivered
        waits.append(back - rejected)
    # 1 x 300, 2 x 300, then 3 x 300 capped at 700 ms: never sooner
    for wait, due in zip(waits, (0.3, 0.6, 0.7), strict=True):
        assert wait >= due - 0.002, waits
    assert b.api("GET", "/api/queues/%2F/work")[1]["messages_delayed"] == 0
    ch.basic_ack(method.delivery_tag)


def test_failed_delays_rejects_and_returned_delays_nacks(ch):
    retrying_queue(ch, "on-failure", "failed")
    retrying_queue(ch, "on-return", "returned")
    for queue in ("on-failure", "on-return"):
        ch.basic_publish("", queue, queue.encode())
    # basic.nack hands the message back: "failed" makes it ready at once
    method, *_ = get_within(ch, "on-failure")
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert ch.basic_get("on-failure")[0] is not None
    # basic.reject is a failed delivery: "returned" makes it ready at once
    method, *_ = get_within(ch, "on-return")
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, *_ = get_within(ch, "on-return", timeout=0.1)
    # and the other way round, each waits
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert ch.basic_get("on-return")[0] is None
    get_within(ch, "on-return")


def test_a_closed_channel_is_a_failed_delivery_and_order_is_kept(b):
    connection = pika.BlockingConnection(pika.URLParameters(b.url))
    ch = connection.channel()
    retrying_queue(ch, "lost", "failed")
    for n in range(5):
        ch.basic_publish("", "lost", b"%d" % n)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=5)
    got = []
    consumer.basic_consume("lost", lambda c, m, p, body: got.append(body))
    while len(got) < 5:
        connection.process_data_events(0.05)
    consumer.close()  # five unacked, returned as failed: they wait, then come back in order
    closed = time.monotonic()
    assert ch.basic_get("lost")[0] is None
    again = [get_within(ch, "lost") for _ in range(5)]
    assert [body for _m, _p, body, _t in again] == [b"%d" % n for n in range(5)]
    assert min(at for *_, at in again) - closed >= MIN_MS / 1000 - 0.002
    connection.close()


def test_the_delivery_limit_still_dead_letters(ch):
    ch.queue_declare("dead")
    retrying_queue(
        ch,
        "limited",
        "all",
        **{
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead",
        },
    )
    ch.basic_publish("", "limited", b"twice")
    method, *_ = get_within(ch, "limited")
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, *_ = get_within(ch, "limited")
    ch.basic_reject(method.delivery_tag, requeue=True)  # over the limit: dead-lettered now
    method, props, body = ch.basic_get("dead")
    assert body == b"twice" and props.headers["x-death"][0]["reason"] == "delivery_limit"
    # with delayed retry on, a nack is not a failed delivery (4.3's delivery count): it
    # never reaches the limit
    ch.basic_publish("", "limited", b"handed back")
    for _ in range(3):
        method, _props, body, _ = get_within(ch, "limited")
        ch.basic_nack(method.delivery_tag, requeue=True)
    method, _props, body, _ = get_within(ch, "limited")
    assert body == b"handed back" and ch.basic_get("dead")[0] is None


def test_a_policy_sets_it_and_a_bad_type_is_refused(b, ch):
    definition = {"delayed-retry-type": "all", "delayed-retry-min": MIN_MS}
    status, _ = b.api(
        "PUT",
        "/api/policies/%2F/retry",
        {"pattern": "^by-policy$", "definition": definition, "apply-to": "quorum_queues"},
    )
    assert status in (201, 204)
    ch.queue_declare("by-policy", durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", "by-policy", b"m")
    method, *_ = get_within(ch, "by-policy")
    ch.basic_reject(method.delivery_tag, requeue=True)
    assert ch.basic_get("by-policy")[0] is None
    get_within(ch, "by-policy")
    # a classic queue takes the arguments and ignores them, as RabbitMQ does
    ch.queue_declare("classic", arguments={"x-delayed-retry-type": "all"})
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(
            "bad",
            durable=True,
            arguments={"x-queue-type": "quorum", "x-delayed-retry-type": "later"},
        )
    assert info.value.reply_code == 406
    assert "x-delayed-retry-type" in info.value.reply_text
