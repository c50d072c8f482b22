"""A dynamic shovel at work (broker/links/shovel.py) between queues and exchanges of a
real broker over real sockets, its ends reached by URI: every message moved once, acked
at the source only once confirmed, the headers RabbitMQ's shovel adds, delete-after."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from support.waiting import until_async

from roarmq.broker.links.client import AmqpClient
from roarmq.broker.links.shovel import Shovel
from roarmq.broker.links.shovel_definition import check_shovel
from roarmq.broker.links.uri import parse_uri
from roarmq.protocol import spec
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(60)


def url(broker) -> str:
    return f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"


async def queue_count(client: AmqpClient, queue: str) -> int:
    ch = await client.channel()
    ok = await ch.call(spec.QueueDeclare(queue=queue, passive=True))
    await ch.close()
    return ok.message_count


async def test_on_confirm_moves_every_message_once_with_rabbitmqs_headers(broker):
    client = await AmqpClient.connect(parse_uri(url(broker)))
    src, dest = "src-" + uuid.uuid4().hex[:6], "dest-" + uuid.uuid4().hex[:6]
    ch = await client.channel()
    await ch.call(spec.QueueDeclare(queue=src, durable=True))
    props = ContentHeader.from_properties(BasicProperties(delivery_mode=2, headers={"n": 1}), 60)
    for i in range(200):
        ch.publish("", src, props, b"m%d" % i)
    await until_count(client, src, 200)
    definition = check_shovel(
        "move",
        {
            "src-uri": url(broker),
            "src-queue": src,
            "dest-uri": [url(broker)],
            "dest-queue": dest,  # declared by the shovel
            "dest-add-forward-headers": True,
            "dest-add-timestamp-header": True,
            "dest-publish-properties": {"app_id": "shovelled"},
            "src-prefetch-count": 16,
            "src-delete-after": "queue-length",
        },
    )
    finished = asyncio.Event()
    shovel = Shovel("/", "move", definition, cluster_name="c1", node="n1", on_finished=finished.set)
    shovel.start()
    try:
        await asyncio.wait_for(finished.wait(), 20)
        assert shovel.moved == 200
        assert await queue_count(client, src) == 0
        assert await queue_count(client, dest) == 200
        got = await ch.call(spec.BasicGet(queue=dest, no_ack=True))
        headers = got.header.properties.headers
        assert got.header.properties.app_id == "shovelled"
        assert got.header.properties.delivery_mode == 2 and headers["n"] == 1
        (entry,) = headers["x-shovelled"]
        assert entry == {
            "shovelled-by": "c1",
            "shovel-type": "dynamic",
            "shovel-name": "move",
            "shovel-vhost": "/",
            "src-uri": f"amqp://127.0.0.1:{broker.port}/%2F",
            "dest-uri": f"amqp://127.0.0.1:{broker.port}/%2F",
            "src-queue": src,
            "dest-queue": dest,
        }
        assert isinstance(headers["x-shovelled-timestamp"], int)
    finally:
        await shovel.stop()
        await client.close()


async def until_count(client: AmqpClient, queue: str, n: int) -> None:
    for _ in range(500):
        if await queue_count(client, queue) == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{queue} never held {n}")


async def test_from_an_exchange_to_an_exchange_keeping_the_routing_key(broker):
    client = await AmqpClient.connect(parse_uri(url(broker)))
    ch = await client.channel()
    out = "out-" + uuid.uuid4().hex[:6]
    await ch.call(spec.ExchangeDeclare(exchange="in-x", type="topic"))
    await ch.call(spec.ExchangeDeclare(exchange=out, type="direct"))
    await ch.call(spec.QueueDeclare(queue=out + "-q", auto_delete=False))
    await ch.call(spec.QueueBind(queue=out + "-q", exchange=out, routing_key="a.b"))
    definition = check_shovel(
        "x2x",
        {
            "src-uri": url(broker),
            "src-exchange": "in-x",
            "src-exchange-key": "a.*",
            "dest-uri": url(broker),
            "dest-exchange": out,
            "ack-mode": "on-publish",
        },
    )
    shovel = Shovel("/", "x2x", definition, cluster_name="c1", node="n1")
    shovel.start()
    try:
        assert await until_async(lambda: shovel.state == "running", 10, 0.02)
        header = ContentHeader.from_properties(BasicProperties(), 60)
        ch.publish("in-x", "a.b", header, b"kept key")
        ch.publish("in-x", "z.b", header, b"not bound")
        await until_count(client, out + "-q", 1)
        row = shovel.row()
        assert (row["state"], row["src_exchange"], row["dest_exchange"]) == ("running", "in-x", out)
        assert "guest" not in str(row)
    finally:
        await shovel.stop()
        await client.close()


async def test_an_unreachable_end_is_terminated_with_the_reason_and_retried():
    from support.waiting import free_port

    definition = check_shovel(
        "nowhere",
        {
            "src-uri": f"amqp://u:secret@127.0.0.1:{free_port()}",
            "src-queue": "a",
            "dest-uri": "amqp://127.0.0.1:1",
            "dest-queue": "b",
            "reconnect-delay": 0.2,
        },
    )
    shovel = Shovel("/", "nowhere", definition, cluster_name="c1", node="n1")
    shovel.start()
    try:
        # (between two attempts: each attempt shows "starting" while it connects)
        assert await until_async(
            lambda: shovel.reconnects >= 2 and shovel.state == "terminated", 10, 0.02
        )
        row = shovel.row()
        assert row["state"] == "terminated"
        assert "ECONNREFUSED" in row["reason"] and "secret" not in str(row)
    finally:
        await shovel.stop()
