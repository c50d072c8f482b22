"""Every error path over a raw socket: the exact reply code and text RabbitMQ would send,
and the broker (and every other connection) keeps working afterwards."""

from __future__ import annotations

import asyncio

import pytest
from support.rawclient import RawClient

from roarmq.protocol import spec
from roarmq.protocol.frames import PROTOCOL_HEADER, encode_method
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(30)


async def channel_close(client: RawClient, channel: int = 1) -> spec.ChannelClose:
    close = await client.expect(spec.ChannelClose)
    client.send(channel, spec.ChannelCloseOk())
    return close


async def connection_close(client: RawClient) -> spec.ConnectionClose:
    close = await client.expect(spec.ConnectionClose)
    client.send(0, spec.ConnectionCloseOk())
    return close


@pytest.fixture
def client(raw):
    return raw


async def assert_broker_alive(broker) -> None:
    """A fresh connection can still declare, publish and get."""
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="", exclusive=True))
    ok = await c.expect(spec.QueueDeclareOk)
    c.publish(1, "", ok.queue, b"alive")
    c.send(1, spec.BasicGet(queue=ok.queue, no_ack=True))
    got = await c.next_frame()
    assert got.body == b"alive"
    await c.close()


async def test_bad_protocol_header_gets_ours_back(broker):
    reader, writer = await asyncio.open_connection("127.0.0.1", broker.port)
    writer.write(b"HTTP/1.1 GET /\r\n\r\n")
    data = await asyncio.wait_for(reader.read(100), 5)
    assert data == PROTOCOL_HEADER
    assert await asyncio.wait_for(reader.read(100), 5) == b""
    writer.close()
    await assert_broker_alive(broker)


async def test_wrong_password_is_403_access_refused(broker):
    c = await RawClient.connect(broker.port, handshake=False)
    got = await c.handshake(password="wrong")
    assert isinstance(got, spec.ConnectionClose)
    assert got.reply_code == 403
    assert got.reply_text.startswith(
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN"
    )
    await c.close()


async def test_unknown_vhost_is_530(broker):
    c = await RawClient.connect(broker.port, handshake=False)
    got = await c.handshake(vhost="/nope")
    assert isinstance(got, spec.ConnectionClose)
    assert got.reply_code == 530 and got.reply_text == "NOT_ALLOWED - vhost /nope not found"
    await c.close()


async def test_passive_declare_missing_queue_is_404_and_connection_survives(client, broker):
    client.send(1, spec.QueueDeclare(queue="missing", passive=True))
    close = await channel_close(client)
    assert close.reply_code == 404
    assert close.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    assert (close.class_id, close.method_id) == (50, 10)
    await client.open_channel(2)  # the connection lives on
    client.send(2, spec.QueueDeclare(queue="", exclusive=True))
    await client.expect(spec.QueueDeclareOk)


async def test_publish_to_missing_exchange_is_404(client):
    client.publish(1, "no-such-x", "k", b"x")
    close = await channel_close(client)
    assert close.reply_code == 404
    assert close.reply_text == "NOT_FOUND - no exchange 'no-such-x' in vhost '/'"


async def test_inequivalent_redeclare_is_406(client):
    client.send(1, spec.QueueDeclare(queue="ineq", durable=False))
    await client.expect(spec.QueueDeclareOk)
    client.send(1, spec.QueueDeclare(queue="ineq", durable=True))
    close = await channel_close(client)
    assert close.reply_code == 406
    assert close.reply_text == (
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
        "'ineq' in vhost '/': received 'true' but current is 'false'"
    )


async def test_inequivalent_exchange_type_is_406(client):
    client.send(1, spec.ExchangeDeclare(exchange="ineq-x", type="direct"))
    await client.expect(spec.ExchangeDeclareOk)
    client.send(1, spec.ExchangeDeclare(exchange="ineq-x", type="topic"))
    close = await channel_close(client)
    assert close.reply_code == 406
    assert "inequivalent arg 'type' for exchange 'ineq-x'" in close.reply_text


async def test_unknown_delivery_tag_is_406(client):
    client.send(1, spec.BasicAck(delivery_tag=42))
    close = await channel_close(client)
    assert close.reply_code == 406
    assert close.reply_text == "PRECONDITION_FAILED - unknown delivery tag 42"


async def test_double_ack_is_406(client):
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.publish(1, "", q, b"x")
    client.send(1, spec.BasicGet(queue=q))
    got = await client.next_frame()
    tag = got.method.delivery_tag
    client.send(1, spec.BasicAck(delivery_tag=tag))
    client.send(1, spec.BasicAck(delivery_tag=tag))
    close = await channel_close(client)
    assert close.reply_code == 406 and f"unknown delivery tag {tag}" in close.reply_text


async def test_exclusive_queue_of_another_connection_is_405(client, broker):
    client.send(1, spec.QueueDeclare(queue="locked", exclusive=True))
    await client.expect(spec.QueueDeclareOk)
    other = await RawClient.connect(broker.port)
    await other.open_channel(1)
    other.send(1, spec.BasicConsume(queue="locked"))
    close = await channel_close(other)
    assert close.reply_code == 405
    assert close.reply_text.startswith(
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'locked' in vhost '/'"
    )
    await other.close()


async def test_exclusive_consumer_conflict_is_403(client):
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.send(1, spec.BasicConsume(queue=q, consumer_tag="a", exclusive=True))
    await client.expect(spec.BasicConsumeOk)
    client.send(1, spec.BasicConsume(queue=q, consumer_tag="b"))
    close = await channel_close(client)
    assert close.reply_code == 403
    assert close.reply_text == f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"


async def test_reserved_names_are_403(client):
    client.send(1, spec.QueueDeclare(queue="amq.mine"))
    close = await channel_close(client)
    assert close.reply_code == 403
    assert (
        close.reply_text
        == "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'"
    )
    await client.open_channel(2)
    client.send(2, spec.ExchangeDeclare(exchange="amq.custom", type="direct"))
    close = await channel_close(client, 2)
    assert close.reply_code == 403


async def test_bind_to_default_exchange_is_403(client):
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.send(1, spec.QueueBind(queue=q, exchange="", routing_key="x"))
    close = await channel_close(client)
    assert close.reply_code == 403


async def test_publish_to_internal_exchange_is_403(client):
    client.send(1, spec.ExchangeDeclare(exchange="internal-x", type="fanout", internal=True))
    await client.expect(spec.ExchangeDeclareOk)
    client.publish(1, "internal-x", "", b"x")
    close = await channel_close(client)
    assert close.reply_code == 403
    assert close.reply_text == (
        "ACCESS_REFUSED - cannot publish to internal exchange 'internal-x' in vhost '/'"
    )


async def test_immediate_is_540_not_implemented(client):
    client.writer.write(
        __import__("roarmq.protocol.frames", fromlist=["encode_content"]).encode_content(
            1,
            spec.BasicPublish(exchange="", routing_key="q", immediate=True),
            BasicProperties(),
            b"x",
            131072,
        )
    )
    close = await connection_close(client)
    assert close.reply_code == 540
    assert close.reply_text == "NOT_IMPLEMENTED - immediate=true"


async def test_unknown_exchange_type_is_503(client):
    client.send(1, spec.ExchangeDeclare(exchange="weird", type="x-unknown"))
    close = await connection_close(client)
    assert close.reply_code == 503
    assert close.reply_text == "COMMAND_INVALID - unknown exchange type 'x-unknown'"


async def test_method_on_unopened_channel_is_504(client, broker):
    client.send(7, spec.QueueDeclare(queue="x"))
    close = await connection_close(client)
    assert close.reply_code == 504
    await assert_broker_alive(broker)


async def test_second_channel_open_is_504(client):
    client.send(1, spec.ChannelOpen())
    close = await connection_close(client)
    assert close.reply_code == 504


async def test_reused_consumer_tag_is_530(client):
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.send(1, spec.BasicConsume(queue=q, consumer_tag="dup"))
    await client.expect(spec.BasicConsumeOk)
    client.send(1, spec.BasicConsume(queue=q, consumer_tag="dup"))
    close = await connection_close(client)
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'dup'"


async def test_body_frame_without_content_is_505(client, broker):
    client.write(b"\x03\x00\x01\x00\x00\x00\x03abc\xce")
    close = await connection_close(client)
    assert close.reply_code == 505
    await assert_broker_alive(broker)


async def test_bad_frame_end_is_501(client, broker):
    frame = bytearray(encode_method(1, spec.BasicQos(prefetch_count=1)))
    frame[-1] = 0x00
    client.write(bytes(frame))
    close = await connection_close(client)
    assert close.reply_code == 501
    await assert_broker_alive(broker)


async def test_oversized_frame_is_501(client):
    client.write(b"\x01\x00\x01" + (10_000_000).to_bytes(4, "big") + b"\x00" * 100)
    close = await connection_close(client)
    assert close.reply_code == 501


async def test_garbled_method_arguments_are_502(client):
    payload = b"\x00\x32\x00\x0a" + b"\xff"  # queue.declare with truncated arguments
    client.write(b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce")
    close = await connection_close(client)
    assert close.reply_code == 502


async def test_unknown_method_is_closed(client):
    payload = b"\x00\x32\x00\xff"  # queue class, method 255
    client.write(b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce")
    close = await connection_close(client)
    assert close.reply_code in (503, 540)


async def test_message_over_max_size_is_406(tmp_path):
    from roarmq.broker.testing import ephemeral_config, running_broker

    cfg = ephemeral_config(data_dir=str(tmp_path), limits={"max_message_size": 1000})
    async with running_broker(cfg) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        c.publish(1, "", "q", b"x" * 5000)
        close = await channel_close(c)
        assert close.reply_code == 406
        assert close.reply_text == (
            "PRECONDITION_FAILED - message size 5000 is larger than configured max size 1000"
        )
        await c.open_channel(2)
        c.send(2, spec.QueueDeclare(queue="", exclusive=True))
        await c.expect(spec.QueueDeclareOk)
        await c.close()


async def test_tx_commit_without_select_is_406(client):
    client.send(1, spec.TxCommit())
    close = await channel_close(client)
    assert close.reply_code == 406
    assert close.reply_text == "PRECONDITION_FAILED - channel is not transactional"


async def test_confirm_after_tx_is_406(client):
    client.send(1, spec.TxSelect())
    await client.expect(spec.TxSelectOk)
    client.send(1, spec.ConfirmSelect())
    close = await channel_close(client)
    assert close.reply_code == 406


async def test_delete_if_unused_and_if_empty_are_406(client):
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.publish(1, "", q, b"x")
    client.send(1, spec.QueueDelete(queue=q, if_empty=True))
    close = await channel_close(client)
    assert close.reply_code == 406 and "is not empty" in close.reply_text
    await client.open_channel(2)
    client.send(2, spec.BasicConsume(queue=q, consumer_tag="c"))
    await client.expect(spec.BasicConsumeOk)
    await client.next_frame()  # the delivery
    client.send(2, spec.QueueDelete(queue=q, if_unused=True))
    close = await channel_close(client, 2)
    assert close.reply_code == 406 and "in use" in close.reply_text


async def test_queue_delete_answers_before_cancelling_consumers(client):
    """RabbitMQ's order: delete-ok to the deleting channel, then the consumers' basic.cancel."""
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.send(1, spec.BasicConsume(queue=q, consumer_tag="c1"))
    await client.expect(spec.BasicConsumeOk)
    client.send(1, spec.QueueDelete(queue=q))
    ok = await client.expect(spec.QueueDeleteOk)
    assert ok.message_count == 0
    cancel = await client.expect(spec.BasicCancel)
    assert cancel.consumer_tag == "c1"


async def test_exchange_delete_always_answers(client):
    client.send(1, spec.ExchangeDelete(exchange="never-declared"))
    await client.expect(spec.ExchangeDeleteOk)
    client.send(1, spec.ExchangeDeclare(exchange="busy-x", type="fanout"))
    await client.expect(spec.ExchangeDeclareOk)
    client.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await client.expect(spec.QueueDeclareOk)).queue
    client.send(1, spec.QueueBind(queue=q, exchange="busy-x"))
    await client.expect(spec.QueueBindOk)
    client.send(1, spec.ExchangeDelete(exchange="busy-x", if_unused=True))
    close = await channel_close(client)
    assert close.reply_code == 406
    await client.open_channel(2)
    client.send(2, spec.ExchangeDelete(exchange="busy-x"))
    await client.expect(spec.ExchangeDeleteOk)


async def test_mandatory_return_is_312(client):
    client.publish(1, "amq.direct", "nobody", b"ret", mandatory=True)
    frame = await client.next_frame()
    assert isinstance(frame.method, spec.BasicReturn)
    assert frame.method.reply_code == 312 and frame.method.reply_text == "NO_ROUTE"
    assert frame.body == b"ret"


async def test_recover_requeue_false_is_540(client):
    client.send(1, spec.BasicRecover(requeue=False))
    close = await connection_close(client)
    assert close.reply_code == 540


async def test_non_durable_stream_is_refused_with_406(client):
    client.send(1, spec.QueueDeclare(queue="s", arguments={"x-queue-type": "stream"}))
    close = await channel_close(client)
    assert close.reply_code == 406
    assert close.reply_text == (
        "PRECONDITION_FAILED - invalid property 'non-durable' for queue 's' in vhost '/'"
    )


async def test_channel_max_counts_open_channels_not_numbers(client):
    """As RabbitMQ: any number up to 65535 opens while fewer than channel_max are open; the
    (channel_max + 1)-th open channel is refused with 530."""
    channel_max = client.tune.channel_max
    client.send(65535, spec.ChannelOpen())
    await client.expect(spec.ChannelOpenOk)
    for n in range(2, channel_max):  # channel 1 (the fixture's) and 65535 are open
        client.send(n, spec.ChannelOpen())
    for _ in range(2, channel_max):
        await client.expect(spec.ChannelOpenOk)
    client.send(channel_max, spec.ChannelOpen())
    close = await connection_close(client)
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - number of channels opened ({channel_max}) has reached the "
        f"negotiated channel_max ({channel_max})"
    )


async def test_guest_only_from_loopback():
    from types import SimpleNamespace

    from roarmq.broker.core.auth import Authenticator, AuthError, hash_password

    guest = SimpleNamespace(
        name="guest", password_hash=hash_password("guest"), tags=(), loopback_only=True
    )
    auth = Authenticator([guest], [])
    assert auth.authenticate("PLAIN", b"\x00guest\x00guest", "127.0.0.1").name == "guest"
    assert auth.authenticate("PLAIN", b"\x00guest\x00guest", "::1").name == "guest"
    with pytest.raises(AuthError, match="only connect via localhost"):
        auth.authenticate("PLAIN", b"\x00guest\x00guest", "192.0.2.10")


async def test_amqplain_login(broker):
    from roarmq.protocol.tables import encode_table

    c = await RawClient.connect(broker.port, handshake=False)
    c.write(PROTOCOL_HEADER)
    await c.expect(spec.ConnectionStart)
    response = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]
    c.send(
        0,
        spec.ConnectionStartOk(
            client_properties={}, mechanism="AMQPLAIN", response=response, locale="en_US"
        ),
    )
    tune = await c.expect(spec.ConnectionTune)
    assert tune.frame_max == 131072 and tune.channel_max == 2047 and tune.heartbeat == 60
    await c.close()


async def test_other_connections_unaffected_by_a_crashing_one(broker):
    good = await RawClient.connect(broker.port)
    await good.open_channel(1)
    good.send(1, spec.QueueDeclare(queue="", exclusive=True))
    q = (await good.expect(spec.QueueDeclareOk)).queue
    for _ in range(5):
        bad = await RawClient.connect(broker.port)
        bad.write(b"\x01\x00\x00\x00\x00\x00\x02\xff\xff\xce" * 3)
        close = await bad.expect(spec.ConnectionClose)
        assert close.reply_code == 501  # a method frame too short to hold a method id
        await bad.close()
    good.publish(1, "", q, b"still here")
    good.send(1, spec.BasicGet(queue=q, no_ack=True))
    got = await good.next_frame()
    assert got.body == b"still here"
    await good.close()


async def test_frames_after_an_oversized_message_are_still_handled(tmp_path):
    """The oversized message and a following method arrive in one write: both get answered."""
    from roarmq.broker.testing import ephemeral_config, running_broker
    from roarmq.protocol.frames import encode_content

    cfg = ephemeral_config(data_dir=str(tmp_path), limits={"max_message_size": 1000})
    async with running_broker(cfg) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        await c.open_channel(2)
        c.write(
            encode_content(
                1,
                spec.BasicPublish(exchange="", routing_key="q"),
                BasicProperties(),
                b"x" * 5000,
                131072,
            )
            + encode_method(2, spec.QueueDeclare(queue="", exclusive=True))
        )
        got = [await c.next_method(), await c.next_method()]
        kinds = sorted(type(m).__name__ for m in got)
        assert kinds == ["ChannelClose", "QueueDeclareOk"]
        await c.close()
