"""queue.declare's refusals, word for word as RabbitMQ 3.10.8 sends them, over real
sockets with pika (which sends an int as a signedint, a str as a longstr, None as void):
each case runs against RoarMQ and, in the slow set, against a RabbitMQ node, with the
same expectation. A redeclaration that differs names both values alone when both are
there ("received '2' but current is '1'"), and their types when one is missing."""

from __future__ import annotations

import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

QUORUM = {"x-queue-type": "quorum"}
INVALID = "PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': "

#: (arguments, the key refused, RabbitMQ's detail after INVALID)
REFUSED = [
    ({"x-expires": "a"}, "x-expires", '"expected integer, got longstr"'),
    ({"x-expires": None}, "x-expires", '"expected integer, got void"'),
    ({"x-message-ttl": True}, "x-message-ttl", '"expected integer, got bool"'),
    ({"x-max-length-bytes": "big"}, "x-max-length-bytes", '"expected integer, got longstr"'),
    ({"x-max-length": [1]}, "x-max-length", '"expected integer, got array"'),
    ({"x-max-length": {"a": 1}}, "x-max-length", '"expected integer, got table"'),
    ({"x-max-priority": None}, "x-max-priority", '"expected integer, got void"'),
    ({"x-max-length": -(2**40)}, "x-max-length", "{value_negative,-1099511627776}"),
    ({"x-queue-mode": 1}, "x-queue-mode", "{unacceptable_type,signedint}"),
    ({"x-queue-mode": None}, "x-queue-mode", "{unacceptable_type,void}"),
    ({"x-overflow": None}, "x-overflow", "{unacceptable_type,void}"),
    ({"x-overflow": 5}, "x-overflow", "{unacceptable_type,signedint}"),
    (
        {"x-single-active-consumer": "yes"},
        "x-single-active-consumer",
        "{unacceptable_type,longstr}",
    ),
    ({"x-single-active-consumer": None}, "x-single-active-consumer", "{unacceptable_type,void}"),
    (
        {"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": 5},
        "x-dead-letter-routing-key",
        "{unacceptable_type,signedint}",
    ),
    (
        {**QUORUM, "x-dead-letter-strategy": "bogus"},
        "x-dead-letter-strategy",
        "invalid_dlx_strategy",
    ),
    (
        {**QUORUM, "x-dead-letter-strategy": 5},
        "x-dead-letter-strategy",
        "{unacceptable_type,signedint}",
    ),
    (
        {**QUORUM, "x-dead-letter-strategy": None},
        "x-dead-letter-strategy",
        "{unacceptable_type,void}",
    ),
]


@pytest.fixture
def ch(target):
    conn = pika.BlockingConnection(pika.URLParameters(target.url))
    yield conn.channel()
    if conn.is_open:
        conn.close()


def declare_refused(ch, name: str, arguments: dict) -> str:
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(name, durable=True, arguments=arguments)
    assert info.value.reply_code == 406
    return info.value.reply_text


@pytest.mark.parametrize(("arguments", "key", "detail"), REFUSED)
def test_a_bad_argument_is_refused_in_rabbitmqs_words(ch, arguments, key, detail):
    name = "q" + uuid.uuid4().hex[:10]
    assert declare_refused(ch, name, arguments) == INVALID.format(key=key, name=name) + detail


def test_the_classic_type_refuses_the_dead_letter_strategy_and_void_exchanges(ch):
    name = "q" + uuid.uuid4().hex[:10]
    assert declare_refused(ch, name, {"x-dead-letter-strategy": "at-least-once"}) == (
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-strategy' for queue '{name}' in "
        "vhost '/' of queue type rabbit_classic_queue"
    )
    ch = ch.connection.channel()
    assert declare_refused(ch, name, {"x-dead-letter-exchange": None}) == (
        f"PRECONDITION_FAILED - invalid type 'void' for arg 'x-dead-letter-exchange' in "
        f"queue '{name}' in vhost '/'"
    )


@pytest.mark.parametrize(
    ("first", "then", "words"),
    [
        (
            {"x-max-length": 1},
            {"x-max-length": 2},
            "'x-max-length' {q}: received '2' but current is '1'",
        ),
        (
            {**QUORUM, "x-dead-letter-strategy": "at-least-once"},
            {**QUORUM, "x-dead-letter-strategy": "at-most-once"},
            "'x-dead-letter-strategy' {q}: received 'at-most-once' but current is 'at-least-once'",
        ),
        (
            {**QUORUM, "x-dead-letter-strategy": "at-least-once"},
            QUORUM,
            "'x-dead-letter-strategy' {q}: received none but current is the value "
            "'at-least-once' of type 'longstr'",
        ),
        (
            {**QUORUM, "x-overflow": "reject-publish"},
            {**QUORUM, "x-overflow": "drop-head"},
            "'x-overflow' {q}: received 'drop-head' but current is 'reject-publish'",
        ),
    ],
)
def test_a_redeclaration_names_what_differs(ch, first, then, words):
    name = "q" + uuid.uuid4().hex[:10]
    ch.queue_declare(name, durable=True, arguments=first)
    where = f"for queue '{name}' in vhost '/'"
    assert declare_refused(ch, name, then) == (
        "PRECONDITION_FAILED - inequivalent arg " + words.format(q=where)
    )
    ch.connection.channel().queue_delete(name)
