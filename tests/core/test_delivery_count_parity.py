"""A quorum queue's `x-delivery-count` header, where a client sees RoarMQ answer as RabbitMQ
3.10.8 does: read from the frames' bytes (RawClient) against RoarMQ and, marked `slow`,
against a RabbitMQ 3.10.8 node of the module's own, asserting the same on both.

Every delivery from a quorum queue, by basic.get or to a consumer, the first too,
carries how many returns came before it (basic.nack, basic.reject, the channel closing
with it unacked, basic.recover) as a signed 64-bit field ('l'), in place of a publisher's
own `x-delivery-count`; a classic queue leaves the publisher's headers as they are."""

from __future__ import annotations

import uuid

import pytest
from support.rawclient import RawClient

from roarmq.protocol import spec
from roarmq.protocol.frames import ContentMessage
from roarmq.protocol.properties import BasicProperties

pytestmark = pytest.mark.timeout(120)

COUNT_KEY = b"\x10x-delivery-count"
PUBLISHED = [
    (b"plain", BasicProperties(delivery_mode=2)),
    (b"headers", BasicProperties(delivery_mode=2, headers={"h": 1})),
    (
        b"own",
        BasicProperties(delivery_mode=2, content_type="t", headers={"x-delivery-count": "zz"}),
    ),
]


def count_of(delivery: ContentMessage) -> int | None:
    """The `x-delivery-count` field of a delivery, checked to be there once and an 'l'."""
    raw = delivery.header.raw
    at = raw.find(COUNT_KEY)
    if at < 0:
        return None
    assert raw.find(COUNT_KEY, at + 1) < 0, raw
    field = raw[at + len(COUNT_KEY) : at + len(COUNT_KEY) + 9]
    assert field[:1] == b"l", raw
    return int.from_bytes(field[1:], "big", signed=True)


async def declared(target, queue_type: str) -> tuple[RawClient, str]:
    name = "dc" + uuid.uuid4().hex[:12]
    c = await RawClient.connect(target.port)
    await c.open_channel(1)
    args = {"x-queue-type": queue_type}
    c.send(1, spec.QueueDeclare(queue=name, durable=True, arguments=args))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.ConfirmSelect())
    await c.expect(spec.ConfirmSelectOk)
    for body, props in PUBLISHED:
        c.publish(1, "", name, body, props)
    acked = 0
    while acked < len(PUBLISHED):  # (one ack may confirm several)
        acked = (await c.expect(spec.BasicAck)).delivery_tag
    return c, name


async def get_all(c: RawClient, channel: int, name: str) -> list[ContentMessage]:
    got = []
    for _ in PUBLISHED:
        c.send(channel, spec.BasicGet(queue=name))
        delivery = await c.next_frame()
        assert isinstance(delivery, ContentMessage), delivery
        got.append(delivery)
    return got


def headers_of(deliveries: list[ContentMessage]) -> list[dict | None]:
    return [d.header.properties.headers for d in deliveries]


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_each_return_counts_and_every_delivery_says_so(target, queue_type):
    c, name = await declared(target, queue_type)
    counted = queue_type == "quorum"
    first = await get_all(c, 1, name)
    assert [d.body for d in first] == [body for body, _ in PUBLISHED]
    if counted:  # from the first delivery on, the publisher's own replaced
        assert [count_of(d) for d in first] == [0, 0, 0]
        assert headers_of(first) == [
            {"x-delivery-count": 0},
            {"h": 1, "x-delivery-count": 0},
            {"x-delivery-count": 0},
        ]
        assert first[2].header.properties.content_type == "t"
    else:  # a classic queue leaves the publisher's headers as they are
        assert headers_of(first) == [None, {"h": 1}, {"x-delivery-count": "zz"}]
    # basic.nack with requeue: the first return
    c.send(
        1, spec.BasicNack(delivery_tag=first[-1].method.delivery_tag, multiple=True, requeue=True)
    )
    second = await get_all(c, 1, name)
    assert [d.method.redelivered for d in second] == [True] * 3
    if counted:
        assert [count_of(d) for d in second] == [1, 1, 1]
    else:
        assert headers_of(second) == headers_of(first)
    # basic.reject with requeue: the second
    for d in second:
        c.send(1, spec.BasicReject(delivery_tag=d.method.delivery_tag, requeue=True))
    third = await get_all(c, 1, name)
    if counted:
        assert [count_of(d) for d in third] == [2, 2, 2]
    # the channel closed with them unacked: the third; a consumer's delivery says so
    c.send(1, spec.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    await c.expect(spec.ChannelCloseOk)
    await c.open_channel(2)
    c.send(2, spec.BasicConsume(queue=name))
    await c.expect(spec.BasicConsumeOk)
    fourth = [await c.next_frame() for _ in PUBLISHED]
    assert all(isinstance(d, ContentMessage) for d in fourth)
    assert [d.body for d in fourth] == [body for body, _ in PUBLISHED]
    if counted:
        assert [count_of(d) for d in fourth] == [3, 3, 3]
    else:
        assert headers_of(fourth) == headers_of(first)
    # basic.recover with requeue: the fourth
    c.send(2, spec.BasicRecover(requeue=True))
    await c.expect(spec.BasicRecoverOk)
    fifth = [await c.next_frame() for _ in PUBLISHED]
    assert sorted(d.body for d in fifth) == sorted(body for body, _ in PUBLISHED)
    if counted:
        assert [count_of(d) for d in fifth] == [4, 4, 4]
    c.send(2, spec.BasicAck(delivery_tag=fifth[-1].method.delivery_tag, multiple=True))
    c.send(2, spec.QueueDelete(queue=name))
    await c.expect(spec.QueueDeleteOk)
    await c.close()
