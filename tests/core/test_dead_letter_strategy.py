"""At-least-once dead-lettering (`x-dead-letter-strategy`, quorum queues with
`x-overflow: reject-publish`), over real sockets with pika: a dead-lettered message
leaves its queue only once every target took it, so no route, a missing exchange or a
full target keeps it (counted in `messages_dlx`) and it is delivered when one appears;
at-most-once (the default, or without reject-publish) drops it as before. Refusals and
their texts as RabbitMQ 3.10.8 answers them (probed)."""

from __future__ import annotations

import time

import pytest
from pika.exceptions import ChannelClosedByBroker
from support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

QUORUM = {"x-queue-type": "quorum"}
AT_LEAST_ONCE = {
    **QUORUM,
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


def reject_one(ch, queue: str, body: bytes) -> None:
    ch.basic_publish("", queue, body)
    method, _props, got = ch.basic_get(queue)
    assert got == body
    ch.basic_reject(method.delivery_tag, requeue=False)


def held(b, queue: str) -> int:
    return b.api("GET", f"/api/queues/%2F/{queue}")[1]["messages_dlx"]


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_no_route_keeps_the_message_until_a_queue_is_bound(b, conn):
    ch = conn.channel()
    ch.exchange_declare("dlx", "direct", durable=True)
    args = {**AT_LEAST_ONCE, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "k"}
    ch.queue_declare("src", durable=True, arguments=args)
    reject_one(ch, "src", b"kept")
    assert count(ch, "src") == 0 and held(b, "src") == 1  # neither ready nor lost
    ch.queue_declare("target", durable=True)
    ch.queue_bind("target", "dlx", "k")
    wait_for(lambda: count(ch, "target") == 1, timeout=10, what="the kept message's delivery")
    _method, props, body = ch.basic_get("target", auto_ack=True)
    assert body == b"kept" and props.headers["x-death"][0]["reason"] == "rejected"
    assert props.headers["x-death"][0]["count"] == 1  # one dead-lettering, however many tries
    assert held(b, "src") == 0


def test_a_missing_exchange_and_a_full_target_keep_it_too(b, conn):
    ch = conn.channel()
    ch.queue_declare(
        "src", durable=True, arguments={**AT_LEAST_ONCE, "x-dead-letter-exchange": "later"}
    )
    reject_one(ch, "src", b"m")
    assert held(b, "src") == 1
    ch.queue_declare("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", "full", b"filler")
    ch.exchange_declare("later", "fanout")
    ch.queue_bind("full", "later")
    time.sleep(2.5)  # two retries at least: the full target keeps refusing it
    assert held(b, "src") == 1 and count(ch, "full") == 1
    assert ch.basic_get("full", auto_ack=True)[2] == b"filler"
    wait_for(lambda: count(ch, "full") == 1, timeout=10, what="the delivery once there is room")
    assert ch.basic_get("full", auto_ack=True)[2] == b"m" and held(b, "src") == 0


def test_expired_and_over_the_delivery_limit_are_dead_lettered_at_least_once(b, conn):
    ch = conn.channel()
    args = {
        **AT_LEAST_ONCE,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "dead",
        "x-message-ttl": 100,
    }
    ch.queue_declare("ttl", durable=True, arguments=args)
    ch.basic_publish("", "ttl", b"expires")
    wait_for(lambda: held(b, "ttl") == 1, timeout=10, what="the expired message held")
    ch.queue_declare("dead", durable=True)
    wait_for(lambda: count(ch, "dead") == 1, timeout=10, what="its delivery")
    assert ch.basic_get("dead", auto_ack=True)[1].headers["x-death"][0]["reason"] == "expired"


def test_at_most_once_drops_what_has_no_route(b, conn):
    ch = conn.channel()
    ch.exchange_declare("dlx", "direct")
    for name, args in (
        ("default", QUORUM),
        ("without-reject-publish", {**QUORUM, "x-dead-letter-strategy": "at-least-once"}),
    ):
        ch.queue_declare(name, durable=True, arguments={**args, "x-dead-letter-exchange": "dlx"})
        reject_one(ch, name, b"gone")
        assert held(b, name) == 0 and count(ch, name) == 0


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (
            {**QUORUM, "x-dead-letter-strategy": "bogus"},
            "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy",
        ),
        (
            {**QUORUM, "x-dead-letter-strategy": 5},
            "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': "
            "{unacceptable_type,signedint}",
        ),
        (
            {"x-dead-letter-strategy": "at-least-once"},
            "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/' of queue type "
            "rabbit_classic_queue",
        ),
    ],
)
def test_refused_as_rabbitmq_refuses_it(conn, args, text):
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q", durable=True, arguments=args)
    assert info.value.reply_code == 406
    assert info.value.reply_text == "PRECONDITION_FAILED - " + text


def test_a_redeclaration_must_name_the_same_strategy(conn):
    ch = conn.channel()
    ch.queue_declare("q", durable=True, arguments=AT_LEAST_ONCE)
    other = {**AT_LEAST_ONCE, "x-dead-letter-strategy": "at-most-once"}
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare("q", durable=True, arguments=other)
    assert info.value.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-strategy' for queue 'q' in "
        "vhost '/': received 'at-most-once' but current is 'at-least-once'"
    )
