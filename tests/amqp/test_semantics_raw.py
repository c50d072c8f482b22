"""Finer RabbitMQ semantics checked frame by frame: qos global, recover, channel.flow,
overflow modes, auto-delete exchanges, exchange unbind, MQTT-syntax topic exchanges."""

from __future__ import annotations

import pytest
from support.rawclient import RawClient

from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(30)


async def declare(c: RawClient, name: str = "", ch: int = 1, **kwargs) -> str:
    c.send(ch, spec.QueueDeclare(queue=name, **kwargs))
    return (await c.expect(spec.QueueDeclareOk)).queue


async def deliveries(c: RawClient, timeout: float = 0.3) -> list[ContentMessage]:
    """Every delivery that arrives until the line goes quiet for `timeout` seconds."""
    got = []
    while True:
        try:
            frame = await c.next_frame(timeout=timeout)
        except TimeoutError:
            return got
        if isinstance(frame, ContentMessage):
            got.append(frame)


@pytest.fixture
def c(raw):
    return raw


async def test_qos_global_limits_the_whole_channel(c):
    q1, q2 = await declare(c), await declare(c)
    for q in (q1, q2):
        for i in range(5):
            c.publish(1, "", q, str(i).encode())
    c.send(1, spec.BasicQos(prefetch_count=3, global_=True))
    await c.expect(spec.BasicQosOk)
    for q in (q1, q2):
        c.send(1, spec.BasicConsume(queue=q, consumer_tag=q))
    got = await deliveries(c)
    assert len(got) == 3  # shared by both consumers
    c.send(1, spec.BasicAck(delivery_tag=got[-1].method.delivery_tag, multiple=True))
    assert len(await deliveries(c)) == 3


async def test_qos_per_consumer(c):
    q1, q2 = await declare(c), await declare(c)
    for q in (q1, q2):
        for i in range(5):
            c.publish(1, "", q, str(i).encode())
    c.send(1, spec.BasicQos(prefetch_count=2))
    await c.expect(spec.BasicQosOk)
    for q in (q1, q2):
        c.send(1, spec.BasicConsume(queue=q, consumer_tag=q))
    got = await deliveries(c)
    assert sorted(m.method.consumer_tag for m in got) == sorted([q1, q1, q2, q2])


async def test_recover_requeues_and_redelivers(c):
    q = await declare(c)
    c.publish(1, "", q, b"a")
    c.send(1, spec.BasicConsume(queue=q, consumer_tag="r"))
    await c.expect(spec.BasicConsumeOk)
    [first] = await deliveries(c)
    assert not first.method.redelivered
    c.send(1, spec.BasicRecover(requeue=True))
    frames = [await c.next_frame(), await c.next_frame()]
    recover_ok = [f for f in frames if not isinstance(f, ContentMessage)]
    again = [f for f in frames if isinstance(f, ContentMessage)]
    assert isinstance(recover_ok[0].method, spec.BasicRecoverOk)
    assert again[0].body == b"a" and again[0].method.redelivered


async def test_channel_flow_from_client_pauses_deliveries(c):
    q = await declare(c)
    c.send(1, spec.BasicConsume(queue=q, consumer_tag="f", no_ack=True))
    await c.expect(spec.BasicConsumeOk)
    c.send(1, spec.ChannelFlow(active=False))
    ok = await c.expect(spec.ChannelFlowOk)
    assert ok.active is False
    c.publish(1, "", q, b"held")
    assert await deliveries(c) == []
    c.send(1, spec.ChannelFlow(active=True))
    frames = [await c.next_frame(), await c.next_frame()]
    assert any(isinstance(f, ContentMessage) and f.body == b"held" for f in frames)


async def test_reject_publish_dlx_dead_letters_the_refused_message(c):
    c.send(1, spec.ExchangeDeclare(exchange="ovf-dlx", type="fanout"))
    await c.expect(spec.ExchangeDeclareOk)
    dead = await declare(c)
    c.send(1, spec.QueueBind(queue=dead, exchange="ovf-dlx"))
    await c.expect(spec.QueueBindOk)
    q = await declare(
        c,
        arguments={
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "ovf-dlx",
        },
    )
    c.send(1, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    c.publish(1, "", q, b"kept")
    c.publish(1, "", q, b"refused")
    ack = await c.expect(spec.BasicAck)
    nack = await c.expect(spec.BasicNack)
    assert (ack.delivery_tag, nack.delivery_tag) == (1, 2)
    c.send(1, spec.BasicGet(queue=dead, no_ack=True))
    got = await c.next_frame()
    assert got.body == b"refused"
    assert got.header.properties.headers["x-death"][0]["reason"] == "maxlen"


async def test_max_length_bytes_drops_head(c):
    q = await declare(c, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        c.publish(1, "", q, body)
    c.send(1, spec.QueueDeclare(queue=q, passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 2
    c.send(1, spec.BasicGet(queue=q, no_ack=True))
    assert (await c.next_frame()).body == b"bbbb"


async def test_auto_delete_exchange_goes_with_its_last_binding(c):
    c.send(1, spec.ExchangeDeclare(exchange="ad-x", type="fanout", auto_delete=True))
    await c.expect(spec.ExchangeDeclareOk)
    q = await declare(c)
    c.send(1, spec.QueueBind(queue=q, exchange="ad-x"))
    await c.expect(spec.QueueBindOk)
    c.send(1, spec.QueueUnbind(queue=q, exchange="ad-x"))
    await c.expect(spec.QueueUnbindOk)
    c.send(1, spec.ExchangeDeclare(exchange="ad-x", type="fanout", passive=True))
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 404


async def test_exchange_unbind_stops_routing(c):
    for name, kind in (("src-x", "direct"), ("dst-x", "fanout")):
        c.send(1, spec.ExchangeDeclare(exchange=name, type=kind))
        await c.expect(spec.ExchangeDeclareOk)
    q = await declare(c)
    c.send(1, spec.QueueBind(queue=q, exchange="dst-x"))
    await c.expect(spec.QueueBindOk)
    c.send(1, spec.ExchangeBind(destination="dst-x", source="src-x", routing_key="k"))
    await c.expect(spec.ExchangeBindOk)
    c.publish(1, "src-x", "k", b"1")
    c.send(1, spec.ExchangeUnbind(destination="dst-x", source="src-x", routing_key="k"))
    await c.expect(spec.ExchangeUnbindOk)
    c.publish(1, "src-x", "k", b"2")
    c.send(1, spec.QueueDeclare(queue=q, passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 1


async def test_mqtt_syntax_topic_exchange(c):
    c.send(
        1,
        spec.ExchangeDeclare(exchange="mqtt-x", type="topic", arguments={"x-topic-syntax": "mqtt"}),
    )
    await c.expect(spec.ExchangeDeclareOk)
    q = await declare(c)
    c.send(1, spec.QueueBind(queue=q, exchange="mqtt-x", routing_key="sensors/+/temp"))
    await c.expect(spec.QueueBindOk)
    c.send(1, spec.QueueBind(queue=q, exchange="mqtt-x", routing_key="alerts/#"))
    await c.expect(spec.QueueBindOk)
    for key in ("sensors/k1/temp", "sensors/k1/hum", "alerts", "alerts/a/b", "sensors.k1.temp"):
        c.publish(1, "mqtt-x", key, key.encode())
    c.send(1, spec.QueueDeclare(queue=q, passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 3
    c.send(1, spec.QueueBind(queue=q, exchange="mqtt-x", routing_key="bad/#/filter"))
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 406


async def test_headers_binding_with_invalid_x_match_is_406(c):
    q = await declare(c)
    c.send(1, spec.QueueBind(queue=q, exchange="amq.headers", arguments={"x-match": "some"}))
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 406
    assert "Invalid x-match field value" in close.reply_text


async def test_per_message_ttl_zero_delivered_only_to_a_waiting_consumer(c):
    q = await declare(c)
    c.publish(1, "", q, b"expires", BasicProperties(expiration="0"))
    c.send(1, spec.QueueDeclare(queue=q, passive=True))
    assert (await c.expect(spec.QueueDeclareOk)).message_count == 0
    c.send(1, spec.BasicConsume(queue=q, consumer_tag="z", no_ack=True))
    await c.expect(spec.BasicConsumeOk)
    c.publish(1, "", q, b"taken", BasicProperties(expiration="0"))
    assert [m.body for m in await deliveries(c)] == [b"taken"]


async def test_invalid_expiration_is_406(c):
    q = await declare(c)
    c.publish(1, "", q, b"x", BasicProperties(expiration="soon"))
    close = await c.expect(spec.ChannelClose)
    assert close.reply_code == 406


async def test_messages_sharing_a_property_list_keep_their_own_headers(c):
    """Messages published with the same property list share its decoded form
    (broker/core/message.py): dead-lettering one (x-death added), stripping BCC from another,
    changes neither the others nor the next publish of that list."""
    c.send(1, spec.ExchangeDeclare(exchange="share-dlx", type="fanout"))
    await c.expect(spec.ExchangeDeclareOk)
    dead = await declare(c)
    c.send(1, spec.QueueBind(queue=dead, exchange="share-dlx"))
    await c.expect(spec.QueueBindOk)
    q = await declare(c, arguments={"x-dead-letter-exchange": "share-dlx"})
    other = await declare(c)
    props = BasicProperties(delivery_mode=2, headers={"app": "a", "BCC": [other]})
    for body in (b"one", b"two"):
        c.publish(1, "", q, body, props)
    c.send(1, spec.BasicGet(queue=q, no_ack=False))
    first = await c.next_frame()
    assert first.body == b"one" and first.header.properties.headers == {"app": "a"}
    c.send(1, spec.BasicReject(delivery_tag=first.method.delivery_tag, requeue=False))
    c.send(1, spec.BasicGet(queue=dead, no_ack=True))
    died = await c.next_frame()
    assert died.body == b"one" and died.header.properties.headers["x-death"][0]["queue"] == q
    c.publish(1, "", q, b"three", props)
    for want, queue in ((b"two", q), (b"three", q), (b"one", other), (b"two", other)):
        c.send(1, spec.BasicGet(queue=queue, no_ack=True))
        got = await c.next_frame()
        assert got.body == want
        assert got.header.properties.headers == {"app": "a"}, (want, queue)
