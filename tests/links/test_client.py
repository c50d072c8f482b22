"""The broker's own AMQP 0-9-1 client (broker/links/client.py), the one shovels and
federation links use, against RoarMQ and (marked `slow`) RabbitMQ 3.10.8 over real
sockets: the same steps, the same answers on both."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from roarmq.broker.links.client import AmqpClient, LinkClosed
from roarmq.broker.links.uri import parse_uri
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(60)


def uri_of(target, query: str = "", *, user: str = "guest", password: str = "guest", vhost="%2F"):
    return parse_uri(f"amqp://{user}:{password}@127.0.0.1:{target.port}/{vhost}{query}")


def header(**props) -> ContentHeader:
    return ContentHeader.from_properties(BasicProperties(**props), 60)


@pytest.mark.parametrize("query", ["", "?auth_mechanism=amqplain&frame_max=4096&heartbeat=2"])
async def test_publish_with_confirms_consume_and_ack(target, query):
    client = await AmqpClient.connect(uri_of(target, query))
    try:
        if query:
            assert (client.frame_max, client.heartbeat) == (4096, 2)
        ch = await client.channel()
        queue = "links-" + uuid.uuid4().hex[:8]
        await ch.call(spec.QueueDeclare(queue=queue, auto_delete=True))
        confirms: list[tuple[int, bool, bool]] = []
        ch.on_confirm = lambda tag, multiple, ack: confirms.append((tag, multiple, ack))
        await ch.confirm_select()
        bodies = [b"small", bytes(range(256)) * 400]  # the second spans frames at 4096
        seqs = [
            ch.publish("", queue, header(delivery_mode=2, headers={"n": i}), body)
            for i, body in enumerate(bodies)
        ]
        assert seqs == [1, 2]
        for _ in range(100):
            if confirms and confirms[-1][0] == 2:
                break
            await asyncio.sleep(0.02)
        assert confirms and confirms[-1][0] == 2 and all(ack for *_, ack in confirms)
        got: asyncio.Queue = asyncio.Queue()
        ch.on_delivery = lambda *delivery: got.put_nowait(delivery)
        await ch.call(spec.BasicQos(prefetch_count=10))
        ok = await ch.call(spec.BasicConsume(queue=queue, consumer_tag="c1"))
        assert ok.consumer_tag == "c1"
        for i, body in enumerate(bodies):
            tag, delivery_tag, redelivered, exchange, key, head, data = await asyncio.wait_for(
                got.get(), 10
            )
            assert (tag, redelivered, exchange, key, data) == ("c1", False, "", queue, body)
            assert head.properties.headers == {"n": i}
            ch.send(spec.BasicAck(delivery_tag=delivery_tag))
        # and a mandatory message nobody takes comes back
        returned: asyncio.Future = asyncio.get_running_loop().create_future()
        ch.on_return = lambda *r: returned.done() or returned.set_result(r)
        ch.publish("", "no-such-queue-" + queue, header(), b"lost", mandatory=True)
        code, text, exchange, key, _head, body = await asyncio.wait_for(returned, 10)
        assert (code, text, body) == (312, "NO_ROUTE", b"lost")
        await ch.close()
        assert ch.closed.done()
    finally:
        await client.close()
    assert client.closed.done() and client.closed.result().reply_code == 200


async def test_a_channel_error_closes_that_channel_only(target):
    client = await AmqpClient.connect(uri_of(target))
    try:
        ch = await client.channel()
        with pytest.raises(LinkClosed) as refused:
            await ch.call(spec.QueueDeclare(queue="absent-" + uuid.uuid4().hex, passive=True))
        assert refused.value.reply_code == 404 and refused.value.by_server
        assert refused.value.reply_text.startswith("NOT_FOUND - no queue 'absent-")
        assert ch.closed.done()
        with pytest.raises(LinkClosed):
            ch.publish("", "q", header(), b"x")  # the channel is gone
        again = await client.channel()  # the connection goes on
        await again.call(spec.ExchangeDeclare(exchange="amq.direct", type="direct", passive=True))
    finally:
        await client.close()


async def test_a_refused_login_and_an_unknown_vhost_are_the_servers_words(target):
    with pytest.raises(LinkClosed) as refused:
        await AmqpClient.connect(uri_of(target, password="wrong"))
    assert refused.value.reply_code == 403 and refused.value.by_server
    assert refused.value.reply_text.startswith(
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"
    )
    with pytest.raises(LinkClosed) as refused:
        await AmqpClient.connect(uri_of(target, vhost="nope"))
    assert (refused.value.reply_code, refused.value.reply_text) == (
        530,
        "NOT_ALLOWED - vhost nope not found",
    )


async def test_nothing_listening_fails_at_once():
    from support.waiting import free_port

    with pytest.raises(OSError):
        await AmqpClient.connect(parse_uri(f"amqp://127.0.0.1:{free_port()}"))
