"""What real clients' own test suites noticed, each checked with a real client.

Every expectation here was checked against RabbitMQ 3.10.8: closing handshakes, nothing
on a channel after its close-ok, the order of queue.delete replies, idempotent teardown,
the default exchange, exclusive queues, channel_max, and the consumer timeout.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import aio_pika
import aiormq
import kombu
import pika
import pika.exceptions
import pytest
from machine import missing
from support.rawclient import RawClient

from roarmq.broker.amqp.connection import CLOSING_TIMEOUT
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage, MethodFrame
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(60)
NODE_DIR = Path(__file__).resolve().parents[1] / "node"


# -- 1. closing handshakes ------------------------------------------------------------


async def test_socket_stays_open_after_close_ok_and_late_frames_are_dropped(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    c.send(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await c.expect(spec.ConnectionCloseOk)
    # Frames still in flight from the client: read and dropped, never a reset or a reply.
    c.publish(1, "", "nowhere", b"late")
    c.send(1, spec.QueueDeclare(queue="late"))
    await c.writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(c.reader.read(1), 0.2)
    assert "late" not in vbroker.broker.vhosts["/"].queues
    assert not vbroker.broker.connections  # the connection's state is gone already
    # A client that never hangs up is cut off after RabbitMQ's closing timeout.
    vbroker.clock.advance(CLOSING_TIMEOUT + 1)
    assert await asyncio.wait_for(c.reader.read(), 5) == b""
    c.writer.close()


async def test_server_close_waits_for_close_ok_dropping_content(vbroker):
    c = await RawClient.connect(vbroker.port)
    await c.open_channel(1)
    c.send(1, spec.BasicAck(delivery_tag=99, multiple=False))  # 406 on the channel ...
    c.send(7, spec.QueueDeclare(queue="x"))  # ... and a connection error: 504
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 406
    close = await c.expect(spec.ConnectionClose)
    assert close.reply_code == 504
    # Content and methods in flight are dropped while the broker waits for close-ok.
    c.publish(1, "", "q", b"in flight")
    c.send(1, spec.BasicQos(prefetch_count=1))
    c.send(0, spec.ConnectionCloseOk())
    assert await asyncio.wait_for(c.reader.read(), 5) == b""
    c.writer.close()


async def test_aiormq_close_observers_get_the_error_passed_to_close(broker):
    class Mine(Exception):
        pass

    conn = await aiormq.connect(broker.url)
    channel = await conn.channel()
    await channel.queue_declare("aiormq-close")
    for i in range(500):
        await channel.basic_publish(b"x%d" % i, routing_key="aiormq-close")
    await conn.close(Mine("mine"))
    with pytest.raises(Mine):
        await conn.closing


async def test_frames_on_a_closed_channel_are_dropped_until_it_reopens(broker):
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    await c.open_channel(2)
    c.send(2, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    await c.expect(spec.ChannelCloseOk)
    c.publish(2, "", "nowhere", b"after close")  # in flight when the channel closed
    c.send(2, spec.QueueDeclare(queue="after-close"))
    c.send(1, spec.QueueDeclare(queue="still-here"))
    assert (await c.expect(spec.QueueDeclareOk)).queue == "still-here"
    assert "after-close" not in broker.broker.vhosts["/"].queues
    await c.open_channel(2)  # reopened: frames count again
    c.send(2, spec.QueueDeclare(queue="after-reopen"))
    assert (await c.expect(spec.QueueDeclareOk)).queue == "after-reopen"
    c.send(9, spec.QueueDeclare(queue="never-opened"))  # never opened: still an error
    close = await c.expect(spec.ConnectionClose)
    assert close.reply_code == 504
    await c.close()


async def test_acks_on_a_channel_the_broker_is_closing_are_dropped(broker):
    """The consumer-ack fast path (Connection._process) keeps the channel's closing rules:
    after the broker's channel.close only close/close-ok count, and its unacked go back."""
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="acks-closing"))
    await c.expect(spec.QueueDeclareOk)
    c.publish(1, "", "acks-closing", b"m")
    c.send(1, spec.BasicGet(queue="acks-closing"))
    tag = (await c.expect(spec.BasicGetOk)).delivery_tag
    c.send(1, spec.BasicAck(delivery_tag=tag + 41))  # unknown: the broker closes the channel
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 406
    c.send(1, spec.BasicAck(delivery_tag=tag))  # in flight: dropped, not applied
    c.send(1, spec.BasicAck(delivery_tag=tag + 41))  # dropped, not a second error
    c.send(1, spec.ChannelCloseOk())
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="acks-closing", passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 1  # requeued, not acked
    await c.close()


# -- 2. nothing on a channel after its close-ok ----------------------------------------


async def test_confirms_owed_go_before_channel_close_ok_and_nothing_after(broker):
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    await c.open_channel(2)
    c.send(1, spec.QueueDeclare(queue="dur", durable=True))
    await c.expect(spec.QueueDeclareOk)
    c.send(2, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    persistent = BasicProperties(delivery_mode=2)
    for i in range(1000):  # persistent: many confirms wait for the disk past the close
        c.publish(2, "", "dur", b"%d" % i, persistent)
    c.send(2, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    # A confirmed publish on channel 1 after the close: its ack comes after every fsync
    # that could have produced a late ack on channel 2.
    c.send(1, spec.ConfirmSelect())
    c.publish(1, "", "dur", b"marker", persistent)
    frames = []
    while True:
        ev = await c.next_event()
        if isinstance(ev, (MethodFrame, ContentMessage)):
            frames.append((ev.channel, ev.method))
            if ev.channel == 1 and isinstance(ev.method, spec.BasicAck):
                break
    on_2 = [m for ch, m in frames if ch == 2]
    assert isinstance(on_2[-1], spec.ChannelCloseOk)
    assert all(isinstance(m, spec.BasicAck) for m in on_2[:-1])
    await c.close()


def node_or_skip_reason() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed: the amqplib checks did not run"
    if not (NODE_DIR / "node_modules" / "amqplib").is_dir():
        return "amqplib is not installed: run `make test` (it runs npm install in tests/node)"
    return None


def test_amqplib_closes_while_publishing_and_closes_a_confirm_channel(thread_broker):
    reason = node_or_skip_reason()
    if reason is not None:
        missing(reason, "ROARMQ_EXPECT_NODE")
    out = subprocess.run(
        ["node", str(NODE_DIR / "close_handshake.js"), thread_broker.url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=NODE_DIR,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


# -- 3. queue.delete-ok before the consumers' basic.cancel ------------------------------


def test_kombu_deletes_a_queue_its_own_channel_consumes(thread_broker):
    with kombu.Connection(thread_broker.url) as conn:
        channel = conn.channel()
        channel.queue_declare("kombu-del")
        channel.basic_publish(channel.prepare_message(b"x"), "", "kombu-del")
        channel.basic_consume("kombu-del", callback=lambda m: None, consumer_tag="ct")
        assert channel.queue_delete("kombu-del") in (0, 1)
        channel.close()


# -- 4. idempotent teardown -------------------------------------------------------------


async def test_unbind_and_delete_of_missing_things_answer_ok(broker):
    conn = await aio_pika.connect(broker.url)
    channel = await conn.channel()
    exchange = await channel.declare_exchange("teardown-x", aio_pika.ExchangeType.TOPIC)
    queue = await channel.declare_queue("teardown-q", auto_delete=True)
    await queue.bind(exchange, "a.b")
    await queue.delete()
    raw = await channel.get_underlay_channel()  # aiormq: the methods exactly as sent
    await queue.unbind(exchange, "a.b")  # queue gone
    await raw.queue_unbind("teardown-q", "no-such-exchange", "k")  # both gone
    other = await channel.declare_queue("teardown-2")
    await other.unbind(exchange, "never.bound")  # binding never existed
    await raw.queue_unbind("teardown-2", "no-such-exchange", "k")  # exchange gone
    await raw.exchange_unbind("no-such-dest", "no-such-source", "k")
    await raw.exchange_unbind("teardown-x", "amq.topic", "never.bound")
    await raw.queue_delete("no-such-queue")
    await raw.exchange_delete("no-such-exchange")
    assert not channel.is_closed
    await conn.close()


# -- 5-7. declarations and channel_max -------------------------------------------------


@pytest.mark.parametrize("passive", [False, True])
def test_declaring_the_default_exchange_is_refused(thread_broker, passive):
    conn = pika.BlockingConnection(pika.URLParameters(thread_broker.url))
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.exchange_declare("", "direct", passive=passive)
    assert err.value.reply_code == 403
    assert err.value.reply_text == (
        "ACCESS_REFUSED - operation not permitted on the default exchange"
    )
    conn.close()


def test_redeclaring_an_exclusive_queue_as_not_exclusive_is_locked(thread_broker):
    conn = pika.BlockingConnection(pika.URLParameters(thread_broker.url))
    ch = conn.channel()
    ch.queue_declare("excl", exclusive=True)
    ch.queue_declare("excl", exclusive=True)  # the same declaration is fine
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare("excl", exclusive=False)
    assert err.value.reply_code == 405
    assert "cannot obtain exclusive access to locked queue 'excl'" in err.value.reply_text
    ch = conn.channel()
    ch.queue_declare("excl", passive=True)  # passive ignores the flag
    conn.close()


def test_pika_opens_channel_65535(thread_broker):
    conn = pika.BlockingConnection(pika.URLParameters(thread_broker.url))
    ch = conn.channel(channel_number=65535)
    assert ch.queue_declare("", exclusive=True).method.queue
    conn.close()


# -- 8. consumer timeout ------------------------------------------------------------------


async def test_consumer_timeout_closes_the_channel_and_requeues(vbroker):
    conn = await aio_pika.connect(vbroker.url)
    channel = await conn.channel()
    queue = await channel.declare_queue("slow", arguments={"x-consumer-timeout": 5000})
    await channel.default_exchange.publish(aio_pika.Message(b"work"), "slow")
    got = asyncio.get_running_loop().create_future()

    async def take(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.set_result(message)  # manual ack, never acked

    await queue.consume(take)
    message = await asyncio.wait_for(got, 5)
    assert message.body == b"work"
    closed = asyncio.get_running_loop().create_future()
    channel.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))
    vbroker.clock.advance(4.0)
    await asyncio.sleep(0.05)
    assert not channel.is_closed  # within the timeout
    for _ in range(3):  # one sweep period at a time, as the broker would see it
        vbroker.clock.advance(2.5)
        await asyncio.sleep(0.05)
    exc = await asyncio.wait_for(closed, 5)
    assert isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed)
    assert (
        str(exc).find(
            "delivery acknowledgement on channel 1 timed out. Timeout value used: 5000 ms"
        )
        >= 0
    )
    # The message went back to its queue, redelivered.
    channel = await conn.channel()
    again = await (await channel.get_queue("slow")).get(fail=True)
    assert again.body == b"work" and again.redelivered
    await again.ack()
    await conn.close()


async def test_consumer_timeout_from_config_and_disabled(tmp_path):
    from roarmq.broker.ops.clock import VirtualClock
    from roarmq.broker.testing import ephemeral_config, running_broker

    for timeout_ms, expect_close in ((60_000, True), (0, False)):
        clock = VirtualClock()
        cfg = ephemeral_config(
            data_dir=str(tmp_path / f"d{timeout_ms}"), limits={"consumer_timeout_ms": timeout_ms}
        )
        async with running_broker(cfg, clock=clock) as b:
            c = await RawClient.connect(b.port)
            await c.open_channel(1)
            c.send(1, spec.QueueDeclare(queue="cfg-timeout"))
            await c.expect(spec.QueueDeclareOk)
            c.publish(1, "", "cfg-timeout", b"m")
            c.send(1, spec.BasicGet(queue="cfg-timeout", no_ack=False))
            await c.next_frame()
            for _ in range(10):
                clock.advance(20)
                await asyncio.sleep(0.01)
            if expect_close:
                close = await c.expect(spec.ChannelClose)
                assert close.reply_code == 406
                assert "Timeout value used: 60000 ms" in close.reply_text
            else:
                c.send(1, spec.QueueDeclare(queue="cfg-timeout", passive=True))
                ok = await c.expect(spec.QueueDeclareOk)
                assert ok.message_count == 0  # still held, unacked, by the open channel
            await c.close()
