"""End-to-end behaviour through aio-pika, an unmodified asyncio client."""

from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika.exceptions import ChannelClosed

pytestmark = pytest.mark.timeout(30)


async def drain(
    queue: aio_pika.abc.AbstractQueue, count: int, timeout: float = 5.0, ack: bool = True
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    got: list = []
    done = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        got.append(message)
        if ack:
            await message.ack()
        if len(got) >= count:
            done.set()

    tag = await queue.consume(on_message)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    finally:
        await queue.cancel(tag)
    return got


async def message_count(ch: aio_pika.abc.AbstractChannel, name: str) -> int:
    """Passive queue.declare straight through aiormq (robust channels cache declarations)."""
    underlay = await ch.get_underlay_channel()
    ok = await underlay.queue_declare(name, passive=True)
    return ok.message_count


async def _ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """A consumer callback that leaves the message unacked."""


@pytest.fixture
async def conn(broker):
    connection = await aio_pika.connect_robust(broker.url)
    yield connection
    await connection.close()


async def test_server_properties_and_capabilities(conn):
    props = conn.transport.connection.server_properties
    assert props["product"] == "RoarMQ"
    caps = props["capabilities"]
    for cap in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
        "consumer_priorities",
        "direct_reply_to",
    ):
        assert caps[cap] is True


async def test_direct_publish_consume(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("direct-q")
    ex = await ch.declare_exchange("direct-x", ExchangeType.DIRECT)
    await q.bind(ex, "k1")
    for i in range(10):
        await ex.publish(Message(f"m{i}".encode(), headers={"i": i}), routing_key="k1")
    await ex.publish(Message(b"nowhere"), routing_key="other")
    got = await drain(q, 10)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(10)]
    assert [m.headers["i"] for m in got] == list(range(10))
    assert all(m.routing_key == "k1" and m.exchange == "direct-x" for m in got)


async def test_default_exchange_routes_by_queue_name(broker):
    plain = await aio_pika.connect(broker.url)  # the robust client names queues itself
    ch = await plain.channel()
    q = await ch.declare_queue("", exclusive=True)
    assert q.name.startswith("amq.gen-")
    await ch.default_exchange.publish(Message(b"hi", content_type="text/plain"), routing_key=q.name)
    [m] = await drain(q, 1)
    assert m.body == b"hi" and m.content_type == "text/plain"
    await plain.close()


async def test_topic_routing(conn):
    ch = await conn.channel()
    ex = await ch.declare_exchange("topic-x", ExchangeType.TOPIC)
    qa = await ch.declare_queue("t-a", exclusive=True)
    qb = await ch.declare_queue("t-b", exclusive=True)
    await qa.bind(ex, "orders.*.created")
    await qb.bind(ex, "orders.#")
    await qb.bind(ex, "#.created")  # reaches qb twice: delivered once
    await ex.publish(Message(b"1"), routing_key="orders.eu.created")
    await ex.publish(Message(b"2"), routing_key="orders.eu.paid.late")
    await ex.publish(Message(b"3"), routing_key="invoices.created")
    a = await drain(qa, 1)
    b = await drain(qb, 3)
    assert [m.body for m in a] == [b"1"]
    assert sorted(m.body for m in b) == [b"1", b"2", b"3"]
    await asyncio.sleep(0.1)
    assert await message_count(ch, "t-b") == 0


async def test_fanout_and_headers(conn):
    ch = await conn.channel()
    fan = await ch.declare_exchange("fan-x", ExchangeType.FANOUT)
    hdr = await ch.declare_exchange("hdr-x", ExchangeType.HEADERS)
    q1 = await ch.declare_queue("f1", exclusive=True)
    q2 = await ch.declare_queue("f2", exclusive=True)
    await q1.bind(fan)
    await q2.bind(fan)
    await q1.bind(hdr, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    await q2.bind(hdr, arguments={"x-match": "any", "format": "zip", "type": "log"})
    await fan.publish(Message(b"fan"), routing_key="")
    await hdr.publish(Message(b"pdf-report", headers={"format": "pdf", "type": "report"}), "")
    await hdr.publish(Message(b"pdf-only", headers={"format": "pdf"}), "")
    await hdr.publish(Message(b"log", headers={"type": "log"}), "")
    assert sorted(m.body for m in await drain(q1, 2)) == [b"fan", b"pdf-report"]
    assert sorted(m.body for m in await drain(q2, 2)) == [b"fan", b"log"]


async def test_publisher_confirms(conn):
    ch = await conn.channel(publisher_confirms=True)
    q = await ch.declare_queue("confirm-q", exclusive=True)
    results = await asyncio.gather(
        *(ch.default_exchange.publish(Message(b"x"), routing_key=q.name) for _ in range(200))
    )
    assert len(results) == 200
    assert all(isinstance(r, aiormq.spec.Basic.Ack) for r in results)
    await asyncio.sleep(0.05)
    assert await message_count(ch, "confirm-q") == 200


async def test_prefetch_limits_unacked(conn):
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=3)
    q = await ch.declare_queue("prefetch-q", exclusive=True)
    for i in range(10):
        await ch.default_exchange.publish(Message(str(i).encode()), routing_key=q.name)
    got: list = []
    event = asyncio.Event()

    async def on_message(message):
        got.append(message)
        if len(got) == 3:
            event.set()

    await q.consume(on_message)
    await asyncio.wait_for(event.wait(), 5)
    await asyncio.sleep(0.2)
    assert len(got) == 3  # nothing more until we ack
    await got[0].ack()
    await asyncio.sleep(0.2)
    assert len(got) == 4
    for m in got[1:]:
        await m.ack()


async def test_nack_requeue_sets_redelivered(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("requeue-q", exclusive=True)
    await ch.default_exchange.publish(Message(b"again"), routing_key=q.name)
    first = await q.get(timeout=5)
    assert not first.redelivered
    await first.nack(requeue=True)
    second = await q.get(timeout=5)
    assert second.body == b"again" and second.redelivered
    await second.ack()


async def test_unacked_requeued_in_order_on_channel_close(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("order-q")
    for i in range(5):
        await ch.default_exchange.publish(Message(str(i).encode()), routing_key="order-q")
    ch2 = await conn.channel()
    await ch2.set_qos(prefetch_count=10)
    q2 = await ch2.get_queue("order-q")
    await drain(q2, 5, ack=False)
    await ch2.close()
    await asyncio.sleep(0.1)
    got = [await q.get(timeout=5) for _ in range(5)]
    assert [m.body for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert all(m.redelivered for m in got)
    for m in got:
        await m.ack()
    await q.delete()


async def test_dead_letter_on_reject_with_x_death(conn):
    ch = await conn.channel()
    dlx = await ch.declare_exchange("dlx", ExchangeType.FANOUT)
    dead = await ch.declare_queue("dead", exclusive=True)
    await dead.bind(dlx)
    work = await ch.declare_queue(
        "work", exclusive=True, arguments={"x-dead-letter-exchange": "dlx"}
    )
    await ch.default_exchange.publish(Message(b"bad", headers={"k": "v"}), routing_key="work")
    m = await work.get(timeout=5)
    await m.reject(requeue=False)
    [d] = await drain(dead, 1)
    assert d.body == b"bad"
    death = d.headers["x-death"][0]
    assert death["reason"] == "rejected"
    assert death["queue"] == "work"
    assert death["count"] == 1
    assert death["exchange"] == ""
    assert list(death["routing-keys"]) == ["work"]
    assert d.headers["x-first-death-reason"] == "rejected"
    assert d.headers["k"] == "v"


async def test_message_ttl_dead_letters_expired(conn):
    ch = await conn.channel()
    dlx = await ch.declare_exchange("ttl-dlx", ExchangeType.FANOUT)
    dead = await ch.declare_queue("ttl-dead", exclusive=True)
    await dead.bind(dlx)
    await ch.declare_queue(
        "ttl-q",
        exclusive=True,
        arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "ttl-dlx"},
    )
    await ch.default_exchange.publish(Message(b"old"), routing_key="ttl-q")
    await ch.default_exchange.publish(Message(b"per-msg", expiration=0.05), routing_key="ttl-q")
    got = await drain(dead, 2)
    assert sorted(m.body for m in got) == [b"old", b"per-msg"]
    assert all(m.headers["x-death"][0]["reason"] == "expired" for m in got)
    per_msg = next(m for m in got if m.body == b"per-msg")
    assert per_msg.headers["x-death"][0]["original-expiration"] == "50"
    assert per_msg.expiration is None


async def test_max_length_drop_head_and_reject_publish(conn):
    ch = await conn.channel(publisher_confirms=True)
    q = await ch.declare_queue("maxlen", exclusive=True, arguments={"x-max-length": 2})
    for i in range(4):
        await ch.default_exchange.publish(Message(str(i).encode()), routing_key="maxlen")
    got = [await q.get(timeout=5) for _ in range(2)]
    assert [m.body for m in got] == [b"2", b"3"]
    for m in got:
        await m.ack()
    await ch.declare_queue(
        "rejpub", exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    await ch.default_exchange.publish(Message(b"a"), routing_key="rejpub")
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await ch.default_exchange.publish(Message(b"b"), routing_key="rejpub")


async def test_basic_get_empty_and_count(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("get-q", exclusive=True)
    assert await q.get(fail=False) is None
    await ch.default_exchange.publish(Message(b"1"), routing_key="get-q")
    await ch.default_exchange.publish(Message(b"2"), routing_key="get-q")
    m = await q.get(timeout=5, no_ack=True)
    assert m.body == b"1" and m.message_count == 1


async def test_exclusive_queue_locked_for_other_connections(conn, broker):
    ch = await conn.channel()
    await ch.declare_queue("mine", exclusive=True)
    other = await aio_pika.connect(broker.url)
    try:
        ch2 = await other.channel()
        with pytest.raises(ChannelClosed) as info:
            await ch2.declare_queue("mine", passive=True)
        assert "RESOURCE_LOCKED" in str(info.value)
    finally:
        await other.close()


async def test_exclusive_queue_deleted_with_its_connection(broker):
    c1 = await aio_pika.connect(broker.url)
    ch = await c1.channel()
    await ch.declare_queue("temp-excl", exclusive=True)
    await c1.close()
    await asyncio.sleep(0.05)
    c2 = await aio_pika.connect(broker.url)
    try:
        ch2 = await c2.channel()
        with pytest.raises(ChannelClosed) as info:
            await ch2.declare_queue("temp-excl", passive=True)
        assert "NOT_FOUND" in str(info.value)
    finally:
        await c2.close()


async def test_auto_delete_queue_goes_with_last_consumer(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("autodel", auto_delete=True)
    tag = await q.consume(_ignore)
    await q.cancel(tag)
    await asyncio.sleep(0.05)
    with pytest.raises(ChannelClosed) as info:
        await message_count(ch, "autodel")
    assert "NOT_FOUND" in str(info.value)


async def test_direct_reply_to_rpc(conn):
    server_ch = await conn.channel()
    rpc_q = await server_ch.declare_queue("rpc", exclusive=True)

    async def serve(message):
        async with message.process():
            await server_ch.default_exchange.publish(
                Message(b"pong:" + message.body, correlation_id=message.correlation_id),
                routing_key=message.reply_to,
            )

    await rpc_q.consume(serve)
    client_ch = await conn.channel()
    replies: asyncio.Queue = asyncio.Queue()
    reply_q = await client_ch.get_queue("amq.rabbitmq.reply-to", ensure=False)

    async def on_reply(m: aio_pika.abc.AbstractIncomingMessage) -> None:
        replies.put_nowait(m)

    await reply_q.consume(on_reply, no_ack=True)
    await client_ch.default_exchange.publish(
        Message(b"ping", reply_to="amq.rabbitmq.reply-to", correlation_id="c1"), routing_key="rpc"
    )
    reply = await asyncio.wait_for(replies.get(), 5)
    assert reply.body == b"pong:ping" and reply.correlation_id == "c1"


async def test_priority_queue(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("prio", exclusive=True, arguments={"x-max-priority": 10})
    for body, prio in ((b"low", 1), (b"high", 9), (b"mid", 5)):
        await ch.default_exchange.publish(Message(body, priority=prio), routing_key="prio")
    got = [await q.get(timeout=5, no_ack=True) for _ in range(3)]
    assert [m.body for m in got] == [b"high", b"mid", b"low"]


async def test_exchange_to_exchange_and_alternate(conn):
    ch = await conn.channel()
    src = await ch.declare_exchange("e2e-src", ExchangeType.TOPIC)
    dst = await ch.declare_exchange("e2e-dst", ExchangeType.FANOUT)
    alt = await ch.declare_exchange("alt-x", ExchangeType.FANOUT)
    with_alt = await ch.declare_exchange(
        "with-alt", ExchangeType.DIRECT, arguments={"alternate-exchange": "alt-x"}
    )
    q = await ch.declare_queue("e2e-q", exclusive=True)
    qa = await ch.declare_queue("alt-q", exclusive=True)
    await dst.bind(src, "a.#")
    await src.bind(dst, "#")  # a cycle: must not loop or duplicate
    await q.bind(dst)
    await q.bind(src, "a.b")  # reaches q twice: once
    await qa.bind(alt)
    await src.publish(Message(b"via-e2e"), routing_key="a.b")
    await with_alt.publish(Message(b"to-alt"), routing_key="unbound")
    assert [m.body for m in await drain(q, 1)] == [b"via-e2e"]
    assert [m.body for m in await drain(qa, 1)] == [b"to-alt"]
    await asyncio.sleep(0.1)
    assert await message_count(ch, "e2e-q") == 0


async def test_consumer_priorities(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("cprio", exclusive=True)
    seen: dict[str, int] = {"low": 0, "high": 0}

    def make(name):
        async def on_message(message):
            seen[name] += 1
            await message.ack()

        return on_message

    await q.consume(make("low"), arguments={"x-priority": 1})
    await q.consume(make("high"), arguments={"x-priority": 10})
    for _ in range(20):
        await ch.default_exchange.publish(Message(b"x"), routing_key="cprio")
    await asyncio.sleep(0.5)
    # Without a prefetch limit the high-priority consumer always has credit, so it gets all.
    assert seen == {"high": 20, "low": 0}


async def test_single_active_consumer(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("sac", exclusive=True, arguments={"x-single-active-consumer": True})
    seen: list[str] = []

    def make(name):
        async def on_message(message):
            seen.append(name)
            await message.ack()

        return on_message

    await q.consume(make("first"))
    await q.consume(make("second"))
    for _ in range(10):
        await ch.default_exchange.publish(Message(b"x"), routing_key="sac")
    await asyncio.sleep(0.3)
    assert seen == ["first"] * 10


async def test_quorum_and_stream_queue_types(conn):
    ch = await conn.channel()
    await ch.declare_queue("qq", durable=True, arguments={"x-queue-type": "quorum"})
    await ch.declare_queue("sq", durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(ChannelClosed) as info:  # streams: tests/core/test_streams.py
        await ch.declare_queue("sq2", durable=False, arguments={"x-queue-type": "stream"})
    assert "invalid property 'non-durable'" in str(info.value)


async def test_quorum_delivery_limit_dead_letters(conn):
    ch = await conn.channel()
    dlx = await ch.declare_exchange("qq-dlx", ExchangeType.FANOUT)
    dead = await ch.declare_queue("qq-dead", exclusive=True)
    await dead.bind(dlx)
    q = await ch.declare_queue(
        "qq-limit",
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": 1,
            "x-dead-letter-exchange": "qq-dlx",
        },
    )
    await ch.default_exchange.publish(Message(b"poison"), routing_key="qq-limit")
    for _ in range(2):
        m = await q.get(timeout=5)
        await m.nack(requeue=True)
    [d] = await drain(dead, 1)
    assert d.headers["x-death"][0]["reason"] == "delivery_limit"
    await q.delete()


async def test_transactions_commit_and_rollback(conn):
    ch = await conn.channel(publisher_confirms=False)
    q = await ch.declare_queue("txq", exclusive=True)
    tx = ch.transaction()
    await tx.select()
    await ch.default_exchange.publish(Message(b"rolled-back"), routing_key="txq")
    await tx.rollback()
    await ch.default_exchange.publish(Message(b"committed"), routing_key="txq")
    await asyncio.sleep(0.05)
    assert await message_count(ch, "txq") == 0
    await tx.commit()
    m = await q.get(timeout=5, no_ack=True)
    assert m.body == b"committed"
    assert await q.get(fail=False) is None


async def test_cc_and_bcc(conn):
    ch = await conn.channel()
    ex = await ch.declare_exchange("cc-x", ExchangeType.DIRECT)
    qs = {}
    for key in ("main", "copy", "blind"):
        qs[key] = await ch.declare_queue(f"cc-{key}", exclusive=True)
        await qs[key].bind(ex, key)
    await ex.publish(Message(b"m", headers={"CC": ["copy"], "BCC": ["blind"]}), routing_key="main")
    for key in ("main", "copy", "blind"):
        m = await qs[key].get(timeout=5, no_ack=True)
        assert m.body == b"m"
        assert "BCC" not in (m.headers or {})
        assert m.headers["CC"] == ["copy"]


async def test_user_id_mismatch_refused(conn):
    ch = await conn.channel()
    with pytest.raises(ChannelClosed) as info:
        await ch.default_exchange.publish(Message(b"x", user_id="mallory"), routing_key="q")
        await ch.declare_queue("after-bad-user", exclusive=True)
    assert "PRECONDITION_FAILED" in str(info.value)
    ch2 = await conn.channel()
    await ch2.default_exchange.publish(Message(b"x", user_id="guest"), routing_key="nowhere")


async def test_mandatory_unroutable_is_returned(conn):
    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
    with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
        await ch.default_exchange.publish(
            Message(b"lost"), routing_key="no-such-queue", mandatory=True
        )
    assert info.value.message.body == b"lost"


async def test_queue_delete_with_consumers_answers(conn):
    """queue.delete always answers, even with a consumer attached; the consumer's channel lives."""
    ch = await conn.channel()
    q = await ch.declare_queue("del-with-consumer")
    await q.consume(_ignore)
    ch2 = await conn.channel()
    result = await ch2.queue_delete("del-with-consumer")
    assert result.message_count == 0
    await asyncio.sleep(0.05)
    assert not ch.is_closed
    await ch.declare_queue("still-usable", exclusive=True)


async def test_persistent_delivery_mode_accepted(conn):
    ch = await conn.channel()
    q = await ch.declare_queue("persist-q", durable=True)
    await ch.default_exchange.publish(
        Message(b"p", delivery_mode=DeliveryMode.PERSISTENT), routing_key="persist-q"
    )
    m = await q.get(timeout=5, no_ack=True)
    assert m.delivery_mode == DeliveryMode.PERSISTENT
    await q.delete()


async def test_many_consumers_one_channel_frames_never_interleave(conn):
    """Large multi-frame messages to many consumers on one channel arrive whole."""
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=50)
    body = bytes(range(256)) * 2000  # 512 KB: several frames each
    queues = [await ch.declare_queue(f"il-{i}", exclusive=True) for i in range(8)]
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_message(message):
        got.append(message.body)
        await message.ack()
        if len(got) == 8 * 5:
            done.set()

    for q in queues:
        await q.consume(on_message)
    pub = await conn.channel()
    for _ in range(5):
        for q in queues:
            await pub.default_exchange.publish(Message(body), routing_key=q.name)
    await asyncio.wait_for(done.wait(), 20)
    assert all(b == body for b in got)
