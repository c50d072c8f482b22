"""Hostile input that once ended in 541 INTERNAL_ERROR (or lost a message): each now gets
RabbitMQ's code and text at the door, or works, and the broker keeps every message it took.

Each case was first checked against RabbitMQ 3.10.8 with the same raw frames.
"""

from __future__ import annotations

import asyncio
import base64
import struct

import aiohttp
import pytest
from support.rawclient import RawClient

from roarmq.broker.testing import ephemeral_config, running_broker
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage, encode_method
from roarmq.protocol.properties import BasicProperties
from roarmq.protocol.tables import MAX_NESTING, RawTimestamp

pytestmark = pytest.mark.timeout(60)

BAD_NAME = "fuzz-\udcff\udcfe"  # encodes (surrogateescape) to b"fuzz-\xff\xfe": not UTF-8


@pytest.fixture
def client(raw):
    return raw


async def closed_with(client: RawClient) -> tuple[str, int, str]:
    """The close the broker sends next, skipping the replies before it."""
    while True:
        ev = await client.next_method()
        if isinstance(ev, spec.ConnectionClose):
            client.send(0, spec.ConnectionCloseOk())
            return "connection", ev.reply_code, ev.reply_text
        if isinstance(ev, spec.ChannelClose):
            client.send(1, spec.ChannelCloseOk())
            return "channel", ev.reply_code, ev.reply_text


async def get(client: RawClient, queue: str, timeout: float = 5.0) -> ContentMessage | None:
    """basic.get, polling until a message is there or the timeout passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        client.send(1, spec.BasicGet(queue=queue, no_ack=True))
        ev = await client.next_frame()
        if isinstance(ev, ContentMessage):
            return ev
        assert isinstance(ev.method if hasattr(ev, "method") else ev, spec.BasicGetEmpty), ev
        if loop.time() > deadline:
            return None
        await asyncio.sleep(0.02)


async def acked(client: RawClient, tag: int) -> None:
    """Wait until publish ``tag`` is acked (acks may come as one ``multiple``)."""
    while True:
        ev = await client.next_method()
        assert isinstance(ev, spec.BasicAck), ev
        if ev.delivery_tag >= tag:
            return


async def declare(client: RawClient, queue: str, **kw) -> None:
    client.send(1, spec.QueueDeclare(queue=queue, **kw))
    await client.expect(spec.QueueDeclareOk)


async def assert_alive(broker) -> None:
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    await declare(c, "alive-check", auto_delete=True)
    c.publish(1, "", "alive-check", b"alive")
    got = await get(c, "alive-check")
    assert got is not None and got.body == b"alive"
    await c.close()


def nested_arrays(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_tables(depth: int, leaf: object = 1) -> object:
    value = leaf
    for _ in range(depth):
        value = {"k": value}
    return value


# -- 1. names that are not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize(
    "method",
    [
        spec.QueueDeclare(queue=BAD_NAME, durable=True),
        spec.QueueDeclare(queue=BAD_NAME),
        spec.ExchangeDeclare(exchange=BAD_NAME, type="direct", durable=True),
        spec.ExchangeDeclare(exchange="x", type="dir\udcff"),
        spec.ExchangeDelete(exchange=BAD_NAME),
        spec.QueueDelete(queue=BAD_NAME),
        spec.QueuePurge(queue=BAD_NAME),
        spec.QueueBind(queue="q", exchange="amq.topic", routing_key=BAD_NAME),
        spec.QueueUnbind(queue="q", exchange="amq.topic", routing_key=BAD_NAME),
        spec.ExchangeBind(destination="amq.direct", source="amq.topic", routing_key=BAD_NAME),
        spec.BasicConsume(queue="q", consumer_tag=BAD_NAME),
        spec.BasicCancel(consumer_tag=BAD_NAME),
        spec.BasicGet(queue=BAD_NAME),
    ],
    ids=lambda m: m.NAME,
)
async def test_a_name_that_is_not_utf8_is_a_frame_error(broker, client, method):
    client.send(1, method)
    assert await closed_with(client) == (
        "connection",
        501,
        "FRAME_ERROR - Malformed UTF-8 in shortstr",
    )
    await assert_alive(broker)


async def test_nothing_half_declared_survives_a_restart(tmp_path):
    """The durable queue with a bad name was never created, so a restart finds none."""
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    async with running_broker(cfg) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        c.send(1, spec.QueueDeclare(queue=BAD_NAME, durable=True))
        assert (await closed_with(c))[1] == 501
        assert all(BAD_NAME not in v.queues for v in b.broker.vhosts.values())
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        assert all(BAD_NAME not in v.queues for v in b.broker.vhosts.values())


async def test_publish_keys_are_bytes_as_in_rabbitmq(broker, client):
    """RabbitMQ does not check basic.publish's key: a key no binding matches is unroutable,
    and a bad exchange name is 404 (it names no exchange)."""
    client.send(1, spec.ConfirmSelect())
    await client.expect(spec.ConfirmSelectOk)
    client.publish(1, "amq.topic", BAD_NAME, b"x")
    assert isinstance(await client.next_method(), spec.BasicAck)
    await declare(client, "bytes-key", auto_delete=True)
    client.publish(1, "", "bytes-key", b"y", BasicProperties(message_id=BAD_NAME))
    got = await get(client, "bytes-key")
    assert got.body == b"y"
    client.publish(1, BAD_NAME, "k", b"z")
    kind, code, text = await closed_with(client)
    assert (kind, code) == ("channel", 404)
    assert text.startswith("NOT_FOUND - no exchange 'fuzz-")


# -- 2. deep tables ----------------------------------------------------------------


@pytest.mark.parametrize("depth", [400, 5000])
async def test_deep_headers_bind_route_and_arrive_intact(broker, client, depth):
    deep = nested_tables(depth)
    await declare(client, "deep", auto_delete=True)
    client.send(
        1,
        spec.QueueBind(
            queue="deep", exchange="amq.headers", arguments={"x-match": "all", "d": deep}
        ),
    )
    await client.expect(spec.QueueBindOk)
    client.send(1, spec.ConfirmSelect())
    await client.expect(spec.ConfirmSelectOk)
    other = nested_tables(depth, leaf=2)  # differs only at the bottom: must not match
    client.publish(1, "amq.headers", "", b"miss", BasicProperties(headers={"d": other}))
    client.publish(1, "amq.headers", "", b"hit", BasicProperties(headers={"d": deep}))
    await acked(client, 2)
    got = await get(client, "deep")
    assert got.body == b"hit"
    assert got.header.properties.headers == {"d": deep}
    assert await get(client, "deep", timeout=0.05) is None


async def test_twenty_thousand_deep_arrays_pass_through(broker, client):
    deep = nested_arrays(20000)
    await declare(client, "arrays", auto_delete=True)
    props = BasicProperties(headers={"a": deep})
    client.publish(1, "", "arrays", b"deep", props)
    got = await get(client, "arrays")
    assert got.header.raw == props.encode()


async def test_nesting_past_max_nesting_is_a_syntax_error(broker, client):
    client.publish(1, "", "q", b"x", BasicProperties(headers={"a": nested_arrays(MAX_NESTING + 1)}))
    kind, code, text = await closed_with(client)
    assert (kind, code) == ("connection", 502)
    assert f"nested deeper than {MAX_NESTING} levels" in text
    await assert_alive(broker)


async def test_durable_deep_arguments_survive_a_restart(tmp_path):
    args = {"x-custom": nested_tables(5000)}
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        await declare(c, "deep-durable", durable=True, arguments=args)
        await c.close()
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "data"))) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        c.send(1, spec.QueueDeclare(queue="deep-durable", passive=True))
        await c.expect(spec.QueueDeclareOk)
        assert b.broker.vhosts["/"].queues["deep-durable"].arguments == args
        await declare(c, "deep-durable", durable=True, arguments=args)  # equivalent
        await c.close()


# -- 3. headers the broker must re-encode ------------------------------------------------

ODD_HEADERS = {
    "ts": RawTimestamp(2**64 - 1),  # beyond any datetime
    "bad-utf8": b"\xff\xfe",  # a longstr that is not UTF-8
    "neg": -(2**63),
    "x-death": 7,  # not an array
}


async def test_bcc_with_odd_headers_is_delivered_without_bcc(broker, client):
    await declare(client, "bcc-a", auto_delete=True)
    await declare(client, "bcc-b", auto_delete=True)
    client.send(1, spec.ConfirmSelect())
    await client.expect(spec.ConfirmSelectOk)
    headers = {**ODD_HEADERS, "BCC": ["bcc-b"]}
    client.publish(1, "", "bcc-a", b"odd", BasicProperties(headers=headers))
    assert isinstance(await client.next_method(), spec.BasicAck)
    for queue in ("bcc-a", "bcc-b"):
        got = await get(client, queue)
        assert got.body == b"odd"
        assert got.header.properties.headers == ODD_HEADERS


async def setup_dead_lettering(client: RawClient, **queue_args) -> None:
    await declare(client, "dlq", auto_delete=False)
    client.send(1, spec.QueueBind(queue="dlq", exchange="amq.fanout"))
    await client.expect(spec.QueueBindOk)
    await declare(client, "work", arguments={"x-dead-letter-exchange": "amq.fanout", **queue_args})


def assert_dead_lettered(got: ContentMessage, reason: str) -> None:
    headers = got.header.properties.headers
    assert got.body == b"odd"
    assert [d["reason"] for d in headers["x-death"]] == [reason]
    assert headers["x-death"][0]["queue"] == "work"
    for name in ("ts", "bad-utf8", "neg"):
        assert headers[name] == ODD_HEADERS[name]


async def test_rejected_message_with_odd_headers_is_dead_lettered(broker, client):
    await setup_dead_lettering(client)
    client.publish(1, "", "work", b"odd", BasicProperties(headers=ODD_HEADERS))
    client.send(1, spec.BasicGet(queue="work"))
    got = await client.next_frame()
    client.send(1, spec.BasicReject(delivery_tag=got.method.delivery_tag, requeue=False))
    dead = await get(client, "dlq")
    assert dead is not None, "the rejected message was lost"
    assert_dead_lettered(dead, "rejected")


async def test_expired_message_with_odd_headers_is_dead_lettered(broker, client):
    await setup_dead_lettering(client, **{"x-message-ttl": 20})
    client.publish(1, "", "work", b"odd", BasicProperties(headers=ODD_HEADERS))
    dead = await get(client, "dlq")
    assert dead is not None, "the expired message was lost"
    assert_dead_lettered(dead, "expired")


async def test_x_death_entries_of_any_shape_are_tolerated(broker, client):
    await setup_dead_lettering(client)
    odd_deaths = {
        "x-death": [
            {"queue": "work", "reason": "rejected", "count": "many"},
            "not a table",
            {"queue": "elsewhere", "reason": "expired", "count": 3},
        ]
    }
    client.publish(1, "", "work", b"odd", BasicProperties(headers=odd_deaths))
    client.send(1, spec.BasicGet(queue="work"))
    got = await client.next_frame()
    client.send(1, spec.BasicReject(delivery_tag=got.method.delivery_tag, requeue=False))
    dead = await get(client, "dlq")
    deaths = dead.header.properties.headers["x-death"]
    assert [(d["queue"], d["count"]) for d in deaths] == [("work", 1), ("elsewhere", 3)]


@pytest.mark.parametrize(
    ("headers", "text"),
    [
        ({"CC": 5}, 'invalid message: {unacceptable_type_in_header,"CC",byte}'),
        ({"CC": "k"}, 'invalid message: {unacceptable_type_in_header,"CC",longstr}'),
        ({"BCC": {"a": 1}}, 'invalid message: {unacceptable_type_in_header,"BCC",table}'),
    ],
)
async def test_cc_that_is_not_an_array_is_refused(broker, client, headers, text):
    client.publish(1, "amq.direct", "k", b"x", BasicProperties(headers=headers))
    assert await closed_with(client) == ("channel", 406, f"PRECONDITION_FAILED - {text}")


# -- 4. malformed content headers --------------------------------------------------------


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


@pytest.mark.parametrize(
    ("properties", "text"),
    [
        (b"", "basic properties truncated"),  # the 12-byte header: no property flags
        (b"\x80", "basic properties truncated"),
        (b"\x80\x00\x05ab", "basic properties truncated"),
        (b"\x00\x00zz", "2 unexpected bytes after the basic properties"),
        (b"\x00\x04", "basic properties truncated"),  # cluster-id flag, no value
        (b"\x20\x00\x00\x00\x00\x05\x01a?xxx", "unknown field value type"),
    ],
)
async def test_malformed_content_header_is_refused_at_the_publisher(
    broker, client, properties, text
):
    await declare(client, "never", auto_delete=False)
    publish = encode_method(1, spec.BasicPublish(exchange="", routing_key="never"))
    header = frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + properties)
    client.write(publish + header + frame(3, 1, b"x"))
    kind, code, reply = await closed_with(client)
    assert (kind, code) == ("connection", 502)
    assert text in reply
    c = await RawClient.connect(broker.port)
    await c.open_channel(1)
    assert await get(c, "never", timeout=0.05) is None, "a malformed message was enqueued"
    await c.close()


# -- 5. what the management API shows of client data ----------------------------------------


async def test_management_api_shows_odd_arguments(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "data"))
    async with running_broker(cfg, management=True) as b:
        c = await RawClient.connect(b.port)
        await c.open_channel(1)
        args = {"x-bytes": b"\xff", "k-\udcff": 1, "deep": nested_tables(2000)}
        await declare(c, "odd-args", durable=True, arguments=args)
        auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        async with aiohttp.ClientSession(headers=auth) as http:
            for path in ("/api/queues", "/api/queues/%2F/odd-args", "/api/definitions"):
                async with http.get(b.mgmt_url + path) as resp:
                    assert resp.status == 200, path
                    await resp.json()
        await c.close()
