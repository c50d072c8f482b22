"""Streams (x-queue-type: stream) through pika and aio-pika against a real broker.

The expected codes and texts are RabbitMQ 3.10.8's answers to the same scenarios (probed
over AMQP 0-9-1 with pika; docs/streams.md lists where RoarMQ chose otherwise: an
unparsable x-stream-offset and basic.recover, which crash 3.10's channel with 541, and
dead-lettering into a stream, which 3.10 silently drops).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import aio_pika
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker
from support.faultlib import BrokerProcess

pytestmark = pytest.mark.timeout(60)

STREAM = {"x-queue-type": "stream"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(target) -> pika.BlockingConnection:  # a BrokerThread or a BrokerProcess
    return pika.BlockingConnection(
        pika.URLParameters(target.url() if callable(target.url) else target.url)
    )


def declare_error(ch_conn, name: str, **kwargs) -> tuple[int, str]:
    ch = ch_conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.queue_declare(name, **kwargs)
    return exc.value.reply_code, exc.value.reply_text


def publish(conn: pika.BlockingConnection, queue: str, bodies, exchange: str = "") -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish(exchange, queue, body, PERSISTENT)  # raises if nacked
    ch.close()


def read(conn, queue: str, offset=None, count: int = 10**9, timeout: float = 1.5, qos: int = 100):
    """(x-stream-offset, body) of what a consumer from `offset` gets within `timeout`."""
    ch = conn.channel()
    # no more in flight than wanted: pika's channel.close nacks what it has not handed out,
    # and a stream answers a nack with 540 (as RabbitMQ does)
    ch.basic_qos(prefetch_count=min(qos, count))
    got: list[tuple[int, bytes]] = []

    def on_message(ch_, method, props, body) -> None:
        got.append((props.headers["x-stream-offset"], body))
        ch_.basic_ack(method.delivery_tag)

    args = {} if offset is None else {"x-stream-offset": offset}
    ch.basic_consume(queue, on_message, arguments=args)
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    ch.close()
    return got


# -- declaring ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "prop"),
    [
        ({"durable": False}, "non-durable"),
        ({"durable": True, "exclusive": True}, "exclusive-owner"),
        ({"durable": True, "auto_delete": True}, "auto-delete"),
    ],
)
def test_declare_refuses_properties(thread_broker, flags, prop):
    conn = connect(thread_broker)
    code, text = declare_error(conn, "s", arguments=STREAM, **flags)
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid property '{prop}' for queue 's' in vhost '/'",
    )
    conn.close()


INVALID = [
    ("x-message-ttl", 1000),
    ("x-expires", 1000),
    ("x-dead-letter-exchange", "dlx"),
    ("x-dead-letter-routing-key", "k"),
    ("x-max-length", 10),
    ("x-max-priority", 5),
    ("x-overflow", "reject-publish"),
    ("x-single-active-consumer", True),
    ("x-queue-mode", "lazy"),
    ("x-delivery-limit", 3),
    ("x-quorum-initial-group-size", 3),
    ("x-max-in-memory-length", 1),
    ("x-queue-master-locator", "client-local"),
]


def test_declare_refuses_arguments_of_other_types(thread_broker):
    conn = connect(thread_broker)
    for key, value in INVALID:
        code, text = declare_error(conn, "s", durable=True, arguments={**STREAM, key: value})
        assert (code, text) == (
            406,
            f"PRECONDITION_FAILED - invalid arg '{key}' for queue 's' in vhost '/' of queue "
            "type rabbit_stream_queue",
        )
    conn.close()


def test_declare_checks_retention_values(thread_broker):
    conn = connect(thread_broker)
    prefix = "PRECONDITION_FAILED - invalid arg"
    for key, value, detail in [
        ("x-max-age", "1x", "invalid_max_age"),
        ("x-max-age", "10", "invalid_max_age"),
        ("x-max-age", "0s", "invalid_max_age"),
        ("x-max-age", 5, "{unacceptable_type,signedint}"),
        ("x-max-length-bytes", -1, "{value_negative,-1}"),
        ("x-stream-max-segment-size-bytes", -5, "{value_negative,-5}"),
        ("x-stream-max-segment-size-bytes", "x", '"expected integer, got longstr"'),
    ]:
        code, text = declare_error(conn, "s", durable=True, arguments={**STREAM, key: value})
        assert (code, text) == (406, f"{prefix} '{key}' for queue 's' in vhost '/': {detail}")
    ch = conn.channel()
    for i, extra in enumerate(
        [
            {"x-max-age": "1D"},
            {"x-max-age": "12h"},
            {"x-max-length-bytes": 0},
            {"x-stream-max-segment-size-bytes": 3_000_000_000},
            {"x-initial-cluster-size": 1, "x-consumer-timeout": 1000, "x-foo": 1},
        ]
    ):
        ok = ch.queue_declare(f"ok{i}", durable=True, arguments={**STREAM, **extra})
        assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)
    conn.close()


def test_redeclare_must_be_equivalent(thread_broker):
    conn = connect(thread_broker)
    args = {**STREAM, "x-max-age": "7D", "x-stream-max-segment-size-bytes": 1000}
    conn.channel().queue_declare("s", durable=True, arguments=args)
    conn.channel().queue_declare("s", durable=True, arguments=args)  # the same: fine
    pre = "PRECONDITION_FAILED - inequivalent arg"
    cases = [
        (
            {**args, "x-max-age": "8D"},
            f"{pre} 'x-max-age' for queue 's' in vhost '/': received '8D' but current is '7D'",
        ),
        (
            {**STREAM, "x-stream-max-segment-size-bytes": 1000},
            f"{pre} 'x-max-age' for queue 's' in vhost '/': received none but current is the "
            "value '7D' of type 'longstr'",
        ),
        (
            {**args, "x-max-length-bytes": 100000},
            f"{pre} 'x-max-length-bytes' for queue 's' in vhost '/': received the value "
            "'100000' of type 'signedint' but current is none",
        ),
        (
            {"x-queue-type": "classic"},
            f"{pre} 'x-queue-type' for queue 's' in vhost '/': received 'classic' but current "
            "is 'stream'",
        ),
    ]
    for arguments, text in cases:
        assert declare_error(conn, "s", durable=True, arguments=arguments) == (406, text)
    conn.close()


# -- consuming ----------------------------------------------------------------------------


def test_offsets(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [f"m{i}".encode() for i in range(100)])
    everything = [(i, f"m{i}".encode()) for i in range(100)]
    assert read(conn, "s", "first", 100) == everything
    assert read(conn, "s", -1, 100) == everything
    assert read(conn, "s", 50, 50) == everything[50:]
    assert read(conn, "s", 1000, timeout=0.5) == []
    assert read(conn, "s", "next", timeout=0.5) == []
    assert read(conn, "s", None, timeout=0.5) == []
    assert read(conn, "s", "last", timeout=0.5) == [(99, b"m99")]  # one message, one chunk
    past = datetime.datetime.utcnow() - datetime.timedelta(hours=1)
    future = datetime.datetime.utcnow() + datetime.timedelta(hours=1)
    assert read(conn, "s", past, 100) == everything
    assert read(conn, "s", future, timeout=0.5) == []
    assert read(conn, "s", "1h", 100) == everything
    assert read(conn, "s", "30m", 100) == everything
    ok = conn.channel().queue_declare("s", passive=True)
    assert ok.method.message_count == 100  # acks removed nothing
    conn.close()


def test_timestamp_offset_starts_at_the_first_newer_message(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [b"old"] * 10)
    time.sleep(1.1)
    middle = datetime.datetime.utcnow()
    publish(conn, "s", [b"new"] * 5)
    got = read(conn, "s", middle, 5)
    assert [b for _, b in got] == [b"new"] * 5
    assert got[0][0] == 10
    conn.close()


def test_consume_refusals(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume("s", lambda *a: None)
        conn.process_data_events(0.2)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 's' in vhost '/''",
    )
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)  # a channel-wide prefetch is not enough
    with pytest.raises(ChannelClosedByBroker) as exc:
        ch.basic_consume("s", lambda *a: None)
    assert exc.value.reply_code == 406
    for args, text in [
        (
            {"x-priority": 3},
            "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 's' in vhost '/' of "
            "queue type rabbit_stream_queue",
        ),
        (
            {"x-stream-offset": "foo"},  # 3.10: 541 INTERNAL_ERROR (a crash); later: refused
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue 's' in vhost '/': "
            "'foo' is not first, last, next, an offset, a timestamp or an interval",
        ),
    ]:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        with pytest.raises(ChannelClosedByBroker) as exc:
            ch.basic_consume("s", lambda *a: None, arguments=args)
        assert (exc.value.reply_code, exc.value.reply_text) == (406, text)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    with pytest.raises(ConnectionClosedByBroker) as exc:
        ch.basic_consume("s", lambda *a: None, auto_ack=True)
        conn.process_data_events(0.2)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        540,
        "NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues queue 's' "
        "in vhost '/'",
    )


def _refused(thread_broker, action) -> tuple[int, str]:
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [b"a", b"b"])
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as exc:
        action(conn, ch)
        conn.process_data_events(0.5)
    return exc.value.reply_code, exc.value.reply_text


def _two_deliveries(conn, ch) -> list[int]:
    ch.basic_qos(prefetch_count=5)
    tags: list[int] = []
    ch.basic_consume(
        "s", lambda c, m, p, b: tags.append(m.delivery_tag), arguments={"x-stream-offset": "first"}
    )
    while len(tags) < 2:
        conn.process_data_events(0.05)
    return tags


NACK_TEXT = "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues queue 's' in vhost '/'"


@pytest.mark.parametrize(
    ("action", "text"),
    [
        (
            lambda conn, ch: ch.basic_get("s"),
            "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 's' in vhost '/'",
        ),
        (
            lambda conn, ch: ch.basic_get("s", auto_ack=True),
            "NOT_IMPLEMENTED - basic.get not supported by stream queues queue 's' in vhost '/'",
        ),
        (
            lambda conn, ch: ch.queue_purge("s"),
            "NOT_IMPLEMENTED - queue.purge not supported by stream queues queue 's' in vhost '/'",
        ),
        (lambda conn, ch: ch.basic_nack(_two_deliveries(conn, ch)[0], requeue=True), NACK_TEXT),
        (lambda conn, ch: ch.basic_nack(_two_deliveries(conn, ch)[0], requeue=False), NACK_TEXT),
        (lambda conn, ch: ch.basic_reject(_two_deliveries(conn, ch)[0]), NACK_TEXT),
        # 3.10 crashes the channel (541); we answer as a nack would be answered
        (lambda conn, ch: (_two_deliveries(conn, ch), ch.basic_recover(True)), NACK_TEXT),
    ],
    ids=["get", "get-no-ack", "purge", "nack-requeue", "nack", "reject", "recover"],
)
def test_refused_operations_close_the_connection(thread_broker, action, text):
    assert _refused(thread_broker, action) == (540, text)


def test_acks_return_credit_and_consumers_are_independent(thread_broker):
    conn = connect(thread_broker)
    conn.channel().queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [str(i).encode() for i in range(300)])
    a = read(conn, "s", "first", 300, timeout=5, qos=1)  # prefetch 1: credit comes from acks
    b = read(conn, "s", "first", 300, timeout=5, qos=7)
    assert a == b == [(i, str(i).encode()) for i in range(300)]
    assert conn.channel().queue_declare("s", passive=True).method.message_count == 300
    conn.close()


def test_live_tailing_many_consumers(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [b"before"])
    ch.basic_qos(prefetch_count=10)
    got: dict[str, list] = {"first": [], "next": [], "last": []}
    for name in got:
        ch.basic_consume(
            "s",
            lambda c, m, p, b, name=name: (
                got[name].append((p.headers["x-stream-offset"], b)),
                c.basic_ack(m.delivery_tag),
            ),
            arguments={"x-stream-offset": name},
        )
    conn.process_data_events(0.3)
    other = connect(thread_broker)
    publish(other, "s", [f"live{i}".encode() for i in range(50)])
    deadline = time.monotonic() + 5
    want = {"first": 51, "next": 50, "last": 51}  # each consumer reads at its own pace
    while any(len(got[k]) < n for k, n in want.items()) and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    live = [(i + 1, f"live{i}".encode()) for i in range(50)]
    assert got["first"] == [(0, b"before"), *live]
    assert got["last"] == [(0, b"before"), *live]
    assert got["next"] == live
    other.close()
    conn.close()


def test_publish_through_exchanges_cc_and_dead_letters(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    ch.exchange_declare("t", "topic")
    ch.queue_bind("s", "t", "a.#")
    ch.confirm_delivery()
    ch.basic_publish("t", "a.b", b"topic", PERSISTENT)
    ch.basic_publish("t", "x", b"cc", pika.BasicProperties(headers={"CC": ["s"]}))  # unbound key
    ch.basic_publish("", "x", b"cc-default", pika.BasicProperties(headers={"CC": ["s"]}))
    ch.basic_publish("", "s", b"mandatory", mandatory=True)
    # dead-lettering into a stream (3.10 drops these silently; 3.11+ and RoarMQ keep them)
    ch.exchange_declare("dlx", "fanout")
    ch.queue_bind("s", "dlx")
    ch.queue_declare("src", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 1})
    ch.basic_publish("", "src", b"dead")
    time.sleep(0.3)
    got = read(conn, "s", "first", 4)
    assert [b for _, b in got] == [b"topic", b"cc-default", b"mandatory", b"dead"]
    conn.close()


def test_delete_cancels_consumers(thread_broker):
    conn = connect(thread_broker)
    ch = conn.channel()
    ch.queue_declare("s", durable=True, arguments=STREAM)
    publish(conn, "s", [b"x"])
    ch.basic_qos(prefetch_count=5)
    cancelled = []
    ch.add_on_cancel_callback(lambda m: cancelled.append(m))
    ch.basic_consume("s", lambda c, m, p, b: c.basic_ack(m.delivery_tag))
    other = connect(thread_broker)
    assert other.channel().queue_delete("s").method.message_count == 1
    conn.process_data_events(0.3)
    assert len(cancelled) == 1
    # gone, and a new stream of the same name starts empty
    other.channel().queue_declare("s", durable=True, arguments=STREAM)
    assert read(other, "s", "first", timeout=0.3) == []
    conn.close()
    other.close()


# -- retention ----------------------------------------------------------------------------


def _segment_files(broker_data: Path) -> int:
    return sum(1 for _ in broker_data.glob("streams/*/*.seg"))


def test_retention_by_size_removes_whole_segments(thread_broker, tmp_path):
    conn = connect(thread_broker)
    args = {**STREAM, "x-stream-max-segment-size-bytes": 4096, "x-max-length-bytes": 20000}
    conn.channel().queue_declare("s", durable=True, arguments=args)
    body = b"x" * 100
    publish(conn, "s", [body] * 1000)
    time.sleep(0.2)
    got = read(conn, "s", "first", 1000, timeout=1)
    offsets = [o for o, _ in got]
    assert offsets == list(range(offsets[0], 1000))  # contiguous to the end
    assert 100 < len(got) < 300  # ~20 kB of ~150-byte records (whole segments)
    count = conn.channel().queue_declare("s", passive=True).method.message_count
    assert count == len(got)
    assert _segment_files(tmp_path / "data") < 12
    conn.close()


def test_retention_by_age(thread_broker):
    conn = connect(thread_broker)
    args = {**STREAM, "x-stream-max-segment-size-bytes": 4096, "x-max-age": "1s"}
    conn.channel().queue_declare("s", durable=True, arguments=args)
    publish(conn, "s", [b"o" * 100] * 100)
    time.sleep(2.1)
    publish(conn, "s", [b"n" * 100] * 100)  # rolls segments: retention runs
    got = read(conn, "s", "first", 200, timeout=1)
    assert got[0][0] >= 70 and got[-1][0] == 199
    assert {b for o, b in got if o >= 100} == {b"n" * 100}
    conn.close()


def test_max_length_bytes_policy_takes_effect(thread_broker):
    conn = connect(thread_broker)
    args = {**STREAM, "x-stream-max-segment-size-bytes": 4096}
    conn.channel().queue_declare("s", durable=True, arguments=args)
    publish(conn, "s", [b"x" * 100] * 300)
    assert conn.channel().queue_declare("s", passive=True).method.message_count == 300
    body = {"pattern": "^s$", "apply-to": "queues", "definition": {"max-length-bytes": 10000}}
    thread_broker.call(lambda: thread_broker.broker.set_policy("/", "cap", body))
    publish(conn, "s", [b"y" * 100] * 100)  # rolls a segment: retention runs
    count = conn.channel().queue_declare("s", passive=True).method.message_count
    assert 40 < count < 130
    conn.close()


# -- aio-pika -----------------------------------------------------------------------------


async def test_aio_pika_publish_and_replay(broker):
    conn = await aio_pika.connect(broker.url)
    ch = await conn.channel(publisher_confirms=True)
    await ch.set_qos(prefetch_count=50)
    queue = await ch.declare_queue("events", durable=True, arguments=STREAM)
    for i in range(20):
        await ch.default_exchange.publish(
            aio_pika.Message(f"e{i}".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="events",
        )
    got = []
    async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
        async for message in it:
            got.append((message.headers["x-stream-offset"], message.body))
            await message.ack()
            if len(got) == 20:
                break
    assert got == [(i, f"e{i}".encode()) for i in range(20)]
    await conn.close()


# -- restart and kill -9 ------------------------------------------------------------------


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "kill-9"])
def test_streams_survive_restart(tmp_path, crash):
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        conn = connect(proc)
        args = {**STREAM, "x-stream-max-segment-size-bytes": 8192}
        conn.channel().queue_declare("s", durable=True, arguments=args)
        publish(conn, "s", [f"a{i}".encode() for i in range(500)])  # confirmed: fsynced
        if crash:
            proc.kill9()
        else:
            conn.close()
            proc.stop()
        proc.start()
        conn = connect(proc)
        ok = conn.channel().queue_declare("s", durable=True, arguments=args)
        assert ok.method.message_count == 500
        # a consumer at `next` sees only what is published after the restart
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        fresh: list = []
        ch.basic_consume(
            "s",
            lambda c, m, p, b: (
                fresh.append((p.headers["x-stream-offset"], b)),
                c.basic_ack(m.delivery_tag),
            ),
            arguments={"x-stream-offset": "next"},
        )
        conn.process_data_events(0.2)
        publish(conn, "s", [f"b{i}".encode() for i in range(10)])
        deadline = time.monotonic() + 5
        while len(fresh) < 10 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        assert fresh == [(500 + i, f"b{i}".encode()) for i in range(10)]
        got = read(conn, "s", "first", 510, timeout=3)
        offsets = [o for o, _ in got]
        assert offsets == list(range(510))  # every offset once, none twice
        assert got[499] == (499, b"a499")
        assert read(conn, "s", 250, 260)[0] == (250, b"a250")
        status, row = proc.call("/api/queues/%2F/s")
        assert status == 200
        assert (row["type"], row["messages"], row["first_offset"]) == ("stream", 510, 0)
        assert row["committed_offset"] == 509 and row["segments"] >= 2
        conn.close()
    finally:
        proc.stop()
