"""Streams over AMQP 0-9-1 where a client sees RoarMQ answer as RabbitMQ 3.10.8 does.

Each test runs its client steps against RoarMQ and, marked `slow`, against a RabbitMQ
3.10.8 node of the module's own (tests/support/rabbitmq.py), asserting the same answers on
both, so the expectation is RabbitMQ's observed behaviour and not a reading of it. Queue
names are fresh per test: the RabbitMQ node serves the whole module. What RoarMQ does on
purpose otherwise is in docs/streams.md ("Differences from RabbitMQ 3.10.8"); the
retention timer, which 3.10.8 lacks, is tested against RoarMQ alone at the end.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from support.rawclient import RawClient
from support.waiting import until_async

from roarmq.broker.core.stream import Stream
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(180)

STREAM = {"x-queue-type": "stream"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
MODULES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}


@pytest.fixture
def name() -> str:
    return "s" + uuid.uuid4().hex[:12]


def connect(target) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(target.url))


def publish(conn: pika.BlockingConnection, queue: str, bodies) -> None:
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, PERSISTENT)  # raises if nacked
    ch.close()


def refused(conn: pika.BlockingConnection, action) -> tuple[int, str]:
    """The channel close `action(channel)` gets."""
    ch = conn.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        action(ch)
        conn.process_data_events(0.3)
    return exc.value.reply_code, exc.value.reply_text


def consume(conn, queue: str, got: list, *, offset="first", exclusive=False) -> None:
    """A consumer of `queue` that appends (x-stream-offset, body) to `got` and acks."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)

    def on_message(ch_, method, props, body) -> None:
        got.append((props.headers["x-stream-offset"], body))
        ch_.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message, exclusive=exclusive, arguments={"x-stream-offset": offset})


def pump(conn, done, timeout: float = 10.0, then: float = 0.0) -> None:
    """Process the connection's events until `done()` (or `timeout`), then `then` more
    seconds (for deliveries that must not come)."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    deadline = time.monotonic() + then
    while time.monotonic() < deadline:
        conn.process_data_events(0.05)


# -- queue.declare ----------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["stream", "quorum"])
def test_a_stream_or_quorum_queue_cannot_be_server_named(target, qtype):
    """An empty name with x-queue-type stream (or quorum): 406 before anything else about
    the declare is looked at (a non-durable or exclusive one gets the same answer)."""
    conn = connect(target)
    text = f"PRECONDITION_FAILED - Cannot declare a server-named queue for type {MODULES[qtype]}"
    args = {"x-queue-type": qtype}
    for flags in [{"durable": True}, {}, {"durable": True, "exclusive": True}]:
        code_text = refused(conn, lambda ch, f=flags: ch.queue_declare("", arguments=args, **f))
        assert code_text == (406, text)
    ok = conn.channel().queue_declare("", exclusive=True, arguments={"x-queue-type": "classic"})
    assert ok.method.queue.startswith("amq.gen-")
    conn.close()


def test_declare_ok_counts_no_consumers_of_a_stream(target, name):
    """A stream's declare-ok (passive or not) says 0 consumers, whatever reads it; other
    queue types still count theirs."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    got: list = []
    consume(conn, name, got)
    consume(conn, name, got)
    assert conn.channel().queue_declare(name, passive=True).method.consumer_count == 0
    again = conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    assert again.method.consumer_count == 0
    classic = name + "-classic"
    ch = conn.channel()
    ch.queue_declare(classic)
    ch.basic_consume(classic, lambda *a: None)
    assert conn.channel().queue_declare(classic, passive=True).method.consumer_count == 1
    conn.close()


# -- deliveries ---------------------------------------------------------------------------

OFFSET_KEY = b"\x0fx-stream-offset"


async def test_every_delivery_carries_its_offset_as_a_signed_64_bit_field(target, name):
    """`x-stream-offset` is an 'l' (signed 64-bit) field on every delivery, read from the
    frame's bytes: added to a message without headers, appended to the publisher's, and
    in place of a publisher's own `x-stream-offset`."""
    c = await RawClient.connect(target.port)
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue=name, durable=True, arguments=STREAM))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    published = [
        (BasicProperties(delivery_mode=2), {}),
        (BasicProperties(delivery_mode=2, headers={"h": 1}), {"h": 1}),
        (
            BasicProperties(delivery_mode=2, content_type="t", headers={"x-stream-offset": "zz"}),
            {},
        ),
    ]
    for i, (props, _) in enumerate(published):
        c.publish(1, "", name, f"m{i}".encode(), props)
    acked = 0
    while acked < len(published):  # (one ack may confirm several)
        acked = (await c.expect(spec.BasicAck)).delivery_tag
    c.send(1, spec.BasicQos(prefetch_count=10))
    await c.expect(spec.BasicQosOk)
    c.send(1, spec.BasicConsume(queue=name, arguments={"x-stream-offset": "first"}))
    await c.expect(spec.BasicConsumeOk)
    offsets = []
    for i, (_, headers) in enumerate(published):
        delivery = await c.next_frame()
        assert isinstance(delivery, ContentMessage) and delivery.body == f"m{i}".encode()
        raw = delivery.header.raw
        at = raw.find(OFFSET_KEY)
        assert at >= 0 and raw.find(OFFSET_KEY, at + 1) < 0, raw  # there, and once
        field = raw[at + len(OFFSET_KEY) : at + len(OFFSET_KEY) + 9]
        assert field[:1] == b"l", raw
        offset = int.from_bytes(field[1:], "big", signed=True)
        offsets.append(offset)
        assert delivery.header.properties.headers == {**headers, "x-stream-offset": offset}
        c.send(1, spec.BasicAck(delivery_tag=delivery.method.delivery_tag))
    assert offsets[0] == 0 and offsets == sorted(set(offsets))
    await c.close()


def test_a_consumer_past_the_end_waits_for_its_offset(target, name):
    """A consumer attached at an offset past the end gets nothing below it: each one gets
    exactly the new messages at or after the offset it asked for (none, for one far
    ahead)."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    publish(conn, name, [b"a", b"b", b"c"])
    existing: list = []
    consume(conn, name, existing)
    pump(conn, lambda: len(existing) == 3)
    start = existing[-1][0] + 1  # the next offset
    ahead = (0, 1, 2, 5, 100)
    got: dict[int, list] = {d: [] for d in ahead}
    for d in ahead:
        consume(conn, name, got[d], offset=start + d)
    pump(conn, lambda: False, timeout=0, then=0.3)
    publish(conn, name, [f"n{i}".encode() for i in range(10)])

    def want(d: int) -> list[int]:  # what came to the consumer at the next offset, from d on
        return [o for o, _ in got[0] if o >= start + d]

    pump(conn, lambda: len(got[0]) == 10 and all(len(got[d]) == len(want(d)) for d in ahead))
    pump(conn, lambda: False, timeout=0, then=0.5)  # nothing more may come
    assert [b for _, b in got[0]] == [f"n{i}".encode() for i in range(10)]
    assert got[0][0][0] == start
    for d in ahead:
        assert [o for o, _ in got[d]] == want(d), d
    assert got[100] == []
    conn.close()


# -- basic.consume ------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["classic", "quorum"])
def test_x_stream_offset_is_refused_on_other_queue_types(target, name, qtype):
    """basic.consume with x-stream-offset on a classic or quorum queue: 406, checked before
    the queue's exclusive use; an x-stream-filter, unknown to 3.10, is taken."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": qtype})
    text = (
        f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{name}' in vhost '/' "
        f"of queue type {MODULES[qtype]}"
    )
    for offset in ["first", 5, "next"]:
        args = {"x-stream-offset": offset}
        code_text = refused(conn, lambda ch, a=args: ch.basic_consume(name, print, arguments=a))
        assert code_text == (406, text)
    holder = conn.channel()
    tag = holder.basic_consume(name, print, exclusive=True)
    args = {"x-stream-offset": "first"}
    assert refused(conn, lambda ch: ch.basic_consume(name, print, arguments=args)) == (406, text)
    holder.basic_cancel(tag)
    conn.channel().basic_consume(name, print, arguments={"x-stream-filter": "emea"})
    conn.close()


def test_x_cancel_on_ha_failover_is_refused_on_a_quorum_queue(target, name):
    """The same rule the other way: an argument only classic queues take."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    args = {"x-cancel-on-ha-failover": True}
    assert refused(conn, lambda ch: ch.basic_consume(name, print, arguments=args)) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-cancel-on-ha-failover' for queue '{name}' in "
        "vhost '/' of queue type rabbit_quorum_queue",
    )
    conn.channel().queue_declare(name + "-classic")
    conn.channel().basic_consume(name + "-classic", print, arguments=args)
    conn.close()


def test_an_exclusive_consumer_of_a_stream_excludes_no_one(target, name):
    """An exclusive consumer of a stream is taken beside a plain one, and others (plain or
    exclusive) beside it; each reads everything."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    got: dict[str, list] = {k: [] for k in ("plain", "exclusive", "plain-2", "exclusive-2")}
    for key, seen in got.items():
        consume(conn, name, seen, exclusive=key.startswith("exclusive"))
    publish(conn, name, [b"x", b"y", b"z"])
    pump(conn, lambda: all(len(seen) == 3 for seen in got.values()))
    for seen in got.values():
        assert [b for _, b in seen] == [b"x", b"y", b"z"]
    conn.close()


# -- queue.delete -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [{"if_empty": True}, {"if_unused": True}, {"if_empty": True, "if_unused": True}],
    ids=["if-empty", "if-unused", "both"],
)
def test_delete_of_a_stream_ignores_if_empty_and_if_unused(target, name, flags):
    """queue.delete with if-empty / if-unused deletes a stream that holds messages and has
    a consumer (cancelled), as every RabbitMQ release does (docs/streams.md says why)."""
    conn = connect(target)
    conn.channel().queue_declare(name, durable=True, arguments=STREAM)
    publish(conn, name, [b"a", b"b", b"c"])
    got: list = []
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    cancelled: list = []
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(
        name,
        lambda c, m, p, b: (got.append(b), c.basic_ack(m.delivery_tag)),
        arguments={"x-stream-offset": "first"},
    )
    pump(conn, lambda: len(got) == 3)
    conn.channel().queue_delete(name, **flags)
    pump(conn, lambda: bool(cancelled), timeout=3)
    assert len(cancelled) == 1
    assert refused(conn, lambda c: c.queue_declare(name, passive=True)) == (
        404,
        f"NOT_FOUND - no queue '{name}' in vhost '/'",
    )
    conn.close()


# -- retention on a timer (RoarMQ: 3.10.8 has none) ----------------------------------------


async def settle() -> None:
    """Let the broker's loop turns and the client's reads go round."""
    for _ in range(5):
        await asyncio.sleep(0)
    await asyncio.sleep(0.02)


async def _publish(client: RawClient, name: str, count: int, sent: int) -> int:
    """`count` confirmed publishes on channel 1 (in confirm mode, `sent` published before);
    the channel's count after them."""
    for _ in range(count):
        client.publish(1, "", name, b"x" * 100, BasicProperties(delivery_mode=2))
    acked = sent
    while acked < sent + count:  # (one ack may confirm several)
        acked = (await client.expect(spec.BasicAck, timeout=10)).delivery_tag
    return sent + count


async def _declare(client: RawClient, name: str, args: dict) -> None:
    client.send(1, spec.QueueDeclare(queue=name, durable=True, arguments=args))
    await client.expect(spec.QueueDeclareOk)


async def _count(client: RawClient, name: str) -> int:
    client.send(1, spec.QueueDeclare(queue=name, passive=True))
    return (await client.expect(spec.QueueDeclareOk)).message_count


async def test_max_age_drops_expired_segments_on_a_timer(vbroker):
    """With x-max-age, a stream nobody writes to still sheds its expired segments: a timer
    fires when the oldest segment passes the age (every segment but the newest, here,
    all written within one instant of the virtual clock), and none is armed while one
    segment is left or without x-max-age."""
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    c.send(1, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    await _declare(
        c, "aged", {**STREAM, "x-max-age": "10s", "x-stream-max-segment-size-bytes": 500}
    )
    await _declare(c, "kept", {**STREAM, "x-stream-max-segment-size-bytes": 500})
    sent = await _publish(c, "aged", 200, 0)
    sent = await _publish(c, "kept", 200, sent)
    vhost = vbroker.broker.vhosts["/"]
    aged, kept = vhost.queues["aged"], vhost.queues["kept"]
    assert isinstance(aged, Stream) and len(aged.segs) > 3
    assert aged._retention_timer is not None and kept._retention_timer is None
    newest = aged.segs[-1].records
    assert await _count(c, "aged") == 200
    vbroker.clock.advance(9.9)
    await settle()
    assert await _count(c, "aged") == 200
    vbroker.clock.advance(0.2)
    await settle()
    assert await _count(c, "aged") == newest  # the newest segment stays
    assert len(aged.segs) == 1 and aged._retention_timer is None
    assert await _count(c, "kept") == 200
    directory = aged.directory
    assert await until_async(lambda: len(list(directory.glob("*.seg"))) == 1, 10)
    # writes roll new segments: the timer is armed again, for the oldest one's expiry
    vbroker.clock.advance(5)
    await _publish(c, "aged", 100, sent)
    assert len(aged.segs) > 1 and aged._retention_timer is not None
    vbroker.clock.advance(9.9)
    await settle()
    assert len(aged.segs) > 1
    vbroker.clock.advance(0.2)
    await settle()
    assert len(aged.segs) == 1 and aged._retention_timer is None
    await c.close()
