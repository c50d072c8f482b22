"""RabbitMQ's vhost and user limits and the global connection limit, each refusal with the
code and text RabbitMQ 3.10.8 sends (checked with the same raw frames against it)."""

from __future__ import annotations

import asyncio

import pytest
from rawclient import RawClient

from roarmq.broker.auth import hash_password
from roarmq.broker.testing import BrokerThread, ephemeral_config, running_broker
from roarmq.protocol import spec

pytestmark = pytest.mark.timeout(60)


async def opened(port: int, user: str = "guest", vhost: str = "/") -> tuple[RawClient, object]:
    """A client and the broker's answer to its connection.open."""
    c = await RawClient.connect(port, handshake=False)
    answer = await c.handshake(
        user=user, password="guest" if user == "guest" else "pw", vhost=vhost
    )
    return c, answer


def setup(broker) -> None:
    broker.add_vhost("v1")
    broker.put_user("lu", hash_password("pw"), ())
    for vhost in ("/", "v1"):
        broker.set_permission("lu", vhost, ".*", ".*", ".*")
    broker.set_permission("guest", "v1", ".*", ".*", ".*")


async def test_vhost_connection_limit(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-connections", 1)
    first, answer = await opened(broker.port, vhost="v1")
    assert isinstance(answer, spec.ConnectionOpenOk)
    second, answer = await opened(broker.port, vhost="v1")
    assert (answer.reply_code, answer.reply_text, answer.class_id, answer.method_id) == (
        530,
        "NOT_ALLOWED - access to vhost 'v1' refused for user 'guest': connection limit (1) is reached",
        10,
        40,
    )
    other, answer = await opened(broker.port, vhost="/")  # another vhost is not counted
    assert isinstance(answer, spec.ConnectionOpenOk)
    await first.close()
    await asyncio.sleep(0.05)
    third, answer = await opened(broker.port, vhost="v1")  # a freed place can be taken
    assert isinstance(answer, spec.ConnectionOpenOk)
    for c in (second, other, third):
        c.writer.close()


async def test_vhost_queue_limit(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-queues", 1)
    c, _ = await opened(broker.port, vhost="v1")
    await c.open_channel(1)
    c.send(1, spec.QueueDeclare(queue="q1"))
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueDeclare(queue="q1"))  # redeclaring is not declaring a new one
    await c.expect(spec.QueueDeclareOk)
    c.send(1, spec.QueueDeclare(queue="q2", exclusive=True))
    close = await c.expect(spec.ChannelClose)
    assert (close.reply_code, close.reply_text) == (
        406,
        "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in vhost 'v1' (1) is reached",
    )
    await c.close()


async def test_user_connection_and_channel_limits(broker):
    setup(broker.broker)
    broker.broker.set_limit("user", "lu", "max-connections", 2)
    broker.broker.set_limit("user", "lu", "max-channels", 2)
    a, _ = await opened(broker.port, "lu")
    b, _ = await opened(broker.port, "lu", vhost="v1")  # counted across vhosts
    c, answer = await opened(broker.port, "lu")
    assert (answer.reply_code, answer.reply_text) == (
        530,
        "NOT_ALLOWED - connection refused for user 'lu': user connection limit (2) is reached",
    )
    await a.open_channel(1)
    await b.open_channel(1)  # counted across connections
    a.send(2, spec.ChannelOpen())
    close = await a.expect(spec.ConnectionClose)
    assert (close.reply_code, close.reply_text) == (
        530,
        "NOT_ALLOWED - number of channels opened for user 'lu' has reached the maximum "
        "allowed user limit of (2)",
    )
    guest, answer = await opened(broker.port)  # other users are not limited
    assert isinstance(answer, spec.ConnectionOpenOk)
    await guest.open_channel(1)
    await guest.open_channel(2)
    await guest.open_channel(3)
    for client in (a, b, c, guest):
        client.writer.close()


async def test_negative_or_cleared_limits_are_no_limits(broker):
    setup(broker.broker)
    broker.broker.set_limit("vhost", "v1", "max-queues", -1)
    c, _ = await opened(broker.port, vhost="v1")
    await c.open_channel(1)
    for name in ("a", "b"):
        c.send(1, spec.QueueDeclare(queue=name))
        await c.expect(spec.QueueDeclareOk)
    broker.broker.set_limit("vhost", "v1", "max-queues", 0)
    c.send(1, spec.QueueDeclare(queue="c"))
    assert (await c.expect(spec.ChannelClose)).reply_code == 406
    c.send(1, spec.ChannelCloseOk())
    assert broker.broker.clear_limit("vhost", "v1", "max-queues")
    await c.open_channel(2)
    c.send(2, spec.QueueDeclare(queue="c"))
    await c.expect(spec.QueueDeclareOk)
    await c.close()


async def test_limits_survive_a_restart(tmp_path):
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        setup(b.broker)
        b.broker.set_limit("vhost", "v1", "max-connections", 0)
    async with running_broker(ephemeral_config(data_dir=str(tmp_path / "d"))) as b:
        c, answer = await opened(b.port, vhost="v1")
        assert answer.reply_code == 530
        c.writer.close()


async def test_global_max_connections(tmp_path):
    cfg = ephemeral_config(data_dir=str(tmp_path / "d"), limits={"max_connections": 1})
    async with running_broker(cfg) as b:
        first, answer = await opened(b.port)
        assert isinstance(answer, spec.ConnectionOpenOk)
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
        writer.close()
        await first.open_channel(1)  # the one within the limit is untouched
        await first.close()


def test_limits_api_and_definitions(tmp_path):
    with BrokerThread(ephemeral_config(data_dir=str(tmp_path / "d")), management=True) as b:
        assert b.api("PUT", "/api/vhosts/v1")[0] == 201
        assert b.api("PUT", "/api/users/lu", {"password": "pw", "tags": ""})[0] == 201
        for path, value in [
            ("/api/vhost-limits/v1/max-connections", 1),
            ("/api/vhost-limits/v1/max-queues", 1),
            ("/api/user-limits/lu/max-connections", 2),
            ("/api/user-limits/lu/max-channels", 2),
        ]:
            assert b.api("PUT", path, {"value": value})[0] == 204
        vhost_rows = [{"vhost": "v1", "value": {"max-connections": 1, "max-queues": 1}}]
        user_rows = [{"user": "lu", "value": {"max-channels": 2, "max-connections": 2}}]
        assert b.api("GET", "/api/vhost-limits") == (200, vhost_rows)
        assert b.api("GET", "/api/vhost-limits/v1") == (200, vhost_rows)
        assert b.api("GET", "/api/vhost-limits/%2F") == (200, [])
        assert b.api("GET", "/api/user-limits") == (200, user_rows)
        assert b.api("GET", "/api/user-limits/lu") == (200, user_rows)
        assert b.api("PUT", "/api/vhost-limits/v1/bogus", {"value": 5}) == (
            400,
            {
                "error": "bad_request",
                "reason": 'Validation failed\n\nUnrecognised terms [{<<"bogus">>,5}] in limits\n',
            },
        )
        status, body = b.api("PUT", "/api/vhost-limits/v1/max-queues", {"value": "x"})
        assert status == 400 and "max-queues should be a number" in body["reason"]
        assert b.api("PUT", "/api/vhost-limits/nope/max-queues", {"value": 1})[0] == 404

        doc = b.api("GET", "/api/definitions")[1]
        assert {
            "value": {"max-connections": 1, "max-queues": 1},
            "vhost": "v1",
            "component": "vhost-limits",
            "name": "limits",
        } in doc["parameters"]
        lu = next(u for u in doc["users"] if u["name"] == "lu")
        assert lu["limits"] == {"max-channels": 2, "max-connections": 2}
        assert lu["tags"] == []

        assert b.api("DELETE", "/api/vhost-limits/v1/max-queues")[0] == 204
        assert b.api("DELETE", "/api/user-limits/lu/max-channels")[0] == 204
        assert b.api("GET", "/api/vhost-limits/v1")[1][0]["value"] == {"max-connections": 1}
        assert b.api("POST", "/api/definitions", doc)[0] == 204  # RabbitMQ's format back in
        assert b.api("GET", "/api/vhost-limits") == (200, vhost_rows)
        assert b.api("GET", "/api/user-limits") == (200, user_rows)
